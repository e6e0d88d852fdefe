"""docs/faults.md L5, L6 (issue #13 item 7): every stack resolve offers renders, with no flag.

A grid of drivers (450 to 595, each a toolkit driver of cuda_toolkits.yaml) × GPUs (Kepler
to Blackwell, GeForce, workstation and datacenter) × constraint sets; for each cell the top
10 stacks resolve prints are rendered as a Docker context, a host script and cloud-init
user-data with default options (no --python-url, no --base-image), and each render is
checked by the gates the renderers already run: hadolint on the Dockerfiles (C2), shellcheck
and ``bash -n`` on the scripts (C1), ``cloud-init schema`` on the user-data. Identical
stacks are rendered once; identical command bodies and user-data shapes are linted once.

Forward-compatibility stacks (CUDA newer than the driver, B200 on 570.124.06 with a CUDA 13
wheel: L6, P1) render all three too: their host script installs NVIDIA's cuda-compat package and
keeps the driver branch they were resolved for, and the test checks each names its package.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from envbuild.data import matrix as matrixmod
from envbuild.data.gpus import find_gpu
from envbuild.data.versions import DriverVersion, parse_requirement
from envbuild.errors import UsageError
from envbuild.render import cloudinit, script
from envbuild.render import docker as render
from envbuild.resolver.model import Request, Stack
from envbuild.resolver.resolve import resolve

TOP = 10
# Toolkit drivers from cuda_toolkits.yaml, one or two per branch from 450 to 595.
DRIVERS = ("450.51.06", "470.82.01", "510.47.03", "525.60.13", "535.104.05", "545.23.08",
           "550.54.15", "560.35.03", "570.124.06", "575.57.08", "580.95.05", "590.48.01",
           "595.45.04")
GPUS = ("Tesla K80", "Tesla P100", "NVIDIA GeForce GTX 1080 Ti", "Tesla V100", "Tesla T4",
        "NVIDIA GeForce RTX 3090", "NVIDIA A100-SXM4-40GB", "NVIDIA A10G", "NVIDIA GeForce RTX 4090",
        "NVIDIA L4", "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 5090", "NVIDIA B200")
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "none": {},
    "devel": {"flavor": "devel"},
    "python-3.10": {"python": parse_requirement("python", "3.10")},
    "ubuntu-22.04": {"ubuntu": "22.04"},
    # Issue 23: with the cu129 builds and 2.7.0 cu128's arch list recorded, a B200 on 570 fills
    # its top 10 with native and minor-version stacks; CUDA 13 keeps forward stacks in the grid.
    "cuda-13": {"cuda": parse_requirement("cuda", "13")},
}


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def offered(m: matrixmod.Matrix) -> tuple[dict[Stack, str], int]:
    """Every stack in a top 10 of the grid, with the first cell that offered it; and the
    number of (cell, stack) pairs."""
    stacks: dict[Stack, str] = {}
    pairs = 0
    for driver in DRIVERS:
        for name in GPUS:
            gpu = find_gpu(m.rows("gpus"), name)
            for label, extra in CONSTRAINTS.items():
                request = Request(driver=DriverVersion.parse(driver), gpus=(gpu,), **extra)
                for stack in resolve(request, m).stacks[:TOP]:
                    pairs += 1
                    stacks.setdefault(stack, f"--driver {driver} --gpu '{name}' {label}")
    return stacks, pairs


def _shape(user_data: bytes) -> str:
    """user-data's keys and structure without the embedded files' text (indented 6 or more) or
    its comments: what cloud-init's schema judges."""
    return "\n".join(line for line in user_data.decode().splitlines()
                     if not line.startswith("      ") and not line.lstrip().startswith("# "))


def test_every_offered_stack_renders_lint_clean(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    started = time.monotonic()
    stacks, pairs = offered(matrix)
    assert len(DRIVERS) >= 10 and len(GPUS) >= 12 and pairs >= 1000  # the grid was really walked
    failures: list[str] = []
    forward = 0
    dockerfiles: dict[bytes, Path] = {}
    scripts: dict[str, Path] = {}
    user_data: dict[str, Path] = {}
    for number, (stack, cell) in enumerate(stacks.items()):
        try:
            lock = render.lock_for(stack, matrix, render.RenderOptions())
            docker = render.render_docker(lock, render.RenderOptions())
            host = script.render_script(lock)
            cloud = cloudinit.render_cloud_init(lock)
        except UsageError as exc:
            failures.append(f"{cell}: torch {stack.torch}+{stack.variant} Python {stack.python} "
                            f"Ubuntu {stack.ubuntu} {stack.compat}: {exc.one_line()}")
            continue
        dockerfile = docker["Dockerfile"]
        assert isinstance(dockerfile, bytes)
        if dockerfile not in dockerfiles:
            dockerfiles[dockerfile] = tmp_path / f"{number}.Dockerfile"
            dockerfiles[dockerfile].write_bytes(dockerfile)
        text = host["install.sh"].decode()
        if stack.compat == "forward":  # L6, P1: the host targets set up cuda-compat
            package, directory = script.compat_facts(lock)
            assert f"readonly COMPAT_PACKAGE={package}\n" in text and package.startswith("cuda-compat-")
            assert f"readonly COMPAT_DIR={directory}\n" in text
            forward += 1
        commands = "\n".join(x for x in text.splitlines() if not x.startswith(("# ", "readonly ")))
        if commands not in scripts:
            scripts[commands] = tmp_path / f"{number}.sh"
            scripts[commands].write_text(text)
        shape = _shape(cloud["user-data.yaml"])
        if shape not in user_data:
            user_data[shape] = tmp_path / f"{number}.user-data"
            user_data[shape].write_bytes(cloud["user-data.yaml"])
    assert not failures, f"{len(failures)} of {len(stacks)} offered stacks do not render:\n" + \
        "\n".join(failures[:20])
    assert forward > 0  # the grid offers forward stacks (B200 on 570.124.06), and they were rendered
    _lint(dockerfiles.values(), scripts.values(), user_data.values())
    seconds = time.monotonic() - started
    print(f"grid: {len(DRIVERS)} drivers x {len(GPUS)} GPUs x {len(CONSTRAINTS)} constraint sets, "
          f"{pairs} offered (cell, stack) pairs, {len(stacks)} distinct stacks, "
          f"{3 * len(stacks)} renders ({forward} forward-compatibility stacks, cuda-compat on the "
          f"host); "
          f"linted {len(dockerfiles)} Dockerfiles, {len(scripts)} script bodies, "
          f"{len(user_data)} user-data shapes; {seconds:.1f} s")


def _lint(dockerfiles: Any, scripts: Any, user_data: Any) -> None:
    hadolint, shellcheck = shutil.which("hadolint"), shutil.which("shellcheck")
    if hadolint is None or shellcheck is None:
        pytest.skip("hadolint or shellcheck is not installed (the test extra brings both)")
    paths = [str(p) for p in dockerfiles]
    done = subprocess.run([hadolint, "--no-color", "--failure-threshold", "warning", *paths],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-4000:]
    paths = [str(p) for p in scripts]
    done = subprocess.run([shellcheck, "-S", "warning", *paths], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:]
    for path in paths:
        assert subprocess.run(["bash", "-n", path], check=False).returncode == 0, path
    cloud_init = shutil.which("cloud-init")
    for path in user_data:
        text = path.read_text()
        assert text.startswith("#cloud-config\n"), path
        if cloud_init is not None:  # the schema check where cloud-init is installed
            done = subprocess.run([cloud_init, "schema", "--config-file", str(path)],
                                  capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
