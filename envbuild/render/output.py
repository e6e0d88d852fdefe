"""Put rendered files on disk: a complete new output directory or an untouched old one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from envbuild.errors import UsageError
from envbuild.fs import FileData, UnwritableDirectory, write_tree


def write_output(files: Mapping[str, FileData], out_dir: Path, *, force: bool) -> None:
    """Write ``files`` into ``out_dir`` atomically: a complete new directory or nothing.

    Refuses a non-empty ``out_dir`` unless ``force``; then the old directory is replaced
    as a whole (moved aside, the new one renamed in, the old one removed)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise UsageError(f"output directory {out_dir} is not empty", hint="pass --force to replace it")
    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror}") from None
    try:
        write_tree(files, out_dir.resolve())
    except UnwritableDirectory as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror}") from None
