"""The one registry client with Docker's credentials and TLS (docs/faults.md U1–U8).

Against Debian's real ``docker-registry`` on 127.0.0.1 over TLS (a test CA from trustme,
trusted through a ``certs.d/<host:port>/ca.crt`` as Docker trusts it) with htpasswd
authentication (the ``Basic`` flow), and against a small https stand-in for the ``Bearer``
flow with credentials and with an identity token. Credentials come from a ``DOCKER_CONFIG``
the test writes: ``auths``, and a ``docker-credential-*`` helper executable that speaks the
real protocol (``get`` reads the server URL on stdin, prints JSON). No Docker engine needed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import schemas
from conftest import run_registry, served

from envbuild.commands import cli
from envbuild.engine.publish import push_failed, tag_digest
from envbuild.errors import DataError
from envbuild.registry.client import RegistryClient, trusted_ca
from envbuild.registry.credentials import Credentials, credentials_for
from envbuild.registry.digest import image_digest
from envbuild.registry.reference import endpoint

trustme = pytest.importorskip("trustme")

USER, SECRET = "ci-bot", "s3cr3t-Pa55-never-printed"
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def docker_config(directory: Path, registry: str, *, password: str = SECRET,
                  helper: str | None = None) -> dict[str, str]:
    """A DOCKER_CONFIG directory holding ``registry``'s login (or naming ``helper`` for it)."""
    directory.mkdir(parents=True, exist_ok=True)
    if helper is not None:
        config: dict[str, Any] = {"credHelpers": {registry: helper}}
    else:
        pair = base64.b64encode(f"{USER}:{password}".encode()).decode()
        config = {"auths": {registry: {"auth": pair}}}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return {"DOCKER_CONFIG": str(directory), "PATH": os.environ.get("PATH", ""), "HOME": str(directory)}


def credential_helper(bin_dir: Path, name: str, answers: dict[str, tuple[str, str]]) -> None:
    """``docker-credential-NAME``: ``get`` reads a server URL on stdin and prints its JSON, or
    says ``credentials not found in native keychain`` and exits 1, as real helpers do."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / f"docker-credential-{name}"
    script.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        f"ANSWERS = {answers!r}\n"
        "if sys.argv[1:] != ['get']:\n    sys.exit(2)\n"
        "server = sys.stdin.read().strip()\n"
        "if server not in ANSWERS:\n"
        "    print('credentials not found in native keychain'); sys.exit(1)\n"
        "user, secret = ANSWERS[server]\n"
        "print(json.dumps({'ServerURL': server, 'Username': user, 'Secret': secret}))\n",
        encoding="utf-8")
    script.chmod(0o755)


# --------------------------------------------------------------------------- credentials


def test_credentials_come_from_docker_config_and_never_show(tmp_path: Path) -> None:
    env = docker_config(tmp_path / "cfg", "registry.example:5000")
    found = credentials_for("registry.example:5000", env)
    assert found == Credentials(username=USER, password=SECRET, source="auths")
    assert SECRET not in repr(found) and SECRET not in str(found)
    assert credentials_for("other.example", env) is None
    assert credentials_for("registry.example:5000", {"DOCKER_CONFIG": str(tmp_path / "none")}) is None


def test_hub_credentials_under_dockers_own_key(tmp_path: Path) -> None:
    env = docker_config(tmp_path / "cfg", "https://index.docker.io/v1/")
    found = credentials_for("docker.io", env)
    assert found is not None and found.username == USER


def test_a_credential_helper_is_asked_with_the_real_protocol(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    credential_helper(tmp_path / "bin", "envbuildtest", {"registry.example:5000": (USER, SECRET)})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env = docker_config(tmp_path / "cfg", "registry.example:5000", helper="envbuildtest")
    found = credentials_for("registry.example:5000", env)
    assert found is not None and (found.username, found.password) == (USER, SECRET)
    assert found.source == "docker-credential-envbuildtest"


def test_a_broken_config_or_helper_is_exit_4_naming_docker_login(tmp_path: Path) -> None:
    """docs/faults.md U3: never quoting the file or what the helper said."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"auths": ' + SECRET, encoding="utf-8")
    env = docker_config(tmp_path / "cfg", "registry.example:5000", helper="missing-helper")
    for environment in ({"DOCKER_CONFIG": str(broken)}, env):
        with pytest.raises(DataError) as caught:
            credentials_for("registry.example:5000", environment)
        assert caught.value.exit_code == 4
        assert "docker login registry.example:5000" in caught.value.one_line()
        assert SECRET not in caught.value.one_line()


