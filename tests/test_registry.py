"""The base image's digest from a registry (envbuild/registry/; docs/faults.md H1–H6).

A fake registry and token server (http.server on 127.0.0.1, in threads) play each answer a
registry can give; the last tests push the local Debian base image to a real registry,
Debian's ``docker-registry`` on 127.0.0.1 (the ``loopback_registry`` fixture in conftest.py),
and compare the digest asked for with the one ``docker push`` reported, anonymously and
through a second instance that wants bearer tokens from a token server run here.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from conftest import push_image, run_registry, served

from envbuild.errors import DataError, EnvbuildError, UsageError
from envbuild.registry import reference as registry
from envbuild.registry.digest import image_digest
from envbuild.registry.reference import ImageReference, parse_reference, pinned
from envbuild.render.values import check_image_reference
from envbuild.upstream.http_client import HttpClient, HttpPolicy

ROOT = Path(__file__).resolve().parent.parent
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def manifest(seed: str) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": DOCKER_V2,
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "digest": "sha256:" + hashlib.sha256(seed.encode()).hexdigest(),
                                  "size": 7}, "layers": []}, indent=3).encode()


def sha(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass
class FakeRegistry:
    """What the fake registry serves and what it saw. ``token`` set: manifests need it."""

    base: str = ""
    host: str = ""
    manifests: dict[str, bytes] = field(default_factory=dict)  # "name:tag" → body
    blobs: dict[str, bytes] = field(default_factory=dict)  # "name@sha256:…" → body (image configs)
    token: str | None = None
    token_server_refuses: bool = False
    challenge: str | None = None  # WWW-Authenticate override
    digest_header: bool = True
    digest_override: str | None = None
    head_allowed: bool = True
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def paths(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _ in self.seen]


def _handler(fake: FakeRegistry) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body_too=False)

        def do_GET(self) -> None:
            self._answer(body_too=True)

        def _send(self, status: int, headers: dict[str, str], body: bytes, body_too: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body_too:
                self.wfile.write(body)

        def _answer(self, body_too: bool) -> None:
            fake.seen.append((self.command, self.path, dict(self.headers.items())))
            url = urlsplit(self.path)
            if url.path == "/token":
                if fake.token_server_refuses or fake.token is None:
                    self._send(401, {}, b'{"errors": []}', body_too)
                else:
                    self._send(200, {"Content-Type": "application/json"},
                               json.dumps({"token": fake.token, "expires_in": 300}).encode(), body_too)
                return
            blob = url.path.split("/blobs/")
            if len(blob) == 2 and f"{blob[0][len('/v2/'):]}@{blob[1]}" in fake.blobs:
                self._send(200, {"Content-Type": "application/octet-stream"},
                           fake.blobs[f"{blob[0][len('/v2/'):]}@{blob[1]}"], body_too)
                return
            parts = url.path.split("/manifests/")
            if len(parts) != 2 or not parts[0].startswith("/v2/"):
                self._send(404, {}, b"", body_too)
                return
            name, tag = parts[0][len("/v2/"):], parts[1]
            if self.command == "HEAD" and not fake.head_allowed:
                self._send(405, {"Allow": "GET"}, b"", body_too)
                return
            if fake.token is not None and self.headers.get("Authorization") != f"Bearer {fake.token}":
                challenge = fake.challenge or (f'Bearer realm="{fake.base}/token",service="fake-registry",'
                                               f'scope="repository:{name}:pull"')
                self._send(401, {"WWW-Authenticate": challenge}, b'{"errors": []}', body_too)
                return
            body = fake.manifests.get(f"{name}:{tag}")
            if body is None:
                self._send(404, {"Content-Type": "application/json"},
                           b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}', body_too)
                return
            headers = {"Content-Type": DOCKER_V2}
            if fake.digest_header:
                headers["Docker-Content-Digest"] = fake.digest_override or sha(body)
            self._send(200, headers, body, body_too)

    return Handler


@contextlib.contextmanager
def serve(fake: FakeRegistry) -> Iterator[FakeRegistry]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.host = f"127.0.0.1:{server.server_address[1]}"
    fake.base = f"http://{fake.host}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeRegistry]:
    with serve(FakeRegistry(manifests={"envbuild/bookworm:base": manifest("base"),
                                       "library/ubuntu:22.04": manifest("ubuntu"),
                                       "nvidia/cuda:12.4.1-runtime-ubuntu22.04": manifest("cuda")})) as f:
        yield f


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(("reference", "expected"), [
    ("ubuntu", ImageReference("docker.io", "library/ubuntu", "latest", None)),
    ("ubuntu:22.04", ImageReference("docker.io", "library/ubuntu", "22.04", None)),
    ("nvidia/cuda:12.4.1-runtime-ubuntu22.04",
     ImageReference("docker.io", "nvidia/cuda", "12.4.1-runtime-ubuntu22.04", None)),
    ("docker.io/ubuntu:24.04", ImageReference("docker.io", "library/ubuntu", "24.04", None)),
    ("index.docker.io/nvidia/cuda:12.4.1",
     ImageReference("docker.io", "nvidia/cuda", "12.4.1", None)),
    ("registry-1.docker.io/library/debian:12", ImageReference("docker.io", "library/debian", "12", None)),
    ("nvcr.io/nvidia/pytorch:24.01-py3", ImageReference("nvcr.io", "nvidia/pytorch", "24.01-py3", None)),
    ("localhost/envbuild/x:1", ImageReference("localhost", "envbuild/x", "1", None)),
    ("127.0.0.1:5000/a/b/c:t", ImageReference("127.0.0.1:5000", "a/b/c", "t", None)),
    ("[::1]:5000/a:t", ImageReference("[::1]:5000", "a", "t", None)),
    ("my_org/image:1", ImageReference("docker.io", "my_org/image", "1", None)),
    ("ubuntu:22.04@sha256:" + "a" * 64,
     ImageReference("docker.io", "library/ubuntu", "22.04", "sha256:" + "a" * 64)),
])
def test_references_are_read_as_docker_reads_them(reference: str, expected: ImageReference) -> None:
    assert parse_reference(reference) == expected


@pytest.mark.parametrize("reference", [
    "My Image:TAG", "../x:1", "ubuntu:", "ubuntu@sha256:abc", "ubuntu@sha512:" + "a" * 128,
    "ubuntu:22.04\n", "Ubuntu:22.04", "a" * 300 + ":1", "", "-x:1", "x:" + "t" * 200,
])
def test_bad_references_are_usage_errors(reference: str) -> None:
    """docs/faults.md H5: exit 2 before any request."""
    with pytest.raises(UsageError, match="invalid image reference") as caught:
        image_digest(reference, env={}, mirrors={"docker.io": f"http://127.0.0.1:{closed_port()}"})
    assert caught.value.exit_code == 2
    assert "\n" not in caught.value.one_line()


@pytest.mark.parametrize("mirror", ["ftp://mirror:5000", "http://", "http://mirror:port/",
                                    "https://mirror/ path", "http://mirror/?q=1"])
def test_bad_mirrors_are_usage_errors(mirror: str) -> None:
    """docs/faults.md H5: a mirror that is not an http(s) base URL is exit 2."""
    with pytest.raises(UsageError, match="invalid registry mirror"):
        image_digest("ubuntu:22.04", env={}, mirrors={"docker.io": mirror})


def test_registries_are_tried_over_https_first_and_loopback_falls_back_to_http() -> None:
    """As Docker does: https first; plain http only as the fallback for loopback registries, or
    for a mirror written with http:// (then only http)."""
    def bases(registry_name: str, mirrors: dict[str, str] | None = None) -> tuple[str, ...]:
        return registry.endpoint(registry_name, mirrors or {}).bases

    assert bases("127.0.0.1:5000") == ("https://127.0.0.1:5000/v2", "http://127.0.0.1:5000/v2")
    assert bases("127.3.2.1:5000")[1] == "http://127.3.2.1:5000/v2"
    assert bases("localhost:5000")[1] == "http://localhost:5000/v2"
    assert bases("[::1]:5000")[1] == "http://[::1]:5000/v2"
    assert bases("10.0.0.1:5000") == ("https://10.0.0.1:5000/v2",)
    assert bases("localhost.example:5000") == ("https://localhost.example:5000/v2",)
    assert bases("docker.io") == ("https://registry-1.docker.io/v2",)
    assert bases("nvcr.io") == ("https://nvcr.io/v2",)
    mirrors = {"index.docker.io": "http://10.1.2.3:5000", "nvcr.io": "mirror.internal:5000/cache/",
               "ghcr.io": "127.0.0.1:6000"}
    assert bases("docker.io", mirrors) == ("http://10.1.2.3:5000/v2",)
    assert bases("nvcr.io", mirrors) == ("https://mirror.internal:5000/cache/v2",)
    assert bases("ghcr.io", mirrors) == ("https://127.0.0.1:6000/v2", "http://127.0.0.1:6000/v2")
    assert bases("quay.io", mirrors) == ("https://quay.io/v2",)
    assert registry.registry_url("127.0.0.1:5000") == "https://127.0.0.1:5000/v2"


