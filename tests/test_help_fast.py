"""`envbuild --help` and every `envbuild COMMAND --help` answer at once (within 3x a bare
interpreter, bench/bench_resolve.py): they import argparse and the command's own module, none
of what running a command needs, and print exactly what the whole CLI's parser prints."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.commands import cli
from envbuild.commands.options import _help_width

COMMANDS = [*cli.OWN_COMMANDS, *cli.LAZY_COMMANDS]
HELP_FORMS = [("--help",), *((command, "--help") for command in COMMANDS),
              ("matrix", "validate", "--help"), ("ci", "github", "--help")]
# Each is a large part of a help's budget, or belongs to running a command, not to its help.
COSTLY = {"typing", "dataclasses", "inspect", "pathlib", "json", "shutil", "threading", "tempfile",
          "subprocess", "jinja2", "docker", "requests", "packaging", "yaml", "envbuild.render",
          "envbuild.project.model", "envbuild.data.matrix", "envbuild.resolver", "envbuild.engine",
          "envbuild.smoke.suite", "envbuild.smoke.report", "envbuild.host.facts", "envbuild.upstream"}


def imported_by(argv: tuple[str, ...], tmp_path: Path) -> set[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), COLUMNS="100")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "from envbuild.__main__ import run; run()", *argv],
                          env=env, check=True, capture_output=True, text=True)
    assert done.stdout.startswith("usage: envbuild"), done.stdout
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("argv", HELP_FORMS, ids=" ".join)
def test_a_help_imports_nothing_costly(argv: tuple[str, ...], tmp_path: Path) -> None:
    imported = imported_by(argv, tmp_path)
    costly = COSTLY - {"shutil"} if argv[0] == "smoke" else COSTLY  # its own argparse sizes help by shutil
    assert {name for name in imported if name in costly or name.rpartition(".")[0] in costly
            or name.split(".")[0] in costly} == set()
    lazy = {module for module, _ in cli.LAZY_COMMANDS.values()}
    own = cli.LAZY_COMMANDS.get(argv[0], ("",))[0]
    assert imported & lazy <= {own}  # a command's help reads its own module, no other's


def _printed_help(parser_argv: list[str], parser: object, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(parser_argv)  # type: ignore[attr-defined]
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", HELP_FORMS, ids=" ".join)
def test_a_help_is_what_the_whole_cli_prints(argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # The command list is LAZY_COMMANDS' names and help, without importing a module: they must
    # be the modules' own, in their order; a command's help is built without the others.
    monkeypatch.setenv("COLUMNS", "100")
    if argv[0] == "smoke":  # the smoke test's own parser, whatever the CLI's holds
        assert cli.main(list(argv)) == 0
        assert capsys.readouterr().out.startswith("usage: envbuild smoke")
        return
    whole = _printed_help(list(argv), cli.build_parser(with_render=True, refresh=True), capsys)
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 0
    assert capsys.readouterr().out == whole


@pytest.mark.parametrize("columns", ["", "40", "100", "250", "nonsense", "0"])
def test_the_help_is_as_wide_as_argparse_makes_it(columns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    assert _help_width() == shutil.get_terminal_size().columns - 2
