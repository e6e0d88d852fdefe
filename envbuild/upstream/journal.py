"""Writing the data directory: one refresh at a time, and all files or none.

The changed files (and ``manifest.json``) are staged in a sibling directory, committed by
one journal rename, then moved into place. A crash before the journal leaves the old
data; after it, ``recover`` (the next refresh's first step) rolls forward.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from envbuild.data import matrix
from envbuild.fs import write_file

JOURNAL = matrix.JOURNAL
STAGING_PREFIX = ".refresh-staging-"
Log = Callable[[str], None]


@contextlib.contextmanager
def refresh_lock(target: Path, timeout_s: float, progress: Log) -> Iterator[None]:
    """One writer per data directory at a time: ``data.matrix.lock``, the lock that
    ``matrix validate --write-manifest`` also takes."""
    target.mkdir(parents=True, exist_ok=True)  # --out may not exist yet
    with matrix.lock(target, timeout_s, progress):
        yield


# --- atomic, all-or-nothing write -----------------------------------------------------------


def commit(target: Path, files: Mapping[str, bytes],
           checkpoint: Callable[[str], None] | None = None) -> None:
    """Replace ``files`` (name → bytes) and the manifest in ``target`` all together."""
    mark = checkpoint or (lambda stage: None)
    with matrix.lock(target, reentrant=True):  # refresh holds it already
        _commit(target, files, mark)


def _commit(target: Path, files: Mapping[str, bytes], mark: Callable[[str], None]) -> None:
    import shutil
    import tempfile

    recover(target)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target))
    for path in sorted(target.glob("*.yaml")):
        shutil.copy2(path, staging / path.name)
    for name, data in files.items():
        mode = (target / name).stat().st_mode & 0o777 if (target / name).exists() else 0o644
        write_file(staging / name, data, mode=mode, sync=True)
    write_file(staging / matrix.MANIFEST, matrix.manifest_body(staging), sync=True)
    mark("staged")
    moves = [[str(staging / name), str(target / name)] for name in [*sorted(files), matrix.MANIFEST]]
    journal = json.dumps({"staging": str(staging), "moves": moves}).encode()
    write_file(target / JOURNAL, journal, sync=True)  # its rename is the commit point
    _sync_directory(target)
    mark("committed")
    roll_forward(target, mark)


def roll_forward(target: Path, mark: Callable[[str], None] = lambda stage: None) -> None:
    import shutil

    journal = json.loads((target / JOURNAL).read_text(encoding="utf-8"))
    for source, destination in journal["moves"]:
        if os.path.exists(source):
            os.replace(source, destination)
            mark("moved")
    _sync_directory(target)
    shutil.rmtree(journal["staging"], ignore_errors=True)
    (target / JOURNAL).unlink()


def recover(target: Path) -> None:
    """Finish a committed refresh a crash interrupted; drop an uncommitted one's leftovers."""
    import shutil

    if (target / JOURNAL).is_file():
        roll_forward(target)
    for leftover in target.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in target.glob(f".{JOURNAL}.*.tmp"):  # write_file's temporary journal
        leftover.unlink(missing_ok=True)


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