def test_pinned_keeps_the_tag_and_the_lock_accepts_it() -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    assert pinned("nvidia/cuda:12.4.1-runtime-ubuntu22.04", digest) == \
        f"nvidia/cuda:12.4.1-runtime-ubuntu22.04@{digest}"
    assert pinned("127.0.0.1:5000/envbuild/bookworm:base@sha256:" + "f" * 64, digest) == \
        f"127.0.0.1:5000/envbuild/bookworm:base@{digest}"
    assert pinned("ubuntu", digest) == f"ubuntu@{digest}"
    for reference in ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "127.0.0.1:5000/envbuild/bookworm:base"):
        value = pinned(reference, digest)
        assert check_image_reference(value, "base_image") == value
        assert image_digest(value, env={}) == digest  # a pinned reference answers itself
    with pytest.raises(UsageError, match="invalid image digest"):
        pinned("ubuntu:22.04", "sha256:ABC")


def test_a_digest_reference_needs_no_request(fake: FakeRegistry) -> None:
    digest = "sha256:" + "9" * 64
    assert image_digest(f"{fake.host}/envbuild/bookworm:base@{digest}", env={}) == digest
    assert fake.seen == []


def test_challenge_parsing() -> None:
    scheme, params = registry.parse_challenge(
        'Bearer realm="https://auth.example/token",service="registry.example",'
        'scope="repository:a/b:pull,push"')
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.example/token", "service": "registry.example",
                      "scope": "repository:a/b:pull,push"}
    assert registry.parse_challenge('Basic realm="x"') == ("basic", {"realm": "x"})


