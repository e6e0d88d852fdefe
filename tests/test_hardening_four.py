"""Hardening, round four (issue 39): names that become identifiers elsewhere, what CI builds
against the lock, credentials on redirects, bounded reads, fleet verdicts, FIFOs as file
arguments, and the small ones. Each test failed on the tree before its fix."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet_lock import IMAGE, matching_lock, write_lock
from test_project import refused

from envbuild.commands.cli import main
from envbuild.fleet.placement import KubernetesPlacement, Placement
from envbuild.render.lockset import LockSet

KUBE = Placement(nodes=1, gpus_per_node=1, kubernetes=KubernetesPlacement(
    node_selector=(("nvidia.com/gpu.product", "NVIDIA-L4"),)))


# --- 1. names that become identifiers (docs/faults.md V14) --------------------------------


def test_targets_that_become_one_job_name_are_refused_at_lock(tmp_path: Path) -> None:
    files = {"envbuild.toml": '[[targets]]\nname = "gpu-a"\n\n[[targets]]\nname = "gpu_a"\n'}
    line = refused(tmp_path, files)
    assert "envbuild.toml:1: targets: targets 'gpu-a' and 'gpu_a' of the project would share the " \
           "Kubernetes Job name 'envbuild-fleet-gpu-a'" in line
    files = {"envbuild.toml": '[[targets]]\nname = "gpu"\n\n[[targets]]\nname = "gpu-"\n'}
    assert "targets 'gpu' and 'gpu-'" in refused(tmp_path, files)


def test_targets_that_become_one_job_name_are_refused_at_fleet_render(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = matching_lock()
    lockset = LockSet(targets={name: replace(base, fleet=KUBE) for name in ("gpu-a", "gpu_a")})
    (tmp_path / "envbuild.lock").write_text(lockset.to_json())
    code = main(["fleet", "render", "--engine", "kubernetes", "--lock", str(tmp_path / "envbuild.lock"),
                 "--image", f"gpu-a={IMAGE}", "--image", f"gpu_a={IMAGE}", "-o", str(tmp_path / "out")],
                env={})
    err = capsys.readouterr().err
    assert code == 2, err
    assert "targets 'gpu-a' and 'gpu_a' of the lock would share the Kubernetes Job name" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gpu-", "a_", "x_-_", "0" * 32, "l4_" + "z" * 29])
def test_every_target_name_gives_a_valid_job(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             name: str) -> None:
    validator = pytest.importorskip("kubernetes_validate")
    lock = write_lock(tmp_path, {name: KUBE})
    out = tmp_path / "out"
    code = main(["fleet", "render", "--engine", "kubernetes", "--lock", str(lock), "--image",
                 f"{name}={IMAGE}", "-o", str(out)], env={})
    assert code == 0, capsys.readouterr().err
    job = yaml.safe_load((out / f"{name}.job.yaml").read_text())
    validator.validate(job, validator.latest_version(), strict=True)
    job_name = job["metadata"]["name"]
    # DNS-1123 label: what the Job's pods carry as their job-name label value (63 at most).
    assert len(job_name) <= 63 and job_name[-1].isalnum() and job_name[0].isalnum()
    assert set(job_name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert json.dumps(job)  # rendered whole


# --- 3. credentials never follow a redirect to another origin (docs/faults.md U13) ---------

SECRET = "idtok-s3cr3t-VALUE"


@contextlib.contextmanager
def recording_server(route: Callable[[str, str], tuple[int, dict[str, str], bytes]]
                     ) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A plain HTTP server on 127.0.0.1: ``route(method, path)`` answers; every request is
    recorded whole (method, path with query, headers, body)."""
    seen: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                         "body": body})
            status, headers, payload = route(self.command, self.path)
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(payload))}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_HEAD = do_PUT = _any

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _everything(seen: list[dict[str, Any]]) -> str:
    return json.dumps([{**s, "body": s["body"].decode("latin-1")} for s in seen])


