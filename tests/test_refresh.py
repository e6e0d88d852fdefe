"""``envbuild matrix refresh`` against recorded upstream documents served on 127.0.0.1.

The PyTorch index, NVIDIA's redist manifests, a registry's tag list and (for the wheels
source) package-index pages and METADATA are fixtures in tests/fixtures/refresh/ (their real
formats); each upstream fault (a black hole, retries, bad documents, shrinking, partial
failure, TLS, crashes, locks …) has a test named ``test_e<N>_...``. The pypi source runs
against the real index in tests/test_refresh_network.py.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemas
import yaml

from envbuild.commands import cli
from envbuild.errors import DataError
from envbuild.upstream import journal, merge, refresh
from envbuild.upstream.http_client import HttpPolicy

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "refresh"
FAST = HttpPolicy(connect_timeout_s=1.0, read_timeout_s=1.0, total_timeout_s=5.0, attempts=3,
                  backoff_s=0.01, max_retry_after_s=5.0)
Reply = tuple[int, dict[str, str], bytes]


# --- the local upstream ---------------------------------------------------------------------


@dataclass
class Upstream:
    base: str = ""
    routes: dict[str, Reply] = field(default_factory=dict)
    scripted: dict[str, list[Reply | Callable[[], Reply]]] = field(default_factory=dict)
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, If-None-Match)

    def serve(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.routes[path] = (200, headers or {}, body)

    def script(self, path: str, *replies: Reply | Callable[[], Reply]) -> None:
        self.scripted[path] = list(replies)

    def paths(self) -> list[str]:
        return [p for p, _ in self.seen]


def _handler(up: Upstream) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            up.seen.append((self.path, self.headers.get("If-None-Match")))
            queue = up.scripted.get(self.path)
            reply = queue.pop(0) if queue else up.routes.get(self.path, (404, {}, b"not found"))
            status, headers, body = reply() if callable(reply) else reply
            etag = headers.get("ETag")
            if etag and self.headers.get("If-None-Match") == etag:
                status, body = 304, b""
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextlib.contextmanager
def serving(up: Upstream, context: ssl.SSLContext | None = None) -> Iterator[Upstream]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(up))
    server.daemon_threads = True
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    scheme = "https" if context else "http"
    up.base = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield up
    finally:
        server.shutdown()
        server.server_close()


def record_upstream(up: Upstream) -> None:
    """The recorded documents at the paths the real hosts use."""
    etag = {"ETag": '"v1"'}
    for variant in ("cpu", "cu124"):
        up.serve(f"/whl/{variant}/torch/", (FIXTURES / f"whl_{variant}_torch.html").read_bytes(), etag)
    other = (FIXTURES / "whl_other_torch.html").read_bytes()
    for variant in ("cu116", "cu117", "cu118", "cu121", "cu126", "cu128", "cu129", "cu130", "cu132"):
        up.serve(f"/whl/{variant}/torch/", other, etag)
    up.serve("/compute/cuda/redist/", (FIXTURES / "cuda_redist.html").read_bytes(), etag)
    for version in ("12.4.1", "99.1.0"):
        up.serve(f"/compute/cuda/redist/redistrib_{version}.json",
                 (FIXTURES / f"redistrib_{version}.json").read_bytes(), etag)
    up.serve("/compute/cudnn/redist/", (FIXTURES / "cudnn_redist.html").read_bytes(), etag)
    up.serve("/compute/cudnn/redist/redistrib_99.0.0.json",
             (FIXTURES / "cudnn_redistrib_99.0.0.json").read_bytes(), etag)
    up.serve("/v2/nvidia/cuda/tags/list?n=1000", (FIXTURES / "tags_page1.json").read_bytes(),
             {**etag,
              "Link": '</v2/nvidia/cuda/tags/list?last=99.1.0-runtime-ubuntu24.04&n=1000>; rel="next"'})
    up.serve("/v2/nvidia/cuda/tags/list?last=99.1.0-runtime-ubuntu24.04&n=1000",
             (FIXTURES / "tags_page2.json").read_bytes(), etag)


@pytest.fixture(scope="session")
def authority() -> Any:
    """The test CA: the upstream speaks TLS, as every real one does (data cites https only)."""
    trustme = pytest.importorskip("trustme")
    return trustme.CA()


def tls_context(authority: Any) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
def upstream(authority: Any) -> Iterator[Upstream]:
    up = Upstream()
    with serving(up, tls_context(authority)):
        record_upstream(up)
        yield up


@pytest.fixture
def data(tmp_path: Path) -> Path:
    target = tmp_path / "matrices"
    shutil.copytree(REPO / "matrices", target)
    return target


@pytest.fixture
def env(tmp_path: Path, authority: Any) -> dict[str, str]:
    ca = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    return {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path), "PATH": os.environ["PATH"],
            "PIP_CERT": str(ca)}


def options(up: Upstream, data: Path, **kw: Any) -> refresh.RefreshOptions:
    defaults: dict[str, Any] = dict(matrices=data, sources=("nvidia", "pytorch", "tags"),
                                    pytorch_url=f"{up.base}/whl/", nvidia_url=f"{up.base}/compute/",
                                    registry_url=f"{up.base}/v2/nvidia/cuda/", policy=FAST,
                                    retrieved="2026-11-21")
    return refresh.RefreshOptions(**(defaults | kw))


def argv(up: Upstream, data: Path, *extra: str) -> list[str]:
    return ["--matrices", str(data), "matrix", "refresh", "--source", "nvidia", "--source", "pytorch",
            "--source", "tags", "--pytorch-url", f"{up.base}/whl/", "--nvidia-url", f"{up.base}/compute/",
            "--registry-url", f"{up.base}/v2/nvidia/cuda/", *extra]


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def rows(directory: Path, relation: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load((directory / f"{relation}.yaml").read_text())["rows"])


def run(up: Upstream, data: Path, env: dict[str, str], **kw: Any) -> refresh.RefreshReport:
    return refresh.refresh(options(up, data, **kw), env, lambda message: None)


# --- the happy path ---------------------------------------------------------------------------


def test_refresh_adds_rows_with_provenance_and_keeps_hand_rows(
    upstream: Upstream, data: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = {r: rows(data, r) for r in ("cuda_toolkits", "cudnn", "torch_variants", "cuda_images")}

    assert cli.main(argv(upstream, data), env) == 0

    after = {r: rows(data, r) for r in before}
    for relation, old in before.items():
        assert after[relation][: len(old)] == old  # hand-sourced rows untouched, in order
    added = {r: after[r][len(before[r]):] for r in before}
    assert [(r["cuda"], r["min_driver"]) for r in added["cuda_toolkits"]] == [("99.1.0", "999.1.1")]
    assert [(r["cudnn"], r["cuda_majors"]) for r in added["cudnn"]] == [("99.0.0.1", [12, 13])]
    assert [(r["torch"], r["variant"], r["cuda"], r["python"]) for r in added["torch_variants"]] == [
        ("99.0.0", "cpu", None, ["3.11"]), ("99.0.0", "cu124", "12.4", ["3.11", "3.12"])]
    assert [(r["cuda"], r["ubuntu"], r["flavors"], r["cudnn_tag"], r.get("cudnn_flavors"))
            for r in added["cuda_images"]] == [
        ("99.1.0", "24.04", ["base", "runtime", "devel"], "cudnn", ["runtime", "devel"])]
    body = (FIXTURES / "redistrib_99.1.0.json").read_bytes()
    assert added["cuda_toolkits"][0]["source"] == (
        f"{upstream.base}/compute/cuda/redist/redistrib_99.1.0.json#sha256={hashlib.sha256(body).hexdigest()}")
    for relation in added:
        assert all(r["retrieved"] for r in added[relation])
    # Appending keeps every existing byte of a hand-written file.
    assert (data / "cudnn.yaml").read_bytes().startswith((REPO / "matrices/cudnn.yaml").read_bytes())
    manifest = json.loads((data / "manifest.json").read_text())["files"]
    assert manifest["cudnn.yaml"] == snapshot(data)["cudnn.yaml"]
    assert cli.main(["--matrices", str(data), "matrix", "validate"], env) == 0
    assert "wrote" in capsys.readouterr().out


def test_dry_run_and_json_write_nothing(upstream: Upstream, data: Path, env: dict[str, str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(data)
    assert cli.main(argv(upstream, data, "--dry-run", "--json"), env) == 0
    report = json.loads(capsys.readouterr().out)
    schemas.check("matrix-refresh.schema.json", report)
    assert report["dry_run"] and report["changes"]["cuda_toolkits"]["added"] == 1
    assert snapshot(data) == before


def test_out_writes_a_copy_and_leaves_the_source(upstream: Upstream, data: Path, env: dict[str, str],
                                                 tmp_path: Path) -> None:
    before = snapshot(data)
    out = tmp_path / "copy"
    assert cli.main(argv(upstream, data, "--out", str(out)), env) == 0
    assert snapshot(data) == before
    assert any(r["cuda"] == "99.1.0" for r in rows(out, "cuda_toolkits"))
    assert cli.main(argv(upstream, data, "--out", str(out)), env) == 2  # not empty: refused


def test_refuses_the_installed_package_data(tmp_path: Path) -> None:
    package = Path(refresh.__file__).resolve().parent
    if (package.parent / ".git").exists():
        refresh.check_writable_target(package.parent / "matrices")  # the checkout: allowed
    with pytest.raises(Exception, match="installed envbuild package") as caught:
        fake = tmp_path / "site" / "envbuild"
        (fake / "matrices").mkdir(parents=True)
        original = refresh.__file__
        try:
            refresh.__file__ = str(fake / "refresh.py")
            refresh.check_writable_target(fake / "matrices")
        finally:
            refresh.__file__ = original
    assert getattr(caught.value, "exit_code", None) == 2


def test_bad_flag_exits_2(data: Path, env: dict[str, str]) -> None:
    assert cli.main(["--matrices", str(data), "matrix", "refresh", "--source", "npm"], env) == 2


# --- upstream faults ------------------------------------------------------------------------------


def test_e1_blackhole_times_out_exit_4_data_unchanged(data: Path, env: dict[str, str]) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    try:
        up = Upstream(base=f"https://127.0.0.1:{listener.getsockname()[1]}")
        before = snapshot(data)
        started = time.monotonic()
        policy = HttpPolicy(connect_timeout_s=0.5, read_timeout_s=0.5, attempts=2, backoff_s=0.01)
        with pytest.raises(DataError, match="giving up") as caught:
            run(up, data, env, sources=("nvidia",), policy=policy)
        assert time.monotonic() - started < 20  # the default policy would wait minutes
        assert caught.value.exit_code == 4
        assert snapshot(data) == before
    finally:
        listener.close()


def test_e2_503_twice_then_200_retries_and_logs(upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    listing = upstream.routes["/compute/cuda/redist/"]
    upstream.script("/compute/cuda/redist/", (503, {}, b"busy"), (503, {}, b"busy"), listing)
    log: list[str] = []
    refresh.refresh(options(upstream, data, sources=("nvidia",)), env, log.append)
    assert sum("retrying" in line and "HTTP 503" in line for line in log) == 2
    assert any(r["cuda"] == "99.1.0" for r in rows(data, "cuda_toolkits"))


def test_e3_retry_after_2_is_honoured(upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    listing = upstream.routes["/compute/cuda/redist/"]
    upstream.script("/compute/cuda/redist/", (429, {"Retry-After": "2"}, b""), listing)
    started = time.monotonic()
    run(upstream, data, env, sources=("nvidia",))
    assert 1.9 < time.monotonic() - started < 10


def test_e3_retry_after_beyond_the_cap_exit_4(upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    upstream.script("/v2/nvidia/cuda/tags/list?n=1000", (429, {"Retry-After": "3600"}, b""))
    before = snapshot(data)
    started = time.monotonic()
    assert cli.main(argv(upstream, data), env) == 4
    assert time.monotonic() - started < 30
    assert snapshot(data) == before


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/compute/cuda/redist/redistrib_99.1.0.json", b'{"release_label": "99.1.0", "nvidia_dr', "not JSON"),
        ("/v2/nvidia/cuda/tags/list?n=1000", b'{"name": "nvidia/cuda", "tags": ["12.4', "not JSON"),
        ("/whl/cu124/torch/", b"<html><body><h1>502 Bad Gateway</h1></body></html>", "not a PEP 503"),
        ("/compute/cuda/redist/", b"<html><body>Service unavailable</body></html>", "lists no redistrib"),
    ],
)
def test_e4_truncated_document_or_error_page_with_200(upstream: Upstream, data: Path, env: dict[str, str],
                                                      path: str, body: bytes, message: str) -> None:
    upstream.serve(path, body)
    before = snapshot(data)
    with pytest.raises(DataError, match=message):
        run(upstream, data, env)
    assert snapshot(data) == before


@pytest.mark.parametrize(
    ("path", "old", "new", "field"),
    [
        ("/compute/cuda/redist/redistrib_99.1.0.json", b'"release_label"', b'"releaseLabel"',
         "release_label"),
        ("/compute/cudnn/redist/redistrib_99.0.0.json", b'"linux-x86_64"', b'"linux_x86_64"',
         "cudnn.linux-x86_64"),
        ("/v2/nvidia/cuda/tags/list?n=1000", b'"tags"', b'"tag_names"', "tags"),
    ],
)
def test_e5_renamed_field_is_named(upstream: Upstream, data: Path, env: dict[str, str],
                                   path: str, old: bytes, new: bytes, field: str) -> None:
    _, headers, body = upstream.routes[path]
    upstream.serve(path, body.replace(old, new), headers)
    before = snapshot(data)
    with pytest.raises(DataError, match=f"field '{field}'"):
        run(upstream, data, env)
    assert snapshot(data) == before


def test_e6_shrink_is_refused_then_allowed(upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    # The Cog floor case: rows recorded from the registry, then the tag list collapses.
    many = [f"99.1.0-base-ubuntu{y}.{m:02d}" for y in range(30, 80) for m in (4,)]
    upstream.serve("/v2/nvidia/cuda/tags/list?n=1000", json.dumps({"tags": many}).encode())
    run(upstream, data, env)
    assert sum(r["cuda"] == "99.1.0" for r in rows(data, "cuda_images")) == 50
    upstream.serve("/v2/nvidia/cuda/tags/list?n=1000", json.dumps({"tags": many[:1]}).encode())
    before = snapshot(data)
    with pytest.raises(DataError, match="refusing to shrink data by 98%"):
        run(upstream, data, env)
    assert snapshot(data) == before
    run(upstream, data, env, allow_shrink=True)
    assert sum(r["cuda"] == "99.1.0" for r in rows(data, "cuda_images")) == 1


def test_e7_one_of_three_sources_fails_no_partial_update(upstream: Upstream, data: Path,
                                                         env: dict[str, str]) -> None:
    upstream.script("/v2/nvidia/cuda/tags/list?n=1000", *[(500, {}, b"")] * 5)
    before = snapshot(data)
    assert cli.main(argv(upstream, data), env) == 4
    assert snapshot(data) == before  # nvidia and pytorch succeeded, yet nothing was written
    assert "/compute/cuda/redist/redistrib_99.1.0.json" in upstream.paths()


def test_e8_self_signed_certificate_is_refused(data: Path, env: dict[str, str]) -> None:
    trustme = pytest.importorskip("trustme")
    stranger = trustme.CA()  # not the CA PIP_CERT names
    up = Upstream()
    with serving(up, tls_context(stranger)):
        record_upstream(up)
        before = snapshot(data)
        with pytest.raises(DataError, match="TLS verification failed"):
            run(up, data, env, sources=("tags",))
        assert snapshot(data) == before
        with stranger.cert_pem.tempfile() as ca:  # trusted: the same server works
            run(up, data, {**env, "PIP_CERT": ca}, sources=("nvidia", "tags"))
    assert any(r["cuda"] == "99.1.0" for r in rows(data, "cuda_images"))


def test_plain_http_upstream_is_refused(data: Path, env: dict[str, str]) -> None:
    argv_http = ["--matrices", str(data), "matrix", "refresh", "--source", "tags",
                 "--registry-url", "http://127.0.0.1:9/v2/nvidia/cuda/"]
    assert cli.main(argv_http, env) == 2


def test_e9_redirect_from_https_to_http_is_refused(upstream: Upstream, data: Path,
                                                    env: dict[str, str]) -> None:
    plain = Upstream()
    with serving(plain):
        record_upstream(plain)
        upstream.script("/v2/nvidia/cuda/tags/list?n=1000",
                        (302, {"Location": f"{plain.base}/v2/nvidia/cuda/tags/list?n=1000"}, b""))
        before = snapshot(data)
        with pytest.raises(DataError, match="refusing redirect"):
            run(upstream, data, env, sources=("tags",))
        assert plain.seen == []
        assert snapshot(data) == before


CRASH = """
import os, signal, sys
from pathlib import Path
from envbuild.upstream import journal
stage = sys.argv[2]
def checkpoint(name):
    if name == stage:
        os.kill(os.getpid(), signal.SIGKILL)
