"""The build context as a tar that is the same bytes every time, so the daemon's cache holds."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from envbuild.fs import FileData


def context_tar(files: Mapping[str, FileData], out: IO[bytes]) -> None:
    """Write ``files`` as a tar the same bytes every time: sorted, directories listed,
    owner 0:0 without names, mtime 0, modes 0644/0755. Paths are streamed, not read in."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(n).parent) for n in files if "/" in n})
        for name in dirs:
            info = _info(name, tarfile.DIRTYPE, 0o755, 0)
            tar.addfile(info)
        for name in sorted(files):
            data = files[name]
            if isinstance(data, Path):
                with _open_regular(data) as handle:
                    info = _info(name, tarfile.REGTYPE, 0o644, os.fstat(handle.fileno()).st_size)
                    tar.addfile(info, handle)
            else:
                tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    out.flush()
    out.seek(0)


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened only if it is itself a regular file: a symbolic link (swapped in after
    render checked the wheelhouse) could pull any file into the context, a FIFO hang it."""
    from envbuild.confine import WHEEL_LIMIT, open_regular

    return os.fdopen(open_regular(path, str(path), limit=WHEEL_LIMIT), "rb")


def _info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