# --------------------------------------------------------------------------- the fake registry


def test_head_answers_the_digest(fake: FakeRegistry) -> None:
    digest = image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert digest == sha(fake.manifests["envbuild/bookworm:base"])
    assert fake.paths() == [("HEAD", "/v2/envbuild/bookworm/manifests/base")]
    accept = fake.seen[0][2]["Accept"]
    for kind in ("application/vnd.oci.image.index.v1+json",
                 "application/vnd.docker.distribution.manifest.list.v2+json",
                 "application/vnd.oci.image.manifest.v1+json", DOCKER_V2):
        assert kind in accept


def test_anonymous_token_flow(fake: FakeRegistry) -> None:
    fake.token = "t0k-anonymous"
    digest = image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert digest == sha(fake.manifests["envbuild/bookworm:base"])
    assert [m for m, _ in fake.paths()] == ["HEAD", "GET", "HEAD"]
    token_query = parse_qs(urlsplit(fake.seen[1][1]).query)
    assert urlsplit(fake.seen[1][1]).path == "/token"
    assert token_query == {"service": ["fake-registry"], "scope": ["repository:envbuild/bookworm:pull"]}
    assert "Authorization" not in fake.seen[0][2]
    assert fake.seen[2][2]["Authorization"] == "Bearer t0k-anonymous"


