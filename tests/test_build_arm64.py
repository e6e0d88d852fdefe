"""arm64 images (issue 38): the builders get --platform linux/arm64 for an aarch64 target, the
Dockerfile names the base's platform, bake names the target's platform; the smoke test's arch
checks know sm_100/103/110/120/121 and the aarch64 lists. (Argv and recipes only: an arm64
image built and verified under qemu is tests/test_arm64_emulated_e2e.py.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_builders import PEM, calls, context_of, stub

from envbuild.commands.build import for_platform
from envbuild.data import matrix as matrixmod
from envbuild.data.versions import parse_requirement
from envbuild.engine.build import SdkBuilder
from envbuild.engine.builders import BuildahBuilder, BuildxBuilder
from envbuild.render.bake import bake_document
from envbuild.render.ci import CiOptions, CiStack
from envbuild.render.docker import RenderOptions, render_docker
from envbuild.render.lock import make_lock
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve
from envbuild.smoke import arch

AARCH64_CU130 = ["sm_80", "sm_90", "sm_100", "sm_110", "sm_120"]  # RELEASE.md's aarch64 table
AARCH64_CU126 = ["sm_80", "sm_90"]


def test_buildah_and_buildx_build_for_the_targets_platform(tmp_path: Path) -> None:
    program = stub(tmp_path, "buildah", "STEP 1/1: FROM base\n", 0)
    arm = for_platform(BuildahBuilder(program=str(program), env=dict(os.environ)), "linux/arm64")
    arm.build(context_of("FROM --platform=linux/arm64 base\n"), tag="t:1", network="host", labels={},
              progress=lambda e: None, secrets={"ca": PEM}, timestamp=0)
    argv = next(c["argv"] for c in calls(tmp_path) if "build" in c["argv"])
    assert argv[argv.index("--platform") + 1] == "linux/arm64"
    x86 = BuildahBuilder(program=str(program), env=dict(os.environ))
    assert for_platform(x86, "linux/amd64") is x86  # an amd64 target builds as before
    docker = tmp_path / "buildx"
    docker.mkdir()
    program = stub(docker, "docker", "", 0)
    for_platform(BuildxBuilder(program=str(program), env=dict(os.environ)), "linux/arm64").build(
        context_of("FROM x\n"), tag="t:1", network=None, labels={}, progress=lambda e: None)
    argv = calls(docker)[-1]["argv"]
    assert argv[argv.index("--platform") + 1] == "linux/arm64"


def test_the_classic_builder_asks_the_daemon_for_the_platform() -> None:
    seen: dict[str, Any] = {}

    class Client:
        def build(self, **kwargs: Any) -> list[dict[str, Any]]:
            seen.update(kwargs)
            return [{"aux": {"ID": "sha256:" + "ab" * 32}}]

        def inspect_image(self, image_id: str) -> dict[str, Any]:
            return {"Size": 1}

    SdkBuilder(client=Client(), platform="linux/arm64").build(
        context_of("FROM x\n"), tag="t:1", network=None, labels={}, progress=lambda e: None)
    assert seen["platform"] == "linux/arm64"


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def _lock(matrix: matrixmod.Matrix, platform: str) -> Any:
    request = Request(platform=platform, torch=parse_requirement("torch", "2.13.0"),
                      variant="cu130", ubuntu="24.04")
    return make_lock(resolve(request, matrix).stacks[0], matrix)


def test_the_dockerfile_and_bake_name_an_arm64_targets_platform(matrix: matrixmod.Matrix) -> None:
    arm, x86 = _lock(matrix, "linux/arm64"), _lock(matrix, "linux/amd64")
    dockerfile = render_docker(arm, RenderOptions())["Dockerfile"].decode()
    assert f"FROM --platform=linux/arm64 {arm.base_image}" in dockerfile
    assert "--platform" not in render_docker(x86, RenderOptions())["Dockerfile"].decode()
    stacks = [CiStack(id="gb200", lock=arm, files={}), CiStack(id="h100", lock=x86, files={})]
    targets = bake_document(stacks, CiOptions(registry="ghcr.io/acme/app"))["target"]
    assert [t.get("platforms") for t in targets.values()] == [["linux/arm64"], None]


@pytest.mark.parametrize(("capability", "arch_list", "how"), [
    ((10, 3), AARCH64_CU130, "sass-compatible"),  # GB300 runs the sm_100 cubin
    ((12, 1), AARCH64_CU130, "sass-compatible"),  # DGX Spark runs the sm_120 cubin
    ((11, 0), AARCH64_CU130, "sass-exact"),  # Thor's sm_110
    ((10, 0), AARCH64_CU130, "sass-exact"),
    ((9, 0), AARCH64_CU126, "sass-exact"),  # GH200 on the cu126 aarch64 list
    ((10, 0), AARCH64_CU126, "none"),  # GB200 needs cu128 or later on aarch64
    ((7, 5), AARCH64_CU130, "none"),  # T4G
    ((8, 7), AARCH64_CU130, "none"),  # Orin: integrated, the sm_80 cubin does not run
])
def test_smoke_arch_checks_know_blackwell_and_the_aarch64_lists(capability: tuple[int, int],
                                                                 arch_list: list[str], how: str) -> None:
    assert arch.arch_coverage(capability, arch_list).how == how


def test_smoke_hint_on_an_arm_host_says_no_variant_runs_an_older_gpu() -> None:
    hint = arch.arch_hint((7, 5), AARCH64_CU130, "cu130", "aarch64")
    assert "no aarch64 torch wheel runs on sm_75" in hint and "--platform linux/amd64" in hint
    assert "JetPack" in arch.arch_hint((8, 7), AARCH64_CU130, "cu130", "aarch64")
    assert "older CUDA variant" in arch.arch_hint((7, 5), AARCH64_CU130, "cu130", "x86_64")
