"""The smoke payload as one file: a deterministic zipapp of this package.

Images and host scripts carry it as ``/opt/envbuild/smoke.py`` (the goldens, the CI
workflow template and users' scripts call that path). CPython runs a zip archive
whatever its name, ``.py`` included: it finds ``__main__.py`` at the archive's root
and puts the archive first on ``sys.path``.
"""

from __future__ import annotations

import io
import os
import zipfile

# The package's name inside the archive. Its modules import each other relatively, so
# the name is free; one no installed distribution uses keeps it from shadowing any.
PACKAGE = "envbuild_smoke"

ENTRY = b'''"""envbuild smoke test (a zipapp): python smoke.py --help"""
import sys

from envbuild_smoke.__main__ import main

sys.exit(main())
'''

# Fixed metadata, so the same sources give the same bytes on every build: rendering
# twice, or on another day, must not change a build context or its image layer.
_TIMESTAMP = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can hold
_MODE = 0o100644  # a regular file, rw-r--r--
_UNIX = 3  # "made by" a Unix system: the mode above is read from external_attr


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_TIMESTAMP)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = _UNIX
    info.external_attr = _MODE << 16
    return info


def sources() -> list[tuple[str, bytes]]:
    """(archive name, bytes) of each module of this package, sorted by name."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as handle:
                found.append(("%s/%s" % (PACKAGE, name), handle.read()))
    return found


def payload() -> bytes:
    """The zipapp's bytes: ``__main__.py`` at the root running the CLI, then the package."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in [("__main__.py", ENTRY), *sources()]:
            archive.writestr(_entry(name), data, compresslevel=9)
    return buffer.getvalue()
