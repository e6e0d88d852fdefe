"""The start-up fast path for plain ``resolve`` (envbuild/__main__.py) against the CLI.

The fast path must print exactly what the argparse CLI prints, hand everything it is
unsure of to the CLI, and, as the envbuild command, exit with everything flushed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envbuild import __main__ as entry
from envbuild.commands import cli

# Plain commands the fast path answers itself, and failures it hands to the CLI (exit 3).
PLAIN = [
    ["resolve", "--driver", "550", "--json"],
    ["resolve", "--driver", "550"],
    ["resolve", "--driver", "550", "--explain"],
    ["resolve", "--driver", "535", "--gpu", "H100", "--json"],
    ["resolve", "--driver", "470", "--gpu", "K80", "--explain"],
    ["resolve", "--driver", "580", "--gpu", "B200", "--gpu", "H100", "--json"],
    ["resolve", "--driver", "535", "--gpu", "A100", "--datacenter", "--explain"],
    ["resolve", "--driver", "550", "--arch", "sm_86", "--top", "50", "--explain"],
    ["resolve", "--driver", "550", "--cuda", "11.8", "--python", "3.10", "--json"],
    ["resolve", "--driver", "550", "--variant", "default", "--explain"],
    ["resolve", "--driver", "550", "--variant", "cpu", "--json"],
    ["resolve", "--gpu", "GTX 1080", "--explain"],
    ["resolve", "--explain", "--top", "100"],
    ["resolve", "--driver", "560", "--flavor", "devel", "--json"],
    ["resolve", "--driver", "550", "--ubuntu", "20.04", "--explain"],
    ["resolve", "--driver", "550", "--cudnn", "9", "--json"],
    ["resolve", "--driver=550", "--torch=2.4", "--json"],  # the --opt=value spelling
    ["resolve", "--driver", "535.104.05", "--gpu", "A100", "--flavor", "devel"],  # K1, K2
    ["resolve", "--driver", "550.144.03", "--json"],  # K2: zero-padded, never 550.144.3
    ["resolve", "--driver", "525", "--json"],  # K4: a branch and its older builds
    ["resolve", "--driver", "525"],
    ["resolve", "--cuda", "13.0", "--json"],  # K5: CUDA 13.0's minimum driver
    [f"--matrices={Path(__file__).resolve().parent.parent / 'matrices'}", "resolve", "--gpu=RTX 4090",
     "--top=3"],
    ["resolve", "--driver", "550", "--torch", ">=2.3,<2.5", "--python", "3.11", "--explain"],
    ["resolve", "--driver", "550", "--torch", "==2.4.*", "--cuda", "12.4", "--json"],
    ["resolve", "--driver", "550", "--torch", "~=2.3.0", "--json"],  # packaging's forms too
    ["resolve", "--driver", "550", "--torch", "2.3.1+cu121", "--explain"],
    ["resolve", "--driver", "470.82", "--cuda", "12.4", "--json"],  # exit 3
    ["resolve", "--driver", "418", "--gpu", "T4", "--datacenter"],  # exit 3
    ["resolve", "--driver", "abc"],  # exit 2
    ["resolve", "--gpu", "GH200", "--json"],  # issue 38: a Grace GPU implies linux/arm64
    ["resolve", "--gpu", "GB10", "--variant", "cu128"],  # exit 3: CUDA 13 for DGX Spark
    ["resolve", "--platform", "linux/arm64", "--arch", "sm_75"],  # exit 3: T4G on Arm
    ["resolve", "--platform=linux/arm64", "--driver", "580", "--json"],
    ["resolve", "--platform", "sm_90"],  # exit 2: --arch's value
]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.mark.parametrize("argv", PLAIN, ids=[" ".join(a) for a in PLAIN])
def test_fast_path_prints_what_the_cli_prints(argv: list[str], env: dict[str, str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    expected_code = cli.main(argv, env)
    expected = capsys.readouterr()
    for _ in range(2):  # a cold index, then the cached one
        assert entry.main(argv, env) == expected_code
        got = capsys.readouterr()
        assert (got.out, got.err) == (expected.out, expected.err)


@pytest.mark.parametrize("argv", [
    ["resolve", "--dri", "550"],  # an abbreviation argparse would accept
    ["resolve", "--driver", "550", "--host"],
    ["resolve", "--driver", "550", "--debug"],
    ["resolve", "--driver", "-1"],
    ["resolve", "--top", "0"],
    ["resolve", "--flavor", "slim"],
    ["resolve", "--flavor=slim"],
    ["resolve", "--driver="],  # an empty value: argparse's business
    ["resolve", "--driver=-1"],
    ["resolve", "--json=yes"],  # a flag takes no value
    ["resolve", "--driver"],
    ["--matrices=", "resolve"],
    ["resolve", "--help"],
    ["detect"],
    ["--matrices", "x", "render", "docker"],
])
def test_anything_but_a_plain_resolve_goes_to_the_cli(argv: list[str]) -> None:
    assert entry.plain_resolve_args(argv) is None


def test_plain_arguments_become_the_cli_selectors() -> None:
    parsed = entry.plain_resolve_args(["--matrices", "/m", "resolve", "--gpu", "A", "--gpu=B",
                                       "--top", "3", "--json", "--torch=2.4"])
    assert parsed is not None
    selectors, output = parsed
    assert (selectors.gpu, selectors.torch, selectors.flavor) == (("A", "B"), "2.4", "runtime")
    assert (output.matrices, output.top, output.json, output.explain) == ("/m", 3, True, False)


def test_the_fast_path_and_the_cli_read_the_same_selectors() -> None:
    # What the fast path reads is what the CLI's namespace holds, through Selectors.of.
    from envbuild.resolver.selection import SELECTOR_FIELDS, Selectors

    argv = ["resolve", "--driver", "550", "--gpu", "A", "--arch=sm_90", "--datacenter",
            "--torch", "2.4", "--python=3.11", "--cuda", "12.4", "--cudnn", "9", "--ubuntu",
            "22.04", "--variant", "cu124", "--flavor", "devel", "--index-url", "https://x.invalid/"]
    parsed = entry.plain_resolve_args(argv)
    assert parsed is not None
    namespace = cli.build_parser().parse_args(argv)
    expected = Selectors.of(namespace)
    for name in SELECTOR_FIELDS:
        assert getattr(parsed[0], name) == getattr(expected, name), name


def _console(*argv: str, tmp_path: Path, stdout: Any,
             stderr: Any) -> subprocess.CompletedProcess[bytes]:
    """``run()``, the envbuild command's entry, in a process of its own."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("PYTHONUNBUFFERED", None)  # buffered, as a user's shell has it
    code = "from envbuild.__main__ import run; run()"
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, check=False,
                          stdout=stdout, stderr=stderr)


