"""One verifying TLS context per CA bundle in the HTTP client (envbuild/upstream/http_client.py).

Left to urllib3, every new TLS connection parses the whole CA bundle again (~25-35 ms of CPU for a
system bundle): eight at once where ``lock``'s hash check reads eight index pages. Servers here
are https on 127.0.0.1 behind trustme certificates; ``counting_ca_loads`` sees every bundle a
context parses. What must not change: every connection is still verified, against that bundle.
"""

from __future__ import annotations

import http.server
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import served
from test_registry_probe import counting_ca_loads

from envbuild.errors import DataError
from envbuild.upstream.http_client import HttpClient, HttpPolicy

trustme = pytest.importorskip("trustme")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "http_proxy", "HTTP_PROXY",
                 "no_proxy", "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


class Slow(http.server.BaseHTTPRequestHandler):
    """Holds each reply until ``HELD`` requests are in: that many connections at once."""

    protocol_version = "HTTP/1.1"
    HELD = 1
    arrived = threading.Semaphore(0)
    lock = threading.Lock()
    count = 0

    def do_GET(self) -> None:
        with Slow.lock:
            Slow.count += 1
            if Slow.count >= Slow.HELD:
                for _ in range(Slow.HELD):
                    Slow.arrived.release()
        Slow.arrived.acquire(timeout=10)
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def server_context(authority: Any, name: str = "127.0.0.1") -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert(name).configure_cert(context)
    return context


def bundle(authority: Any, tmp_path: Path) -> Path:
    path = tmp_path / "bundle.pem"
    authority.cert_pem.write_to_path(str(path))
    return path


def get_all(client: HttpClient, urls: list[str]) -> list[object]:
    """Each URL on a thread of its own, all at once; the replies' bodies or the errors."""
    found: list[object] = [None] * len(urls)

    def one(i: int) -> None:
        try:
            found[i] = client.get(urls[i]).body
        except DataError as exc:
            found[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(urls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return found


def test_six_connections_at_once_parse_the_bundle_once(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    authority = trustme.CA()
    pem = bundle(authority, tmp_path)
    monkeypatch.setattr(Slow, "HELD", 6)
    monkeypatch.setattr(Slow, "count", 0)
    monkeypatch.setattr(Slow, "arrived", threading.Semaphore(0))
    with served(Slow, tls=server_context(authority)) as host:
        loads = counting_ca_loads(monkeypatch)
        client = HttpClient(env={"PIP_CERT": str(pem)}, policy=HttpPolicy(total_timeout_s=20))
        urls = [f"https://{host}/page/{i}" for i in range(6)]
        assert get_all(client, urls) == [f"/page/{i}".encode() for i in range(6)]
        assert Slow.count == 6  # six requests, held until all were in: six connections
        assert loads == [str(pem)]  # where each connection parsed it before


def test_every_connection_is_still_verified(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trusted, stranger = trustme.CA(), trustme.CA()
    pem = bundle(trusted, tmp_path)
    client = HttpClient(env={"PIP_CERT": str(pem)}, policy=HttpPolicy(total_timeout_s=10, attempts=1))
    with served(Slow, tls=server_context(trusted)) as host:
        assert client.get(f"https://{host}/ok").body == b"/ok"
    # Another CA's certificate, then the trusted CA's for another name: refused by the same client.
    for server in (server_context(stranger), server_context(trusted, "elsewhere.example")):
        with served(Slow, tls=server) as host, pytest.raises(DataError, match="TLS verification failed"):
            client.get(f"https://{host}/x")


def test_a_bundle_that_cannot_be_parsed_is_the_error_it_was(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    authority = trustme.CA()
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    client = HttpClient(env={"PIP_CERT": str(broken)}, policy=HttpPolicy(total_timeout_s=10, attempts=1))
    with served(Slow, tls=server_context(authority)) as host, pytest.raises(DataError) as raised:
        client.get(f"https://{host}/x")
    assert host in raised.value.message and "\n" not in raised.value.one_line()
