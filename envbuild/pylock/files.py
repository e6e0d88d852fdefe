"""Read and validate a PEP 751 lock file (``pylock.toml``).

The file must satisfy PEP 751's reference reader (``packaging.pylock``) and, beyond it, only
what envbuild installs is accepted: lock-version 1.0, packages with a name and a
version, and files (wheels, an sdist) each with a ``url`` or a ``path`` and a sha256; an
``archive`` when it is a wheel at an https URL (a direct-URL wheel of the project:
envbuild/pylock/direct.py), read as the package's one wheel, or a source archive at a plain
http(s) URL, read as its sdist; a ``vcs`` table when it is git at one commit
(envbuild/pylock/sources.py). Both of the latter are built in the image. A ``directory`` and
other VCS are refused. Every problem is a
:class:`~envbuild.errors.UsageError` naming the field, as ``packages[3].wheels[0].hashes``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from envbuild.confine import quoted, token
from envbuild.errors import UsageError
from envbuild.project.toml import check_key_parts, tomllib  # the one place that picks tomllib
from envbuild.pylock.direct import ARCHIVE_SUFFIXES
from envbuild.pylock.sources import VcsSource, pylock_vcs

LOCK_VERSION = "1.0"
SHA256 = re.compile(r"[0-9a-f]{64}")
UNSUPPORTED_SOURCES = ("directory",)


@dataclass(frozen=True, slots=True)
class PylockFile:
    """One distribution file: a wheel or an sdist."""

    filename: str
    url: str | None
    path: str | None
    sha256: str
    # PEP 751's packages.wheels.upload-time / sdist.upload-time: when the index says the file was
    # uploaded (uv records it where the index gives one: PEP 700's JSON ``upload-time``, the HTML
    # page's ``data-upload-time``). None: the index gave none. Aware, in UTC.
    upload_time: datetime | None = None

    @property
    def is_local(self) -> bool:
        """True for a ``path`` or a ``file://`` URL: the build cannot fetch it by itself."""
        return self.url is None or urlsplit(self.url).scheme == "file"


@dataclass(frozen=True, slots=True)
class PylockPackage:
    name: str  # canonical
    version: str
    wheels: tuple[PylockFile, ...]
    sdist: PylockFile | None
    direct: bool = False  # its one wheel is a direct https URL (``archive``), on no index
    vcs: VcsSource | None = None  # a git repository at one commit, built in the image
    by_url: bool = False  # its sdist is a source archive by URL (``archive``), on no index

    @property
    def built(self) -> bool:
        """True for a git source or a source archive by URL: built in the image, on no index."""
        return self.vcs is not None or self.by_url


@dataclass(frozen=True, slots=True)
class Pylock:
    lock_version: str
    requires_python: str | None
    packages: tuple[PylockPackage, ...]

    def versions(self) -> dict[str, str]:
        """{canonical name: version} for every package, sorted by name."""
        return {p.name: p.version for p in sorted(self.packages, key=lambda p: p.name)}

    def uploads(self) -> dict[str, list[tuple[str, datetime]]]:
        """{"name version": [(file name, upload time)]} for every file with an upload time."""
        found: dict[str, list[tuple[str, datetime]]] = {}
        for p in self.packages:
            for f in (*p.wheels, *(() if p.sdist is None else (p.sdist,))):
                if f.upload_time is not None:
                    found.setdefault(f"{p.name} {p.version}", []).append((f.filename, f.upload_time))
        return found

    def package(self, name: str) -> PylockPackage:
        wanted = canonicalize_name(name)
        for package in self.packages:
            if package.name == wanted:
                return package
        raise UsageError(f"the pylock has no package {name!r}",
                         hint="lock again: the pylock and the requirements disagree")


def read_pylock(text: str, *, reference: bool = True) -> Pylock:
    """The validated content of a ``pylock.toml``; UsageError naming the first bad field.
    ``reference=False`` leaves out PEP 751's reference reader (half the time): for a file
    that is read and dropped, never written or installed (the survey's, envbuild/pylock/uv.py)."""
    check_key_parts(text, "pylock")  # 20,000 dotted parts: refused before the parser's ~16 s
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"pylock: not valid TOML: {token(str(exc), 200)}") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise UsageError(f"pylock: a value too large to read ({token(str(exc), 80)})") from None
    except RecursionError:  # arrays or tables nested ~1000 deep
        raise UsageError("pylock: arrays or tables nested too deep to read") from None
    version = data.get("lock-version")
    if version != LOCK_VERSION:
        shown = quoted(version) if isinstance(version, str) else f"a {type(version).__name__}"
        raise UsageError(f"pylock: lock-version: {shown} is not {LOCK_VERSION!r}",
                         hint="envbuild reads PEP 751 lock files of version 1.0")
    requires_python = data.get("requires-python")
    if requires_python is not None and not isinstance(requires_python, str):
        raise UsageError("pylock: requires-python: not a string")
    raw = data.get("packages")
    if not isinstance(raw, list):
        raise UsageError("pylock: packages: missing or not an array of tables")
    packages = tuple(_package(entry, f"packages[{i}]") for i, entry in enumerate(raw))
    if reference:
        _check_with_reference(data)
    seen: set[str] = set()
    for package in packages:
        if package.name in seen:
            raise UsageError(f"pylock: packages: {token(package.name)} appears twice",
                             hint="envbuild locks one version of each package")
        seen.add(package.name)
    return Pylock(lock_version=version, requires_python=requires_python, packages=packages)


