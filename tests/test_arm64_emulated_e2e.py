"""An arm64 image built and verified on this amd64 machine, under emulation (issue 38): a project
with a linux/arm64 target is locked (uv resolves the aarch64 closure; the base is pinned by its
arm64 manifest in a loopback registry), built with ``--builder buildah`` (``--platform
linux/arm64``: every RUN step runs through qemu's binfmt handler) and verified: the smoke test runs
inside the arm64 container, passes its CPU checks, and says that it ran under emulation and judged
no speed.

torch is the package index's default Linux aarch64 wheel of 2.10, a CPU build (its nvidia-*
requirements are gated to x86_64): the smallest aarch64 torch there is (146 MB, cp311 for the
base's Python 3.11). The base is scripts/base-image.sh's debootstrapped arm64 Debian bookworm
(``--platform linux/arm64``). Needs dockerd, buildah, docker-registry, the package index and
qemu-user-static with binfmt (DEVELOPERS.md); skipped without qemu's binfmt handler unless
ENVBUILD_REQUIRE_DOCKER is set (CI, .ci/run), then it fails. One build and one verify: 2 min 16 s
here (push 7 s, lock 1 s, build 102 s, verify 18 s), after the base (.ci/run makes it: 2.5 to 5
minutes); figures in DEVELOPERS.md.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import push_image
from test_lock_e2e import _buildah_images as buildah_images
from test_lock_e2e import envbuild

pytestmark = [pytest.mark.docker, pytest.mark.network]

ROOT = Path(__file__).resolve().parent.parent
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
# The package index's default aarch64 torch of 2.10 is a CPU build (matrices/torch_aarch64.yaml).
TORCH = "2.10.0"


def _missing(what: str) -> None:
    if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):  # CI (.ci/run) must run this test
        pytest.fail(f"ENVBUILD_REQUIRE_DOCKER is set but {what}")
    pytest.skip(what)


def binfmt_problem(text: str | None) -> str | None:
    """What keeps qemu's aarch64 handler (its /proc/sys/fs/binfmt_misc entry, ``text``) from
    running arm64 programs in a container; None when it can."""
    if text is None:
        return ("no qemu binfmt handler for aarch64 (" + str(BINFMT) + "): apt-get install "
                "qemu-user-static binfmt-support, and mount binfmt_misc (DEVELOPERS.md)")
    if text.splitlines()[0].strip() != "enabled":
        return f"qemu's aarch64 binfmt handler is disabled ({BINFMT})"
    flags = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("flags:")), "")
    if "F" not in flags:
        # Without F (fix binary) the kernel looks for the interpreter inside the container's root.
        return f"qemu's aarch64 binfmt handler lacks the F flag ({BINFMT}: flags {flags!r})"
    return None


def test_binfmt_problem_names_what_is_missing() -> None:  # the skip/fail reason above can be right
    entry = "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n"
    assert binfmt_problem(entry) is None
    assert "lacks the F flag" in str(binfmt_problem(entry.replace("flags: PF", "flags: P")))
    assert "disabled" in str(binfmt_problem(entry.replace("enabled", "disabled")))
    assert "qemu-user-static" in str(binfmt_problem(None))


@pytest.fixture(scope="module")
def emulation() -> None:
    if platform.machine() == "aarch64":
        pytest.skip("the host is arm64: nothing here runs under emulation")
    problem = binfmt_problem(BINFMT.read_text() if BINFMT.is_file() else None)
    if problem is not None:
        _missing(problem)
    if shutil.which("buildah") is None:
        _missing("there is no buildah")


@pytest.fixture(scope="module")
def arm_base(emulation: None, docker_api: Any, loopback_registry: str) -> Iterator[str]:
    """The debootstrapped arm64 bookworm, pushed to the loopback registry: lock pins its arm64
    manifest's digest there, and buildah pulls it from there for the build."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "base-image.sh"), "--platform", "linux/arm64"],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    local = done.stdout.strip().splitlines()[-1]
    assert docker_api.inspect_image(local)["Architecture"] == "arm64"
    repository = f"{loopback_registry}/envbuild/bookworm-arm64"
    push_image(docker_api, local, repository, "base")
    try:
        yield f"{repository}:base"
    finally:
        docker_api.remove_image(f"{repository}:base")


