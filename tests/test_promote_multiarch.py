"""``promote --multiarch``: one tag naming an OCI image index of an amd64 and an arm64 image
(issue 38), against a real registry (Debian's ``docker-registry`` on 127.0.0.1).

The two images are written honestly through the Registry HTTP API here (a layer blob, a config
blob naming its architecture, a manifest), the way a push would leave them; the index promote
writes is read back through the same API and, where it is installed, with ``skopeo inspect``."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from schemas import check

from envbuild.commands.cli import main

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
GPU_RUN = {"torch": {"devices": [{"index": 0, "name": "NVIDIA GH200"}]},
           "checks": [{"name": "gpu.kernel@cuda:0", "gpu": True, "status": "pass"}]}


def _blob(host: str, name: str, data: bytes) -> str:
    """Upload ``data`` as a blob (POST, then a monolithic PUT); its digest."""
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    start = urllib.request.Request(f"http://{host}/v2/{name}/blobs/uploads/", method="POST", data=b"")
    with OPENER.open(start) as reply:
        location = reply.headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    put = urllib.request.Request(f"{location}{'&' if '?' in location else '?'}digest={digest}",
                                 method="PUT", data=data,
                                 headers={"Content-Type": "application/octet-stream"})
    with OPENER.open(put) as reply:
        assert reply.status == 201
    return digest


def push_tiny_image(host: str, name: str, arch: str, labels: dict[str, str] | None = None,
                    tag: str | None = None) -> str:
    """An image of one layer (one file naming ``arch``) whose config says linux/``arch`` (and
    carries ``labels``), tagged ``tag`` (default: ``arch``); the digest of its manifest."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        body = f"built for {arch}\n".encode()
        info = tarfile.TarInfo("arch.txt")
        info.size, info.mtime = len(body), 0
        tar.addfile(info, io.BytesIO(body))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = json.dumps({"architecture": arch, "os": "linux", "config": {"Labels": labels} if labels else {},
                         "rootfs": {"type": "layers",
                                    "diff_ids": [f"sha256:{hashlib.sha256(raw.getvalue()).hexdigest()}"]}
                         }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _blob(host, name, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _blob(host, name, layer), "size": len(layer)}]}).encode()
    put = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{tag or arch}", method="PUT",
                                 data=manifest, headers={"Content-Type": OCI_MANIFEST})
    with OPENER.open(put) as reply:
        digest = reply.headers["Docker-Content-Digest"]
    assert digest == f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    return str(digest)


def _report(path: Path, pinned: str, exit_code: int = 0) -> Path:
    """What 'verify --report' writes for a run of ``pinned`` (the smoke test's part abridged)."""
    path.write_text(json.dumps({**GPU_RUN, "envbuild.verify": {
        "image": pinned, "digest": pinned.partition("@")[2], "exit_code": exit_code,
        "cpu_ok": False, "tier": None}}))
    return path


def _get(host: str, name: str, reference: str) -> tuple[str, dict[str, Any], str]:
    request = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{reference}",
                                     headers={"Accept": OCI_INDEX})
    with OPENER.open(request) as reply:
        return reply.headers["Content-Type"], json.loads(reply.read()), reply.headers["Docker-Content-Digest"]


def test_promote_multiarch_tags_an_oci_index_of_each_platforms_verified_image(
        loopback_registry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """J26: one tag for an amd64 and an arm64 image, each by digest with its platform; only
    after each image's smoke test passed; refusals tag nothing."""
    host, name = loopback_registry, "ml/multiarch-h38b"
    amd = f"{host}/{name}@{push_tiny_image(host, name, 'amd64')}"
    arm = f"{host}/{name}@{push_tiny_image(host, name, 'arm64')}"
    amd_report, arm_report = _report(tmp_path / "amd.json", amd), _report(tmp_path / "arm.json", arm)
    # the arm64 image's report failed: nothing is tagged
    failed = _report(tmp_path / "arm-failed.json", arm, exit_code=7)
    assert main(["promote", amd, "gh", "--multiarch", arm, "--verified-report", str(amd_report),
                 "--verified-report", str(failed)]) == 7
    assert "did not pass" in capsys.readouterr().err
    # a report missing for one of the images: refused, naming its digest
    assert main(["promote", amd, "gh", "--multiarch", arm, "--verified-report", str(amd_report)]) == 2
    assert f"not {arm.partition('@')[2]}" in capsys.readouterr().err
    # two images of one platform, or images of two repositories: refused before anything is written
    assert main(["promote", amd, "gh", "--multiarch", amd, "--verified-report", str(amd_report)]) == 2
    assert "two images for linux/amd64" in capsys.readouterr().err
    other = _report(tmp_path / "other.json", f"{host}/ml/other@{arm.partition('@')[2]}")
    assert main(["promote", amd, "gh", "--multiarch", f"{host}/ml/other@{arm.partition('@')[2]}",
                 "--verified-report", str(amd_report), "--verified-report", str(other)]) == 2
    assert "in one repository" in capsys.readouterr().err
    with pytest.raises(urllib.error.HTTPError):
        _get(host, name, "gh")
    # both passed (reports in any order): the tag names an OCI index of the two digests
    assert main(["promote", amd, "gh", "--multiarch", arm, "--verified-report", str(arm_report),
                 "--verified-report", str(amd_report), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    check("promote.schema.json", document)
    media, index, digest = _get(host, name, "gh")
    assert media == OCI_INDEX and index["mediaType"] == OCI_INDEX and document["digest"] == digest
    platforms = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
                 for m in index["manifests"]}
    assert platforms == {"linux/amd64": amd.partition("@")[2], "linux/arm64": arm.partition("@")[2]}
    assert {m["platform"]: m["digest"] for m in document["manifests"]} == platforms
    assert all(m["mediaType"] == OCI_MANIFEST for m in index["manifests"])
    # an index among the images is no platform's image: refused
    nested = f"{host}/{name}@{digest}"
    assert main(["promote", nested, "gh2", "--multiarch", arm, "--verified-report", str(arm_report),
                 "--verified-report", str(_report(tmp_path / "index.json", nested))]) == 2
    assert "is no single image" in capsys.readouterr().err
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        return

    def inspect(*argv: str) -> Any:
        done = subprocess.run([skopeo, *argv], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    assert inspect("inspect", "--tls-verify=false", "--raw", f"docker://{host}/{name}:gh") == index
    for arch in ("amd64", "arm64"):  # a client asking for each platform gets that platform's image
        seen = inspect("--override-arch", arch, "--override-os", "linux", "inspect", "--tls-verify=false",
                       f"docker://{host}/{name}:gh")
        assert (seen["Digest"], seen["Architecture"], seen["Os"]) == (digest, arch, "linux")
        config = inspect("inspect", "--tls-verify=false", "--config", "--raw",
                         f"docker://{host}/{name}@{platforms['linux/' + arch]}")
        assert config["architecture"] == arch
