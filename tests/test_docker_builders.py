"""buildah and the classic builder for real, a real registry (docs/faults.md J): the CPU stack
built from the $PIP_FIND_LINKS wheelhouse with each, pushed to the loopback registry, verified
by digest, promoted; the CA bundle in no layer of the pushed image; a failing step and Ctrl-C
with buildah leave nothing behind. Needs dockerd, buildah and docker-registry (DEVELOPERS.md).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tagged
from test_docker_e2e import CPU_TAG, TORCH_WHEEL, all_containers, base_image, client, envbuild

from envbuild.engine.builders import BuildahBuilder
from envbuild.engine.context import context_tar
from envbuild.errors import BuildFailed
from envbuild.registry.digest import image_digest
from envbuild.registry.reference import ACCEPT

pytestmark = pytest.mark.docker
__all__ = ["base_image", "client"]  # fixtures shared with test_docker_e2e

BUILDAH_TAG = tagged("envbuild-test/cpu-buildah:2.13.0")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="session")
def buildah() -> BuildahBuilder:
    if shutil.which("buildah") is None:
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail("ENVBUILD_REQUIRE_DOCKER is set but there is no buildah (apt-get install buildah)")
        pytest.skip("no buildah")
    return BuildahBuilder()


def cpu_args(base_image: str) -> list[str]:
    wheelhouse = os.environ.get("PIP_FIND_LINKS", "")
    if not (Path(wheelhouse) / TORCH_WHEEL).is_file():
        pytest.skip(f"no {TORCH_WHEEL} in $PIP_FIND_LINKS")
    # --no-compile-toolchain: these builds test the builders, not torch.compile (test_lock_e2e's
    # image compiles); without g++ each build and each verify here is shorter.
    args = ["build", "--torch", "==2.13.0", "--variant", "cpu", "--python", "3.11",
            "--no-companions", "--no-compile-toolchain", "--base-image", base_image,
            "--wheelhouse", wheelhouse, "--network", "host"]
    cert = os.environ.get("PIP_CERT")
    if cert:
        args += ["--ca-bundle", cert]
    return args


def pushed(client: Any, base_image: str, registry: str, builder: str, tag: str,
           tmp: Path) -> dict[str, Any]:
    """buildah's build with --no-load: pushed from buildah's storage, never copied into the
    Docker engine; the tests below verify and promote it by the pushed digest."""
    report = tmp / f"{builder}.json"
    ref = f"{registry}/envbuild-test/cpu-{builder}:candidate"
    no_load = ["--no-load"] if builder == "buildah" else []
    if no_load and client.images(name=tag):  # copied in by an earlier run: not what is checked below
        client.remove_image(tag, force=True)
    done = envbuild(*cpu_args(base_image), "--builder", builder, "--tag", tag, "--push", ref,
                    "--report", str(report), *no_load, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads(report.read_text())
    assert f"built {tag} with {'docker-sdk' if builder == 'classic' else builder}" in done.stdout
    assert f"pushed {data['pushed']['pinned']}" in done.stdout
    if no_load:
        assert "in buildah's storage only" in done.stdout and data["size"] == 0
        assert not client.images(name=tag), "--no-load: the image must not be in the Docker engine"
    return dict(data)


@pytest.fixture(scope="session")
def by_builder(client: Any, base_image: str, loopback_registry: str, buildah: BuildahBuilder,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Each builder's build report, its image pushed to the loopback registry. The classic one
    has test_docker_e2e's recipe (each module removes its images when it ends: each builds its own). The
    buildah image leaves buildah's storage afterwards."""
    tmp = tmp_path_factory.mktemp("builders")
    before = buildah_images(buildah)
    try:
        yield {"classic": pushed(client, base_image, loopback_registry, "classic", CPU_TAG, tmp),
               "buildah": pushed(client, base_image, loopback_registry, "buildah", BUILDAH_TAG, tmp)}
    finally:
        # The tag, then the images its build left in buildah's storage (its --layers steps)
        subprocess.run([*buildah.base(), "rmi", BUILDAH_TAG], capture_output=True, check=False)
        made = buildah_images(buildah) - before
        if made:
            subprocess.run([*buildah.base(), "rmi", "--force", *made], capture_output=True, check=False)