journal.commit(Path(sys.argv[1]), {"cudnn.yaml": Path(sys.argv[3]).read_bytes()}, checkpoint=checkpoint)
"""


@pytest.mark.parametrize(("stage", "expected"), [("staged", "old"), ("committed", "new"), ("moved", "new")])
def test_e10_sigkill_during_the_write(data: Path, env: dict[str, str], tmp_path: Path,
                                      stage: str, expected: str) -> None:
    old = (data / "cudnn.yaml").read_bytes()
    new = old + b"# a new version of the file\n"
    (tmp_path / "new.yaml").write_bytes(new)
    done = subprocess.run([sys.executable, "-c", CRASH, str(data), stage, str(tmp_path / "new.yaml")],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == -signal.SIGKILL
    assert (data / "cudnn.yaml").read_bytes() in (old, new)
    journal.recover(data)  # what the next refresh does first
    assert (data / "cudnn.yaml").read_bytes() == (old if expected == "old" else new)
    assert not [p for p in data.iterdir() if p.name.startswith(".refresh")]
    if expected == "new":
        manifest = json.loads((data / "manifest.json").read_text())["files"]
        assert manifest["cudnn.yaml"] == hashlib.sha256(new).hexdigest()
        assert cli.main(["--matrices", str(data), "matrix", "validate"], env) == 0


def test_e11_304_not_modified_rewrites_nothing(upstream: Upstream, data: Path, env: dict[str, str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv(upstream, data), env) == 0
    mtimes = {p.name: p.stat().st_mtime_ns for p in data.iterdir()}
    upstream.seen.clear()
    capsys.readouterr()
    assert cli.main(argv(upstream, data), env) == 0
    assert "up to date" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in data.iterdir()} == mtimes
    assert upstream.seen and all(etag == '"v1"' for _, etag in upstream.seen)


def test_e12_offline_never_connects(upstream: Upstream, data: Path, env: dict[str, str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.main(argv(upstream, data, "--dry-run"), env) == 0  # fills the cache
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert cli.main(argv(upstream, data, "--offline"), env) == 0  # from the cache alone
    assert any(r["cuda"] == "99.1.0" for r in rows(data, "cuda_toolkits"))
    before = snapshot(data)
    cold = {**env, "XDG_CACHE_HOME": str(Path(env["HOME"]) / "empty-cache")}
    assert cli.main(argv(upstream, data, "--offline"), cold) == 4
    assert snapshot(data) == before
    assert attempts == []


def test_e13_second_refresh_sees_the_lock(upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    before = snapshot(data)
    with journal.refresh_lock(data, 0, lambda m: None):
        with pytest.raises(DataError, match="refresh in progress"):
            run(upstream, data, env, lock_timeout_s=0.3)
        assert cli.main(argv(upstream, data), env) == 4
    assert snapshot(data) == before
    run(upstream, data, env)  # the lock is free again


def test_e14_unknown_local_tags_are_ignored(upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    log: list[str] = []
    refresh.refresh(options(upstream, data, sources=("pytorch",)), {**env, "ENVBUILD_DEBUG": "1"}, log.append)
    added = [r for r in rows(data, "torch_variants") if r["torch"] == "99.0.0"]
    assert sorted(r["variant"] for r in added) == ["cpu", "cu124"]
    assert any("rocm6.1" in line for line in log) and any("'xpu'" in line for line in log)


# --- pieces ----------------------------------------------------------------------------------------


def test_merge_keeps_hand_rows_replaces_own_rows_and_appends_new() -> None:
    hand = {"cuda": "12.4.1", "min_driver": "550.54.15", "source": "https://docs.nvidia.com/x"}
    own = {"cuda": "12.5.0", "min_driver": "1", "source": "https://up/x#sha256=1"}
    derived = [{**hand, "source": "https://up/a"}, {**own, "min_driver": "2"}, {"cuda": "9.9.9", "source": "https://up/b"}]
    merged, change = merge.merge_rows("cuda_toolkits", [hand, own], derived, "https://up/", False)
    assert merged[0] is hand and merged[1]["min_driver"] == "2" and merged[2]["cuda"] == "9.9.9"
    assert (change.added, change.updated, change.kept_hand_sourced) == (1, 1, 1)


@pytest.mark.parametrize(("variant", "cuda"), [("cpu", None), ("cu118", "11.8"), ("cu121", "12.1"),
                                               ("cu130", "13.0")])
def test_cuda_of_variant(variant: str, cuda: str | None) -> None:
    from envbuild.upstream.sources.pytorch_index import cuda_of

    assert cuda_of(variant) == cuda


def test_token_challenge_is_answered(upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    path = "/v2/nvidia/cuda/tags/list?n=1000"
    challenge = (f'Bearer realm="{upstream.base}/token",service="registry.test",'
                 'scope="repository:nvidia/cuda:pull"')
    upstream.script(path, (401, {"WWW-Authenticate": challenge}, b""))
    upstream.serve("/token?scope=repository%3Anvidia%2Fcuda%3Apull&service=registry.test",
                   b'{"token": "t0k"}')
    run(upstream, data, env, sources=("nvidia", "tags"))
    assert any(r["cuda"] == "99.1.0" for r in rows(data, "cuda_images"))


# --- row derivation and merging, without a server ----------------------------------------


def _cudnn_manifest(*builds: str) -> Any:
    from envbuild.upstream.sources import Document

    body = {"cudnn": {"version": "8.6.0.163",
                      "linux-x86_64": {b: {"relative_path": f"x/{b}.tar.xz"} for b in builds}}}
    return Document(url="https://nv.test/cudnn/redist/redistrib_8.6.0.json", status=200,
                    headers={}, body=json.dumps(body).encode())


def test_cudnn_builds_before_cuda_11_are_out_of_scope() -> None:
    from envbuild.upstream.sources.nvidia_redistrib import cudnn_row

    row = cudnn_row(_cudnn_manifest("cuda10", "cuda11"), "2026-11-21")
    assert row is not None and row["cuda_majors"] == [11]
    assert cudnn_row(_cudnn_manifest("cuda10"), "2026-11-21") is None
    with pytest.raises(DataError, match="no cudaNN build"):
        cudnn_row(_cudnn_manifest(), "2026-11-21")


def test_merge_refreshes_provenance_and_keeps_what_the_source_does_not_derive() -> None:
    from envbuild.upstream.merge import merge_rows

    prefix = "https://nv.test/"
    hand = {"cudnn": "8.6.0.163", "cuda_majors": [11], "pip_packages": {"11": "nvidia-cudnn-cu11"},
            "source": f"{prefix}cudnn/redist/redistrib_8.6.0.json", "retrieved": "2026-01-01",
            "note": "read in a copy of the manifest"}
    fresh = {"cudnn": "8.6.0.163", "cuda_majors": [11],
             "source": f"{prefix}cudnn/redist/redistrib_8.6.0.json#sha256=ab", "retrieved": "2026-11-21",
             "note": "derived"}
    # The live document now backs the row: its provenance replaces the copy's; the
    # hand-added pip_packages, which the source does not derive, stay.
    merged, change = merge_rows("cudnn", [hand], [fresh], prefix, allow_shrink=False)
    assert change.updated == 1
    assert merged == [dict(fresh, pip_packages={"11": "nvidia-cudnn-cu11"})]
    # Read again from the same document: only the date would change, so nothing does.
    again, change = merge_rows("cudnn", merged, [dict(fresh, retrieved="2026-12-01")], prefix,
                               allow_shrink=False)
    assert again == merged and change.updated == 0


# --- the wheels source (torch_wheels.yaml) --------------------------------------------------

WHEEL_PROJECTS = ("torch", "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "nvidia-nccl-cu12",
                  "torchvision")
# A torch release the index fixtures publish, recorded by hand: torch_wheels.yaml takes its
# companions from here. Its default variant cu999 names a CUDA (99.9) no data knows.
TORCH_98 = """\
- torch: "98.0.0"
  default_variant: cu999
  python: ["3.11", "3.12"]
  torchvision: "98.1.0"
  torchaudio: null
  source: https://example.test/torch-98.0.0
  retrieved: "2026-11-21"