def test_missing_digest_header_falls_back_to_get_and_sha256(fake: FakeRegistry) -> None:
    """docs/faults.md H4: no Docker-Content-Digest → GET the manifest and hash its bytes."""
    fake.digest_header = False
    digest = image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert digest == sha(fake.manifests["envbuild/bookworm:base"])
    assert fake.paths() == [("HEAD", "/v2/envbuild/bookworm/manifests/base"),
                            ("GET", "/v2/envbuild/bookworm/manifests/base")]


def test_a_registry_refusing_head_is_asked_with_get(fake: FakeRegistry) -> None:
    """docs/faults.md H4: 405 to HEAD → GET; the GET's header is checked against the body."""
    fake.head_allowed = False
    digest = image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert digest == sha(fake.manifests["envbuild/bookworm:base"])
    assert [m for m, _ in fake.paths()] == ["HEAD", "GET"]
    fake.digest_override = "sha256:" + "e" * 64  # a header the body does not hash to
    with pytest.raises(DataError, match="not its Docker-Content-Digest"):
        image_digest(f"{fake.host}/envbuild/bookworm:base", env={})


def test_fallback_refuses_a_body_that_is_not_a_manifest(fake: FakeRegistry) -> None:
    """docs/faults.md H4: an error page served with 200 and no digest is exit 4, not hashed."""
    fake.digest_header = False
    fake.manifests["envbuild/bookworm:base"] = b"<html>proxy says hello</html>"
    with pytest.raises(DataError, match="not an image manifest") as caught:
        image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert caught.value.exit_code == 4


@pytest.mark.parametrize("header", ["sha256:xyz", "md5:" + "a" * 32, "sha256:" + "A" * 64, "garbage"])
def test_malformed_digest_header_is_exit_4(fake: FakeRegistry, header: str) -> None:
    """docs/faults.md H4."""
    fake.digest_override = header
    with pytest.raises(DataError, match="malformed digest") as caught:
        image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert caught.value.exit_code == 4
    assert "lock --no-registry" in caught.value.hint


def test_unknown_tag_is_no_such_image(fake: FakeRegistry) -> None:
    """docs/faults.md H2."""
    with pytest.raises(DataError, match="no such image or tag") as caught:
        image_digest(f"{fake.host}/envbuild/bookworm:gone", env={})
    assert caught.value.exit_code == 4
    assert "lock --no-registry" in caught.value.one_line()
    fake.token = "t0k"  # behind the token flow too
    with pytest.raises(DataError, match="no such image or tag"):
        image_digest(f"{fake.host}/envbuild/nothing:1", env={})


def test_401_after_the_token_wants_credentials(fake: FakeRegistry) -> None:
    """docs/faults.md H3: the anonymous token is not enough; the token never reaches the line."""
    fake.token = "the-one-the-registry-wants"
    # A token server elsewhere hands out a token the registry then refuses.
    with serve(FakeRegistry(token="secret-token-value")) as tokens:
        fake.challenge = f'Bearer realm="{tokens.base}/token?client=envbuild",service="fake-registry"'
        with pytest.raises(DataError, match="wants credentials") as caught:
            image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert caught.value.exit_code == 4
    assert "secret-token-value" not in caught.value.one_line()
    assert [m for m, _ in fake.paths()] == ["HEAD", "HEAD"]
    assert fake.seen[-1][2]["Authorization"] == "Bearer secret-token-value"
    # The realm's own query is kept, and the scope the registry did not name is the
    # repository's, to pull.
    query = parse_qs(urlsplit(tokens.seen[0][1]).query)
    assert query == {"client": ["envbuild"], "service": ["fake-registry"],
                     "scope": ["repository:envbuild/bookworm:pull"]}


def test_a_token_server_that_refuses_or_a_basic_challenge_wants_credentials(fake: FakeRegistry) -> None:
    """docs/faults.md H3."""
    fake.token = "t0k"
    fake.token_server_refuses = True
    with pytest.raises(DataError, match="wants credentials") as caught:
        image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert caught.value.exit_code == 4
    fake.token_server_refuses = False
    fake.challenge = 'Basic realm="registry"'
    with pytest.raises(DataError, match=r"wants credentials.*basic authentication"):
        image_digest(f"{fake.host}/envbuild/bookworm:base", env={})