TOKEN = json.dumps({"token": "T-anonymous"}).encode()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_an_identity_token_never_follows_a_realm_redirect_to_another_origin(tmp_path: Path,
                                                                          status: int) -> None:
    from envbuild.errors import DataError
    from envbuild.registry.client import RegistryClient

    with recording_server(lambda m, p: (200, {"Content-Type": "application/json"}, TOKEN)) as (other, elsewhere):
        def realm(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
            return status, {"Location": f"http://{other}/token?from=realm"}, b""

        with recording_server(realm) as (realm_host, at_realm):
            def registry(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
                if any(h.get("Authorization") for h in [seen_registry[-1]["headers"]]):
                    return 200, {"Docker-Content-Digest": "sha256:" + "7" * 64}, b""
                return 401, {"WWW-Authenticate": f'Bearer realm="http://{realm_host}/token",'
                                                 f'service="reg"'}, b""

            with recording_server(registry) as (host, seen_registry):
                (tmp_path / "config.json").write_text(json.dumps({"auths": {host: {"identitytoken": SECRET}}}))
                client = RegistryClient(host, "a/b", env={"DOCKER_CONFIG": str(tmp_path)},
                                        certs_d=tmp_path / "none", daemon_json=tmp_path / "none.json")
                try:
                    client.manifest("HEAD", "1")
                except DataError as exc:
                    assert status in (307, 308), exc.message
                    assert "refusing to send credentials to another origin" in exc.message
                    assert SECRET not in exc.one_line()
                else:
                    assert status in (301, 302, 303)
                    # RFC 9110: the redirected request is a GET without the form.
                    assert [s["method"] for s in elsewhere] == ["GET"] and elsewhere[0]["body"] == b""
        assert any(SECRET in s["body"].decode() for s in at_realm)  # the realm itself got it
        assert SECRET not in _everything(elsewhere)


@pytest.mark.parametrize(("status", "method", "body"), [
    (307, "POST", b"form"), (308, "POST", b"form"), (303, "GET", b""), (302, "GET", b""),
    (301, "GET", b"")])
def test_redirects_of_a_post_follow_rfc_9110_within_one_origin(status: int, method: str, body: bytes) -> None:
    from envbuild.upstream.http_client import HttpClient

    def route(m: str, path: str) -> tuple[int, dict[str, str], bytes]:
        return (status, {"Location": "/next"}, b"") if path == "/first" else (200, {}, b"ok")

    with recording_server(route) as (host, seen):
        reply = HttpClient(env={}).send("POST", f"http://{host}/first",
                                        {"Authorization": "Basic dXNlcjpwdw==",
                                         "Content-Type": "application/x-www-form-urlencoded"},
                                        data=b"form", secret_body=True)
    assert reply.body == b"ok"
    assert [(s["method"], s["path"], s["body"]) for s in seen] == [
        ("POST", "/first", b"form"), (method, "/next", body)]
    assert seen[1]["headers"].get("Authorization") == "Basic dXNlcjpwdw=="  # same origin: kept
    assert ("Content-Type" in seen[1]["headers"]) == (method == "POST")


def test_a_manifest_put_redirected_elsewhere_keeps_its_body_but_not_the_token() -> None:
    from envbuild.upstream.http_client import HttpClient

    with recording_server(lambda m, p: (201, {}, b"")) as (other, elsewhere):
        with recording_server(lambda m, p: (307, {"Location": f"http://{other}/put"}, b"")) as (host, _):
            HttpClient(env={}).send("PUT", f"http://{host}/v2/a/manifests/1",
                                    {"Authorization": "Bearer T-registry", "Cookie": "s=1"}, data=b"{}")
    assert [(s["method"], s["body"]) for s in elsewhere] == [("PUT", b"{}")]
    assert "Authorization" not in elsewhere[0]["headers"] and "Cookie" not in elsewhere[0]["headers"]
