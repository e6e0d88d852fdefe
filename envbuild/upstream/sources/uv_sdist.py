"""uv's download list read from a uv release on the Python package index.

The code host that serves uv's repository is not reachable from every network the package
index is. uv's source distribution holds the same list
(``uv-X.Y.Z/crates/uv-python-managed/download-metadata.json``), so the python source can read
it from there: the index's JSON page for ``uv`` names the sdist and its sha256, the sdist is
fetched whole and checked against that sha256, and the one member is read from the gzip'd tar
as a stream.

Why whole and not by range requests: a gzip stream has no index, so reading a member by range
means inflating everything before it anyway (in uv 0.13.9 the list starts 31.9 MB into the
unpacked tar, about 70% of the 7.6 MB sdist), and only the whole file can be checked against
the index's sha256. Bounds: the sdist at most ``MAX_SDIST_BYTES`` (the index's ``size`` is
checked before the download, the HTTP client's cap during it), at most ``MAX_UNPACKED_BYTES``
inflated while looking for the member, and the member at most ``MAX_MEMBER_BYTES``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from envbuild.errors import DataError

PROJECT = "uv"
MEMBER = re.compile(r"uv-[0-9][0-9A-Za-z.+-]*/crates/uv-python-managed/download-metadata\.json")
_SDIST = re.compile(r"uv-([0-9][0-9A-Za-z.+-]*)\.tar\.gz")
MAX_SDIST_BYTES = 48 * 1024 * 1024
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
MAX_MEMBER_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Sdist:
    filename: str
    url: str
    version: Version
    sha256: str
    size: int | None


def pick_sdist(body: bytes, page_url: str, wanted: str | None) -> Sdist:
    """The sdist of uv ``wanted`` (a version; None: the newest final release) on a PEP 691 page."""
    found = [s for s in _sdists(body, page_url) if wanted is None or s.version == _version(wanted)]
    final = [s for s in found if wanted is not None or not s.version.is_prerelease]
    if not final:
        raise DataError(f"the package index lists no uv {wanted or 'release'} source distribution "
                        "with a sha256", hint="name a uv release the index has (--uv-release X.Y.Z)")
    return max(final, key=lambda s: s.version)


def _version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise DataError(f"invalid uv release {text!r}", hint="give a version such as 0.13.9") from exc


def _sdists(body: bytes, page_url: str) -> list[Sdist]:
    from urllib.parse import urljoin

    try:
        files = json.loads(body)["files"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{page_url}: not a JSON simple API page (PEP 691)") from exc
    sdists = []
    for entry in files if isinstance(files, list) else ():
        sdist = _sdist(entry, page_url, urljoin)
        if sdist is not None:
            sdists.append(sdist)
    return sdists


def _sdist(entry: Any, page_url: str, urljoin: Any) -> Sdist | None:
    if not isinstance(entry, dict) or entry.get("yanked"):
        return None
    name, url = entry.get("filename"), entry.get("url")
    sha256 = (entry.get("hashes") or {}).get("sha256") if isinstance(entry.get("hashes"), dict) else None
    match = _SDIST.fullmatch(name) if isinstance(name, str) else None
    if match is None or not isinstance(url, str) or not isinstance(sha256, str):
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return None
    try:
        version = Version(match[1])
    except InvalidVersion:
        return None
    size = entry.get("size")
    return Sdist(filename=str(name), url=urljoin(page_url, url), version=version, sha256=sha256,
                 size=size if isinstance(size, int) and not isinstance(size, bool) else None)


def check_size(sdist: Sdist) -> None:
    if sdist.size is not None and sdist.size > MAX_SDIST_BYTES:
        raise DataError(f"{sdist.filename} is {sdist.size} bytes, more than the "
                        f"{MAX_SDIST_BYTES} a uv sdist is read to", hint="name another uv release")


def check_digest(sdist: Sdist, body: bytes) -> None:
    if hashlib.sha256(body).hexdigest() != sdist.sha256:
        raise DataError(f"{sdist.filename} does not match the sha256 the index lists for it",
                        hint="the download was damaged or replaced; retry, or use another index")


class _Bounded(io.RawIOBase):
    """The inflated stream, refusing to give more than ``limit`` bytes."""

    def __init__(self, inner: gzip.GzipFile, limit: int) -> None:
        self.inner, self.left = inner, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(min(len(buffer), self.left + 1))
        if len(data) > self.left:
            raise DataError(f"the sdist unpacks to more than {MAX_UNPACKED_BYTES} bytes before "
                            "uv's download list", hint="name another uv release")
        self.left -= len(data)
        buffer[: len(data)] = data
        return len(data)


def read_member(filename: str, body: bytes) -> tuple[str, bytes]:
    """(member name, content) of uv's download list inside the sdist ``body``."""
    raw = _Bounded(gzip.GzipFile(fileobj=io.BytesIO(body)), MAX_UNPACKED_BYTES)
    try:
        with tarfile.open(fileobj=io.BufferedReader(raw), mode="r|") as archive:
            for info in archive:
                if MEMBER.fullmatch(info.name):
                    return info.name, _content(filename, archive, info)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{filename} is not a readable gzip'd tar ({exc})") from exc
    raise DataError(f"{filename} holds no crates/uv-python-managed/download-metadata.json",
                    hint="uv moved its download list again; name the release that has it")


def _content(filename: str, archive: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    if not info.isreg() or info.size > MAX_MEMBER_BYTES:
        raise DataError(f"{filename}: {info.name} is not a regular file of at most "
                        f"{MAX_MEMBER_BYTES} bytes")
    member = archive.extractfile(info)
    if member is None:
        raise DataError(f"{filename}: {info.name} cannot be read")
    return member.read()
