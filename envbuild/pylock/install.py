"""From a pylock to what a build installs: hash-pinned requirement lines and local wheels.

The image installs with ``pip install --no-deps --no-index --require-hashes -r FILE``: one
line per package, ``name @ URL --hash=sha256:HEX``, naming the one wheel that the image's
CPython prefers on its glibc (x86_64 manylinux only: envbuild installs wheels, never builds
an sdist). A wheel that is a local file (``path`` or ``file://``) is rewritten to the build
context's wheelhouse, ``local_dir`` (an absolute path inside the image or a URL).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from envbuild.confine import WHEEL_LIMIT, WHEEL_NAME, confined, open_regular, quoted, token
from envbuild.errors import UsageError

TYPE_CHECKING = False  # for the type checker only: a pylock's module is read where one is read
if TYPE_CHECKING:
    from envbuild.pylock.files import Pylock, PylockFile, PylockPackage

ARCH = "x86_64"  # the default; a linux/arm64 target's closure installs its aarch64 wheels
ARCHES = ("x86_64", "aarch64")
_PYTHON = re.compile(r"3\.(\d+)")
_GLIBC = re.compile(r"2\.(\d+)")
# The legacy manylinux names and the glibc they stand for (PEP 600).
_LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}

_REMOTE_URL = re.compile(r"https?://[A-Za-z0-9._~%!$&'()*+,;=:@/-]+(?:#[A-Za-z0-9._~%=&-]*)?", re.ASCII)


def is_remote_url(url: str) -> bool:
    """``url`` is a plain http(s) URL a requirements line can carry: no space, quote or option."""
    return _REMOTE_URL.fullmatch(url) is not None


def python_minor(python: str) -> int:
    match = _PYTHON.fullmatch(python.strip())
    if match is None:
        raise UsageError(f"python {python!r} is not a CPython 3.X version", hint='write it as "3.11"')
    return int(match[1])


def glibc_minor(glibc: str) -> int:
    match = _GLIBC.fullmatch(glibc.strip())
    if match is None or int(match[1]) < 5:
        raise UsageError(f"glibc {glibc!r} is not a glibc 2.N version of 2.5 or later",
                         hint='write it as "2.35" (Ubuntu 22.04)')
    return int(match[1])


def platform_tag(glibc: str, arch: str = ARCH) -> str:
    """The newest manylinux platform tag a system with ``glibc`` runs: manylinux_2_35_x86_64."""
    return f"manylinux_2_{glibc_minor(glibc)}_{_arch(arch)}"


def _arch(arch: str) -> str:
    if arch not in ARCHES:
        raise UsageError(f"unknown CPU architecture {arch!r}", hint="x86_64 or aarch64")
    return arch


def supported_tags(python: str, glibc: str, arch: str = ARCH) -> list[Tag]:
    """Every tag CPython ``python`` on ``arch`` Linux with ``glibc`` installs, best first:
    the interpreter's own ABI, then the stable ABI, then pure and generic tags. (aarch64 has
    no manylinux1/2010 wheels; manylinux2014_aarch64 is glibc 2.17's.)"""
    minor = python_minor(python)
    arch = _arch(arch)
    platforms: list[str] = []
    for glibc_2 in range(glibc_minor(glibc), 4, -1):
        platforms.append(f"manylinux_2_{glibc_2}_{arch}")
        if glibc_2 in _LEGACY and (arch == "x86_64" or glibc_2 == 17):
            platforms.append(f"{_LEGACY[glibc_2]}_{arch}")
    version = (3, minor)
    return [*cpython_tags(python_version=version, platforms=platforms),
            *compatible_tags(python_version=version, interpreter=f"cp3{minor}", platforms=platforms)]


def best_wheel(package: PylockPackage, tags: list[Tag]) -> PylockFile | None:
    """The wheel of ``package`` whose best tag comes first in ``tags``; None if none fits.
    Ties (several wheels equally good) go to the first file name in sorting order."""
    rank = {tag: i for i, tag in enumerate(tags)}
    best: tuple[int, str, PylockFile] | None = None
    for wheel in package.wheels:
        try:
            _, _, _, wheel_tags = parse_wheel_filename(wheel.filename)
        except InvalidWheelFilename:
            continue
        ranks = [rank[t] for t in wheel_tags if t in rank]
        if not ranks:
            continue
        candidate = (min(ranks), wheel.filename, wheel)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    return None if best is None else best[2]


def unfit_wheels(pylock: Pylock, *, python: str, glibc: str, runs_on: str, arch: str = ARCH) -> list[str]:
    """``name version wheel`` of each package whose wheel, as picked for ``glibc`` (the lock's
    platform), does not run on ``runs_on`` (a base image's older glibc), sorted."""
    picked, fits = supported_tags(python, glibc, arch), set(supported_tags(python, runs_on, arch))
    found = []
    for package in sorted(pylock.packages, key=lambda p: p.name):
        wheel = best_wheel(package, picked)
        if wheel is not None and not fits & set(parse_wheel_filename(wheel.filename)[3]):
            found.append(f"{token(package.name)} {token(package.version)} ({token(wheel.filename)})")
    return found


