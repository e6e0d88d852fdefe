"""``envbuild sbom --attach REF@sha256:…``: the bill of materials pushed as an OCI artifact referring
to the image, against a real registry (Debian's ``docker-registry`` 2.8 on 127.0.0.1, which has no
referrers API: it answers ``GET /v2/<name>/referrers/<digest>`` with 404 and sets no ``OCI-Subject``,
so the artifact must be found through the referrers tag schema). The images are written through
the registry's API (tests/test_promote_multiarch.py), labelled as the lock's build labels them.
docs/faults.md J27–J29."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_cutoff import Served, env, project, run, served  # noqa: F401 (fixtures)
from test_promote_multiarch import OPENER, _blob, push_tiny_image

from envbuild.registry.client import RegistryClient
from envbuild.registry.referrers import OCI_INDEX, OCI_MANIFEST, referrers, referrers_tag
from envbuild.render.docker import label_values
from envbuild.render.lockset import read_lockset

CYCLONEDX = "application/vnd.cyclonedx+json"
SIGNATURE = "application/vnd.example.signature"


def _get(host: str, name: str, path: str, accept: str = OCI_MANIFEST) -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://{host}/v2/{name}/{path}", headers={"Accept": accept})
    try:
        with OPENER.open(request) as reply:
            return reply.status, reply.headers.get("Content-Type", ""), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _push_signature(host: str, name: str, subject: str) -> dict[str, Any]:
    """Another tool's artifact referring to ``subject`` (a stand-in signature); its descriptor as
    a referrers index lists it."""
    empty, content = _blob(host, name, b"{}"), _blob(host, name, b"signed")
    image = _get(host, name, f"manifests/{subject}")[2]
    body = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": SIGNATURE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty, "size": 2},
        "layers": [{"mediaType": SIGNATURE, "digest": content, "size": 6}],
        "subject": {"mediaType": OCI_MANIFEST, "digest": subject, "size": len(image)}}).encode()
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    put = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{digest}", method="PUT", data=body,
                                 headers={"Content-Type": OCI_MANIFEST})
    with OPENER.open(put) as reply:
        assert reply.status == 201
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(body), "artifactType": SIGNATURE}


def _put_index(host: str, name: str, tag: str, entries: list[dict[str, Any]]) -> None:
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    put = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{tag}", method="PUT", data=body,
                                 headers={"Content-Type": OCI_INDEX})
    with OPENER.open(put) as reply:
        assert reply.status == 201


def _lock_labels(directory: Path) -> dict[str, str]:
    """The labels a build of the lock's one target gives its image (the unknown ones left out)."""
    lock = read_lockset(directory / "envbuild.lock").targets["default"]
    return {key: value for key, value in label_values(lock).items() if value}


