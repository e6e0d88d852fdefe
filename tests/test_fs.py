"""envbuild.fs: the one atomic writer for files and directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from envbuild.fs import MARKER, MARKER_TEXT, write_file, write_tree


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_file_is_0644_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "envbuild.lock"
    write_file(target, b"one")
    write_file(target, b"two")
    assert target.read_bytes() == b"two"
    assert mode(target) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.lock"]


def test_write_file_failure_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "data.yaml"
    target.write_bytes(b"old")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        write_file(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.yaml"]


def test_write_tree_replaces_whole_and_sets_modes(tmp_path: Path) -> None:
    source = tmp_path / "big.whl"
    source.write_bytes(b"wheel")
    out = tmp_path / "out"
    write_tree({"old": b"1"}, out)  # envbuild wrote it, so it may be replaced
    (out / "stale").write_text("from an earlier render")
    write_tree({"Dockerfile": b"FROM x\n", "wheels/big.whl": source}, out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        MARKER, "Dockerfile", "wheels", "wheels/big.whl"]
    assert (out / "wheels" / "big.whl").read_bytes() == b"wheel"
    assert (out / MARKER).read_bytes() == MARKER_TEXT
    assert (mode(out), mode(out / "Dockerfile"), mode(out / MARKER)) == (0o755, 0o644, 0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.whl", "out"]


def test_write_tree_failure_leaves_target_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("kept")
    (out / MARKER).write_bytes(MARKER_TEXT)
    with pytest.raises(OSError):
        write_tree({"a": b"1", "a/b": b"2"}, out)  # "a" is a file, so "a/b" cannot be written
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "keep"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
