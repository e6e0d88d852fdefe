"""SIGTERM and SIGHUP clean up as Ctrl-C does (docs/faults.md F13): the temporary tree a
writer was filling is removed, the output is untouched, the exit code is the shell's
128 + signal (143, 129; 130 for SIGINT) and stderr says which signal ended the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Render into tmp/out with a write that blocks once the temporary tree exists, until signalled.
SLOW_RENDER = """
import sys, time
from pathlib import Path
ready = Path(sys.argv[1])
original = Path.write_bytes
def slow(self, data):
    written = original(self, data)
    ready.write_text(str(self))
    time.sleep(60)
    return written
Path.write_bytes = slow
from envbuild.commands.cli import main
sys.exit(main(["render", "docker", "--driver", "550", "-o", sys.argv[2]], {"ENVBUILD_NO_CACHE": "1"}))
"""


@pytest.mark.parametrize(("signum", "code", "said"), [
    (signal.SIGTERM, 143, "envbuild: terminated by SIGTERM"),
    (signal.SIGHUP, 129, "envbuild: terminated by SIGHUP"),
    (signal.SIGINT, 130, "envbuild: interrupted"),
])
def test_a_signal_during_a_write_removes_the_temporary_tree(
        tmp_path: Path, signum: int, code: int, said: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    ready, out = tmp_path / "ready", work / "out"
    # The signal's default disposition in the child: a suite started under nohup hands its
    # children SIGHUP ignored, which envbuild (rightly) keeps, and the SIGHUP case would hang.
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RENDER, str(ready), str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert list(work.iterdir()), "the temporary tree should exist while the write runs"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == said
    assert list(work.iterdir()) == []  # no output, no temporary tree left behind


def test_handlers_are_restored_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    from envbuild.commands.cli import main

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    assert main(["matrix", "show", "gpus", "--json"], {"ENVBUILD_NO_CACHE": "1"}) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before
