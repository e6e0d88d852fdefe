"""The HTTP client refresh reads upstream through: retries with backoff (honouring
Retry-After up to a cap), one wall-clock deadline per request, a size cap, and redirects
that may never downgrade from https. Every body byte received is counted.

The deadline (``HttpPolicy.total_timeout_s``) bounds a whole ``get``: every attempt,
redirect and back-off, and within an attempt the connect, the TLS handshake, the headers
and the body. Socket timeouts alone cannot do that (a server trickling one byte a second
never lets a read time out), so a watchdog timer shuts down the sockets the request uses
once the deadline passes, whatever phase it is in (docs/faults.md E16, E17)."""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import DEFAULT_CA_BUNDLE_PATH, HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from envbuild import __version__
from envbuild.errors import DataError
from envbuild.redact import redact, server_text
from envbuild.upstream.pipconfig import tls_verify

TYPE_CHECKING = False
if TYPE_CHECKING:
    from requests.adapters import _HostParams, _PoolKwargs
    from urllib3._base_connection import BaseHTTPConnection

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
    total_timeout_s: float = 300.0  # one get, wall clock: every attempt, redirect, back-off, phase
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



class _Deadline:
    """The wall-clock budget of one ``get``. While it is active (``with``), every connection
    the client takes from its pools is watched; when the budget runs out a timer thread
    shuts their sockets down, which ends a blocked connect, handshake or read at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._connections: list[object] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def watch(self, connection: object) -> None:
        with self._lock:
            self._connections.append(connection)
            if self.expired:
                _shut(connection)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for connection in self._connections:
                _shut(connection)

    def __enter__(self) -> _Deadline:
        _ACTIVE.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        _ACTIVE.deadline = None


class _Active(threading.local):
    deadline: _Deadline | None = None


_ACTIVE = _Active()


def _shut(connection: object) -> None:
    """Shut a connection's socket (or a raw socket) down from another thread: a blocked recv
    returns at once. ``socket.socket.shutdown`` itself, not ``SSLSocket``'s, so the TLS state
    is left alone."""
    for sock in (connection, getattr(connection, "sock", None),
                 getattr(connection, "_envbuild_socket", None)):
        if isinstance(sock, socket.socket):
            # OSError: not connected yet, or closed, or handed over to the TLS socket.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self._envbuild_socket = sock  # the raw socket, before any TLS wraps it
        return sock


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self._envbuild_socket = sock
        return sock


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection

    def _get_conn(self, timeout: float | None = None) -> BaseHTTPConnection:
        connection = super()._get_conn(timeout)
        if _ACTIVE.deadline is not None:
            _ACTIVE.deadline.watch(connection)
        return connection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection

    def _get_conn(self, timeout: float | None = None) -> BaseHTTPConnection:
        connection = super()._get_conn(timeout)
        if _ACTIVE.deadline is not None:
            _ACTIVE.deadline.watch(connection)
        return connection


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter with pools whose connections the active deadline can shut down, and
    one verifying TLS context per CA bundle: left to urllib3, every new connection parses the
    whole bundle again (~25-35 ms of CPU for a system bundle; eight at once where the hash
    check reads eight index pages). Its settings are urllib3's own for a verified connection;
    a bundle that cannot be loaded takes urllib3's path as before, which reports it."""

    def __init__(self) -> None:
        self._contexts: dict[str, ssl.SSLContext | None] = {}
        self._contexts_lock = threading.Lock()
        super().__init__()

    def init_poolmanager(self, *args: object, **kwargs: object) -> None:
        super().init_poolmanager(*args, **kwargs)  # type: ignore[arg-type]
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedHTTPPool,
                                                   "https": _WatchedHTTPSPool}

    def build_connection_pool_key_attributes(
            self, request: requests.PreparedRequest, verify: bool | str,
            cert: str | tuple[str, str] | None = None) -> tuple[_HostParams, _PoolKwargs]:
        host, pool = super().build_connection_pool_key_attributes(request, verify, cert)
        context = self._context(host["scheme"], verify, cert)
        if context is not None:  # requests' documented way to give a context of one's own
            pool.pop("ca_certs", None)
            pool.pop("ca_cert_dir", None)
            pool["ssl_context"] = context
        return host, pool

    def cert_verify(self, conn: HTTPConnectionPool, url: str, verify: bool | str,
                    cert: str | tuple[str, str] | None) -> None:
        super().cert_verify(conn, url, verify, cert)  # type: ignore[no-untyped-call]  # its checks kept
        if isinstance(conn, HTTPSConnectionPool) and self._context(urlsplit(url).scheme, verify, cert):
            conn.ca_certs = conn.ca_cert_dir = None  # in the pool's context already

    def _context(self, scheme: str, verify: bool | str, cert: object) -> ssl.SSLContext | None:
        """The verifying context for ``verify`` (a bundle's path, or True: requests' default
        bundle), made once; None for plain http, no verification or a client certificate."""
        if scheme.lower() != "https" or not verify or cert:
            return None
        where = verify if isinstance(verify, str) else DEFAULT_CA_BUNDLE_PATH
        with self._contexts_lock:
            if where not in self._contexts:
                self._contexts[where] = _verifying_context(where)
            return self._contexts[where]


