"""The HTTP client refresh reads upstream through: retries with backoff (honouring
Retry-After up to a cap), a deadline per body, a size cap, and redirects that may never
downgrade from https. Every body byte received is counted."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin, urlsplit

import requests
from requests.structures import CaseInsensitiveDict

from envbuild import __version__
from envbuild.errors import DataError
from envbuild.redact import redact
from envbuild.upstream.pipconfig import tls_verify

# HTTP statuses worth another try: rate limiting and transient server trouble.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def check_redirect(source: str, target: str) -> None:
    """Refuse redirects that downgrade https or leave http(s) altogether."""
    old, new = urlsplit(source).scheme, urlsplit(target).scheme
    if new not in ("http", "https") or (old == "https" and new != "https"):
        raise DataError(
            f"refusing redirect from {source} to {target} (downgrade from {old} to {new})",
            hint="fix the index URL or its proxy; envbuild never falls back to plain http",
        )



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



class HttpClient:
    """GETs with retries. Counts every body byte it receives in ``bytes_received``."""

    def __init__(
        self,
        *,
        env: Mapping[str, str],
        session: requests.Session | None = None,
        policy: HttpPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.policy = policy or HttpPolicy()
        self.bytes_received = 0
        self.requests_made = 0
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
                        self._log(redact(f"retrying {url} in {delay:.1f} s ({reason})"))
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
