"""The package-index client (envbuild.upstream: simple_api, http_client, remote_zip, pipconfig,
torch_facts) against a local index: JSON pages, range requests, retries, errors.

The server runs on 127.0.0.1 in a thread and serves wheels built here with zipfile,
honouring Range headers and counting the bytes it sends.
"""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import http.server
import io
import json
import os
import random
import re
import socket
import struct
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from envbuild.errors import DataError
from envbuild.upstream import http_client, pipconfig, remote_zip, simple_api, torch_facts

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- fake index

Response = tuple[int, dict[str, str], bytes]


@dataclass
class FakeIndex:
    """What the local server serves, and what it saw."""

    base: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # path → bytes, Range honoured
    pages: dict[str, bytes] = field(default_factory=dict)  # path → JSON page body
    scripted: dict[str, list[Response]] = field(default_factory=dict)  # served first
    ignore_range: bool = False
    bytes_sent: dict[str, int] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.base + path

    def sent(self, path: str) -> int:
        return self.bytes_sent.get(path, 0)


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end] inclusive from ``bytes=a-b`` / ``bytes=-n`` / ``bytes=a-``."""
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", header or "")
    if not match:
        return None
    first, last = match.groups()
    if not first:
        return max(0, size - int(last)), size - 1
    return int(first), min(int(last), size - 1) if last else size - 1


def _handler(index: FakeIndex) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:
            path = self.path
            index.requests.append((path, self.headers.get("Range")))
            if index.scripted.get(path):
                self._send(*index.scripted[path].pop(0))
            elif path in index.pages:
                self._send(200, {"Content-Type": simple_api.SIMPLE_JSON}, index.pages[path])
            elif path in index.files:
                self._send_file(index.files[path])
            else:
                self._send(404, {}, b"not found")

        def _send_file(self, data: bytes) -> None:
            span = None if index.ignore_range else _range(self.headers.get("Range"), len(data))
            if span is None:
                self._send(200, {}, data)
                return
            start, end = span
            headers = {"Content-Range": f"bytes {start}-{end}/{len(data)}"}
            self._send(206, headers, data[start : end + 1])

        def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # Count before writing: the client may finish reading before this thread resumes.
            index.bytes_sent[self.path] = index.bytes_sent.get(self.path, 0) + len(body)
            # The client may hang up on purpose (a refused whole-file reply).
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

    return Handler


@pytest.fixture
def index() -> Iterator[FakeIndex]:
    fake = FakeIndex()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


def client_for(index: FakeIndex, **kwargs: Any) -> simple_api.IndexClient:
    sleeps: list[float] = kwargs.pop("sleeps", [])
    return simple_api.IndexClient(index.url("/simple/"), env={}, sleep=sleeps.append, **kwargs)


# --------------------------------------------------------------------------- wheels


def metadata_text(name: str, version: str, requires: list[str]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += ["Requires-Python: >=3.10", *(f"Requires-Dist: {r}" for r in requires)]
    return "\n".join(lines) + "\n\nA description long enough to be worth deflating. " * 20


def build_wheel(
    name: str,
    version: str,
    metadata: str,
    *,
    layout: str = "last",
    members: int = 200,
    payload: int = 2_000_000,
) -> bytes:
    """A real zip wheel; ``layout`` puts *.dist-info last, first or in the middle."""
    dist_info = f"{name}-{version}.dist-info"
    meta = [(f"{dist_info}/METADATA", metadata.encode()), (f"{dist_info}/WHEEL", b"Wheel: 1\n")]
    body = [(f"{name}/m{i:06d}.py", b"x = 1\n") for i in range(members)]
    body.insert(1, (f"{name}/_C.so", random.Random(0).randbytes(payload)))
    if layout == "first":
        entries = meta + body
    elif layout == "middle":
        entries = body[: len(body) // 2] + meta + body[len(body) // 2 :]
    else:
        entries = body + meta
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, content in entries:
            stored = member.endswith(".so")  # big random bytes do not deflate
            archive.writestr(member, content, zipfile.ZIP_STORED if stored else None)
    return buffer.getvalue()


def page(files: list[dict[str, Any]]) -> bytes:
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "x", "files": files}).encode()


def file_entry(index: FakeIndex, filename: str, **extra: Any) -> dict[str, Any]:
    return {"filename": filename, "url": index.url(f"/files/{filename}"), "hashes": {}, **extra}


def publish(index: FakeIndex, project: str, wheels: dict[str, bytes], **extra: Any) -> None:
    index.pages[f"/simple/{project}/"] = page([file_entry(index, filename, **extra) for filename in wheels])
    for filename, data in wheels.items():
        index.files[f"/files/{filename}"] = data


# --------------------------------------------------------------------------- range reads


@pytest.mark.parametrize("layout", ["last", "first", "middle"])
def test_metadata_by_range_requests_equals_the_member(index: FakeIndex, layout: str) -> None:
    text = metadata_text("demo", "1.0", ["torch==2.4.0"])
    wheel = build_wheel("demo", "1.0", text, layout=layout, members=3000)
    filename = "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    publish(index, "demo", {filename: wheel})
    client = client_for(index, tail_bytes=8 * 1024)  # directory ≈ 150 KB: bigger than the tail

    (found,) = client.list_wheels("demo")
    read = client.wheel_metadata(found)

    assert read.text == text
    assert read.method == "range"
    assert read.bytes_transferred == index.sent(f"/files/{filename}")
    assert read.bytes_transferred < len(wheel) // 10


def test_metadata_at_the_end_costs_only_the_tail(index: FakeIndex) -> None:
    text = metadata_text("demo", "1.0", [])
    wheel = build_wheel("demo", "1.0", text, layout="last", members=3000)
    filename = "demo-1.0-py3-none-any.whl"
    publish(index, "demo", {filename: wheel})
    client = client_for(index, tail_bytes=8 * 1024)

    read = client.wheel_metadata(client.list_wheels("demo")[0])

    # Tail plus one member: no request for the directory's head.
    assert read.text == text
    assert [r for _, r in index.requests if r] == ["bytes=-8214", read_range(index)]
    assert read.bytes_transferred < 8214 + len(text.encode())


def read_range(index: FakeIndex) -> str:
    return next(r for _, r in index.requests if r and not r.startswith("bytes=-"))


@pytest.fixture(scope="module")
def zip64_wheel() -> tuple[bytes, str]:
    text = metadata_text("big", "1.0", ["torch==2.5.1"])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(0x10001):  # more entries than the classic end record can count
            archive.writestr(f"big/d{i:05x}", b"")
        archive.writestr("big-1.0.dist-info/METADATA", text, zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    assert data[-22:-18] == b"PK\x05\x06" and b"PK\x06\x06" in data[-200:]
    # zipfile only sets the entry count to 0xFFFF; mark size and offset "see zip64" too,
    # as a writer past 4 GiB would, so that only the zip64 record can locate the directory.
    data = data[:-10] + b"\xff" * 8 + data[-2:]
    with zipfile.ZipFile(io.BytesIO(data)) as check:  # still a valid zip for zipfile
        assert check.read("big-1.0.dist-info/METADATA").decode() == text
    return data, text


def test_zip64_wheel(index: FakeIndex, zip64_wheel: tuple[bytes, str]) -> None:
    wheel, text = zip64_wheel
    publish(index, "big", {"big-1.0-py3-none-any.whl": wheel})
    client = client_for(index)

    read = client.wheel_metadata(client.list_wheels("big")[0])

    assert read.text == text
    assert read.bytes_transferred < len(wheel) // 20


def test_server_ignoring_range_is_refused(index: FakeIndex) -> None:
    publish(index, "demo", {"demo-1.0-py3-none-any.whl": build_wheel("demo", "1.0", "x")})
    index.ignore_range = True
    client = client_for(index)

    with pytest.raises(DataError, match="ignored the HTTP Range"):
        client.wheel_metadata(client.list_wheels("demo")[0])


def test_not_a_zip_raises(index: FakeIndex) -> None:
    publish(index, "demo", {"demo-1.0-py3-none-any.whl": b"<html>oops</html>" * 10})
    client = client_for(index)

    with pytest.raises(DataError, match="end-of-central-directory"):
        client.wheel_metadata(client.list_wheels("demo")[0])


def test_zip64_extra_field_replaces_placeholders() -> None:
    extra = struct.pack("<2H", 0x7075, 1) + b"x" + struct.pack("<2H3Q", 1, 24, 5_000_000_000, 7, 9)
    values = remote_zip._zip64_values(extra, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    assert values == (5_000_000_000, 7, 9)
    # Only the fields that hold the placeholder are in the extra field, in order.
    assert remote_zip._zip64_values(struct.pack("<2HQ", 1, 8, 6_000_000_000), 10, 20, 0xFFFFFFFF) == (
        10,
        20,
        6_000_000_000,
    )


# --------------------------------------------------------------------------- PEP 658


@pytest.mark.parametrize("key", ["core-metadata", "dist-info-metadata"])
def test_advertised_metadata_file_is_used(index: FakeIndex, key: str) -> None:
    text = metadata_text("demo", "1.0", [])
    filename = "demo-1.0-py3-none-any.whl"
    digest = hashlib.sha256(text.encode()).hexdigest()
    publish(index, "demo", {filename: build_wheel("demo", "1.0", text)}, **{key: {"sha256": digest}})
    index.files[f"/files/{filename}.metadata"] = text.encode()
    client = client_for(index)

    read = client.wheel_metadata(client.list_wheels("demo")[0])

    assert (read.text, read.method) == (text, "pep658")
    assert read.bytes_transferred == len(text.encode())
    assert f"/files/{filename}" not in [path for path, _ in index.requests]


def test_advertised_metadata_with_wrong_hash_raises(index: FakeIndex) -> None:
    filename = "demo-1.0-py3-none-any.whl"
    publish(index, "demo", {filename: b""}, **{"core-metadata": {"sha256": "0" * 64}})
    index.files[f"/files/{filename}.metadata"] = b"Name: demo\n"
    client = client_for(index)

    with pytest.raises(DataError, match="sha256"):
        client.wheel_metadata(client.list_wheels("demo")[0])


# --------------------------------------------------------------------------- HTTP faults


def test_503_then_200_is_retried(index: FakeIndex) -> None:
    publish(index, "demo", {"demo-1.0-py3-none-any.whl": b""})
    index.scripted["/simple/demo/"] = [(503, {}, b"busy"), (503, {"Retry-After": "2"}, b"")]
    sleeps: list[float] = []
    client = client_for(index, sleeps=sleeps)

    wheels = client.list_wheels("demo")

    assert [w.filename for w in wheels] == ["demo-1.0-py3-none-any.whl"]
    assert sleeps == [0.5, 2.0]  # backoff, then the server's Retry-After


def test_retries_run_out(index: FakeIndex) -> None:
    index.scripted["/simple/demo/"] = [(503, {}, b"")] * 4
    client = client_for(index)

    with pytest.raises(DataError, match=r"after 4 attempts \(HTTP 503\)"):
        client.list_wheels("demo")


def test_retry_after_beyond_the_cap_raises_at_once(index: FakeIndex) -> None:
    index.scripted["/simple/demo/"] = [(429, {"Retry-After": "3600"}, b"")]
    sleeps: list[float] = []
    client = client_for(index, sleeps=sleeps)

    with pytest.raises(DataError, match="rate limited"):
        client.list_wheels("demo")
    assert sleeps == []


def test_404_raises_data_error(index: FakeIndex) -> None:
    with pytest.raises(DataError, match="HTTP 404") as caught:
        client_for(index).list_wheels("no-such-project")
    assert caught.value.exit_code == 4


def test_redirect_within_http_is_followed(index: FakeIndex) -> None:
    publish(index, "demo", {"demo-1.0-py3-none-any.whl": b""})
    index.scripted["/simple/Demo/"] = [(301, {"Location": "/simple/demo/"}, b"")]
    client = simple_api.IndexClient(index.url("/simple"), env={})

    # canonicalize_name gives "demo" anyway; call get() to exercise the redirect.
    reply = client.get(index.url("/simple/Demo/"))

    assert reply.url == index.url("/simple/demo/")


def test_blackhole_server_times_out() -> None:
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        policy = http_client.HttpPolicy(connect_timeout_s=0.5, read_timeout_s=0.3, attempts=2)
        port = listener.getsockname()[1]
        client = simple_api.IndexClient(
            f"http://127.0.0.1:{port}/simple/", env={}, policy=policy, sleep=lambda _: None
        )

        with pytest.raises(DataError, match="after 2 attempts"):
            client.list_wheels("demo")


# A raw server on 127.0.0.1 that answers each connection with ``serve(connection)``.


@contextlib.contextmanager
def raw_server(serve: Any) -> Iterator[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()
    hits: list[int] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            hits.append(1)
            threading.Thread(target=_serve_one, args=(serve, connection, stop), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/simple/"
    finally:
        stop.set()
        thread.join()
        listener.close()


def _serve_one(serve: Any, connection: socket.socket, stop: threading.Event) -> None:
    with connection, contextlib.suppress(OSError):
        connection.recv(65536)  # the request
        serve(connection, stop)


def trickle(data: bytes) -> Any:
    """Send ``data`` one byte every 0.5 s: no single read ever times out."""
    def serve(connection: socket.socket, stop: threading.Event) -> None:
        for byte in data:
            if stop.wait(0.5):
                return
            connection.sendall(bytes([byte]))
    return serve


PAGE = b'{"meta": {"api-version": "1.1"}, "files": []}'
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.pypi.simple.v1+json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(PAGE))


@pytest.mark.parametrize(("name", "serve"), [
    ("headers", trickle(HEAD + PAGE)),
    ("body", lambda c, stop: (c.sendall(HEAD), trickle(PAGE)(c, stop))),
])
def test_a_trickling_server_fails_within_the_budget(name: str, serve: Any) -> None:
    """docs/faults.md E16: the budget covers connect, headers and body, whatever the read timeout."""
    policy = http_client.HttpPolicy(connect_timeout_s=1.0, read_timeout_s=5.0, total_timeout_s=2.0,
                                    attempts=3, backoff_s=0.01)
    with raw_server(serve) as url:
        client = simple_api.IndexClient(url, env={}, policy=policy, sleep=lambda _: None)
        started = time.monotonic()
        with pytest.raises(DataError, match=r"within 2 s \(connect, TLS, headers and body\)") as caught:
            client.get(url + "demo/")
        took = time.monotonic() - started
    assert caught.value.exit_code == 4
    assert took < 2.0 + 1.0, took


def test_a_stalled_tls_handshake_fails_within_the_budget() -> None:
    """docs/faults.md E16: the budget covers the handshake too, whatever the socket timeouts."""
    policy = http_client.HttpPolicy(connect_timeout_s=10.0, read_timeout_s=30.0, total_timeout_s=1.5,
                                    attempts=2, backoff_s=0.01)
    with socket.socket() as listener:  # accepts, never says a word of TLS
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"https://127.0.0.1:{listener.getsockname()[1]}/simple/"
        client = simple_api.IndexClient(url, env={}, policy=policy, sleep=lambda _: None)
        started = time.monotonic()
        with pytest.raises(DataError, match=r"within 1.5 s") as caught:
            client.get(url + "demo/")
        took = time.monotonic() - started
    assert caught.value.exit_code == 4
    assert took < 1.5 + 1.0, took


def test_a_connection_cut_mid_body_is_retried_then_exit_4() -> None:
    """docs/faults.md E17: fewer bytes than Content-Length, then a close: retried, then 4."""
    def cut(connection: socket.socket, stop: threading.Event) -> None:
        connection.sendall(HEAD + PAGE[:10])

    log: list[str] = []
    policy = http_client.HttpPolicy(connect_timeout_s=1.0, read_timeout_s=2.0, attempts=3, backoff_s=0.01)
    with raw_server(cut) as url:
        client = simple_api.IndexClient(url, env={}, policy=policy, sleep=lambda _: None, log=log.append)
        with pytest.raises(DataError, match="after 3 attempts") as caught:
            client.get(url + "demo/")
    assert caught.value.exit_code == 4
    assert len(log) == 2 and all("connection cut while reading the body" in line for line in log)


def test_a_connection_cut_once_is_retried_and_succeeds() -> None:
    served: list[int] = []

    def cut_once(connection: socket.socket, stop: threading.Event) -> None:
        served.append(1)
        connection.sendall(HEAD + (PAGE[:10] if len(served) == 1 else PAGE))

    policy = http_client.HttpPolicy(connect_timeout_s=1.0, read_timeout_s=2.0, attempts=3, backoff_s=0.01)
    with raw_server(cut_once) as url:
        client = simple_api.IndexClient(url, env={}, policy=policy, sleep=lambda _: None)
        assert client.get(url + "demo/").body == PAGE
    assert len(served) == 2


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("https://index.example/simple/x/", "http://index.example/simple/x/", False),
        ("https://index.example/simple/x/", "ftp://index.example/x", False),
        ("https://index.example/simple/x/", "https://files.example/x.whl", True),
        ("http://127.0.0.1/simple/x/", "http://127.0.0.1/simple/y/", True),
        ("http://127.0.0.1/simple/x/", "https://127.0.0.1/simple/x/", True),
    ],
)
def test_redirect_check(source: str, target: str, allowed: bool) -> None:
    if allowed:
        http_client.check_redirect(source, target)
    else:
        with pytest.raises(DataError, match="refusing redirect"):
            http_client.check_redirect(source, target)


# --------------------------------------------------------------------------- JSON pages


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"meta": {"api-version": "1.1"}, "files": [', "not JSON"),
        (b"<html><body>Service unavailable</body></html>", "not JSON"),
        (b'{"meta": {"api-version": "1.1"}, "wheels": []}', "'files'"),
        (b'{"meta": {"api-version": "2.0"}, "files": []}', "api-version"),
        (b'{"meta": {"api-version": "1.0"}, "files": [{"url": "/x.whl"}]}', "'filename'"),
        (b"[]", "'files'"),
    ],
)
def test_bad_page_raises(index: FakeIndex, body: bytes, message: str) -> None:
    index.pages["/simple/demo/"] = body

    with pytest.raises(DataError, match=message):
        client_for(index).list_wheels("demo")


def test_page_parsing_resolves_urls_and_skips_non_wheels() -> None:
    body = page(
        [
            {"filename": "demo-1.0.tar.gz", "url": "../../f/demo-1.0.tar.gz"},
            {"filename": "not a wheel.whl", "url": "x"},
            {
                "filename": "demo-1.0-2-cp311-cp311-manylinux1_x86_64.whl",
                "url": "../../f/demo.whl#sha256=00",
                "requires-python": ">=3.8",
                "size": 10,
                "yanked": "broken",
                "core-metadata": True,
            },
        ]
    )

    (wheel,) = simple_api.parse_simple_page(body, page_url="https://i.example/simple/demo/", project="demo")

    assert wheel.url == "https://i.example/f/demo.whl#sha256=00"
    assert (wheel.version, wheel.build, wheel.platform) == (
        Version("1.0"),
        (2, ""),
        "manylinux1_x86_64",
    )
    assert (wheel.requires_python, wheel.size, wheel.yanked) == (">=3.8", 10, True)
    assert (wheel.metadata_advertised, wheel.metadata_sha256) == (True, None)


# --------------------------------------------------------------------------- index URL


def test_index_url_flag_beats_env() -> None:
    env = {"PIP_INDEX_URL": "https://env.example/simple"}
    assert pipconfig.index_url("https://flag.example/simple", env) == "https://flag.example/simple"
    assert pipconfig.index_url(None, env) == "https://env.example/simple"


@pytest.fixture
def pip_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose pip configuration is only the file written here."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    if pipconfig.pip_config_index_url(env):
        pytest.skip("a system-wide pip configuration sets index-url on this machine")
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://config.example/simple\n")
    env["PIP_CONFIG_FILE"] = str(config)
    return env


def test_index_url_env_beats_pip_config(pip_env: dict[str, str]) -> None:
    assert pipconfig.index_url(None, pip_env) == "https://config.example/simple"
    env = {**pip_env, "PIP_INDEX_URL": "https://env.example/simple"}
    assert pipconfig.index_url(None, env) == "https://env.example/simple"


def test_index_url_falls_back_to_pips_default(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull}
    default = pipconfig.pip_default_index_url()
    assert default and default.startswith("https://")
    assert pipconfig.index_url(None, env) == default


def test_pips_default_read_from_its_source_is_the_one_pip_imported_gives() -> None:
    """lock reads pip's default index from pip's source (importing pip costs ~4 ms before uv
    starts): the same URL as pip's own module, imported."""
    from pip._internal.models.index import PyPI

    assert pipconfig._written_default_index_url() == PyPI.simple_url
    assert pipconfig.pip_default_index_url() == PyPI.simple_url


