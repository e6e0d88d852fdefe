"""Atomic writes: every file and directory envbuild writes is complete or untouched.

A file is written to a temporary name beside its target, flushed to disk, given its
final mode and renamed over the target; a directory is assembled beside its target and
swapped in whole. Regular files are 0644 and directories 0755 unless a caller asks for
another mode: what envbuild writes (locks, Dockerfiles, data) holds no secret, and a
build or a CI job run as another user must be able to read it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

FILE_MODE = 0o644
DIR_MODE = 0o755

# A file's contents: bytes, or a path whose bytes are copied (large wheels are not read
# into memory).
FileData = bytes | Path


class UnwritableDirectory(OSError):
    """The directory that would hold a new file or tree refuses to (read-only, no space,
    no permission): nothing was written, which callers report as bad output paths."""


def write_file(path: Path, data: bytes, *, mode: int = FILE_MODE, sync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it: complete or untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # mkstemp's 0600 is not what a reader of the output expects
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_tree(files: Mapping[str, FileData], target: Path) -> None:
    """Make ``target`` a directory holding exactly ``files`` (relative names), atomically:
    the new tree is assembled beside it and swapped in; an existing ``target`` is replaced
    as a whole (moved aside, the new one renamed in, the old one removed). Callers decide
    whether replacing is allowed."""
    target = Path(target)
    try:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    except OSError as exc:
        raise UnwritableDirectory(exc.errno, exc.strerror, str(target.parent)) from None
    try:
        for name, data in files.items():
            dest = tmp / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, Path):
                shutil.copyfile(data, dest)
            else:
                dest.write_bytes(data)
            os.chmod(dest, FILE_MODE)
        os.chmod(tmp, DIR_MODE)  # mkdtemp's 0700 would surprise whoever builds from it
        _swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, target: Path) -> None:
    if not target.exists():
        os.replace(tmp, target)
        return
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
    os.rmdir(old)
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
