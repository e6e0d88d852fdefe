"""The package index's JSON simple API (PEP 691) and wheel METADATA without the wheel.

A wheel's METADATA comes from the PEP 658/714 ``.metadata`` file when the index
advertises one, otherwise from HTTP range requests into the wheel's zip (tail → central
directory → one member), so a torch wheel of 800 MB costs kilobytes. Only refresh code
imports this module; the resolver never does (it reads ``matrices/`` only).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urljoin

import requests
from packaging.tags import Tag
from packaging.utils import (
    BuildTag,
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envbuild.errors import DataError
from envbuild.upstream.http_client import HttpClient, HttpPolicy, parse_content_range
from envbuild.upstream.remote_zip import ZipFormatError, read_zip_member

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# Where the METADATA member of a wheel lives: ``<name>-<version>.dist-info/METADATA``.
METADATA_MEMBER = re.compile(r"[^/]+\.dist-info/METADATA")


@dataclass(frozen=True, slots=True, kw_only=True)
class WheelFile:
    project: NormalizedName
    filename: str
    url: str
    version: Version
    build: BuildTag
    tags: frozenset[Tag]
    requires_python: str | None
    size: int | None
    yanked: bool
    metadata_advertised: bool
    metadata_sha256: str | None
    upload_time: str | None = None  # PEP 700 ``upload-time`` (ISO 8601, UTC), when the index gives it

    @property
    def platform(self) -> str:
        """The platform part of the file name as written (may be a compressed tag set)."""
        return self.filename[: -len(".whl")].rsplit("-", 1)[1]


_CPYTHON_TAG = re.compile(r"cp(\d)(\d+)")


def cpython_of(tag: Tag) -> str | None:
    """The CPython a wheel tag is built for, as the data writes it: "3.11", or "3.13t" for a
    free-threaded build (abi ``cp313t``); None for other interpreters and the stable ABI."""
    match = _CPYTHON_TAG.fullmatch(tag.interpreter)
    if match is None or tag.abi == "abi3":
        return None
    return f"{match[1]}.{match[2]}" + ("t" if tag.abi.endswith("t") else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataRead:
    wheel: WheelFile
    text: str
    method: Literal["pep658", "range"]
    bytes_transferred: int


def parse_simple_page(body: bytes, *, page_url: str, project: str) -> tuple[WheelFile, ...]:
    """The wheels on a PEP 691 JSON page; other files and unparsable names are skipped."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(
            f"index page for {project} is not JSON ({exc})",
            hint="the index must support the JSON simple API (PEP 691)",
        ) from exc
    files = _field(data, "files", list, project)
    api = str(_field(_field(data, "meta", dict, project), "api-version", str, project))
    if api.split(".")[0] != "1":
        raise DataError(f"index page for {project} has unsupported api-version {api!r}")
    wheels = (_wheel_file(entry, page_url, project) for entry in files)
    return tuple(wheel for wheel in wheels if wheel is not None)


def _field(data: Any, key: str, kind: type, project: str) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get(key), kind):
        raise DataError(f"index page for {project}: field {key!r} missing or not a {kind.__name__}")
    return data[key]


def _wheel_file(entry: Any, page_url: str, project: str) -> WheelFile | None:
    filename = str(_field(entry, "filename", str, project))
    url = urljoin(page_url, str(_field(entry, "url", str, project)))
    if not filename.endswith(".whl"):
        return None
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    # PEP 714 renamed the key; older indexes still send the PEP 658 one.
    metadata = entry.get("core-metadata", entry.get("dist-info-metadata", False))
    size = entry.get("size")
    requires_python = entry.get("requires-python")
    uploaded = entry.get("upload-time")
    return WheelFile(
        project=name,
        filename=filename,
        url=url,
        version=version,
        build=build,
        tags=tags,
        requires_python=requires_python if isinstance(requires_python, str) else None,
        size=size if isinstance(size, int) else None,
        yanked=bool(entry.get("yanked", False)),
        metadata_advertised=bool(metadata),
        metadata_sha256=metadata.get("sha256") if isinstance(metadata, dict) else None,
        upload_time=uploaded if isinstance(uploaded, str) else None,
    )