def _check_with_reference(data: dict[str, Any]) -> None:
    """PEP 751's reference reader (``packaging.pylock``, packaging 26.1 and later) accepts
    ``data`` too: what the checks above leave alone (created-by, wheel file names that match
    their package's name and version, versions, markers, the types of every other key).
    Imported here, never on resolve's start-up path."""
    from packaging.pylock import Pylock as Reference
    from packaging.pylock import PylockValidationError

    try:
        Reference.from_dict(data)
    except PylockValidationError as exc:
        where = f"{exc.context}: " if exc.context else ""
        raise UsageError(f"pylock: {token(where + exc.message, 200)}",
                         hint="lock again: PEP 751's reference reader refuses this file") from None


def _package(entry: Any, where: str) -> PylockPackage:
    if not isinstance(entry, dict):
        raise UsageError(f"pylock: {where}: not a table")
    name = _string(entry, "name", where)
    version = _string(entry, "version", where)
    for key in UNSUPPORTED_SOURCES:
        if key in entry:
            raise UsageError(f"pylock: {where}.{key}: {token(name)} is a {key} source",
                             hint="envbuild installs wheels only")
    if "archive" in entry:
        return _archive(entry, name, version, where)
    if "vcs" in entry:
        if "wheels" in entry or "sdist" in entry:
            raise UsageError(f"pylock: {where}: {token(name)} has a vcs source and files")
        return PylockPackage(name=canonicalize_name(name), version=version, wheels=(), sdist=None,
                             vcs=pylock_vcs(entry["vcs"], name, where))
    wheels_raw = entry.get("wheels", [])
    if not isinstance(wheels_raw, list):
        raise UsageError(f"pylock: {where}.wheels: not an array of tables")
    wheels = tuple(_file(w, f"{where}.wheels[{i}]") for i, w in enumerate(wheels_raw))
    sdist = _file(entry["sdist"], f"{where}.sdist") if "sdist" in entry else None
    if not wheels and sdist is None:
        raise UsageError(f"pylock: {where}: {token(name)} has no wheels and no sdist")
    return PylockPackage(name=canonicalize_name(name), version=version, wheels=wheels, sdist=sdist)


def _archive(entry: dict[str, Any], name: str, version: str, where: str) -> PylockPackage:
    """A direct-URL wheel: an https ``archive`` named like a wheel of ``name``, nothing else."""
    if "wheels" in entry or "sdist" in entry:
        raise UsageError(f"pylock: {where}: {token(name)} has an archive and other files")
    wheel = _file(entry["archive"], f"{where}.archive")
    if wheel.url is not None and wheel.filename.endswith(ARCHIVE_SUFFIXES) \
            and urlsplit(wheel.url).scheme in ("http", "https"):  # a source archive by URL
        return PylockPackage(name=canonicalize_name(name), version=version, wheels=(), sdist=wheel,
                             by_url=True)
    if wheel.url is None or urlsplit(wheel.url).scheme != "https" or not wheel.filename.endswith(".whl"):
        raise UsageError(f"pylock: {where}.archive: {token(name)} is not a wheel at an https URL",
                         hint="envbuild installs wheels only; a direct URL must be an https wheel")
    try:
        wheel_name, _, _, _ = parse_wheel_filename(wheel.filename)
    except InvalidWheelFilename:
        raise UsageError(f"pylock: {where}.archive: {quoted(wheel.filename)} is not a wheel name") from None
    if wheel_name != canonicalize_name(name):
        raise UsageError(f"pylock: {where}.archive: {quoted(wheel.filename)} is not a wheel of {token(name)}")
    return PylockPackage(name=canonicalize_name(name), version=version, wheels=(wheel,), sdist=None,
                         direct=True)


def _string(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise UsageError(f"pylock: {where}.{key}: missing or not a string")
    return value


def _file(entry: Any, where: str) -> PylockFile:
    if not isinstance(entry, dict):
        raise UsageError(f"pylock: {where}: not a table")
    url = entry.get("url")
    path = entry.get("path")
    if url is not None and not isinstance(url, str):
        raise UsageError(f"pylock: {where}.url: not a string")
    if path is not None and not isinstance(path, str):
        raise UsageError(f"pylock: {where}.path: not a string")
    if not url and not path:
        raise UsageError(f"pylock: {where}: neither url nor path")
    hashes = entry.get("hashes")
    if not isinstance(hashes, dict):
        raise UsageError(f"pylock: {where}.hashes: missing or not a table",
                         hint="every file needs a sha256: lock again from an index that gives hashes")
    sha256 = hashes.get("sha256")
    if not isinstance(sha256, str) or not SHA256.fullmatch(sha256.lower()):
        raise UsageError(f"pylock: {where}.hashes.sha256: missing or not 64 hex digits",
                         hint="every file needs a sha256: lock again from an index that gives hashes")
    name = entry.get("name")
    if name is not None and not isinstance(name, str):
        raise UsageError(f"pylock: {where}.name: not a string")
    filename = name or _last_component(url or path or "")
    if not filename:
        raise UsageError(f"pylock: {where}: no file name in its url or path")
    uploaded = entry.get("upload-time")
    if uploaded is not None and (not isinstance(uploaded, datetime) or uploaded.tzinfo is None):
        raise UsageError(f"pylock: {where}.upload-time: not a date-time with an offset",
                         hint="PEP 751 records it as a TOML offset date-time, e.g. 2026-11-01T00:00:00Z")
    return PylockFile(filename=filename, url=url or None, path=path or None, sha256=sha256.lower(),
                      upload_time=None if uploaded is None else uploaded.astimezone(timezone.utc))


def _last_component(location: str) -> str:
    if "://" in location:
        location = unquote(urlsplit(location).path)
    return PurePosixPath(location).name