def _verifying_context(where: str) -> ssl.SSLContext | None:
    """urllib3's context for a verified connection with the bundle (file or directory) at
    ``where`` loaded; None where it cannot be read or parsed (urllib3 then says why)."""
    import os

    from urllib3.util.ssl_ import create_urllib3_context

    context = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED)
    try:
        if os.path.isdir(where):
            context.load_verify_locations(capath=where)
        else:
            context.load_verify_locations(cafile=where)
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return None
    return context


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
        adapter = _WatchedAdapter()
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def get(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        allow: frozenset[int] = frozenset(),
    ) -> Reply:
        """GET with retries; a 2xx reply, one whose status is in ``allow`` (304, 401), or DataError.
        The whole call, retries and back-off included, ends within ``total_timeout_s``."""
        return self._request("GET", url, headers, allow)

    def head(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        allow: frozenset[int] = frozenset(),
    ) -> Reply:
        """HEAD, with ``get``'s retries, budget and redirect rules; the reply's body is empty."""
        return self._request("HEAD", url, headers, allow)

    def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        data: bytes | None = None,
        allow: frozenset[int] = frozenset(),
        secret_body: bool = False,
    ) -> Reply:
        """Any idempotent request (a registry's manifest PUT, a token POST) with ``get``'s
        retries, budget and redirect rules; ``data`` is sent again on each try. A
        ``secret_body`` (a token grant's form) is never sent to another origin: a 307/308 there
        is refused, a 301/302/303 becomes a GET without it (RFC 9110 15.4)."""
        return self._request(method, url, headers, allow, data, secret_body)

    def _request(self, method: str, url: str, headers: Mapping[str, str] | None,
                 allow: frozenset[int], data: bytes | None = None, secret_body: bool = False) -> Reply:
        reason = ""
        with _Deadline(self.policy.total_timeout_s) as deadline:
            for attempt in range(self.policy.attempts):
                try:
                    return self._get_once(method, url, dict(headers or {}), allow, deadline, data,
                                          secret_body)
                except _Retry as retry:
                    if deadline.expired or deadline.remaining() <= 0:
                        raise self._too_slow(url) from retry
                    reason = retry.reason
                    if attempt + 1 < self.policy.attempts:
                        delay = retry.delay_s or self.policy.backoff_s * 2**attempt
                        if delay >= deadline.remaining():
                            raise self._too_slow(url) from retry
                        if self._log is not None:
                            self._log(redact(f"retrying {url} in {delay:.1f} s ({reason})"))
                        self._sleep(delay)
        raise DataError(
            f"giving up on {url} after {self.policy.attempts} attempts ({reason})",
            hint="the index may be down or unreachable; retry later",
        )

    def _too_slow(self, url: str) -> DataError:
        return DataError(
            f"{url} did not answer in full within {self.policy.total_timeout_s:g} s "
            "(connect, TLS, headers and body)",
            hint="the server is stalled or trickling; retry later or use another index or mirror",
        )

    def _get_once(self, method: str, url: str, headers: dict[str, str], allow: frozenset[int],
                  deadline: _Deadline, data: bytes | None = None, secret_body: bool = False) -> Reply:
        for _ in range(self.policy.max_redirects + 1):
            response = self._send(method, url, headers, deadline, data)
            with response:
                if response.is_redirect:
                    target = urljoin(url, response.headers["Location"])
                    check_redirect(url, target)
                    method, headers, data = redirected(response.status_code, method, headers, data)
                    if _origin(target) != _origin(url):
                        # A token or password is for the server it was given to, not for
                        # wherever that server sends us: no header, no form that holds one.
                        if data is not None and secret_body:
                            raise DataError(
                                f"refusing to send credentials to another origin: {_shown(url)} "
                                f"redirected the request ({response.status_code}) to {_shown(target)}",
                                hint="credentials go only to the server they were given for; "
                                     "check the registry's token realm")
                        headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
                    url = target
                    continue
                return self._reply(url, response, ranged="Range" in headers, allow=allow,
                                   deadline=deadline)
        raise DataError(f"too many redirects from {url}")

    def _send(self, method: str, url: str, headers: dict[str, str],
              deadline: _Deadline, data: bytes | None = None) -> requests.Response:
        self.requests_made += 1
        left = max(deadline.remaining(), 0.001)
        timeout = (min(self.policy.connect_timeout_s, left), min(self.policy.read_timeout_s, left))
        try:
            return self._session.request(
                method,
                url,
                headers=headers,
                data=data,
                timeout=timeout,
                verify=self._verify,
                allow_redirects=False,
                stream=True,
            )
        except requests.exceptions.SSLError as exc:
            if deadline.expired:  # the watchdog cut the handshake or a TLS read
                raise _Retry("deadline passed") from exc
            if not is_verification_failure(exc):  # no certificate was judged: no TLS spoken there
                raise DataError(f"no TLS handshake with {url}: {exc}",
                                hint="the server may not speak TLS at that address") from exc
            raise DataError(
                f"TLS verification failed for {url}: {exc}",
                hint="set PIP_CERT or REQUESTS_CA_BUNDLE to your CA bundle",
            ) from exc
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc

    def _reply(
        self, url: str, response: requests.Response, *, ranged: bool, deadline: _Deadline,
        allow: frozenset[int] = frozenset(),
    ) -> Reply:
        if deadline.expired:
            # The watchdog cut the headers short: what arrived is no reply (a 200 without its
            # length, an empty body that reads as "not JSON").
            raise _Retry("deadline passed")
        status = response.status_code
        if status in RETRY_STATUSES:
            raise _Retry(f"HTTP {status}", self._retry_after(url, response))
        if status in allow:
            body = b"" if status == 304 else self._read_body(url, response, deadline)
            return Reply(url=url, status=status, headers=CaseInsensitiveDict(response.headers), body=body)
        if not 200 <= status < 300:
            raise DataError(f"HTTP {status} {server_text(response.reason or '')} for {url}")
        if ranged and status == 200:
            # A server that ignores Range would send the whole wheel: hundreds of MB.
            raise DataError(
                f"{url} ignored the HTTP Range request",
                hint="use an index whose file host supports range requests or PEP 658",
            )
        body = self._read_body(url, response, deadline)
        headers = CaseInsensitiveDict(response.headers)
        return Reply(url=url, status=status, headers=headers, body=body)

    def _read_body(self, url: str, response: requests.Response, deadline: _Deadline) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_content(64 * 1024):
                size += len(chunk)
                self.bytes_received += len(chunk)
                if size > self.policy.max_body_bytes:
                    raise DataError(f"{url} sent more than {self.policy.max_body_bytes} bytes")
                if deadline.remaining() <= 0:
                    raise _Retry("deadline passed")
                chunks.append(chunk)
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                requests.exceptions.SSLError) as exc:
            # A connection cut mid-body (fewer bytes than Content-Length) is transient: retried.
            if deadline.expired:
                raise _Retry("deadline passed") from exc
            raise _Retry(f"connection cut while reading the body: {type(exc).__name__}: {exc}") from exc
        if deadline.expired:  # a body without a length ends where the watchdog cut it
            raise _Retry("deadline passed")
        return b"".join(chunks)

    def _retry_after(self, url: str, response: requests.Response) -> float | None:
        delay = parse_retry_after(response.headers.get("Retry-After"))
        if delay is not None and delay > self.policy.max_retry_after_s:
            raise DataError(
                f"{url} is rate limited (Retry-After {delay:.0f} s)",
                hint="retry later or authenticate with the index",
            )
        return delay