def install_requirements(pylock: Pylock, names: Iterable[str], *, python: str, glibc: str,
                         local_dir: str | None = None, arch: str = ARCH) -> str:
    """Hash-pinned requirement lines for the packages ``names`` (sorted by canonical name):
    ``name @ URL --hash=sha256:HEX``, one per line.

    UsageError: a name the pylock lacks, a package with no wheel for CPython ``python`` on
    manylinux ``arch`` up to ``glibc``, a local wheel with no ``local_dir`` to find it in."""
    tags = supported_tags(python, glibc, arch)
    lines = []
    for name in sorted({canonicalize_name(n) for n in names}):
        package = pylock.package(name)
        wheel = best_wheel(package, tags)
        if wheel is None:
            offered = token(", ".join(w.filename for w in package.wheels), 200) or "no wheel at all"
            raise UsageError(
                f"{token(package.name)} {token(package.version)} has no wheel for CPython {python} on "
                f"{platform_tag(glibc, arch)} or older ({offered})",
                hint="envbuild installs wheels only: pick another version or another stack")
        lines.append(f"{package.name} @ {_location(wheel, local_dir)} --hash=sha256:{wheel.sha256}")
    return "".join(f"{line}\n" for line in lines)


def _location(wheel: PylockFile, local_dir: str | None) -> str:
    if wheel.url is not None and "@" in urlsplit(wheel.url).netloc:
        # requirements/*.txt is part of the build context and of an image layer.
        raise UsageError(f"pylock: the url of {wheel.filename!r} carries credentials (user:password@): "
                         "they would be written into the build's requirements files",
                         hint="lock against the index without credentials in its URL; the build "
                              "gets them from pip's configuration or netrc")
    if not wheel.is_local:
        assert wheel.url is not None
        # A requirements line is the URL, then options: a space, a quote or a line break in it
        # would add an option (--index-url …) or a requirement of the pylock's choosing.
        if not is_remote_url(wheel.url):
            raise UsageError(f"pylock: the url of {quoted(wheel.filename)} is not a plain http(s) URL",
                             hint="lock again: uv writes only such URLs")
        return wheel.url
    if local_dir is None:
        raise UsageError(f"local file {token(wheel.filename)} cannot be fetched by the build: "
                         "use a wheelhouse",
                         hint="copy the local wheels into the build context (local_dir)")
    name = quote(wheel.filename, safe="+!")
    if "://" in local_dir:
        return f"{local_dir.rstrip('/')}/{name}"
    if not local_dir.startswith("/"):
        raise UsageError(f"local_dir {local_dir!r} is neither an absolute path nor a URL")
    return f"file://{quote(local_dir.rstrip('/'), safe='/+!')}/{name}"


def local_wheels(pylock: Pylock, roots: Sequence[Path]) -> list[Path]:
    """Every wheel of the pylock that is a local file (a ``file://`` URL or a ``path``,
    relative paths taken from ``roots[0]``, the pylock's directory), sorted, each once, its
    links resolved. Each, whatever platform it is for, must be named like a wheel (its
    ``name`` too) and be a regular file inside one of ``roots`` (the project's directory,
    a declared wheelhouse): a pylock from a pull request must not pull /etc/shadow or
    /dev/zero into the build context. Anything else is a UsageError naming the field."""
    found: set[Path] = set()
    for i, package in enumerate(pylock.packages):
        for j, wheel in enumerate(package.wheels):
            if wheel.is_local:
                found.add(_local_wheel(wheel, roots, f"pylock: packages[{i}].wheels[{j}]"))
    return sorted(found)


def _local_wheel(wheel: PylockFile, roots: Sequence[Path], where: str) -> Path:
    if wheel.url is not None:
        where, location = f"{where}.url", unquote(urlsplit(wheel.url).path)
    else:
        where, location = f"{where}.path", wheel.path or ""
    path = Path(location)
    if not path.is_absolute() and roots:
        path = roots[0] / path
    if not (WHEEL_NAME.fullmatch(path.name) and path.name == wheel.filename):
        raise UsageError(f"{where}: the local file {token(path.name)} is not named like a wheel "
                         f"(or not as the entry names it)", hint="lock again: uv writes only wheels")
    real = confined(path, roots, f"{where}: the local wheel {token(path.name)}",
                    outside_hint="local wheels must lie inside the project's directory "
                                 "or a wheelhouse named with --wheelhouse DIR")
    if real.name != wheel.filename:
        raise UsageError(f"{where}: the local wheel {token(path.name)} is a link to another name",
                         hint="copy the wheel itself there")
    os.close(open_regular(real, f"{where}: the local wheel {token(path.name)}", limit=WHEEL_LIMIT))
    return real
