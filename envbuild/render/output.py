"""Put rendered files on disk: a complete new output directory or an untouched old one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from envbuild.errors import UsageError
from envbuild.fs import FileData, UnwritableDirectory, check_tree_target, write_tree


def write_output(files: Mapping[str, FileData], out_dir: Path, *, force: bool) -> None:
    """Write ``files`` into ``out_dir`` atomically: a complete new directory or nothing.

    Refuses a non-empty ``out_dir`` unless ``force``; then the old directory is replaced
    as a whole (moved aside, the new one renamed in, the old one removed) if envbuild
    wrote it. A link, device, FIFO or socket at ``out_dir``, the current directory and
    its ancestors are refused, with or without ``force`` (``envbuild.fs``)."""
    out_dir = Path(out_dir)
    check_tree_target(out_dir)
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise UsageError(f"output directory {out_dir} is not empty", hint="pass --force to replace it")
    target = Path(os.path.abspath(out_dir))  # a link at the end is refused above, never followed
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror}") from None
    try:
        write_tree(files, target)
    except UnwritableDirectory as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror}") from None