def test_endpoints_try_https_first_and_http_only_where_docker_would() -> None:
    assert endpoint("127.0.0.1:5000").bases == ("https://127.0.0.1:5000/v2", "http://127.0.0.1:5000/v2")
    assert endpoint("10.0.0.7:5000").bases == ("https://10.0.0.7:5000/v2",)
    assert endpoint("10.0.0.7:5000", insecure=["10.0.0.0/8"]).bases[1] == "http://10.0.0.7:5000/v2"
    assert endpoint("reg.internal:5000", insecure=["reg.internal:5000"]).bases[1].startswith("http:")
    assert endpoint("docker.io", {"docker.io": "http://10.1.2.3:5000"}).bases == ("http://10.1.2.3:5000/v2",)
    assert endpoint("docker.io").host == "docker.io"


def test_the_ca_is_taken_as_docker_takes_it(tmp_path: Path) -> None:
    (tmp_path / "reg:5000").mkdir()
    (tmp_path / "reg:5000" / "ca.crt").write_text("x", encoding="utf-8")
    expected = str(tmp_path / "reg:5000" / "ca.crt")
    assert trusted_ca("reg:5000", {"SSL_CERT_FILE": "/b"}, certs_d=tmp_path) == expected
    assert trusted_ca("other:5000", {"SSL_CERT_FILE": "/b"}, certs_d=tmp_path) == "/b"
    assert trusted_ca("other:5000", {}, certs_d=tmp_path) is None


def test_an_auth_refusal_on_push_is_exit_4_naming_docker_login() -> None:
    error = push_failed("reg.example/a:1", "reg.example", "unauthorized: authentication required")
    assert error.exit_code == 4 and "docker login reg.example" in error.one_line()
    assert push_failed("reg.example/a:1", "reg.example", "disk full").exit_code == 6


# --------------------------------------------------------------------------- a TLS registry


@pytest.fixture(scope="module")
def ca() -> Any:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_files(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(directory / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    return directory / "cert.pem", directory / "key.pem", directory / "ca.pem"


def certs_d_for(host: str, ca_file: Path, root: Path) -> Path:
    (root / host).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca_file, root / host / "ca.crt")
    return root


def _push_manifest(base: str, name: str, tag: str, ca_file: Path) -> str:
    """A config blob and a v2 manifest straight through the registry API; the digest."""
    session = requests.Session()
    session.auth = (USER, SECRET)
    session.verify = str(ca_file)
    session.trust_env = False
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers",
                                                                           "diff_ids": []}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    start = session.post(f"{base}/v2/{name}/blobs/uploads/", timeout=30)
    assert start.status_code == 202, start.text
    location = start.headers["Location"]
    sep = "&" if "?" in location else "?"
    done = session.put(f"{location}{sep}digest={config_digest}", data=config,
                       headers={"Content-Type": "application/octet-stream"}, timeout=30)
    assert done.status_code == 201, done.text
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_V2, "config": {
        "mediaType": "application/vnd.docker.container.image.v1+json", "digest": config_digest,
        "size": len(config)}, "layers": []}).encode()
    put = session.put(f"{base}/v2/{name}/manifests/{tag}", data=manifest,
                      headers={"Content-Type": DOCKER_V2}, timeout=30)
    assert put.status_code == 201, put.text
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


@pytest.fixture(scope="module")
def tls_registry(tls_files: tuple[Path, Path, Path],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """docker-registry over TLS with htpasswd auth, holding envbuild/tiny:1; (host, digest)."""
    if shutil.which("htpasswd") is None:
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):  # CI installs it (.ci/run)
            pytest.fail("ENVBUILD_REQUIRE_DOCKER is set but there is no htpasswd (apache2-utils)")
        pytest.skip("no htpasswd (apt-get install apache2-utils)")
    directory = tmp_path_factory.mktemp("tls-registry")
    line = subprocess.run(["htpasswd", "-Bbn", USER, SECRET], capture_output=True, text=True,
                          check=True).stdout.strip()
    (directory / "htpasswd").write_text(line + "\n", encoding="utf-8")
    auth = f"auth:\n  htpasswd:\n    realm: envbuild-test\n    path: {directory / 'htpasswd'}\n"
    with run_registry(directory, directory / "storage", auth, tls=tls_files) as host:
        yield host, _push_manifest(f"https://{host}", "envbuild/tiny", "1", tls_files[2])