@pytest.fixture(scope="module")
def project(arm_base: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("arm64-project")
    # No compile toolchain: apt-get installing g++ under qemu would be most of the build's time.
    (directory / "envbuild.toml").write_text(
        f'torch = "=={TORCH}"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'compile-toolchain = false\nplatform = "linux/arm64"\nbase-image = "{arm_base}"\n')
    return directory


def test_an_arm64_image_builds_and_verifies_under_emulation(project: Path, docker_api: Any) -> None:
    done = envbuild("lock", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    target = json.loads((project / "envbuild.lock").read_text())["targets"]["default"]
    assert target["stack"]["platform"] == "linux/arm64"
    assert target["pylock"]["platform"].startswith("aarch64-manylinux_2_")
    assert target["packages"]["torch"] == TORCH
    pylock = (project / target["pylock"]["file"]).read_text()
    assert f"torch-{TORCH}-cp311-cp311-manylinux_2_28_aarch64.whl" in pylock
    assert "nvidia" not in pylock  # the aarch64 wheel of 2.10 is a CPU build: no CUDA libraries
    assert target["base_digest"].startswith("sha256:")  # the arm64 manifest's (docs/faults.md B10)

    tag = f"envbuild-test/arm64-emulated:{uuid.uuid4().hex[:10]}"
    before = buildah_images()
    try:
        args = ["build", "--lock", "envbuild.lock", "--builder", "buildah", "--network", "host",
                "--tag", tag, "--report", "build.json"]
        cert = os.environ.get("PIP_CERT")
        if cert:  # TLS here goes through an inspecting proxy whose CA the build must trust
            args += ["--ca-bundle", cert]
        done = envbuild(*args, cwd=project, timeout=2400)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert "glibc 2.36" in done.stderr  # the base's own glibc was read, by running it (emulated)
        inspected = docker_api.inspect_image(tag)
        assert (inspected["Os"], inspected["Architecture"]) == ("linux", "arm64")
        machine = subprocess.run(["docker", "run", "--rm", "--network", "none", "--platform", "linux/arm64",
                                  "--entrypoint", "uname", tag, "-m"], capture_output=True, text=True,
                                 timeout=120)
        assert machine.stdout.strip() == "aarch64", machine.stderr

        done = envbuild("verify", tag, "--cpu-ok", "--json", "--report", "verify.json", cwd=project,
                        timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        emulated = "linux/arm64 on a linux/amd64 host"
        assert (f"image {tag} is linux/arm64, this Docker engine linux/amd64: the smoke test runs under "
                "emulation (qemu); its speed and host balance are not judged") in done.stderr
        report = json.loads(done.stdout)
        saved = json.loads((project / "verify.json").read_text())["envbuild.verify"]
        assert (saved["platform"], saved["emulated"], saved["exit_code"]) == ("linux/arm64", emulated, 0)
        assert report["host"]["emulated"] == emulated
        assert report["host"]["machine"] == "aarch64"  # the smoke test's own Python ran as arm64
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["torch.import"]["status"] == "pass" and TORCH in checks["torch.import"]["message"]
        assert checks["cpu.selfcheck"]["status"] == "pass", checks["cpu.selfcheck"]  # on qemu's CPU
        assert checks["lock"]["status"] == "pass", checks["lock"]  # the image's torch is the lock's
        balance = checks["host.balance"]
        assert balance["status"] == "skip" and "under emulation" in balance["message"], balance
        assert not [c for c in report["checks"] if c["status"] == "fail"]
    finally:
        subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)
        subprocess.run(["buildah", "rmi", tag], capture_output=True, check=False)
        made = buildah_images() - before
        if made:
            subprocess.run(["buildah", "rmi", "--force", *made], capture_output=True, check=False)