def buildah_images(buildah: BuildahBuilder) -> set[str]:
    done = subprocess.run([*buildah.base(), "images", "--all", "--quiet", "--no-trunc"],
                          capture_output=True, text=True, check=False)
    return set(done.stdout.split())


def manifest(ref: str) -> dict[str, Any]:
    host, _, rest = ref.partition("/")
    name, _, digest = rest.partition("@")
    request = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{digest}",
                                     headers={"Accept": ACCEPT})
    with OPENER.open(request, timeout=30) as reply:
        return dict(json.loads(reply.read()))


def layers(ref: str) -> Iterator[tarfile.TarFile]:
    """Each layer of the pushed image ``ref`` (name@digest) as an open tar, from the registry."""
    host, _, rest = ref.partition("/")
    name = rest.partition("@")[0]
    for layer in manifest(ref)["layers"]:
        with OPENER.open(f"http://{host}/v2/{name}/blobs/{layer['digest']}", timeout=120) as reply:
            blob = reply.read()
        data = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            yield tar


def holders(tar: tarfile.TarFile, needle: bytes) -> list[str]:
    """Members of ``tar`` whose bytes contain ``needle``."""
    found = []
    for member in tar.getmembers():
        if member.isfile():
            handle = tar.extractfile(member)
            if handle is not None and needle in handle.read():
                found.append(member.name)
    return found


def test_holders_finds_a_file_in_a_layer() -> None:  # the check below can fail
    out = io.BytesIO()
    context_tar({"etc/envbuild/ca-bundle.crt": b"xx-BUNDLE-xx"}, out)
    with tarfile.open(fileobj=out) as tar:
        assert holders(tar, b"BUNDLE") == ["etc/envbuild/ca-bundle.crt"]


@pytest.mark.parametrize("builder", ["classic", "buildah"])
def test_pushed_digest_is_the_registrys_and_the_ca_bundle_is_in_no_layer(
        by_builder: dict[str, dict[str, Any]], builder: str) -> None:
    pushed = by_builder[builder]["pushed"]
    assert image_digest(pushed["ref"], env={}) == pushed["digest"]
    cert = os.environ.get("PIP_CERT")
    if not cert:
        pytest.skip("no $PIP_CERT bundle to look for")
    bundle = Path(cert).read_bytes()
    count = 0
    for tar in layers(pushed["pinned"]):
        count += 1
        assert holders(tar, bundle) == []
        assert not [n for n in tar.getnames() if n.endswith(("ca-bundle.crt", "envbuild-ca"))]
    assert count >= 2  # the base and what the recipe added (buildah without --layers: one)


@pytest.mark.parametrize("builder", ["classic", "buildah"])
def test_verify_by_digest_pulls_then_promote_tags_that_digest(
        client: Any, by_builder: dict[str, dict[str, Any]], builder: str, tmp_path: Path) -> None:
    pushed = by_builder[builder]["pushed"]
    pinned, digest = pushed["pinned"], pushed["digest"]
    repository = pinned.partition("@")[0]
    for image in client.images(name=repository):  # not local: verify must pull it
        client.remove_image(image["Id"], force=True)
    report = tmp_path / "verify.json"
    done = envbuild("verify", pinned, "--cpu-ok", "--tier", "1", "--report", str(report))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(report.read_text())["envbuild.verify"]["digest"] == digest
    # A report of a CPU-only run (no GPU here) is not enough by default: docs/faults.md U7.
    done = envbuild("promote", pinned, "verified", "--verified-report", str(report))
    assert done.returncode == 2 and "--allow-cpu-report" in done.stderr, done.stderr
    done = envbuild("promote", pinned, "verified", "--verified-report", str(report), "--allow-cpu-report")
    assert done.returncode == 0, done.stderr
    assert f"promoted {pinned} to {repository}:verified" in done.stdout
    assert image_digest(f"{repository}:verified", env={}) == digest
    if builder == "buildah":  # without a report promote runs the smoke test itself
        done = envbuild("promote", pinned, "stable", "--cpu-ok", "--allow-cpu-report")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "exit 0 (pass)" in done.stdout
        assert image_digest(f"{repository}:stable", env={}) == digest