def test_attach_pushes_the_sbom_as_a_referrer_found_from_the_image_digest(
        loopback_registry: str, tmp_path: Path, served: Served, env: dict[str, str],  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """J27: blob, empty config and an artifact manifest whose subject is the image's descriptor as
    the registry serves it; listed once in the tag sha256-<hex> (this registry has no referrers
    API), however often it is attached; the SBOM read back from the image digest is the file's
    bytes."""
    monkeypatch.chdir(project(tmp_path, served.url))
    assert run(capsys, env, "lock")[0] == 0
    host, name = loopback_registry, "ml/sbom-h41c"
    labels = {**_lock_labels(tmp_path), "dev.envbuild.built-by": "envbuild build", "mine": "kept"}
    digest = push_tiny_image(host, name, "amd64", labels, tag="gpu")
    ref = f"{host}/{name}@{digest}"
    # The registry here has no referrers API: its answer is the 404 that sends clients to the tag.
    assert _get(host, name, f"referrers/{digest}", OCI_INDEX)[0] == 404
    code, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--attach", ref)
    assert code == 0, err
    tag = referrers_tag(digest)
    assert tag == "sha256-" + digest.removeprefix("sha256:")
    assert f"attached sbom.default.cdx.json to {ref} as sha256:" in out and f"listed in the tag {tag}" in out
    written = (tmp_path / "sbom.default.cdx.json").read_bytes()
    assert json.loads(written)["metadata"]["component"]["name"] == ref  # the document names its image

    def found() -> list[dict[str, Any]]:
        status, media, body = _get(host, name, f"manifests/{tag}", OCI_INDEX)
        assert status == 200 and media == OCI_INDEX
        index = json.loads(body)
        assert index["mediaType"] == OCI_INDEX and index["schemaVersion"] == 2
        return list(index["manifests"])

    (entry,) = found()
    assert entry["artifactType"] == CYCLONEDX and entry["mediaType"] == OCI_MANIFEST
    assert entry["annotations"] == {"dev.envbuild.target": "default"}
    status, media, body = _get(host, name, f"manifests/{entry['digest']}")
    assert status == 200 and media == OCI_MANIFEST and len(body) == entry["size"]
    assert f"sha256:{hashlib.sha256(body).hexdigest()}" == entry["digest"]
    artifact = json.loads(body)
    image = _get(host, name, f"manifests/{digest}")[2]
    assert artifact["artifactType"] == CYCLONEDX
    assert artifact["subject"] == {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(image)}
    assert artifact["config"] == {"mediaType": "application/vnd.oci.empty.v1+json", "size": 2,
                                  "digest": f"sha256:{hashlib.sha256(b'{}').hexdigest()}"}
    assert _get(host, name, f"blobs/{artifact['config']['digest']}")[2] == b"{}"
    (layer,) = artifact["layers"]
    assert layer["mediaType"] == CYCLONEDX and layer["annotations"]["org.opencontainers.image.title"] \
        == "sbom.default.cdx.json"
    assert _get(host, name, f"blobs/{layer['digest']}")[2] == written  # the same bytes back
    # The library's reading (the referrers API first, its 404 then the tag) finds the same entry.
    client = RegistryClient(host, name, env={})
    assert referrers(client, digest, CYCLONEDX) == ([entry], "tag")
    assert referrers(client, digest, "application/spdx+json") == ([], "tag")
    # Attached again (the same document): the tag still lists it once.
    code, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--attach", ref)
    assert code == 0 and "it was listed already" in out, err
    assert found() == [entry]
    # Another tool's referrer listed there (and the SBOM not yet): kept, the SBOM appended once.
    other = _push_signature(host, name, digest)
    _put_index(host, name, tag, [other])
    code, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--attach", ref)
    assert code == 0 and "listed already" not in out, err
    assert found() == [other, entry]
    assert referrers(client, digest) == ([other, entry], "tag")
    skopeo = shutil.which("skopeo")
    if skopeo is not None:  # another client reads the tag's index and the artifact alike
        raw = subprocess.run([skopeo, "inspect", "--tls-verify=false", "--raw", f"docker://{host}/{name}:{tag}"],
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(raw)["manifests"] == [other, entry]
        raw = subprocess.run([skopeo, "inspect", "--tls-verify=false", "--raw",
                              f"docker://{host}/{name}@{entry['digest']}"],
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(raw)["subject"]["digest"] == digest


def test_attach_refuses_what_is_not_the_targets_image_and_lists_nothing(
        loopback_registry: str, tmp_path: Path, served: Served, env: dict[str, str],  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """J28: a REF without digest, a digest the registry lacks, an image of another stack or
    platform, an image envbuild did not build, an index: 2, nothing pushed or listed; a referrers
    tag holding something other than an index: 4, left as it was."""
    monkeypatch.chdir(project(tmp_path, served.url))
    assert run(capsys, env, "lock")[0] == 0
    host, name = loopback_registry, "ml/sbom-refused-h41c"
    labels = _lock_labels(tmp_path)
    good = push_tiny_image(host, name, "amd64", labels, tag="good")

    def refused(ref: str, code: int = 2) -> str:
        got, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--attach", ref)
        assert got == code and out == "" and err.splitlines()[-1].startswith("envbuild: error[usage]: ")
        assert err.count("\n") <= 2, err  # the document's warning (no Debian packages recorded), the error
        assert not (tmp_path / "sbom.default.cdx.json").exists()
        return err

    assert "needs the image by digest" in refused(f"{host}/{name}:good")
    code, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--stdout",
                         "--attach", f"{host}/{name}@{good}")
    assert code == 2 and out == "" and "it writes the file, not --stdout" in err
    missing = "sha256:" + "0" * 64
    assert f"has no manifest {missing}" in refused(f"{host}/{name}@{missing}")
    other_torch = push_tiny_image(host, name, "amd64", {**labels, "dev.envbuild.torch": "2.12.0"}, tag="t")
    err = refused(f"{host}/{name}@{other_torch}")
    assert "is not the image this target describes: label dev.envbuild.torch 2.12.0, not 2.13.0" in err
    arm = push_tiny_image(host, name, "arm64", labels, tag="arm")
    assert "platform linux/arm64, not linux/amd64" in refused(f"{host}/{name}@{arm}")
    plain = push_tiny_image(host, name, "amd64", {"mine": "x"}, tag="plain")
    assert "no dev.envbuild.* label: not an image envbuild built" in refused(f"{host}/{name}@{plain}")
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": good, "size": len(_get(host, name, f"manifests/{good}")[2]),
         "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    put = urllib.request.Request(f"http://{host}/v2/{name}/manifests/multi", method="PUT", data=index,
                                 headers={"Content-Type": OCI_INDEX})
    with OPENER.open(put) as reply:
        multi = reply.headers["Docker-Content-Digest"]
    assert "is no single image" in refused(f"{host}/{name}@{multi}")
    for digest in (missing, other_torch, arm, plain, multi):  # nothing was listed for any of them
        assert _get(host, name, f"manifests/{referrers_tag(digest)}", OCI_INDEX)[0] == 404
    # The good image's referrers tag holds an image, not an index: reported (4), never overwritten.
    squatter = push_tiny_image(host, name, "amd64", labels, tag=referrers_tag(good))
    code, _, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--attach", f"{host}/{name}@{good}")
    assert code == 4 and err.splitlines()[-1].startswith("envbuild: error[data]: "), err
    assert f"the tag {referrers_tag(good)} of" in err and "holds no image index of referrers" in err
    status, _, body = _get(host, name, f"manifests/{referrers_tag(good)}")
    assert status == 200 and f"sha256:{hashlib.sha256(body).hexdigest()}" == squatter


class ReferrersRegistry:
    """A stand-in registry that has the referrers API (none is installed here): blobs, manifests by
    digest or tag, ``OCI-Subject`` on the PUT of a manifest with a subject, and
    ``GET /v2/<name>/referrers/<digest>`` listing them; relative upload locations. ``tags`` records
    every tag a client PUT."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[str, bytes]] = {}
        self.tags: list[str] = []

    def store(self, data: bytes, media: str | None = None, tag: str | None = None) -> str:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        if media is None:
            self.blobs[digest] = data
        else:
            self.manifests[digest] = (media, data)
            if tag is not None:
                self.manifests[tag] = (media, data)
                self.tags.append(tag)
        return digest

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                kind, _, ref = path.removeprefix("/v2/ml/api/").partition("/")
                if path == "/v2/":
                    self.answer(200, b"{}")
                elif kind == "blobs" and ref in registry.blobs:
                    self.answer(200, registry.blobs[ref])
                elif kind == "manifests" and ref in registry.manifests:
                    media, body = registry.manifests[ref]
                    said = f"sha256:{hashlib.sha256(body).hexdigest()}"
                    self.answer(200, body, {"Content-Type": media, "Docker-Content-Digest": said})
                elif kind == "referrers":
                    listed = []
                    for key, (media, body) in sorted(registry.manifests.items()):
                        manifest = json.loads(body)
                        if key.startswith("sha256:") and manifest.get("subject", {}).get("digest") == ref:
                            listed.append({"mediaType": media, "digest": key, "size": len(body),
                                           "artifactType": manifest["artifactType"],
                                           "annotations": manifest.get("annotations", {})})
                    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed}
                    self.answer(200, json.dumps(index).encode(), {"Content-Type": OCI_INDEX})
                else:
                    self.answer(404)

            do_HEAD = do_GET

            def do_POST(self) -> None:
                self.answer(202, headers={"Location": "/v2/ml/api/blobs/uploads/one?_state=x"})

            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                path, _, query = self.path.partition("?")
                if "/blobs/uploads/" in path:
                    assert query.startswith("_state=x&digest=")
                    self.answer(201, headers={"Location": "/v2/ml/api/blobs/" + registry.store(body)})
                    return
                ref = path.rpartition("/")[2]
                digest = registry.store(body, self.headers["Content-Type"],
                                        None if ref.startswith("sha256:") else ref)
                subject = json.loads(body).get("subject")
                headers = {"Docker-Content-Digest": digest}
                if subject:
                    headers["OCI-Subject"] = subject["digest"]
                self.answer(201, headers=headers)

        return Handler


def test_a_registry_with_the_referrers_api_lists_the_sbom_itself(
        tmp_path: Path, served: Served, env: dict[str, str],  # noqa: F811 (the fixtures)
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """J29: the push answered with OCI-Subject: no referrers tag is written; the referrers API
    lists the artifact, with its artifactType and annotations."""
    monkeypatch.chdir(project(tmp_path, served.url))
    assert run(capsys, env, "lock")[0] == 0
    registry = ReferrersRegistry()
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Labels": _lock_labels(tmp_path)}}).encode()
    image = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                   "digest": registry.store(config), "size": len(config)},
                        "layers": []}).encode()
    digest = registry.store(image, OCI_MANIFEST, "gpu")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), registry.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        ref = f"{host}/ml/api@{digest}"
        code, out, err = run(capsys, env, "sbom", "--lock", "envbuild.lock", "--attach", ref)
        assert code == 0 and "the registry's referrers API lists it" in out, err
        assert registry.tags == ["gpu"]  # no sha256-<hex> tag was written
        (entry,), via = referrers(RegistryClient(host, "ml/api", env={}), digest, CYCLONEDX)
        assert via == "api" and entry["annotations"] == {"dev.envbuild.target": "default"}
        layer = json.loads(registry.manifests[entry["digest"]][1])["layers"][0]["digest"]
        assert registry.blobs[layer] == (tmp_path / "sbom.default.cdx.json").read_bytes()
    finally:
        server.shutdown()
        server.server_close()