def test_pips_default_written_otherwise_is_read_from_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """(from pip imported in a second Python: tests/test_pipconfig_pip.py says why)"""
    from pip._internal.models.index import PyPI

    monkeypatch.setattr(pipconfig, "_PIP_DEFAULT", re.compile(r"^a line pip never writes$"))
    assert pipconfig._written_default_index_url() is None
    assert pipconfig.pip_default_index_url() == PyPI.simple_url


def test_index_url_rejects_non_http() -> None:
    with pytest.raises(DataError, match="not an http"):
        pipconfig.index_url("file:///srv/simple", {})


def test_parse_pip_config_list() -> None:
    text = "global.index-url='https://a.example/simple'\n:env:.cert='/x'\ngarbage\nk=[1]\n"
    assert pipconfig.parse_pip_config_list(text) == {
        "global.index-url": "https://a.example/simple",
        ":env:.cert": "/x",
    }


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PIP_CERT": "/pip.pem", "REQUESTS_CA_BUNDLE": "/req.pem"}, "/pip.pem"),
        ({"REQUESTS_CA_BUNDLE": "/req.pem"}, "/req.pem"),
        ({}, True),
    ],
)
def test_tls_verify(env: dict[str, str], expected: str | bool) -> None:
    assert pipconfig.tls_verify(env) == expected