def test_hub_names_go_to_the_mirror(fake: FakeRegistry) -> None:
    """The hub's name (library/ for one component) is asked of the mirror, never of the hub."""
    mirrors = {"docker.io": fake.base}
    assert image_digest("ubuntu:22.04", env={}, mirrors=mirrors) == \
        sha(fake.manifests["library/ubuntu:22.04"])
    assert image_digest("index.docker.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04", env={},
                        mirrors=mirrors) == sha(fake.manifests["nvidia/cuda:12.4.1-runtime-ubuntu22.04"])
    assert image_digest("nvcr.io/envbuild/bookworm:base", env={},
                        mirrors={"nvcr.io": f"{fake.host}/"}) == sha(fake.manifests["envbuild/bookworm:base"])
    assert fake.paths() == [("HEAD", "/v2/library/ubuntu/manifests/22.04"),
                            ("HEAD", "/v2/nvidia/cuda/manifests/12.4.1-runtime-ubuntu22.04"),
                            ("HEAD", "/v2/envbuild/bookworm/manifests/base")]


def test_mirror_with_a_token_flow(fake: FakeRegistry) -> None:
    fake.token = "mirror-token"
    assert image_digest("ubuntu:22.04", env={}, mirrors={"docker.io": fake.base}) == \
        sha(fake.manifests["library/ubuntu:22.04"])
    assert parse_qs(urlsplit(fake.seen[1][1]).query)["scope"] == ["repository:library/ubuntu:pull"]


def test_unreachable_registry_is_exit_4_with_the_offline_hint() -> None:
    """docs/faults.md H1: connection refused, retried briefly, then one line naming --offline."""
    port = closed_port()
    started = time.monotonic()
    with pytest.raises(DataError) as caught:
        image_digest(f"127.0.0.1:{port}/envbuild/bookworm:base", env={}, timeout=5)
    assert time.monotonic() - started < 10
    line = caught.value.one_line()
    assert caught.value.exit_code == 4
    assert f"127.0.0.1:{port}" in line and "lock --no-registry" in line
    assert "\n" not in line


def test_credentials_in_a_mirror_are_never_printed() -> None:
    """docs/faults.md H1 (and E15): the mirror's password is not in the error line."""
    port = closed_port()
    with pytest.raises(DataError) as caught:
        image_digest("ubuntu:22.04", env={}, timeout=3,
                     mirrors={"docker.io": f"http://someone:pa55word@127.0.0.1:{port}"})
    assert "pa55word" not in caught.value.one_line()
    assert "pa55word" not in str(caught.value)
    with pytest.raises(UsageError) as bad:
        image_digest("ubuntu:22.04", env={}, mirrors={"docker.io": "ftp://someone:pa55word@mirror"})
    assert "pa55word" not in bad.value.one_line()


def test_a_stalled_registry_fails_within_the_timeout() -> None:
    """docs/faults.md H6: a registry that accepts and never answers ends within the timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(DataError, match="did not answer in full within 1 s") as caught:
            image_digest(f"127.0.0.1:{port}/envbuild/bookworm:base", env={}, timeout=1)
        assert time.monotonic() - started < 3
    assert "lock --no-registry" in caught.value.hint


def test_redirects_to_another_origin_carry_no_authorization(fake: FakeRegistry) -> None:
    """The token is for the registry that was asked, not for where it redirects."""

    class Redirect(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"{fake.base}/v2/envbuild/bookworm/manifests/base")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        client = HttpClient(env={}, policy=HttpPolicy(attempts=1))
        reply = client.get(f"http://127.0.0.1:{server.server_address[1]}/v2/x/manifests/1",
                           {"Authorization": "Bearer abc", "Accept": DOCKER_V2})
    finally:
        server.shutdown()
        server.server_close()
    assert reply.body == fake.manifests["envbuild/bookworm:base"]
    assert "Authorization" not in fake.seen[0][2]
    assert fake.seen[0][2]["Accept"] == DOCKER_V2


def test_the_error_line_of_each_fault_is_one_line(fake: FakeRegistry) -> None:
    fake.digest_override = "sha256:\x1b[31mred"
    with pytest.raises(EnvbuildError) as caught:
        image_digest(f"{fake.host}/envbuild/bookworm:base", env={})
    assert "\n" not in caught.value.one_line()


# --------------------------------------------------------------------------- a real registry


@pytest.fixture(scope="module")
def docker_client(docker_api: Any) -> Any:
    return docker_api


@pytest.fixture(scope="module")
def pushed_base(docker_client: Any, loopback_registry: str) -> Iterator[tuple[str, str]]:
    """The local Debian base pushed to the loopback registry: (reference, digest push reported)."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "base-image.sh")], capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        pytest.fail(f"scripts/base-image.sh failed: {done.stderr[-2000:]}")
    base = done.stdout.strip().splitlines()[-1]
    repository = f"{loopback_registry}/envbuild/bookworm"
    reported = push_image(docker_client, base, repository, "base")
    try:
        yield f"{repository}:base", reported
    finally:
        docker_client.remove_image(f"{repository}:base")


