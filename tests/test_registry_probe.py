"""The TLS probe before a loopback or insecure registry's https attempt (envbuild/upstream/
http_client.py ``speaks_tls``, envbuild/registry/client.py).

Servers on 127.0.0.1 play each answer a hello can get: plain HTTP (Python's http.server), TLS
(the same server behind a trustme certificate), a port nobody listens on, a server that
accepts and says nothing, one that trickles a TLS record a byte at a time, one that hangs up.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import served

from envbuild.registry.client import RegistryClient
from envbuild.upstream.http_client import speaks_tls

trustme = pytest.importorskip("trustme")

DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
BODY = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_V2, "layers": []}).encode()
DIGEST = "sha256:" + hashlib.sha256(BODY).hexdigest()


class _Seen:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.connections = 0


def _handler(seen: _Seen) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            seen.connections += 1
            super().setup()

        def do_HEAD(self) -> None:
            seen.requests.append(f"HEAD {self.path}")
            self.send_response(200)
            self.send_header("Content-Type", DOCKER_V2)
            self.send_header("Docker-Content-Digest", DIGEST)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()

    return Handler


@contextlib.contextmanager
def registry(tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, _Seen]]:
    """A one-manifest registry on 127.0.0.1, plain HTTP or (``tls``) HTTPS: (host:port, seen)."""
    seen = _Seen()
    with served(_handler(seen), tls) as host:
        yield host, seen


@contextlib.contextmanager
def raw_server(behave: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that hands each accepted connection to ``behave``: its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_closing(behave, conn), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _closing(behave: Callable[[socket.socket], None], conn: socket.socket) -> Callable[[], None]:
    def run() -> None:
        with conn, contextlib.suppress(OSError):
            behave(conn)
    return run


@pytest.fixture
def ca(tmp_path: Path) -> tuple[Any, ssl.SSLContext, Path]:
    """(the test CA, a server context for 127.0.0.1 it signed, a certs.d holding nothing)."""
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    return authority, context, tmp_path / "certs.d"


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "http_proxy", "HTTP_PROXY",
                 "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


def counting_ca_loads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every CA file or directory a TLS context parses from now on."""
    loads: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def load(self: ssl.SSLContext, cafile: Any = None, capath: Any = None, cadata: Any = None) -> None:
        loads.append(cafile or capath or "cadata")
        original(self, cafile, capath, cadata)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", load)
    return loads


def test_a_plain_http_server_does_not_speak_tls_and_a_tls_one_does(
        ca: tuple[Any, ssl.SSLContext, Path]) -> None:
    _, context, _ = ca
    with registry() as (plain, _), registry(context) as (secure, _):
        assert speaks_tls(f"https://{plain}/v2", timeout=2.0) is False
        assert speaks_tls(f"https://{secure}/v2", timeout=2.0) is True


def test_no_listener_and_no_answer_in_time_are_no_tls() -> None:
    """A TLS server answers a hello at once: silence (an HTTP server waiting for a line, a
    stalled one) is no TLS, decided within the timeout whatever the server trickles."""
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        closed = spare.getsockname()[1]
    assert speaks_tls(f"https://127.0.0.1:{closed}/v2", timeout=2.0) is False

    def silent(conn: socket.socket) -> None:
        conn.recv(4096)
        time.sleep(3)

    def trickling(conn: socket.socket) -> None:  # a TLS handshake record, a byte at a time
        conn.recv(4096)
        for byte in b"\x16\x03\x03\x40\x00" + b"\x02" * 64:
            conn.sendall(bytes([byte]))
            time.sleep(0.05)

    for behave in (silent, trickling):
        with raw_server(behave) as port:
            began = time.monotonic()
            assert speaks_tls(f"https://127.0.0.1:{port}/v2", timeout=0.5) is False
            assert time.monotonic() - began < 2.0, behave.__name__  # the deadline, all phases


def test_a_server_that_hangs_up_at_the_hello_speaks_no_tls() -> None:
    with raw_server(lambda conn: conn.recv(4096)) as port:
        assert speaks_tls(f"https://127.0.0.1:{port}/v2", timeout=2.0) is False


def test_a_proxy_in_the_way_or_a_url_that_is_not_https_is_not_probed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with registry() as (plain, seen):
        monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
        monkeypatch.setenv("no_proxy", "")
        assert speaks_tls(f"https://{plain}/v2", timeout=2.0) is None
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        assert speaks_tls(f"https://{plain}/v2", timeout=2.0) is False  # bypassed: asked
        assert speaks_tls(f"http://{plain}/v2", timeout=2.0) is None
        assert seen.connections == 1


def test_a_plain_http_loopback_registry_is_asked_over_http_at_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No verified https attempt first: one request, and no CA bundle parsed for it."""
    with registry() as (host, seen):
        loads = counting_ca_loads(monkeypatch)
        client = RegistryClient(host, "envbuild/tiny", env={}, certs_d=tmp_path,
                                daemon_json=tmp_path / "none")
        reply = client.manifest("HEAD", "1")
        assert reply.headers["Docker-Content-Digest"] == DIGEST
        assert client._http.requests_made == 1 and client.base == f"http://{host}/v2"
        assert seen.requests == ["HEAD /v2/envbuild/tiny/manifests/1"]
        assert loads == []


def test_a_tls_loopback_registry_is_still_asked_over_verified_https(
        monkeypatch: pytest.MonkeyPatch, ca: tuple[Any, ssl.SSLContext, Path]) -> None:
    authority, context, certs_d = ca
    with registry(context) as (host, seen):
        (certs_d / host).mkdir(parents=True)
        authority.cert_pem.write_to_path(str(certs_d / host / "ca.crt"))
        loads = counting_ca_loads(monkeypatch)
        client = RegistryClient(host, "envbuild/tiny", env={}, certs_d=certs_d,
                                daemon_json=certs_d / "none")
        reply = client.manifest("HEAD", "1")
        assert reply.headers["Docker-Content-Digest"] == DIGEST
        assert client.base == f"https://{host}/v2" and client._http.requests_made == 1
        assert seen.requests == ["HEAD /v2/envbuild/tiny/manifests/1"]
        assert str(certs_d / host / "ca.crt") in loads  # verified against the registry's CA