# --------------------------------------------------------------------------- facts


@pytest.mark.parametrize(
    ("requires", "expected"),
    [
        # torch 1.13 style: unconditional, parenthesised pins, no NCCL pin
        (
            ["nvidia-cuda-runtime-cu11 (==11.7.99)", "nvidia-cudnn-cu11 (==8.5.0.96)"],
            {"cuda_runtime": "11.7.99", "cudnn": "8.5.0.96"},
        ),
        # torch 2.x style: markers for Linux x86_64; extras and other platforms ignored
        (
            [
                'nvidia-cuda-runtime-cu12==12.1.105; platform_system == "Linux" and '
                'platform_machine == "x86_64"',
                'nvidia-nccl-cu12==2.20.5; platform_system == "Linux"',
                'nvidia-cudnn-cu12==9.1.0.70; platform_system == "Windows"',
                "nvidia-nccl-cu12==9.9.9; extra == 'distributed'",
                "nvidia-cudnn-cu12>=9",
            ],
            {"cuda_runtime": "12.1.105", "nccl": "2.20.5"},
        ),
        # CUDA 13 style: the runtime comes through the cuda-toolkit meta package
        (
            [
                'cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"',
                'nvidia-cudnn-cu13==9.19.0.56; platform_system == "Linux"',
            ],
            {"cuda_runtime": "13.0.2", "cudnn": "9.19.0.56"},
        ),
        (['cuda-toolkit[cublas]==13.0.2; platform_system == "Linux"'], {}),
    ],
)
def test_cuda_pins(requires: list[str], expected: dict[str, str]) -> None:
    pins = torch_facts.cuda_pins(requires)
    assert {key: value for key, (value, _) in pins.items()} == expected


