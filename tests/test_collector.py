"""The cyclic garbage collector through `envbuild`'s start-up (envbuild/__main__.py): off while the
CLI's modules are imported (they free nothing), on for every command's work, and for `lock` on
once uv's closure run has started (its start-up is the time `lock` adds to uv's: issue 40)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs `envbuild ARGS` as the command does (envbuild.__main__.run), with the closure's uv run and
# `matrix validate` replaced by stand-ins that print whether the collector is on.
SCRIPT = """
import gc, sys
import envbuild.commands.cli as cli
import envbuild.pylock.uv as uv
from envbuild.errors import UsageError

def closure(spec, *, started=None):
    print("closure-before", gc.isenabled(), flush=True)
    started()
    print("closure-after", gc.isenabled(), flush=True)
    raise UsageError("stand-in: no uv run")

def validate(*args, **kwargs):
    print("validate", gc.isenabled(), flush=True)
    return 0

uv.compile_closure = closure
cli.cmd_matrix_validate = validate
sys.argv = ["envbuild", *sys.argv[1:]]
from envbuild.__main__ import run
run()
"""


def envbuild(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_collector_is_on_for_a_commands_work(tmp_path: Path) -> None:
    done = envbuild(tmp_path, "matrix", "validate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["validate True"]


def test_lock_turns_the_collector_on_once_uvs_closure_run_has_started(tmp_path: Path) -> None:
    done = envbuild(tmp_path, "lock", "--no-project", "--driver", "550", "--no-registry")
    assert done.returncode == 2 and "stand-in: no uv run" in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["closure-before False", "closure-after True"]
