"""A requirements file's own ``--hash=sha256:`` options (pip-compile's output) against the lock.

uv resolves the closure afresh and records the sha256 of every file it may install; a project
whose requirements already carry hashes said which files it trusts. So after locking, the file
the build will install for each hashed requirement (the best wheel for the target, or the sdist
``build-sdists`` builds) must be one of the hashes its line gives: another is a file the author
never hashed, and the lock is refused naming the line and the package.
"""

from __future__ import annotations

from collections.abc import Iterable

from envbuild.confine import token
from envbuild.errors import DataError
from envbuild.pylock.files import Pylock
from envbuild.pylock.install import best_wheel, supported_tags

Hashed = tuple[str, str, frozenset[str]]  # (canonical name, FILE:LINE, sha256s allowed)


def check_hashed(pylock: Pylock, hashed: Iterable[Hashed], *, python: str, glibc: str, arch: str,
                 sdists: Iterable[str] = ()) -> None:
    """DataError (4) for the first hashed requirement whose locked file is not among its
    hashes; a requirement the target does not install (a marker left it out) is passed over."""
    tags = supported_tags(python, glibc, arch)
    versions = pylock.versions()
    from_sdist = set(sdists)
    for name, where, allowed in hashed:
        if name not in versions:
            continue
        package = pylock.package(name)
        chosen = package.sdist if name in from_sdist else best_wheel(package, tags)
        if chosen is None:
            continue  # no file to install: install_requirements says so for the build
        if chosen.sha256 not in allowed:
            raise DataError(
                f"{where}: {token(name)} {token(package.version)}: the locked file "
                f"{token(chosen.filename)} has sha256 {chosen.sha256}, which is none of the "
                f"{len(allowed)} hash{'es' if len(allowed) != 1 else ''} the line gives",
                hint="the index serves another file than the one hashed: regenerate the hashes "
                     "(pip-compile --generate-hashes) against this index, or check the index")