@pytest.mark.parametrize(
    ("runtime", "variant"), [("11.7.99", "cu117"), ("12.1.105", "cu121"), ("13.0.2", "cu130")]
)
def test_variant_of(runtime: str, variant: str) -> None:
    assert torch_facts.variant_of(runtime) == variant


def wheel(filename: str, *, yanked: bool = False) -> simple_api.WheelFile:
    body = page([{"filename": filename, "url": f"/{filename}", "yanked": yanked}])
    (parsed,) = simple_api.parse_simple_page(body, page_url="http://i/", project="torch")
    return parsed


def test_preferred_wheel_takes_linux_cp311_with_the_highest_build() -> None:
    wheels = [
        wheel("torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl"),
        wheel("torch-2.10.0-cp310-cp310-manylinux_2_28_x86_64.whl"),
        wheel("torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        wheel("torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl"),
        wheel("torch-2.10.0-cp311-cp311t-manylinux_2_28_x86_64.whl"),
    ]
    chosen = torch_facts.preferred_wheel(wheels)
    assert chosen.filename == "torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl"
    pure = [
        wheel("torchvision-0.29.2-py3-none-macosx_14_0_arm64.whl"),
        wheel("torchvision-0.29.2-py3-none-manylinux_2_28_x86_64.whl"),
    ]
    assert torch_facts.preferred_wheel(pure).platform == "manylinux_2_28_x86_64"


def test_releases_keep_final_unyanked_versions_since() -> None:
    wheels = [
        wheel("torch-1.12.1-cp310-cp310-manylinux1_x86_64.whl"),
        wheel("torch-2.0.0-cp310-cp310-manylinux1_x86_64.whl"),
        wheel("torch-2.1.0rc1-cp310-cp310-manylinux1_x86_64.whl"),
        wheel("torch-2.1.0-cp310-cp310-manylinux1_x86_64.whl", yanked=True),
        wheel("torch-1.13.0-cp310-cp310-manylinux1_x86_64.whl"),
    ]
    found = torch_facts.releases(wheels, since=Version("1.13.0"))
    assert [str(version) for version, _ in found] == ["1.13.0", "2.0.0"]


def torch_metadata(version: str, runtime: str) -> str:
    return metadata_text("torch", version, [f"nvidia-cuda-runtime-cu12=={runtime}"])


def test_torch_and_companion_facts_from_a_fake_index(index: FakeIndex) -> None:
    torch = {
        "torch-1.12.1-cp310-cp310-manylinux1_x86_64.whl": ("1.12.1", "12.1.105"),
        "torch-2.4.0-cp311-cp311-manylinux1_x86_64.whl": ("2.4.0", "12.1.105"),
        "torch-2.4.0-cp312-cp312-manylinux1_x86_64.whl": ("2.4.0", "12.1.105"),
        "torch-2.4.0-cp311-none-macosx_11_0_arm64.whl": ("2.4.0", "12.1.105"),
        "torch-2.5.0-cp313-cp313t-manylinux1_x86_64.whl": ("2.5.0", "12.4.127"),
        "torch-2.5.0-cp311-cp311-manylinux1_x86_64.whl": ("2.5.0", "12.4.127"),
    }
    publish(
        index,
        "torch",
        {
            name: build_wheel("torch", version, torch_metadata(version, runtime), payload=10)
            for name, (version, runtime) in torch.items()
        },
    )
    vision = {"0.19.0": "torch==2.4.0", "0.20.0": "torch (==2.5.0)", "0.13.1": "torch==1.12.1"}
    publish(
        index,
        "torchvision",
        {
            f"torchvision-{v}-cp311-cp311-manylinux1_x86_64.whl": build_wheel(
                "torchvision", v, metadata_text("torchvision", v, [r]), payload=10
            )
            for v, r in vision.items()
        },
    )
    publish(
        index,
        "torchaudio",
        {
            "torchaudio-2.4.0-cp311-cp311-manylinux1_x86_64.whl": build_wheel(
                "torchaudio",
                "2.4.0",
                metadata_text("torchaudio", "2.4.0", ["torch==2.4.0"]),
                payload=10,
            ),
            "torchaudio-2.5.0-cp311-cp311-manylinux1_x86_64.whl": build_wheel(
                "torchaudio", "2.5.0", metadata_text("torchaudio", "2.5.0", []), payload=10
            ),
        },
    )

    client, since = client_for(index), Version("2.0.0")
    torch = torch_facts.torch_facts(client, since=since)
    vision = torch_facts.companion_facts(client, "torchvision", since=since)
    audio = torch_facts.companion_facts(client, "torchaudio", since=since)
    companions = torch_facts.companions_table([fact.torch for fact in torch], vision, audio)

    assert [f.torch for f in torch] == ["2.4.0", "2.5.0"]
    first, second = torch
    assert (first.default_variant, first.python, first.free_threaded) == (
        "cu121",
        ("3.11", "3.12"),
        (),
    )
    assert first.filename == "torch-2.4.0-cp311-cp311-manylinux1_x86_64.whl"
    assert (second.default_variant, second.free_threaded) == ("cu124", ("3.13",))
    assert [
        (r.torch, r.torchvision and r.torchvision.version, r.torchaudio and r.torchaudio.version)
        for r in companions
    ] == [("2.4.0", "0.19.0", "2.4.0"), ("2.5.0", "0.20.0", None)]
    # torchvision 0.13.1 pins a torch older than `since`: the walk stops there.
    assert [f.version for f in vision] == ["0.19.0", "0.20.0"]
    assert audio[-1].torch is None and audio[-1].torch_requirement is None
    assert client.bytes_received > 0


# --------------------------------------------------------------------------- real index


@pytest.mark.network
def test_real_torch_2_4_0_pins_cuda_runtime_12_1_105() -> None:
    client = simple_api.IndexClient(pipconfig.index_url(None, os.environ), env=os.environ)
    wheels = [w for w in client.list_wheels("torch") if w.version == Version("2.4.0")]
    linux = [w for w in wheels if torch_facts.is_linux_x86_64_cpython(w)]

    read = client.wheel_metadata(torch_facts.preferred_wheel(linux))
    metadata = email.parser.HeaderParser().parsestr(read.text)
    pins = torch_facts.cuda_pins(metadata.get_all("Requires-Dist") or [])

    assert pins["cuda_runtime"][0] == "12.1.105"
    assert read.bytes_transferred < 2_000_000  # the wheel is ~800 MB


def test_pip_is_not_asked_when_no_config_file_names_index_url(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip config list` costs ~0.3 s of every lock: skipped when no file pip reads has the key."""
    files = [tmp_path / "a.conf", tmp_path / "missing.conf", tmp_path / "b.conf"]
    files[0].write_text("[global]\nextra-index-url = https://extra.example/simple\ncert = /x\n")
    files[2].write_text("[install]\n  find-links = /w\n")
    monkeypatch.setattr(pipconfig, "pip_config_files", lambda env: [str(f) for f in files])
    monkeypatch.setattr(pipconfig.subprocess, "run", lambda *a, **k: pytest.fail("pip was asked"))
    assert pipconfig.no_file_sets_index_url({}) is True
    assert pipconfig.pip_config_index_url({}) is None


@pytest.mark.parametrize("text", ["[global]\nindex-url = https://c.example/simple\n",
                                  "[install]\n  Index_URL: https://c.example/simple\n"])
def test_pip_is_asked_when_a_config_file_may_set_index_url(tmp_path: Path, text: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pip.conf").write_text(text)
    unreadable = tmp_path / "dir.conf"
    unreadable.mkdir()
    for files in ([tmp_path / "pip.conf"], [unreadable]):
        monkeypatch.setattr(pipconfig, "pip_config_files", lambda env, f=files: [str(p) for p in f])
        assert pipconfig.no_file_sets_index_url({}) is False
    monkeypatch.setattr(pipconfig, "pip_config_files", lambda env: None)  # Windows: pip is asked
    assert pipconfig.no_file_sets_index_url({}) is False


def test_pip_config_files_follow_pips_documented_locations(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "XDG_CONFIG_DIRS": f"/opt/a{os.pathsep}/opt/b", "PIP_CONFIG_FILE": str(tmp_path / "env.conf")}
    files = pipconfig.pip_config_files(env)
    assert files is not None
    assert files[0] == str(tmp_path / "env.conf")
    assert {"/opt/a/pip/pip.conf", "/opt/b/pip/pip.conf", "/etc/pip.conf",
            str(tmp_path / ".pip" / "pip.conf"), str(tmp_path / "xdg" / "pip" / "pip.conf"),
            os.path.join(sys.prefix, "pip.conf")} <= set(files)
    defaults = pipconfig.pip_config_files({"HOME": str(tmp_path)})
    assert defaults is not None and "/etc/xdg/pip/pip.conf" in defaults
    assert str(tmp_path / ".config" / "pip" / "pip.conf") in defaults