def test_promote_without_a_passing_smoke_test_tags_nothing(
        by_builder: dict[str, dict[str, Any]]) -> None:
    pinned = by_builder["classic"]["pushed"]["pinned"]
    repository = pinned.partition("@")[0]
    done = envbuild("promote", pinned, "gpu-ok", "--gpus", "all")  # no GPU here: verify fails
    assert done.returncode in (7, 8), done.stderr
    with pytest.raises(Exception, match=r"not found|404|unknown"):
        image_digest(f"{repository}:gpu-ok", env={})


def buildah_containers() -> set[str]:
    # The storage envbuild's builder uses (its driver, as it passes it), not buildah's default.
    done = subprocess.run([*BuildahBuilder().base(), "containers", "-aq", "--notruncate"],
                          capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def our_tempdirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("envbuild-build-*")}


def test_buildah_failing_step_exit_6_leaves_no_container(buildah: BuildahBuilder, client: Any,
                                                         base_image: str) -> None:
    before, temps = buildah_containers(), our_tempdirs()
    context = io.BytesIO()
    context_tar({"Dockerfile": f"FROM {base_image}\nRUN echo about to fail && exit 3\n".encode()},
                context)
    with pytest.raises(BuildFailed) as info:
        BuildahBuilder(docker=client).build(context, tag="envbuild-test/fail-buildah:1",
                                            network="host", labels={}, progress=lambda e: None)
    assert info.value.exit_code == 6
    assert "RUN echo about to fail" in info.value.message and "exit status 3" in info.value.message
    assert "about to fail" in info.value.details
    assert buildah_containers() == before and our_tempdirs() == temps


