"""Failures reported for what they are (docs/faults.md R10–R14): a header phase cut by the deadline
is a timeout, not "not JSON"; a key twice in a lock is refused; init's unwritable directory is
exit 2 like lock's and render's; a full disk names the file; a closed stderr leaves the exit code
alone."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from test_pypi import raw_server, trickle

from envbuild.commands.cli import main
from envbuild.errors import DataError
from envbuild.upstream import http_client, simple_api

ROOT = Path(__file__).resolve().parent.parent
ENV = {"ENVBUILD_NO_CACHE": "1"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv), env=ENV)
    return code, capsys.readouterr().err


def test_a_header_phase_cut_by_the_deadline_is_a_timeout() -> None:
    """R10: the headers arrive, then trickle; the watchdog's cut must not read as a 200 with an
    empty body (which the JSON API then called "not JSON")."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.pypi.simple.v1+json\r\n"

    def serve(connection: Any, stop: threading.Event) -> None:
        connection.sendall(head)
        trickle(b"X-Pad: " + b"a" * 100 + b"\r\n\r\n{}")(connection, stop)

    policy = http_client.HttpPolicy(connect_timeout_s=1.0, read_timeout_s=5.0, total_timeout_s=1.5,
                                    attempts=2, backoff_s=0.01)
    with raw_server(serve) as url:
        client = simple_api.IndexClient(url, env={}, policy=policy, sleep=lambda _: None)
        with pytest.raises(DataError) as caught:
            client.list_wheels("demo")
    assert "did not answer in full within 1.5 s" in caught.value.message
    assert "not JSON" not in caught.value.message


@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_key_twice_in_the_lock_is_refused(where: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """R11: JSON lets the last of two equal keys win; a reviewer reads the first."""
    lock = tmp_path / "envbuild.lock"
    assert run(capsys, "lock", "--stack-only", "--driver", "550", "-o", str(lock))[0] == 0
    text = lock.read_text()
    json.loads(text)
    if where == "top":
        text = text.replace('"user": "envbuild"', '"user": "envbuild", "user": "mallory"', 1)
    else:  # inside the stack (or packages) object
        text = text.replace('"torch": "', '"torch": "1.0", "torch": "', 1)
    assert text != lock.read_text()
    lock.write_text(text)
    code, err = run(capsys, "render", "docker", "--lock", str(lock), "-o", str(tmp_path / "out"))
    assert code == 2 and "appears twice in one object" in err, err
    assert not (tmp_path / "out").exists()


def test_init_in_an_unwritable_directory_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """R12: as lock and render report it (root ignores modes, so the read-only file system is
    simulated)."""
    def read_only(*args: object, **kwargs: object) -> str:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    code, err = run(capsys, "init", "--driver", "550", "-o", str(tmp_path / "envbuild.toml"))
    assert code == 2, err
    assert err.startswith(f"envbuild: error[usage]: cannot write to {tmp_path}: Read-only file system")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("command", "named"), [
    (["render", "docker", "--driver", "550", "-o", "{out}"], "{out}/.dockerignore"),  # the tree's first
    (["lock", "--stack-only", "--driver", "550", "-o", "{out}"], "{out}"),
    (["init", "--driver", "550", "-o", "{out}"], "{out}"),
])
def test_a_full_disk_names_the_file(command: list[str], named: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """R13: the one line says which file could not be written."""
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "out"
    code, err = run(capsys, *[arg.format(out=out) for arg in command])
    assert code == 1, err
    assert err.strip() == (f"envbuild: error[output]: cannot write {named.format(out=out)}: No space left "
                           "on device — free space or choose a writable directory; nothing was half-written")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("reader", ["closed", "head -8"])
def test_a_closed_stderr_keeps_the_exit_code(reader: str, tmp_path: Path) -> None:
    """R14: `envbuild resolve --torch 9.9 2>&1 | head -8` exited 3 or 1, as the race between the
    12-line report and head's exit went; now always 3, the command's own code."""
    argv = [sys.executable, "-m", "envbuild", "resolve", "--torch", "9.9"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)}
    codes = set()
    for _ in range(3):
        if reader == "closed":
            read, write = os.pipe()
            os.close(read)
            try:
                done = subprocess.run(argv, stdout=write, stderr=write, env=env, check=False)
            finally:
                os.close(write)
            codes.add(done.returncode)
        else:
            shell = subprocess.run(["bash", "-c", '"$@" 2>&1 | head -8 >/dev/null; echo "${PIPESTATUS[0]}"',
                                    "bash", *argv], env=env, capture_output=True, text=True, check=True)
            codes.add(int(shell.stdout.strip()))
    assert codes == {3}