def test_a_tls_registry_with_a_login_gives_the_digest_and_promote_tags_it(
        tls_registry: tuple[str, str], tls_files: tuple[Path, Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md U1: https with the CA from certs.d, Basic auth from DOCKER_CONFIG; the
    digest lookup and promote's PUT both log in; the secret is in no output."""
    host, digest = tls_registry
    certs_d = certs_d_for(host, tls_files[2], tmp_path / "certs.d")
    env = docker_config(tmp_path / "cfg", host)
    logged: list[str] = []
    assert image_digest(f"{host}/envbuild/tiny:1", env=env, certs_d=certs_d, log=logged.append) == digest
    monkeypatch.setattr("envbuild.registry.client.CERTS_D", certs_d)
    assert tag_digest(f"{host}/envbuild/tiny@{digest}", "stable", env) == digest
    assert image_digest(f"{host}/envbuild/tiny:stable", env=env, certs_d=certs_d) == digest
    assert not any(SECRET in line for line in logged)
    # the command, --json: a report of a GPU run of that digest lets it tag "gpu-ok"
    report = tmp_path / "verify.json"
    report.write_text(json.dumps({"envbuild.verify": {"digest": digest, "exit_code": 0, "cpu_ok": False},
                                  "checks": [{"name": "gpu.kernel@cuda:0", "status": "pass", "gpu": True}],
                                  "torch": {"cuda": "13.0", "devices": ["NVIDIA H100 80GB HBM3"]}}))
    capsys.readouterr()
    code = cli.main(["promote", f"{host}/envbuild/tiny@{digest}", "gpu-ok", "--verified-report", str(report),
                     "--json"], env)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document = json.loads(captured.out)
    schemas.check("promote.schema.json", document)
    assert (document["digest"], document["tag"]) == (digest, "gpu-ok") and SECRET not in captured.out
    assert image_digest(f"{host}/envbuild/tiny:gpu-ok", env=env, certs_d=certs_d) == digest


def test_an_sbom_is_attached_to_a_tls_registry_with_a_login(
        tls_registry: tuple[str, str], tls_files: tuple[Path, Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md J27 over https with Basic auth: the blob uploads, the artifact manifest and the
    referrers tag's index all go through the one client's login; read back with it; no secret logged."""
    from envbuild.registry.referrers import attach, read_manifest, referrers, referrers_tag

    host, digest = tls_registry
    monkeypatch.setattr("envbuild.registry.client.CERTS_D", certs_d_for(host, tls_files[2], tmp_path / "c"))
    logged: list[str] = []
    env = docker_config(tmp_path / "cfg", host)
    client = RegistryClient(host, "envbuild/tiny", env=env, log=logged.append)
    found = read_manifest(client, digest)
    assert found is not None and found[0].media_type == DOCKER_V2
    done = attach(client, found[0], b'{"bomFormat": "CycloneDX"}',
                  artifact_type="application/vnd.cyclonedx+json", annotations={}, title="sbom.json")
    assert (done.via, done.tag, done.listed_before) == ("tag", referrers_tag(digest), False)
    (entry,), via = referrers(client, digest)
    assert via == "tag" and entry["digest"] == done.artifact.digest and "annotations" not in entry
    assert client.endpoint.bases[0].startswith("https:") and client.base.startswith("https:")
    assert not any(SECRET in line for line in logged)


def test_a_tls_registry_through_a_credential_helper(tls_registry: tuple[str, str],
                                                    tls_files: tuple[Path, Path, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    host, digest = tls_registry
    credential_helper(tmp_path / "bin", "envbuildtest", {host: (USER, SECRET)})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env = docker_config(tmp_path / "cfg", host, helper="envbuildtest")
    certs_d = certs_d_for(host, tls_files[2], tmp_path / "certs.d")
    assert image_digest(f"{host}/envbuild/tiny:1", env=env, certs_d=certs_d) == digest


def test_wrong_or_missing_credentials_are_exit_4_naming_docker_login(
        tls_registry: tuple[str, str], tls_files: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """docs/faults.md U2."""
    host, _ = tls_registry
    certs_d = certs_d_for(host, tls_files[2], tmp_path / "certs.d")
    wrong = docker_config(tmp_path / "wrong", host, password="not-" + SECRET)
    missing = {"DOCKER_CONFIG": str(tmp_path / "nothing")}
    for env, words in ((wrong, "refused the credentials"), (missing, "wants credentials")):
        with pytest.raises(DataError, match=words) as caught:
            image_digest(f"{host}/envbuild/tiny:1", env=env, certs_d=certs_d)
        line = caught.value.one_line()
        assert caught.value.exit_code == 4 and f"docker login {host}" in line
        assert SECRET not in line and "\n" not in line


def test_an_untrusted_tls_registry_is_exit_4_and_never_spoken_to_in_plain_http(
        tls_registry: tuple[str, str], tmp_path: Path) -> None:
    """docs/faults.md U4: no CA for it: https fails; the http fallback (loopback) meets an https
    server and the TLS failure is what is reported, with where the CA goes."""
    host, _ = tls_registry
    env = {**docker_config(tmp_path / "cfg", host), "SSL_CERT_FILE": ""}
    with pytest.raises(DataError, match="TLS verification failed") as caught:
        image_digest(f"{host}/envbuild/tiny:1", env=env, certs_d=tmp_path / "empty")
    assert f"/etc/docker/certs.d/{host}/ca.crt" in caught.value.one_line()


# --------------------------------------------------------------------------- the bearer flow


@contextlib.contextmanager
def bearer_registry(ca: Any, seen: list[dict[str, Any]]) -> Iterator[str]:
    """An https registry whose realm hands a token only to ci-bot's password or refresh token."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            seen.append({"method": "POST", "form": form})
            ok = form.get("grant_type") == ["refresh_token"] and form.get("refresh_token") == [SECRET]
            self._answer(200 if ok else 401, json.dumps({"access_token": "T-ok"}).encode())

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            seen.append({"method": self.command, "path": url.path, "auth": self.headers.get("Authorization")})
            if url.path == "/token":
                good = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
                ok = self.headers.get("Authorization") == good
                self._answer(200 if ok else 401, json.dumps({"token": "T-ok"}).encode())
            elif self.headers.get("Authorization") != "Bearer T-ok":
                realm = f"https://{self.headers['Host']}/token"
                self._answer(401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="t",'
                                                               'scope="repository:a/b:pull"'})
            else:
                self._answer(200, b"", {"Docker-Content-Digest": "sha256:" + "7" * 64})

        do_HEAD = do_GET

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with served(Handler, context) as host:
        yield host


def test_bearer_tokens_with_a_password_or_an_identity_token(ca: Any, tmp_path: Path) -> None:
    """docs/faults.md U5: the realm gets the password as Basic auth, or the identity token as the
    refresh_token grant; the registry only ever sees the bearer token."""
    seen: list[dict[str, Any]] = []
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with bearer_registry(ca, seen) as host:
        certs_d = certs_d_for(host, ca_file, tmp_path / "certs.d")
        env = docker_config(tmp_path / "cfg", host)
        assert image_digest(f"{host}/a/b:1", env=env, certs_d=certs_d) == "sha256:" + "7" * 64
        registry_auth = [s["auth"] for s in seen if s.get("path", "").startswith("/v2/")]
        assert registry_auth == [None, "Bearer T-ok"]
        seen.clear()
        (tmp_path / "tok").mkdir()
        (tmp_path / "tok" / "config.json").write_text(json.dumps(
            {"auths": {host: {"identitytoken": SECRET}}}), encoding="utf-8")
        client = RegistryClient(host, "a/b", env={"DOCKER_CONFIG": str(tmp_path / "tok")}, certs_d=certs_d)
        assert client.manifest("HEAD", "1").status == 200
        assert [s["method"] for s in seen] == ["HEAD", "POST", "HEAD"]