def test_buildah_sigint_exits_130_and_leaves_nothing(buildah: BuildahBuilder, client: Any,
                                                     base_image: str) -> None:
    context = io.BytesIO()
    context_tar({"Dockerfile": f"FROM {base_image}\nCOPY apt-get /usr/local/bin/apt-get\n"
                               "RUN chmod 755 /usr/local/bin/apt-get\n".encode(),
                 "apt-get": b"#!/bin/sh\nsleep 60\n"}, context)
    from envbuild.engine.build import SdkBuilder

    SdkBuilder(client=client).build(context, tag="envbuild-test/slow-apt:1", network="none",
                                    labels={}, progress=lambda e: None)
    before, temps, docker_before = buildah_containers(), our_tempdirs(), all_containers(client)
    proc = subprocess.Popen(
        [sys.executable, "-m", "envbuild", "build", "--builder", "buildah", "--variant", "cpu",
         "--torch", "==2.13.0", "--python", "3.11", "--no-companions", "--base-image",
         "envbuild-test/slow-apt:1", "--network", "host", "--tag", "envbuild-test/interrupted-buildah:1",
         # the slow step must run: a run whose step once finished (a test killed by its time-out)
         # left it in buildah's layer cache, and the next run went on to download torch instead
         "--no-cache"],
        cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    assert proc.stderr is not None
    seen = ""
    while "apt-get update" not in seen:
        line = proc.stderr.readline()
        assert line, f"build ended early: {seen}"
        seen += line
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    # communicate, not wait: both pipes drained, so no cleanup line can block on a full pipe
    try:
        _, rest = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()  # a build left running would finish its step into the layer cache
        raise
    assert proc.returncode == 130, seen + rest
    assert buildah_containers() == before
    assert our_tempdirs() == temps
    assert all_containers(client) == docker_before
    assert not client.images(name="envbuild-test/interrupted-buildah")
    assert subprocess.run([*buildah.base(), "inspect", "--type", "image",
                           "envbuild-test/interrupted-buildah:1"], capture_output=True).returncode != 0


def test_buildah_builds_on_a_base_pinned_by_digest_in_a_loopback_registry(
        buildah: BuildahBuilder, client: Any, base_image: str, loopback_registry: str) -> None:
    """A lock's base is ``name@sha256:…`` in a registry. buildah pulls it from there (plain HTTP
    for a loopback registry, digest checked), not from the Docker engine, which takes no digest."""
    # A base of its own (a layer no other run has), so buildah cannot hold its digest already:
    # buildah finds an image by digest under any name.
    repository = f"{loopback_registry}/envbuild/digest-base"
    unique = io.BytesIO()
    context_tar({"Dockerfile": f"FROM {base_image}\nRUN echo {os.urandom(8).hex()} > /unique\n".encode()},
                unique)
    unique.seek(0)
    from envbuild.engine.build import SdkBuilder

    SdkBuilder(client=client).build(unique, tag=f"{repository}:base", network="none", labels={},
                                    progress=lambda e: None)
    for line in client.push(repository, "base", stream=True, decode=True):
        assert "error" not in line, line
    pinned = f"{repository}@{image_digest(f'{repository}:base', env={})}"
    assert not buildah.has_image(pinned)
    context = io.BytesIO()
    context_tar({"Dockerfile": f"FROM {pinned}\nRUN echo on-the-pinned-base > /pinned\n".encode()},
                context)
    events: list[str] = []
    tag = "envbuild-test/on-digest-buildah:1"
    try:
        result = BuildahBuilder(docker=None).build(context, tag=tag, network="host", labels={},
                                                   progress=lambda e: events.append(e.text))
        assert result.image_id.startswith("sha256:")
        assert any(text.startswith(f"pulling {pinned}") for text in events)
        assert not any("from the Docker engine" in text for text in events)
    finally:
        subprocess.run([*buildah.base(), "rmi", "-f", tag, pinned], capture_output=True, check=False)
        client.remove_image(f"{repository}:base", force=True)


def test_buildah_builds_on_the_base_as_the_docker_engine_holds_it_now(
        buildah: BuildahBuilder, client: Any, base_image: str) -> None:
    """docs/faults.md U16: a base tag buildah once copied from the Docker engine, then rebuilt
    there with other content, is copied again (buildah's copy and the engine's image compared
    by image ID, not by tag): the next build is on the new base, not on buildah's older copy."""
    from envbuild.engine.build import SdkBuilder

    token = os.urandom(4).hex()
    base, tag = f"envbuild-test/rebased-{token}:base", f"envbuild-test/on-rebased-{token}:1"
    engine_images: list[str] = []
    before = buildah_images(buildah)

    def make_base(content: str) -> None:
        context = io.BytesIO()
        context_tar({"Dockerfile": f"FROM {base_image}\nRUN echo {content} > /marker\n".encode()}, context)
        engine_images.append(SdkBuilder(client=client).build(
            context, tag=base, network="none", labels={}, progress=lambda e: None).image_id)

    def build_on_it() -> tuple[str, list[str]]:
        context = io.BytesIO()
        context_tar({"Dockerfile": f"FROM {base}\nRUN cp /marker /seen\n".encode()}, context)
        events: list[str] = []
        engine_images.append(BuildahBuilder(docker=client).build(
            context, tag=tag, network="host", labels={}, progress=lambda e: events.append(e.text)).image_id)
        seen = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, "cat", "/seen"],
                              capture_output=True, text=True, check=True, timeout=120)
        return seen.stdout.strip(), events

    try:
        make_base(f"first-{token}")
        seen, events = build_on_it()
        assert seen == f"first-{token}" and f"copying {base} from the Docker engine" in events
        assert buildah.image_id(base) == engine_images[0]  # buildah's copy: the engine's image
        make_base(f"second-{token}")  # the same tag, rebuilt in the engine
        seen, events = build_on_it()
        assert seen == f"second-{token}", "buildah built on its older copy of the base"
        assert any(e.startswith(f"copying {base} from the Docker engine again") for e in events), events
        assert buildah.image_id(base) == engine_images[2]
        _, events = build_on_it()  # unchanged: not copied a third time
        assert not any("from the Docker engine" in e and "copying" in e for e in events), events
    finally:
        subprocess.run([*buildah.base(), "rmi", tag, base], capture_output=True, check=False)
        made = buildah_images(buildah) - before
        if made:
            subprocess.run([*buildah.base(), "rmi", "--force", *made], capture_output=True, check=False)
        for image in [tag, base, *reversed(engine_images)]:
            with contextlib.suppress(Exception):
                client.remove_image(image, force=True)