@pytest.mark.docker
def test_real_registry_digest_equals_the_pushed_one(pushed_base: tuple[str, str],
                                                    loopback_registry: str) -> None:
    """The debootstrap base pushed to Debian's docker-registry on 127.0.0.1: the digest asked
    by manifest HEAD is the one ``docker push`` reported (RepoDigests)."""
    reference, reported = pushed_base
    assert image_digest(reference, env=os.environ) == reported
    # The same through a mirror of another name, and spelled as localhost.
    assert image_digest("registry.invalid/envbuild/bookworm:base", env=os.environ,
                        mirrors={"registry.invalid": f"http://{loopback_registry}"}) == reported
    port = loopback_registry.rpartition(":")[2]
    assert image_digest(f"localhost:{port}/envbuild/bookworm:base", env=os.environ) == reported
    # What the fallback would hash: the manifest bytes the registry serves have that digest.
    answer = requests.get(f"http://{loopback_registry}/v2/envbuild/bookworm/manifests/base",
                          headers={"Accept": registry.ACCEPT}, timeout=30)
    assert answer.status_code == 200
    assert sha(answer.content) == reported
    assert check_image_reference(pinned(reference, reported), "base_image")


@pytest.mark.docker
def test_real_registry_unknown_tag_is_no_such_image(pushed_base: tuple[str, str],
                                                    loopback_registry: str) -> None:
    """docs/faults.md H2 against the real registry: an unknown tag and an unknown name."""
    with pytest.raises(DataError, match="no such image or tag"):
        image_digest(f"{loopback_registry}/envbuild/bookworm:no-such-tag", env=os.environ)
    with pytest.raises(DataError, match="no such image or tag"):
        image_digest(f"{loopback_registry}/envbuild/never-pushed:1", env=os.environ)


# A token server for the real registry: RS256 JSON web tokens whose x5c header carries a
# self-signed certificate the registry trusts (its rootcertbundle), as the distribution
# project's token authentication specifies.


@dataclass
class TokenIssuer:
    key: Any
    certificate_der: bytes
    service: str = "envbuild-test"
    issuer: str = "envbuild-test-issuer"
    grant: bool = True  # False: a valid token that grants nothing
    seen: list[dict[str, list[str]]] = field(default_factory=list)

    def token(self, scope: str) -> str:
        import base64

        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        kind, name, actions = scope.split(":")
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": "", "aud": self.service, "exp": now + 300,
                  "nbf": now - 60, "iat": now, "jti": hashlib.sha256(os.urandom(16)).hexdigest(),
                  "access": [{"type": kind, "name": name, "actions": actions.split(",")}]
                  if self.grant else []}
        header = {"typ": "JWT", "alg": "RS256",
                  "x5c": [base64.b64encode(self.certificate_der).decode()]}
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{b64(signature)}"


