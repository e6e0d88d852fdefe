"""The lock and its pylock files are replaced as one (docs/faults.md R1, R13): a full disk, Ctrl-C
or SIGTERM between two renames puts the previous set back, and the message says what happened."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lock_command import env, indexes, project, run  # noqa: F401 (fixtures)

from envbuild.errors import Terminated
from envbuild.fs import replace_files

NAMES = ("pylock.a.toml", "pylock.b.toml", "envbuild.lock")


@pytest.fixture()
def terminating() -> Iterator[None]:
    """SIGTERM raises Terminated and SIGINT KeyboardInterrupt, as under ``envbuild``'s main."""
    def terminate(signum: int, frame: Any) -> None:
        raise Terminated(signum, signal.Signals(signum).name)

    previous = (signal.signal(signal.SIGTERM, terminate),
                signal.signal(signal.SIGINT, signal.default_int_handler))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def failing_replace(monkeypatch: pytest.MonkeyPatch, at: int, fault: str) -> list[str]:
    """``os.replace`` that meets ``fault`` on its ``at``-th call (counting from 1): an OSError
    (a full disk), or a signal delivered just before or just after the rename is made."""
    real = os.replace
    calls: list[str] = []

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        calls.append(str(dst))
        if len(calls) != at:
            return real(src, dst, **kwargs)
        if fault == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        signum = signal.SIGINT if fault.startswith("sigint") else signal.SIGTERM
        if fault.endswith("after"):
            real(src, dst, **kwargs)
        # to the main thread, as a Ctrl-C reaches the envbuild command's only thread: os.kill of
        # the process may be taken by another thread that holds no mask (pytest-xdist's I/O
        # thread), and then it is not held until the renames are done
        signal.pthread_kill(threading.main_thread().ident or 0, signum)
        return None

    monkeypatch.setattr(os, "replace", replace)
    return calls


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_replace_files_writes_every_file(tmp_path: Path) -> None:
    (tmp_path / "pylock.a.toml").write_bytes(b"old a")
    (tmp_path / "envbuild.lock").write_bytes(b"old lock")
    replace_files({tmp_path / n: f"new {n}".encode() for n in NAMES})
    assert snapshot(tmp_path) == {n: f"new {n}".encode() for n in NAMES}
    assert all(os.stat(tmp_path / n).st_mode & 0o777 == 0o644 for n in NAMES)


@pytest.mark.parametrize("at", [1, 2, 3])
@pytest.mark.parametrize(("fault", "raised"), [
    ("enospc", OSError), ("sigterm-before", Terminated), ("sigterm-after", Terminated),
    ("sigint-before", KeyboardInterrupt),
])
def test_a_failure_between_renames_puts_the_old_set_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminating: None, at: int, fault: str,
        raised: type[BaseException]) -> None:
    # pylock.b.toml is new: after a failure it must be gone again, not left beside the old lock.
    (tmp_path / "pylock.a.toml").write_bytes(b"old a")
    (tmp_path / "envbuild.lock").write_bytes(b"old lock")
    before = snapshot(tmp_path)
    calls = failing_replace(monkeypatch, at, fault)
    with pytest.raises(raised) as caught:
        replace_files({tmp_path / n: f"new {n}".encode() for n in NAMES})
    assert len(calls) >= at
    assert snapshot(tmp_path) == before  # no temporary, no kept copy, no new file left
    if fault == "enospc":  # the one-line error names the file it could not put in place
        assert isinstance(caught.value, OSError) and caught.value.filename == str(tmp_path / NAMES[at - 1])


def test_a_full_disk_while_staging_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    (tmp_path / "envbuild.lock").write_bytes(b"old lock")
    with pytest.raises(OSError) as caught:
        replace_files({tmp_path / "pylock.toml": b"new", tmp_path / "envbuild.lock": b"new"})
    assert caught.value.filename == str(tmp_path / "pylock.toml")
    assert snapshot(tmp_path) == {"envbuild.lock": b"old lock"}


# --- through `envbuild lock`: two targets, so three files ------------------------------------


def _locked_twice(tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811
                  capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    targets = '\n[[targets]]\nname = "a100"\ndriver = "550"\n\n[[targets]]\nname = "cpu"\n'
    monkeypatch.chdir(project(tmp_path, indexes, targets=targets))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    before = snapshot(tmp_path)
    project(tmp_path, indexes, deps='["six", "idna"]', targets=targets)  # the next lock differs
    return before


@pytest.mark.parametrize(("fault", "code", "said"), [
    ("sigterm-before", 143, "envbuild: terminated by SIGTERM"),
    ("sigint-after", 130, "envbuild: interrupted"),
    ("enospc", 1, "envbuild: error[output]: cannot write {path}: No space left on device"),
])
def test_lock_interrupted_between_renames_keeps_the_previous_pair(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, fault: str, code: int, said: str) -> None:
    # Nothing remembered between the locks: the index pages' sha256 records are written with
    # os.replace too, and would be the renames counted here.
    env = {**env, "ENVBUILD_NO_CACHE": "1"}
    before = _locked_twice(tmp_path, indexes, env, capsys, monkeypatch)
    calls = failing_replace(monkeypatch, 2, fault)
    got, _, err = run(capsys, env, "lock")
    after = {**snapshot(tmp_path), "envbuild.toml": before["envbuild.toml"]}
    assert (got, after) == (code, before), err
    assert err.strip().splitlines()[-1].startswith(said.format(path=calls[1])), err
    assert len(calls) >= 2 and Path(calls[1]).name == "pylock.cpu.toml"
    data = json.loads(before["envbuild.lock"])
    assert set(data["targets"]) == {"a100", "cpu"}

