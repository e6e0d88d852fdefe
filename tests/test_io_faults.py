"""A full disk or an unwritable place while writing an output: one line, a documented exit
code, nothing half-written (docs/faults.md A19)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from envbuild.commands.cli import main

ENV = {"ENVBUILD_NO_CACHE": "1"}


def _fail(code: int, text: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, text)
    return fail


@pytest.mark.parametrize("command", [
    ["render", "docker", "--driver", "550", "-o", "{out}"],
    ["lock", "--stack-only", "--driver", "550", "-o", "{out}"],
])
def test_a_full_disk_while_writing_is_one_line_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: list[str]) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(Path, "write_bytes", _fail(errno.ENOSPC, "No space left on device"))
    monkeypatch.setattr(os, "fsync", _fail(errno.ENOSPC, "No space left on device"))
    code = main([arg.format(out=out) for arg in command], env=ENV)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1, err
    assert err[0].startswith("envbuild: error[output]: cannot write")
    assert "No space left on device" in err[0] and "internal" not in err[0]
    assert list(tmp_path.iterdir()) == []  # no output, no temporary left beside it


def test_an_unrelated_os_error_is_still_internal(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from envbuild.commands import cli

    monkeypatch.setattr(cli, "load_matrix", _fail(errno.ECONNRESET, "Connection reset"))
    assert main(["matrix", "show", "gpus"], env=ENV) == 1
    assert "error[internal]: ConnectionResetError" in capsys.readouterr().err
