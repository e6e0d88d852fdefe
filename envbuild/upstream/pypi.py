"""Facts from the Python package index: wheel lists and wheel METADATA.

Files are listed through the JSON simple API (PEP 691). A wheel's METADATA comes from
the PEP 658/714 ``.metadata`` file when the index advertises one, otherwise from HTTP
range requests into the wheel's zip (tail → central directory → one member), so a
torch wheel of 800 MB costs kilobytes. Only ``bin/update_pypi_facts.py`` and refresh
code import this module; the resolver never does (it reads ``matrices/`` only).
"""

from __future__ import annotations

import ast
import email.parser
import hashlib
import importlib
import json
import re
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol
from urllib.parse import urljoin, urlsplit

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import (
    BuildTag,
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version
from requests.structures import CaseInsensitiveDict

from envbuild import __version__
from envbuild.errors import DataError

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
PIP_CONFIG_TIMEOUT_S = 15.0
# HTTP statuses worth another try: rate limiting and transient server trouble.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Where the METADATA member of a wheel lives: ``<name>-<version>.dist-info/METADATA``.
METADATA_MEMBER = re.compile(r"[^/]+\.dist-info/METADATA")
LINUX_X86_64 = re.compile(r"(many)?linux(1|2010|2014|_\d+_\d+)?_x86_64")
PREFERRED_PYTHON = "cp311"
# PyPI names of the CUDA libraries a torch wheel pins. Since CUDA 13 the ``-cuXX``
# suffix is gone for some of them (``nvidia-cuda-runtime``), so the suffix is optional.
CUDA_PIN_NAMES: Mapping[str, re.Pattern[str]] = {
    "cuda_runtime": re.compile(r"nvidia-cuda-runtime(-cu\d+)?"),
    "cudnn": re.compile(r"nvidia-cudnn(-cu\d+)?"),
    "nccl": re.compile(r"nvidia-nccl(-cu\d+)?"),
}
# The environment a Linux x86_64 CPython 3.11 install evaluates Requires-Dist markers in.
LINUX_MARKERS: Mapping[str, str] = {
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "extra": "",
}


# --------------------------------------------------------------------------- index URL


def index_url(flag: str | None, env: Mapping[str, str]) -> str:
    """The index to read: ``flag``, then PIP_INDEX_URL, then pip's config, then pip's default."""
    candidates: Sequence[tuple[str, Callable[[], str | None]]] = (
        ("--index-url", lambda: flag),
        ("PIP_INDEX_URL", lambda: env.get("PIP_INDEX_URL")),
        ("pip configuration", lambda: pip_config_index_url(env)),
        ("pip's default", pip_default_index_url),
    )
    for origin, candidate in candidates:
        url = (candidate() or "").strip()
        if url:
            return _checked_index_url(url, origin)
    raise DataError(
        "no Python package index configured",
        hint="pass --index-url or set PIP_INDEX_URL",
    )


def _checked_index_url(url: str, origin: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DataError(
            f"index URL {url!r} from {origin} is not an http(s) URL",
            hint="the JSON simple API needs an http(s) index",
        )
    return url


def pip_config_index_url(env: Mapping[str, str]) -> str | None:
    """``index-url`` from pip's configuration files, as pip itself merges them; None if unknown."""
    command = [sys.executable, "-m", "pip", "config", "list"]
    try:
        done = subprocess.run(
            command,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=PIP_CONFIG_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    values = parse_pip_config_list(done.stdout)
    # pip install reads the [install] section over [global]; do the same.
    return values.get("install.index-url") or values.get("global.index-url")


def parse_pip_config_list(text: str) -> dict[str, str]:
    """Parse ``pip config list`` output: one ``key='value'`` per line (value is a repr)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str):
            values[key.strip()] = value
    return values


def pip_default_index_url() -> str | None:
    """The index pip uses when nothing is configured, read from pip itself (not an API)."""
    try:
        module = importlib.import_module("pip._internal.models.index")
        url = module.PyPI.simple_url
    except Exception:  # pip's internals may move or be absent: "unknown", not a crash
        return None
    return url if isinstance(url, str) else None


def tls_verify(env: Mapping[str, str]) -> str | bool:
    """What to verify TLS against: PIP_CERT, then REQUESTS_CA_BUNDLE, else the default store."""
    return env.get("PIP_CERT") or env.get("REQUESTS_CA_BUNDLE") or True


def check_redirect(source: str, target: str) -> None:
    """Refuse redirects that downgrade https or leave http(s) altogether."""
    old, new = urlsplit(source).scheme, urlsplit(target).scheme
    if new not in ("http", "https") or (old == "https" and new != "https"):
        raise DataError(
            f"refusing redirect from {source} to {target} (downgrade from {old} to {new})",
            hint="fix the index URL or its proxy; envbuild never falls back to plain http",
        )


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpPolicy:
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    total_timeout_s: float = 300.0
    attempts: int = 4
    backoff_s: float = 0.5
    max_retry_after_s: float = 60.0
    max_redirects: int = 5
    max_body_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """One HTTP reply (or, for ``matrix refresh``, a document: ``cached`` when it came
    from the ETag cache, after a 304 or offline)."""

    url: str
    status: int
    headers: Mapping[str, str]
    body: bytes
    cached: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


class _Retry(Exception):
    """A transient failure: try again after ``delay_s`` (None: the policy's backoff)."""

    def __init__(self, reason: str, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s


class IndexClient:
    """Reads one index. Counts every body byte it receives in ``bytes_received``."""

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
        self.index = index.rstrip("/") + "/"
        self.policy = policy or HttpPolicy()
        self.bytes_received = 0
        self.requests_made = 0
        self.tail_bytes = tail_bytes
        self._verify = tls_verify(env)
        self._sleep = sleep
        self._log = log
        self._session = session or requests.Session()
        self._session.headers["User-Agent"] = f"envbuild/{__version__}"

    def get(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        allow: frozenset[int] = frozenset(),
    ) -> Reply:
        """GET with retries; a 2xx reply, one whose status is in ``allow`` (304, 401), or DataError."""
        reason = ""
        for attempt in range(self.policy.attempts):
            try:
                return self._get_once(url, dict(headers or {}), allow)
            except _Retry as retry:
                reason = retry.reason
                if attempt + 1 < self.policy.attempts:
                    delay = retry.delay_s or self.policy.backoff_s * 2**attempt
                    if self._log is not None:
                        self._log(f"retrying {url} in {delay:.1f} s ({reason})")
                    self._sleep(delay)
        raise DataError(
            f"giving up on {url} after {self.policy.attempts} attempts ({reason})",
            hint="the index may be down or unreachable; retry later",
        )

    def _get_once(self, url: str, headers: dict[str, str], allow: frozenset[int]) -> Reply:
        for _ in range(self.policy.max_redirects + 1):
            response = self._send(url, headers)
            with response:
                if response.is_redirect:
                    target = urljoin(url, response.headers["Location"])
                    check_redirect(url, target)
                    url = target
                    continue
                return self._reply(url, response, ranged="Range" in headers, allow=allow)
        raise DataError(f"too many redirects from {url}")

    def _send(self, url: str, headers: dict[str, str]) -> requests.Response:
        self.requests_made += 1
        timeout = (self.policy.connect_timeout_s, self.policy.read_timeout_s)
        try:
            return self._session.get(
                url,
                headers=headers,
                timeout=timeout,
                verify=self._verify,
                allow_redirects=False,
                stream=True,
            )
        except requests.exceptions.SSLError as exc:
            raise DataError(
                f"TLS verification failed for {url}: {exc}",
                hint="set PIP_CERT or REQUESTS_CA_BUNDLE to your CA bundle",
            ) from exc
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc

    def _reply(
        self, url: str, response: requests.Response, *, ranged: bool, allow: frozenset[int] = frozenset()
    ) -> Reply:
        status = response.status_code
        if status in RETRY_STATUSES:
            raise _Retry(f"HTTP {status}", self._retry_after(url, response))
        if status in allow:
            body = b"" if status == 304 else self._read_body(url, response)
            return Reply(url=url, status=status, headers=CaseInsensitiveDict(response.headers), body=body)
        if not 200 <= status < 300:
            raise DataError(f"HTTP {status} {response.reason} for {url}")
        if ranged and status == 200:
            # A server that ignores Range would send the whole wheel: hundreds of MB.
            raise DataError(
                f"{url} ignored the HTTP Range request",
                hint="use an index whose file host supports range requests or PEP 658",
            )
        body = self._read_body(url, response)
        headers = CaseInsensitiveDict(response.headers)
        return Reply(url=url, status=status, headers=headers, body=body)

    def _read_body(self, url: str, response: requests.Response) -> bytes:
        deadline = time.monotonic() + self.policy.total_timeout_s
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_content(64 * 1024):
                size += len(chunk)
                self.bytes_received += len(chunk)
                if size > self.policy.max_body_bytes:
                    raise DataError(f"{url} sent more than {self.policy.max_body_bytes} bytes")
                if time.monotonic() > deadline:
                    raise _Retry(f"{url} took longer than {self.policy.total_timeout_s} s")
                chunks.append(chunk)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise _Retry(f"{type(exc).__name__} while reading: {exc}") from exc
        return b"".join(chunks)

    def _retry_after(self, url: str, response: requests.Response) -> float | None:
        delay = parse_retry_after(response.headers.get("Retry-After"))
        if delay is not None and delay > self.policy.max_retry_after_s:
            raise DataError(
                f"{url} is rate limited (Retry-After {delay:.0f} s)",
                hint="retry later or authenticate with the index",
            )
        return delay

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
        url = wheel.url.split("#", 1)[0]
        try:
            return read_zip_member(
                tail=lambda n: self._tail(url, n),
                read=lambda start, end: self._range(url, start, end),
                tail_bytes=self.tail_bytes,
                wanted=METADATA_MEMBER,
            )
        except ZipFormatError as exc:
            raise DataError(f"cannot read METADATA of {wheel.filename}: {exc}") from exc

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


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def parse_content_range(value: str | None, url: str) -> tuple[int, int]:
    """(first byte, total size) from ``Content-Range: bytes a-b/total``."""
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", (value or "").strip())
    if not match:
        raise DataError(f"{url}: missing or unusable Content-Range {value!r}")
    return int(match[1]), int(match[3])


# --------------------------------------------------------------------------- simple API page


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

    @property
    def platform(self) -> str:
        """The platform part of the file name as written (may be a compressed tag set)."""
        return self.filename[: -len(".whl")].rsplit("-", 1)[1]


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
    )


# --------------------------------------------------------------------------- remote zip


class ZipFormatError(ValueError):
    """The bytes read are not the zip structure they should be."""


EOCD = struct.Struct("<4s4H2LH")  # end of central directory, 22 bytes
ZIP64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes, just before the EOCD
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # 56 bytes
CENTRAL = struct.Struct("<4s6H3L5H2L")  # 46 bytes + name + extra + comment
LOCAL = struct.Struct("<4s5H3L2H")  # 30 bytes + name + extra
MAX_MEMBER_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ZipMember:
    name: str
    flags: int
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int
    extra_length: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CentralDirectory:
    offset: int
    size: int


TailReader = Callable[[int], tuple[bytes, int]]  # n → (last n bytes, file size)
RangeReader = Callable[[int, int], bytes]  # [start, end) → bytes


def read_zip_member(
    *, tail: TailReader, read: RangeReader, tail_bytes: int, wanted: re.Pattern[str]
) -> bytes:
    """The content of the one member whose name fully matches ``wanted``."""
    data, total = tail(tail_bytes + EOCD.size)
    tail_start = total - len(data)
    directory = find_central_directory(data, tail_start, read)
    member = _find_member(data, tail_start, directory, read, wanted)
    return _read_member(member, directory, read)


def find_central_directory(data: bytes, tail_start: int, read: RangeReader) -> CentralDirectory:
    """Locate the central directory from the end records (zip64 aware)."""
    pos = _eocd_position(data)
    fields = EOCD.unpack_from(data, pos)
    entries, size, offset = fields[4], fields[5], fields[6]
    if entries != 0xFFFF and 0xFFFFFFFF not in (size, offset):
        return CentralDirectory(offset=offset, size=size)
    locator_start = tail_start + pos - ZIP64_LOCATOR.size
    locator = _slice_or_read(data, tail_start, locator_start, ZIP64_LOCATOR.size, read)
    signature, _, record_offset, _ = ZIP64_LOCATOR.unpack(locator)
    if signature != b"PK\x06\x07":
        raise ZipFormatError("zip64 end-of-directory locator missing")
    record = _slice_or_read(data, tail_start, record_offset, ZIP64_EOCD.size, read)
    fields64 = ZIP64_EOCD.unpack(record)
    if fields64[0] != b"PK\x06\x06":
        raise ZipFormatError("zip64 end-of-directory record missing")
    return CentralDirectory(offset=fields64[9], size=fields64[8])


def _eocd_position(data: bytes) -> int:
    # The EOCD is followed only by its comment; check that, since a comment may hold PK\5\6.
    pos = data.rfind(b"PK\x05\x06")
    while pos != -1:
        if pos + EOCD.size <= len(data):
            comment_length = EOCD.unpack_from(data, pos)[7]
            if pos + EOCD.size + comment_length == len(data):
                return pos
        pos = data.rfind(b"PK\x05\x06", 0, pos)
    raise ZipFormatError("no end-of-central-directory record (not a zip file?)")


def _slice_or_read(
    data: bytes, tail_start: int, start: int, length: int, read: RangeReader
) -> bytes:
    """Bytes [start, start + length): from the tail already read when it holds them."""
    if start < 0:
        raise ZipFormatError("zip structure points before the start of the file")
    if start >= tail_start:
        chunk = data[start - tail_start : start - tail_start + length]
        if len(chunk) == length:
            return chunk
    return read(start, start + length)


def _find_member(
    data: bytes,
    tail_start: int,
    directory: CentralDirectory,
    read: RangeReader,
    wanted: re.Pattern[str],
) -> ZipMember:
    end = directory.offset + directory.size
    if end > tail_start + len(data):
        raise ZipFormatError("central directory runs past the end of the file")
    if directory.offset >= tail_start:
        members = parse_central_directory(data[directory.offset - tail_start : end - tail_start])
        return _only_match(members, wanted)
    # A torch wheel's directory is ~1 MB, but *.dist-info sits at one of its ends: last
    # when the wheel was built by the usual tools, first when it was repacked. Look at
    # the end already read, then at the start, and only then read the whole directory.
    partial = data[: end - tail_start]
    found = _matches(members_from_partial_directory(partial), wanted)
    if found:
        return _only_match(found, wanted)
    head_end = min(directory.offset + len(data), tail_start)
    head = read(directory.offset, head_end)
    found = _matches(members_from_directory_start(head), wanted)
    if found:
        return _only_match(found, wanted)
    middle = read(head_end, tail_start) if head_end < tail_start else b""
    return _only_match(parse_central_directory(head + middle + partial), wanted)


def _matches(members: Iterable[ZipMember] | None, wanted: re.Pattern[str]) -> list[ZipMember]:
    return [m for m in members or () if wanted.fullmatch(m.name)]


def _only_match(members: Iterable[ZipMember], wanted: re.Pattern[str]) -> ZipMember:
    found = [m for m in members if wanted.fullmatch(m.name)]
    if len(found) != 1:
        raise ZipFormatError(f"expected one member matching {wanted.pattern}, found {len(found)}")
    return found[0]


def parse_central_directory(data: bytes, start: int = 0) -> list[ZipMember]:
    """Every entry from ``start`` to the exact end of ``data``."""
    members: list[ZipMember] = []
    pos = start
    while pos < len(data):
        member, pos = _central_entry(data, pos)
        members.append(member)
    if pos != len(data):
        raise ZipFormatError("central directory entries overrun the directory")
    return members


def members_from_directory_start(head: bytes) -> list[ZipMember]:
    """The complete entries at the start of a directory that ``head`` holds only part of."""
    members: list[ZipMember] = []
    pos = 0
    while True:
        try:
            member, pos = _central_entry(head, pos)
        except ZipFormatError:
            return members
        members.append(member)


def members_from_partial_directory(partial: bytes) -> list[ZipMember] | None:
    """Entries of a directory's tail: the first signature whose chain ends exactly at the end."""
    pos = partial.find(b"PK\x01\x02")
    while pos != -1:
        try:
            return parse_central_directory(partial, pos)
        except (ZipFormatError, struct.error, UnicodeDecodeError):
            pos = partial.find(b"PK\x01\x02", pos + 1)
    return None


def _central_entry(data: bytes, pos: int) -> tuple[ZipMember, int]:
    if pos + CENTRAL.size > len(data):
        raise ZipFormatError("truncated central directory entry")
    fields = CENTRAL.unpack_from(data, pos)
    if fields[0] != b"PK\x01\x02":
        raise ZipFormatError("bad central directory signature")
    flags, method, crc, compressed, size = fields[3], fields[4], fields[7], fields[8], fields[9]
    name_length, extra_length, comment_length = fields[10:13]
    offset = fields[16]
    name_start = pos + CENTRAL.size
    extra_start = name_start + name_length
    next_pos = extra_start + extra_length + comment_length
    if next_pos > len(data):
        raise ZipFormatError("truncated central directory entry")
    # Bit 11: the name is UTF-8; otherwise cp437 (zip's historical default).
    name = data[name_start:extra_start].decode("utf-8" if flags & 0x800 else "cp437")
    size, compressed, offset = _zip64_values(
        data[extra_start : extra_start + extra_length], size, compressed, offset
    )
    member = ZipMember(
        name=name,
        flags=flags,
        method=method,
        crc=crc,
        compressed_size=compressed,
        size=size,
        header_offset=offset,
        extra_length=extra_length,
    )
    return member, next_pos


def _zip64_values(extra: bytes, size: int, compressed: int, offset: int) -> tuple[int, int, int]:
    """Replace 0xFFFFFFFF placeholders from the zip64 extra field (id 1), in its fixed order."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if tag != 1:
            continue
        values = [v for (v,) in struct.iter_unpack("<Q", body[: len(body) // 8 * 8])]
        if size == 0xFFFFFFFF and values:
            size = values.pop(0)
        if compressed == 0xFFFFFFFF and values:
            compressed = values.pop(0)
        if offset == 0xFFFFFFFF and values:
            offset = values.pop(0)
    return size, compressed, offset


def _read_member(member: ZipMember, directory: CentralDirectory, read: RangeReader) -> bytes:
    if member.flags & 0x1:
        raise ZipFormatError(f"{member.name} is encrypted")
    if member.size > MAX_MEMBER_BYTES or member.compressed_size > MAX_MEMBER_BYTES:
        raise ZipFormatError(f"{member.name} is implausibly large ({member.size} bytes)")
    start = member.header_offset
    # The local header's extra field usually matches the central one; read both in one go.
    guess = LOCAL.size + len(member.name.encode()) + member.extra_length + member.compressed_size
    chunk = read(start, min(start + guess, directory.offset))
    if len(chunk) < LOCAL.size or chunk[:4] != b"PK\x03\x04":
        raise ZipFormatError(f"bad local header for {member.name}")
    name_length, extra_length = LOCAL.unpack_from(chunk)[9:11]
    data_start = LOCAL.size + name_length + extra_length
    needed = data_start + member.compressed_size
    if len(chunk) < needed:
        chunk += read(start + len(chunk), start + needed)
    return _inflate(member, chunk[data_start:needed])


def _inflate(member: ZipMember, raw: bytes) -> bytes:
    if member.method == 0:
        content = raw
    elif member.method == 8:
        try:
            inflater = zlib.decompressobj(-15)
            content = inflater.decompress(raw, MAX_MEMBER_BYTES) + inflater.flush()
        except zlib.error as exc:
            raise ZipFormatError(f"{member.name}: {exc}") from exc
    else:
        raise ZipFormatError(f"{member.name}: unsupported compression method {member.method}")
    if len(content) != member.size or zlib.crc32(content) != member.crc:
        raise ZipFormatError(f"{member.name}: size or CRC mismatch")
    return content


# --------------------------------------------------------------------------- torch facts


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchWheelFact:
    """What the index says about one torch release's default Linux x86_64 wheels."""

    torch: str
    default_variant: str | None
    python: tuple[str, ...]
    free_threaded: tuple[str, ...]
    requires_python: str | None
    platform_tag: str
    other_platform_tags: tuple[str, ...]
    cuda_runtime: str | None
    cuda_runtime_via: str | None
    cudnn: str | None
    nccl: str | None
    filename: str
    metadata_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompanionFact:
    """A torchvision/torchaudio release and the torch it pins (None: not pinned)."""

    project: str
    version: str
    torch: str | None
    torch_requirement: str | None
    filename: str
    metadata_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompanionRow:
    torch: str
    torchvision: CompanionFact | None
    torchaudio: CompanionFact | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PypiFacts:
    torch: tuple[TorchWheelFact, ...]
    torchvision: tuple[CompanionFact, ...]
    torchaudio: tuple[CompanionFact, ...]
    companions: tuple[CompanionRow, ...]
    bytes_transferred: int
    requests_made: int


Progress = Callable[[str], None]
FIRST_TORCH = Version("1.13.0")


class IndexReader(Protocol):
    """What the fact collectors need from an index: IndexClient, or a cache in front of it."""

    def list_wheels(self, project: str) -> tuple[WheelFile, ...]: ...

    def wheel_metadata(self, wheel: WheelFile) -> MetadataRead: ...


def collect_facts(
    client: IndexClient, *, since: Version = FIRST_TORCH, progress: Progress | None = None
) -> PypiFacts:
    """torch, torchvision and torchaudio facts for every final torch release >= ``since``."""
    torch = torch_facts(client, since=since, progress=progress)
    vision = companion_facts(client, "torchvision", since=since, progress=progress)
    audio = companion_facts(client, "torchaudio", since=since, progress=progress)
    return PypiFacts(
        torch=torch,
        torchvision=vision,
        torchaudio=audio,
        companions=companions_table([fact.torch for fact in torch], vision, audio),
        bytes_transferred=client.bytes_received,
        requests_made=client.requests_made,
    )


def torch_facts(
    client: IndexReader, *, since: Version = FIRST_TORCH, progress: Progress | None = None
) -> tuple[TorchWheelFact, ...]:
    """One fact per final torch release >= ``since`` that has Linux x86_64 CPython wheels."""
    facts: list[TorchWheelFact] = []
    for version, wheels in releases(client.list_wheels("torch"), since=since):
        linux = [w for w in wheels if is_linux_x86_64_cpython(w)]
        if not linux:
            continue
        read = client.wheel_metadata(preferred_wheel(linux))
        facts.append(torch_fact(version, linux, read))
        _report(progress, f"torch {version}: {read.bytes_transferred} bytes ({read.method})")
    return tuple(facts)


def torch_fact(version: Version, linux: Sequence[WheelFile], read: MetadataRead) -> TorchWheelFact:
    metadata = email.parser.HeaderParser().parsestr(read.text)
    pins = cuda_pins(metadata.get_all("Requires-Dist") or [])
    runtime = pins.get("cuda_runtime")
    platforms = sorted({w.platform for w in linux} - {read.wheel.platform})
    return TorchWheelFact(
        torch=str(version),
        default_variant=variant_of(runtime[0]) if runtime else None,
        python=_pythons(linux, free_threaded=False),
        free_threaded=_pythons(linux, free_threaded=True),
        requires_python=metadata.get("Requires-Python") or read.wheel.requires_python,
        platform_tag=read.wheel.platform,
        other_platform_tags=tuple(platforms),
        cuda_runtime=runtime[0] if runtime else None,
        cuda_runtime_via=runtime[1] if runtime else None,
        cudnn=pins["cudnn"][0] if "cudnn" in pins else None,
        nccl=pins["nccl"][0] if "nccl" in pins else None,
        filename=read.wheel.filename,
        metadata_bytes=read.bytes_transferred,
    )


def cuda_pins(requires_dist: Iterable[str]) -> dict[str, tuple[str, str]]:
    """{"cuda_runtime"|"cudnn"|"nccl": (pinned version, requirement it came from)}.

    Only ``==`` pins that apply on Linux x86_64. Since CUDA 13, torch pins the runtime
    through ``cuda-toolkit[cudart,...]==X`` instead of ``nvidia-cuda-runtime-cuXX``.
    """
    pins: dict[str, tuple[str, str]] = {}
    for line in requires_dist:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker and not requirement.marker.evaluate(dict(LINUX_MARKERS)):
            continue
        pinned = exact_pin(requirement)
        if pinned is None:
            continue
        name = canonicalize_name(requirement.name)
        for key, pattern in CUDA_PIN_NAMES.items():
            if pattern.fullmatch(name):
                pins[key] = (pinned, f"{name}=={pinned}")
        if name == "cuda-toolkit" and "cudart" in requirement.extras:
            pins.setdefault("cuda_runtime", (pinned, f"cuda-toolkit[cudart]=={pinned}"))
    return pins


def exact_pin(requirement: Requirement) -> str | None:
    specs = list(requirement.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def variant_of(cuda_runtime: str) -> str:
    """``cu117`` from a CUDA runtime pin such as 11.7.99."""
    release = Version(cuda_runtime).release
    return f"cu{release[0]}{release[1] if len(release) > 1 else 0}"


def companion_facts(
    client: IndexReader,
    project: str,
    *,
    since: Version = FIRST_TORCH,
    progress: Progress | None = None,
) -> tuple[CompanionFact, ...]:
    """Releases of ``project`` (newest first) down to the first that pins a torch < ``since``."""
    facts: list[CompanionFact] = []
    for version, wheels in reversed(releases(client.list_wheels(project))):
        read = client.wheel_metadata(preferred_wheel(wheels))
        requirement = torch_requirement(read.text)
        torch = exact_pin(requirement) if requirement else None
        _report(progress, f"{project} {version}: torch {torch} ({read.bytes_transferred} bytes)")
        if torch is not None and Version(torch) < since:
            break
        facts.append(
            CompanionFact(
                project=canonicalize_name(project),
                version=str(version),
                torch=torch,
                torch_requirement=str(requirement.specifier) if requirement else None,
                filename=read.wheel.filename,
                metadata_bytes=read.bytes_transferred,
            )
        )
    return tuple(sorted(facts, key=lambda fact: Version(fact.version)))


def torch_requirement(metadata_text: str) -> Requirement | None:
    """The unconditional ``Requires-Dist: torch...`` of a companion, if it has one."""
    metadata = email.parser.HeaderParser().parsestr(metadata_text)
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) == "torch" and not requirement.marker:
            return requirement
    return None


def companions_table(
    torch_versions: Iterable[str],
    vision: Iterable[CompanionFact],
    audio: Iterable[CompanionFact],
) -> tuple[CompanionRow, ...]:
    """For each torch version, the newest torchvision/torchaudio release pinning exactly it."""
    by_torch_vision = _newest_by_torch(vision)
    by_torch_audio = _newest_by_torch(audio)
    return tuple(
        CompanionRow(
            torch=version,
            torchvision=by_torch_vision.get(version),
            torchaudio=by_torch_audio.get(version),
        )
        for version in sorted(set(torch_versions), key=Version)
    )


def _newest_by_torch(facts: Iterable[CompanionFact]) -> dict[str, CompanionFact]:
    table: dict[str, CompanionFact] = {}
    for fact in sorted(facts, key=lambda f: Version(f.version)):
        if fact.torch is not None:
            table[str(Version(fact.torch))] = fact
    return table


def releases(
    wheels: Iterable[WheelFile], *, since: Version | None = None
) -> list[tuple[Version, list[WheelFile]]]:
    """Final releases (oldest first) with their non-yanked wheels."""
    grouped: dict[Version, list[WheelFile]] = {}
    for wheel in wheels:
        version = wheel.version
        if wheel.yanked or version.is_prerelease or version.is_postrelease or version.local:
            continue
        if since is None or version >= since:
            grouped.setdefault(version, []).append(wheel)
    return sorted(grouped.items())


def is_linux_x86_64_cpython(wheel: WheelFile) -> bool:
    return any(
        tag.interpreter.startswith("cp") and LINUX_X86_64.fullmatch(tag.platform)
        for tag in wheel.tags
    )


def preferred_wheel(wheels: Sequence[WheelFile]) -> WheelFile:
    """The wheel whose METADATA stands for the release: Linux x86_64 cp311 if there is one.

    Among equals the highest build tag wins, as in pip (torch 2.10.0 was re-uploaded
    as build 3); then the file name, so the choice never depends on the index's order.
    """

    def rank(wheel: WheelFile) -> tuple[bool, bool, bool]:
        linux = any(LINUX_X86_64.fullmatch(tag.platform) for tag in wheel.tags)
        cp311 = any(tag.interpreter == PREFERRED_PYTHON == tag.abi for tag in wheel.tags)
        pure = all(tag.platform == "any" for tag in wheel.tags)
        return (not (linux and cp311), not linux, not pure)

    ordered = sorted(wheels, key=lambda wheel: wheel.filename)
    ordered.sort(key=lambda wheel: wheel.build, reverse=True)  # stable: names stay sorted
    return min(ordered, key=rank)  # min keeps the first of equal ranks


def _pythons(wheels: Iterable[WheelFile], *, free_threaded: bool) -> tuple[str, ...]:
    """CPython versions ("3.11") of the wheels, regular or free-threaded (abi ``cp314t``)."""
    found: set[Version] = set()
    for wheel in wheels:
        for tag in wheel.tags:
            match = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
            if match and tag.abi.endswith("t") == free_threaded and tag.abi != "abi3":
                found.add(Version(f"{match[1]}.{match[2]}"))
    return tuple(str(version) for version in sorted(found))


def _report(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)