def test_console_entry_flushes_everything_before_it_exits(tmp_path: Path) -> None:
    # A pipe is block-buffered: without a flush before os._exit the JSON would be cut.
    done = _console("resolve", "--driver", "550", "--json", tmp_path=tmp_path,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(b"\n}\n")
    body = json.loads(done.stdout)
    assert body["driver"]["max_cuda"] == "12.4"
    assert len(body["stacks"]) == 10


def test_console_entry_writes_a_short_answer_whole(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Shorter than the pipe's buffer: nothing reaches the pipe unless it is flushed.
    argv = ("resolve", "--driver", "550", "--top", "1")
    assert cli.main(list(argv), {"ENVBUILD_NO_CACHE": "1"}) == 0
    expected = capsys.readouterr().out
    done = _console(*argv, tmp_path=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert (done.returncode, done.stdout.decode()) == (0, expected)


@pytest.mark.parametrize("argv", [("resolve", "--driver", ""), ("resolve", "--driver=")])
def test_an_empty_driver_is_exit_2_not_no_driver(argv: tuple[str, ...], tmp_path: Path) -> None:
    """docs/faults.md K3: the fast path hands an empty value to the CLI, which refuses it."""
    assert entry.plain_resolve_args(list(argv)) is None
    done = _console(*argv, tmp_path=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode().startswith("envbuild: error[usage]: invalid driver version ''")


def test_console_entry_hands_failures_to_the_cli(tmp_path: Path) -> None:
    done = _console("resolve", "--driver", "470.82", "--cuda", "12.4", tmp_path=tmp_path,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert done.returncode == 3
    assert done.stderr.decode().startswith("envbuild: error[")


@pytest.mark.parametrize("argv", [
    ("resolve", "--driver", "550", "--json"),  # the fast path
    ("resolve", "--dri", "550", "--json"),  # the CLI
])
def test_a_reader_that_stops_early_ends_the_command_quietly(argv: tuple[str, ...],
                                                            tmp_path: Path) -> None:
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before anything is written, as with `| head -c0`
    try:
        done = _console(*argv, tmp_path=tmp_path, stdout=writer, stderr=subprocess.PIPE)
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (141, b"")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [
    ("resolve", "--driver", "550", "--json"),
    ("resolve", "--dri", "550", "--json"),
])
def test_a_full_disk_is_one_line_and_exit_1(argv: tuple[str, ...], tmp_path: Path) -> None:
    with open("/dev/full", "wb") as full:
        done = _console(*argv, tmp_path=tmp_path, stdout=full, stderr=subprocess.PIPE)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 1
    assert len(lines) == 1
    assert lines[0].startswith("envbuild: error[output]: cannot write standard output: ")


@pytest.mark.parametrize("argv", [
    ("resolve", "--driver", "550", "--json"),
    ("resolve", "--driver=550", "--torch=2.4", "--python", "3.11", "--cuda", "12.4"),
    ("resolve", "--gpu", "RTX 4090", "--torch", ">=2.3,<2.6", "--explain"),
])
def test_a_warm_plain_resolve_starts_without_the_costly_imports(argv: tuple[str, ...],
                                                               tmp_path: Path) -> None:
    # Each of these costs a large part of the start-up budget (twice a bare interpreter).
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("ENVBUILD_NO_CACHE", None)
    warm = ("import os, sys\n"
            "from envbuild.resolver import index\n"
            "index.RACY_NS = 0  # data just checked out may be younger than the racy window\n"
            "from envbuild.__main__ import main\n"
            "sys.exit(main(sys.argv[1:], os.environ))\n")
    subprocess.run([sys.executable, "-c", warm, *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "from envbuild.__main__ import run; run()", *argv],
                          env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    costly = {"argparse", "dataclasses", "typing", "packaging.version", "packaging.specifiers",
              "json.decoder", "pathlib", "envbuild.commands.cli", "re"}
    assert imported & costly == set()


ROOT = Path(__file__).resolve().parent.parent


def test_the_envbuild_command_is_the_shipped_script_not_an_entry_point_launcher() -> None:
    # An entry point's launcher is written by the installer, and pip's imports `re` first:
    # about 1.6x a bare interpreter on its own (bench/bench_resolve.py). The wheel ships
    # bin/envbuild as its script instead; a [project.scripts] entry of the same name would
    # replace it with that launcher again.
    from envbuild.project.toml import parse

    project = parse((ROOT / "pyproject.toml").read_text(encoding="utf-8"), "pyproject.toml")
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["shared-scripts"] == {"bin/envbuild": "envbuild"}
    assert "envbuild" not in project["project"].get("scripts", {})
    script = ROOT / "bin" / "envbuild"
    assert os.access(script, os.X_OK)
    assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env python3\n")


def test_the_shipped_script_answers_as_python_m_does_and_imports_no_re(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    env.pop("ENVBUILD_NO_CACHE", None)
    argv = ["resolve", "--driver", "550", "--json"]
    by_module = subprocess.run([sys.executable, "-m", "envbuild", *argv], env=env, check=True,
                               capture_output=True, text=True, cwd=tmp_path)
    by_script = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "bin" / "envbuild"),
                                *argv], env=env, check=True, capture_output=True, text=True,
                               cwd=tmp_path)
    assert by_script.stdout == by_module.stdout
    assert json.loads(by_script.stdout)["stacks"]
    imported = {line.split("|")[-1].strip() for line in by_script.stderr.splitlines()
                if line.startswith("import time:")}
    assert "envbuild.__main__" in imported
    assert "re" not in imported
