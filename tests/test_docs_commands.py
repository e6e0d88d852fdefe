"""The docs cannot rot: every `envbuild …` command in a code block of README.md or docs/*.md is
parsed by the real parser, and the ones that need no engine, GPU or network are run for real,
with the exit code the docs show (`# exit N` after the command; 0 when none is written)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.commands.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
# Commands run for real: offline, no engine, no GPU, nothing written outside a temporary folder.
RUNNABLE = {"resolve", "matrix show", "matrix validate", "config show", "completion", "init",
            "render docker", "render script", "render cloud-init", "ci github", "ci bake", "smoke"}


def doc_commands() -> list[tuple[str, str]]:
    """(page:line, command line) for every line of a code block that starts an envbuild command
    (after an optional `$ ` prompt); a trailing backslash continues it."""
    found: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in FENCE.finditer(text):
            first_line = text[:block.start(1)].count("\n") + 1
            lines = block[1].splitlines()
            i = 0
            while i < len(lines):
                line, at = lines[i].removeprefix("$ ").strip(), i
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                i += 1
                for part in line.split(" && "):
                    if part.strip().startswith("envbuild "):
                        # <placeholders> stand for a value the reader supplies
                        part = re.sub(r"<[^>]+>", "0" * 64, part.strip())
                        found.append((f"{page.relative_to(ROOT)}:{first_line + at}", part))
    return found


COMMANDS = doc_commands()


def argv_of(line: str) -> tuple[list[str], int]:
    """The argv and the documented exit code of one command line (pipes and comments cut)."""
    command, _, comment = line.partition(" #")
    command = command.split(" | ")[0].split(" > ")[0]
    code = re.search(r"\bexit (\d+)", comment)
    return shlex.split(command)[1:], int(code[1]) if code else 0


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 15, COMMANDS


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_documented_command_parses(where: str, line: str) -> None:
    argv, _ = argv_of(line)
    try:
        if argv[:1] == ["smoke"]:  # the smoke test parses its own arguments (it runs in images alone)
            from envbuild.smoke.__main__ import parse_args

            parse_args(argv[1:])
        else:
            build_parser(with_render=True, refresh=True).parse_args(argv)
    except SystemExit as exc:  # --help / --version; an error of the smoke test's own parser
        assert exc.code == 0, f"{where}: {line}"


def runnable(line: str) -> bool:
    argv = argv_of(line)[0]
    return bool(argv) and (argv[0] in RUNNABLE or " ".join(argv[:2]) in RUNNABLE)


RUN = [(w, line) for w, line in COMMANDS if runnable(line)]


@pytest.mark.parametrize(("where", "line"), RUN, ids=[w for w, _ in RUN])
def test_each_offline_documented_command_runs(where: str, line: str, tmp_path: Path) -> None:
    argv, expected = argv_of(line)
    if argv[:1] == ["init"] and "--host" in argv:
        pytest.skip("reads this host")
    if argv[:1] == ["smoke"]:
        pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ENVBUILD_NO_CACHE": "1", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "envbuild", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == expected, f"{where}: {line}\n{done.stderr[-2000:]}"