def _issuer(directory: Path) -> tuple[TokenIssuer, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "envbuild test token issuer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    bundle = directory / "token-root.pem"
    bundle.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return TokenIssuer(key=key, certificate_der=certificate.public_bytes(serialization.Encoding.DER)), bundle


@contextlib.contextmanager
def token_server(issuer: TokenIssuer) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            issuer.seen.append(query)
            if query.get("service") != [issuer.service] or len(query.get("scope", [])) != 1:
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps({"token": issuer.token(query["scope"][0]), "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with served(Handler) as host:
        yield f"http://{host}/token"


@pytest.mark.docker
def test_real_registry_with_token_authentication(pushed_base: tuple[str, str], registry_storage: Path,
                                                 tmp_path: Path) -> None:
    """The anonymous token flow against the real registry: a second docker-registry serves the
    pushed base from the same storage but wants a bearer token from a realm; the digest comes
    back through 401 → token → HEAD. A token that grants nothing is 401 again: docs/faults.md H3."""
    reference, reported = pushed_base
    issuer, bundle = _issuer(tmp_path)
    with token_server(issuer) as realm:
        auth = ("auth:\n  token:\n"
                f"    realm: {realm}\n    service: {issuer.service}\n"
                f"    issuer: {issuer.issuer}\n    rootcertbundle: {bundle}\n")
        with run_registry(tmp_path / "token-registry", registry_storage, auth) as host:
            served = f"{host}/{reference.split('/', 1)[1]}"
            answer = requests.head(f"http://{host}/v2/envbuild/bookworm/manifests/base", timeout=30)
            assert answer.status_code == 401  # it does want a token
            assert image_digest(served, env=os.environ) == reported
            assert issuer.seen == [{"service": [issuer.service],
                                    "scope": ["repository:envbuild/bookworm:pull"]}]
            issuer.grant = False
            with pytest.raises(DataError, match="wants credentials") as caught:
                image_digest(served, env=os.environ)
            assert caught.value.exit_code == 4


# --------------------------------------------------------------------------- B10: a platform's digest

OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _index(*platforms: str) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": DOCKER_V2, "size": 7, "digest": sha(manifest(p)),
         "platform": {"os": p.split("/")[0], "architecture": p.split("/")[1]}} for p in platforms]}).encode()


def _single(platform: str) -> tuple[bytes, str, bytes]:
    """A one-image manifest whose config says ``platform``: (manifest, config digest, config)."""
    config = json.dumps({"os": platform.split("/")[0], "architecture": platform.split("/")[1]}).encode()
    body = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_V2,
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "digest": sha(config), "size": len(config)}, "layers": []}).encode()
    return body, sha(config), config


def test_b10_an_arm64_target_pins_the_arm64_manifest_of_a_multi_arch_tag() -> None:
    """docs/faults.md B10: the index digest would let an engine pick (or emulate) another
    architecture; an arm64 target's lock pins the arm64 entry's own digest."""
    fake = FakeRegistry(manifests={"nvidia/cuda:13.0.2": _index("linux/amd64", "linux/arm64"),
                                   "library/x86only:1": _index("linux/amd64")})
    with serve(fake):
        assert image_digest(f"{fake.host}/nvidia/cuda:13.0.2", env={}, platform="linux/arm64") == \
            sha(manifest("linux/arm64"))
        index = _index("linux/amd64", "linux/arm64")
        assert image_digest(f"{fake.host}/nvidia/cuda:13.0.2", env={}) == sha(index)
        with pytest.raises(DataError, match=r"has no linux/arm64 image \(its index lists linux/amd64\)"):
            image_digest(f"{fake.host}/library/x86only:1", env={}, platform="linux/arm64")


def test_b10_a_single_image_tag_is_pinned_only_when_its_config_says_the_platform() -> None:
    arm, arm_config_digest, arm_config = _single("linux/arm64")
    amd, amd_config_digest, amd_config = _single("linux/amd64")
    fake = FakeRegistry(manifests={"acme/arm:1": arm, "acme/amd:1": amd},
                        blobs={f"acme/arm@{arm_config_digest}": arm_config,
                               f"acme/amd@{amd_config_digest}": amd_config})
    with serve(fake):
        assert image_digest(f"{fake.host}/acme/arm:1", env={}, platform="linux/arm64") == sha(arm)
        with pytest.raises(DataError, match="is a linux/amd64 image, not linux/arm64"):
            image_digest(f"{fake.host}/acme/amd:1", env={}, platform="linux/arm64")