def is_verification_failure(exc: BaseException) -> bool:
    """Whether a TLS error is a certificate that failed verification (untrusted, expired, for
    another name), not a handshake that never happened (a plain-http server, a reset)."""
    text = str(exc)
    return "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text \
        or "doesn't match" in text or "hostname mismatch" in text.lower()


def speaks_tls(url: str, *, timeout: float) -> bool | None:
    """Whether the server of an https ``url`` answers a TLS hello within ``timeout`` seconds
    (connect and handshake together): True where it does (or refuses it with a TLS alert);
    False where nothing answers so: a plain-http server's reply, a hang-up, silence (a TLS
    server answers a hello at once; an HTTP server may wait for a line), no listener; None
    where it was not asked: a proxy is in the way, or ``url`` is not https.

    Nothing is verified (no CA is loaded, no request follows on this connection): the probe
    costs a connection where a verified attempt at a plain-http server first parses the whole
    CA bundle (~35 ms of CPU that holds the interpreter lock, beside uv's run in ``lock``)
    only to meet an HTTP reply. A caller still verifies every connection it makes over TLS."""
    parts = urlsplit(url)
    try:
        port = parts.port or 443
    except ValueError:
        return None
    if parts.scheme != "https" or not parts.hostname \
            or requests.utils.get_environ_proxies(url):  # the session would go through the proxy
        return None
    hello = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    hello.check_hostname = False
    hello.verify_mode = ssl.CERT_NONE
    with _Deadline(timeout) as deadline:
        try:
            raw = socket.create_connection((parts.hostname, port), timeout=timeout)
        except OSError:  # refused, unreachable, no such name, no answer
            return False
        with raw:
            deadline.watch(raw)  # a server trickling its hello is cut at the deadline
            try:
                with hello.wrap_socket(raw, server_hostname=parts.hostname):
                    return True
            except ssl.SSLError as exc:  # an alert is TLS spoken; a record that is not TLS is not
                return not deadline.expired and "ALERT" in str(exc.reason or "")
            except OSError:  # reset, closed, or silent past the deadline
                return False


_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


def redirected(status: int, method: str, headers: dict[str, str],
               data: bytes | None) -> tuple[str, dict[str, str], bytes | None]:
    """The request a redirect asks for (RFC 9110 15.4): 303 is a GET (HEAD stays HEAD), a
    POST answered 301 or 302 becomes a GET as every user agent makes it, both without the
    body or its headers; 307 and 308 keep the method and the body."""
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        kept = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-length")}
        return "GET", kept, None
    return method, headers, data


def _shown(url: str) -> str:
    """A URL as a message shows it: its origin and path, no query (it may carry a credential)."""
    parts = urlsplit(url)
    return redact(f"{parts.scheme}://{parts.netloc}{parts.path}")


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.rpartition("@")[2].lower()


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