"""


def record_index(up: Upstream) -> None:
    for project in WHEEL_PROJECTS:
        up.serve(f"/simple/{project}/", (FIXTURES / f"simple_{project}.json").read_bytes())
    for version, pythons in (("97.0.0", ("cp311",)), ("98.0.0", ("cp311", "cp312"))):
        for python in pythons:
            up.serve(f"/files/torch-{version}-{python}-{python}-manylinux_2_28_x86_64.whl.metadata",
                     (FIXTURES / f"torch_{version}.metadata").read_bytes())


def with_torch_98(data: Path, keep_wheel_rows: int | None = 2) -> Path:
    """The data plus the hand-recorded torch 98.0.0; torch_wheels.yaml cut to its first rows."""
    with (data / "torch_pypi.yaml").open("a") as handle:
        handle.write(TORCH_98)
    if keep_wheel_rows is not None:
        text = (data / "torch_wheels.yaml").read_text()
        cut = [i for i in range(len(text)) if text.startswith("\n- torch:", i)][keep_wheel_rows]
        kept = text[: cut + 1]
        (data / "torch_wheels.yaml").write_text(kept if keep_wheel_rows else kept + "  []\n")
    return data


def wheel_options(up: Upstream, data: Path, **kw: Any) -> refresh.RefreshOptions:
    return options(up, data, **({"sources": ("wheels",), "index_url": f"{up.base}/simple/"} | kw))


def test_wheels_source_adds_sizes_and_pins_per_python(upstream: Upstream, data: Path,
                                                      env: dict[str, str]) -> None:
    record_index(upstream)
    with_torch_98(data)
    before = rows(data, "torch_wheels")
    log: list[str] = []

    report = refresh.refresh(wheel_options(upstream, data), env, log.append)

    after = rows(data, "torch_wheels")
    assert after[:2] == before  # rows it no longer derives are kept (no --allow-shrink)
    assert report.written == ("torch_wheels",)
    assert report.changes["torch_wheels"].added == 2
    py311, py312 = after[2:]
    metadata = (FIXTURES / "torch_98.0.0.metadata").read_bytes()
    digest = hashlib.sha256(metadata).hexdigest()
    assert py311 == {
        "torch": "98.0.0", "python": "3.11", "platform_tag": "manylinux_2_28_x86_64",
        "bytes": 900000311,
        "nvidia": {"nvidia-cuda-runtime-cu12": "12.4.127", "nvidia-cudnn-cu12": "9.1.0.70"},
        # The newest manylinux wheel, as pip would pick on a current glibc.
        "nvidia_bytes": {"nvidia-cuda-runtime-cu12": 884000, "nvidia-cudnn-cu12": 664000000},
        "torchvision": "98.1.0", "torchvision_bytes": 7000311,
        "files": {
            "nvidia-cuda-runtime-cu12": "pip-index:///simple/nvidia-cuda-runtime-cu12/"
                                        "#nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux_2_28_x86_64.whl",
            "nvidia-cudnn-cu12": "pip-index:///simple/nvidia-cudnn-cu12/"
                                 "#nvidia_cudnn_cu12-9.1.0.70-py3-none-manylinux2014_x86_64.whl",
            "torchvision": "pip-index:///simple/torchvision/"
                           "#torchvision-98.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"},
        "source": "pip-index:///simple/torch/#torch-98.0.0-cp311-cp311-manylinux_2_28_x86_64.whl"
                  f"&sha256={digest}",
        "retrieved": "2026-11-21",
        "note": "nvidia requirements without an exact pin: nvidia-cufft-cu12>=11",
    }
    # The NCCL pin applies to Python >= 3.12 only, and the index has no wheel of that version.
    assert py312["nvidia"]["nvidia-nccl-cu12"] == "2.21.5"
    assert "nvidia-nccl-cu12" not in py312["nvidia_bytes"]
    assert py312["note"].startswith("no Linux x86_64 wheel size for nvidia-nccl-cu12==2.21.5; ")
    assert (py312["bytes"], py312["torchvision_bytes"]) == (900000312, 7000312)
    assert not any("127.0.0.1" in line for line in (data / "torch_wheels.yaml").read_text().splitlines())
    assert any("torch 97.0.0 3.11: 0 nvidia pins" in line for line in log)  # read, but no row
    manifest = json.loads((data / "manifest.json").read_text())["files"]
    assert manifest["torch_wheels.yaml"] == snapshot(data)["torch_wheels.yaml"]


def test_wheels_source_again_reads_metadata_from_the_cache(upstream: Upstream, data: Path,
                                                           env: dict[str, str]) -> None:
    record_index(upstream)
    with_torch_98(data, keep_wheel_rows=0)
    refresh.refresh(wheel_options(upstream, data), env, lambda message: None)
    assert [(r["torch"], r["python"]) for r in rows(data, "torch_wheels")] == [
        ("98.0.0", "3.11"), ("98.0.0", "3.12")]
    before = snapshot(data)
    upstream.seen.clear()
    again = refresh.refresh(wheel_options(upstream, data), env, lambda message: None)
    assert again.up_to_date and snapshot(data) == before
    assert upstream.paths() and not [p for p in upstream.paths() if p.endswith(".metadata")]


def test_wheels_source_is_guarded_against_shrinking(upstream: Upstream, data: Path,
                                                   env: dict[str, str]) -> None:
    record_index(upstream)
    with_torch_98(data, keep_wheel_rows=None)  # every recorded row: the index lists far fewer
    before = snapshot(data)
    with pytest.raises(DataError, match="refusing to shrink data by 99%: wheels gave 2 torch_wheels"):
        refresh.refresh(wheel_options(upstream, data), env, lambda message: None)
    assert snapshot(data) == before
    refresh.refresh(wheel_options(upstream, data, allow_shrink=True), env, lambda message: None)
    assert [(r["torch"], r["python"]) for r in rows(data, "torch_wheels")] == [
        ("98.0.0", "3.11"), ("98.0.0", "3.12")]


def test_wheels_source_is_named_not_part_of_all(upstream: Upstream, data: Path, env: dict[str, str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from envbuild.commands.refresh import add_refresh_arguments, options_from_args

    def chosen(*sources: str) -> tuple[str, ...]:
        parser = argparse.ArgumentParser()
        parser.add_argument("--matrices")
        add_refresh_arguments(parser)
        args = parser.parse_args(["--matrices", str(data), *[f"--source={s}" for s in sources]])
        return options_from_args(args, env).sources

    assert chosen() == chosen("all") == refresh.SOURCES
    assert "wheels" not in refresh.SOURCES
    assert chosen("wheels", "pypi") == ("pypi", "wheels")  # the order the data needs
    assert chosen("all", "wheels") == ("nvidia", "pypi", "wheels", "pytorch", "tags", "python")

    record_index(upstream)
    with_torch_98(data)
    argv_wheels = ["--matrices", str(data), "matrix", "refresh", "--source", "wheels",
                   "--index-url", f"{upstream.base}/simple/"]
    assert cli.main(argv_wheels, env) == 0
    assert "wrote torch_wheels" in capsys.readouterr().out


def test_warnings_carry_one_prefix(upstream: Upstream, data: Path, env: dict[str, str],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    upstream.serve("/whl/cu999/torch/", (FIXTURES / "whl_other_torch.html").read_bytes())
    with_torch_98(data)
    assert cli.main(argv(upstream, data, "--dry-run"), env) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if "warning" in line]
    assert warnings == ["envbuild: warning: pytorch cu999: skipped, CUDA 99.9 is not in "
                        "cuda_toolkits.yaml (refresh the nvidia source first)"]
    assert "refreshing from pytorch" in err  # progress is printed as it is

    log: list[str] = []
    refresh.refresh(options(upstream, data, sources=("pytorch",)), env, log.append)
    assert any(line.startswith("warning: pytorch cu999: skipped") for line in log)


def test_e15_credentials_in_an_upstream_url_are_never_printed(
        upstream: Upstream, data: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    listing = upstream.routes["/compute/cuda/redist/"]
    upstream.script("/compute/cuda/redist/", (503, {}, b"busy"), (503, {}, b"busy"), listing)
    secret = upstream.base.replace("https://", "https://alice:s3cr3t@") + "/compute/"
    command = argv(upstream, data, "--json", "--dry-run")
    command[command.index("--nvidia-url") + 1] = secret
    assert cli.main(command, env) == 0
    out, err = capsys.readouterr()
    assert err.count("retrying https://***@127.0.0.1") == 2
    assert "s3cr3t" not in out + err and "alice" not in out + err
    upstream.script("/compute/cuda/redist/", *[(503, {}, b"busy")] * 4)
    assert cli.main(command, env) == 4
    out, err = capsys.readouterr()
    assert "giving up on https://***@127.0.0.1" in err and "s3cr3t" not in out + err


def _no_space(fd: int) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_e18_full_disk_during_the_write_exit_4_nothing_half_written(
        upstream: Upstream, data: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(data)
    monkeypatch.setattr(os, "fsync", _no_space)  # as a full disk reports it, at the flush
    assert cli.main(argv(upstream, data), env) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("envbuild: error[data]: cannot write the refreshed data")
    assert "No space left on device" in err[-1] and "Traceback" not in "".join(err)
    assert snapshot(data) == before
    assert not [p for p in data.iterdir() if p.name.startswith(".")]


def test_e18_read_only_data_directory_exit_4(
        upstream: Upstream, data: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    def read_only(*args: Any, **kwargs: Any) -> str:
        raise OSError(errno.EROFS, "Read-only file system", str(kwargs.get("dir")))

    before = snapshot(data)
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    assert cli.main(argv(upstream, data), env) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("envbuild: error[data]: cannot write the refreshed data")
    assert "Read-only file system" in err[-1]
    assert snapshot(data) == before


def test_e18_a_signal_during_the_write_leaves_no_staging(
        upstream: Upstream, data: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from envbuild.errors import Terminated

    before = snapshot(data)

    def stop(stage: str) -> None:
        if stage == "staged":
            raise Terminated(signal.SIGTERM, "SIGTERM")

    with pytest.raises(Terminated):
        refresh.refresh(options(upstream, data), env, lambda message: None, checkpoint=stop)
    assert snapshot(data) == before
    assert not [p for p in data.iterdir() if p.name.startswith(".refresh")]


def test_e15_rows_record_their_source_without_credentials(
        upstream: Upstream, data: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    secret = upstream.base.replace("https://", "https://alice:s3cr3t@")
    command = argv(upstream, data)
    for flag, path in (("--nvidia-url", "/compute/"), ("--pytorch-url", "/whl/"),
                       ("--registry-url", "/v2/nvidia/cuda/")):
        command[command.index(flag) + 1] = secret + path
    assert cli.main(command, env) == 0
    out, err = capsys.readouterr()
    assert "s3cr3t" not in out + err
    assert any(r["cuda"] == "99.1.0" for r in rows(data, "cuda_toolkits"))
    for path in data.iterdir():
        assert "s3cr3t" not in path.read_text(encoding="utf-8"), path.name
    assert any(str(r["source"]).startswith(upstream.base + "/compute/")
               for r in rows(data, "cuda_toolkits"))
    cache = Path(env["XDG_CACHE_HOME"])
    assert [p for p in cache.rglob("*.json")]
    for path in cache.rglob("*"):
        if path.is_file():
            assert b"s3cr3t" not in path.read_bytes(), path
    assert cli.main([*command, "--offline", "--dry-run"], env) == 0  # the cache still serves them


@pytest.mark.parametrize(("project", "relations"), [
    ("cuda", {"cuda_toolkits"}), ("cudnn", {"cudnn"}), ("images", {"cuda_images"}),
    ("torch", {"torch_variants"})])
def test_t1_only_limits_the_refresh_to_the_projects_named(upstream: Upstream, data: Path, env: dict[str, str],
                                                          project: str, relations: set[str]) -> None:
    """docs/faults.md T1: `--only` works for every project; each touches only its own relations
    (torchvision/torchaudio: tests/test_companions.py, python: tests/test_python_standalone.py)."""
    before = snapshot(data)
    report = run(upstream, data, env, only=frozenset({project}), dry_run=True)
    assert set(report.changes) == relations and snapshot(data) == before
    # The recorded tags name CUDA 99.1.0, which only a refresh of the nvidia source adds: no image row.
    assert any(c.added or c.updated for c in report.changes.values()) == (project != "images")