class IndexClient(HttpClient):
    """Reads one index (and, being an ``HttpClient``, any other URL refresh needs)."""

    def __init__(
        self,
        index: str,
        *,
        env: Mapping[str, str],
        session: requests.Session | None = None,
        policy: HttpPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        tail_bytes: int = 64 * 1024,
        log: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(env=env, session=session, policy=policy, sleep=sleep, log=log)
        self.index = index.rstrip("/") + "/"
        self.tail_bytes = tail_bytes

    # ----------------------------------------------------------------------- simple API

    def list_wheels(self, project: str) -> tuple[WheelFile, ...]:
        """Every wheel of ``project`` the index lists (PEP 691 JSON)."""
        name = canonicalize_name(project)
        page = self.get(urljoin(self.index, f"{name}/"), {"Accept": SIMPLE_JSON})
        return parse_simple_page(page.body, page_url=page.url, project=name)

    # ----------------------------------------------------------------------- METADATA

    def wheel_metadata(self, wheel: WheelFile) -> MetadataRead:
        """The METADATA of ``wheel``, without downloading the wheel."""
        before = self.bytes_received
        method: Literal["pep658", "range"] = "pep658" if wheel.metadata_advertised else "range"
        raw = self._pep658_metadata(wheel) if method == "pep658" else self._range_metadata(wheel)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"METADATA of {wheel.filename} is not UTF-8: {exc}") from exc
        return MetadataRead(
            wheel=wheel,
            text=text,
            method=method,
            bytes_transferred=self.bytes_received - before,
        )

    def _pep658_metadata(self, wheel: WheelFile) -> bytes:
        body = self.get(wheel.url.split("#", 1)[0] + ".metadata").body
        expected = wheel.metadata_sha256
        if expected and hashlib.sha256(body).hexdigest() != expected.lower():
            raise DataError(f"METADATA of {wheel.filename} does not match its sha256")
        return body

    def _range_metadata(self, wheel: WheelFile) -> bytes:
        try:
            return self._member(wheel, METADATA_MEMBER)
        except ZipFormatError as exc:
            raise DataError(f"cannot read METADATA of {wheel.filename}: {exc}") from exc

    def optional_member(self, wheel: WheelFile, wanted: re.Pattern[str]) -> bytes | None:
        """The one member of ``wheel`` whose name fully matches ``wanted``, by range requests;
        None when the wheel is a zip without that one member (or no zip at all): the caller
        can do without it. Network failures still raise."""
        try:
            return self._member(wheel, wanted)
        except ZipFormatError:
            return None

    def _member(self, wheel: WheelFile, wanted: re.Pattern[str]) -> bytes:
        url = wheel.url.split("#", 1)[0]
        return read_zip_member(tail=lambda n: self._tail(url, n),
                               read=lambda start, end: self._range(url, start, end),
                               tail_bytes=self.tail_bytes, wanted=wanted)

    def _tail(self, url: str, n: int) -> tuple[bytes, int]:
        reply = self.get(url, {"Range": f"bytes=-{n}"})
        start, total = parse_content_range(reply.headers.get("Content-Range"), url)
        if start + len(reply.body) != total:
            raise DataError(f"{url}: short read of the file's tail")
        return reply.body, total

    def _range(self, url: str, start: int, end: int) -> bytes:
        reply = self.get(url, {"Range": f"bytes={start}-{end - 1}"})
        got, _ = parse_content_range(reply.headers.get("Content-Range"), url)
        if got != start or len(reply.body) != end - start:
            raise DataError(f"{url}: asked for bytes {start}-{end - 1}, got something else")
        return reply.body
