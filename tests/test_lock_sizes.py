"""torch_wheels.yaml, the lock's nvidia-* pins and layer sizes, and the duplicate-CUDA warning."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.version import Version

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.data.versions import DriverVersion, parse_requirement
from envbuild.errors import UsageError
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.resolver.model import Request, Stack
from envbuild.resolver.resolve import resolve

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


@pytest.fixture(scope="module")
def script() -> ModuleType:
    """The producer of torch_wheels.yaml: matrix refresh's wheels source."""
    from envbuild.upstream.sources import pypi_wheels

    return pypi_wheels


def top(m: matrixmod.Matrix, **request: Any) -> Stack:
    stacks = resolve(Request(**request), m).stacks
    assert stacks, request
    return stacks[0]


def default_stack(m: matrixmod.Matrix, torch: str | None = None) -> Stack:
    extra = {"torch": parse_requirement("torch", torch)} if torch else {}
    return top(m, driver=DriverVersion.parse("570"), variant="default", **extra)


# --- the data -------------------------------------------------------------------------


def test_rows_agree_with_torch_pypi(matrix: matrixmod.Matrix) -> None:
    """torch_pypi.yaml read the cp311 wheel's cuDNN/NCCL pins; torch_wheels.yaml must agree."""
    pypi = {r["torch"]: r for r in matrix.rows("torch_pypi")}
    rows = matrix.rows("torch_wheels")
    assert len({r["torch"] for r in rows}) >= 30  # every release 1.13.0 .. the newest
    for row in rows:
        facts = pypi[row["torch"]]
        assert row["python"].rstrip("t") in facts["python"] or row["python"] in facts["python"] \
            or row["python"].endswith("t"), row
        if row["python"] != "3.11":
            continue
        cudnn = [v for k, v in row["nvidia"].items() if k.startswith("nvidia-cudnn")]
        nccl = [v for k, v in row["nvidia"].items() if k.startswith("nvidia-nccl")]
        assert cudnn == ([facts["cudnn"]] if "cudnn" in facts else []), row["torch"]
        assert nccl == ([facts["nccl"]] if "nccl" in facts else []), row["torch"]
        assert row.get("torchvision") == facts["torchvision"] or "torchvision" not in row


def test_sizes_are_plausible_and_sourced(matrix: matrixmod.Matrix) -> None:
    for row in matrix.rows("torch_wheels"):
        assert 100_000_000 < row["bytes"] < 3_000_000_000, row["source"]
        assert set(row["nvidia_bytes"]) <= set(row["nvidia"])
        for name in row["nvidia_bytes"]:
            assert row["files"][name].startswith(f"pip-index:///simple/{name}/#"), name
        assert row["source"].startswith("pip-index:///simple/torch/#torch-" + row["torch"])
        assert "://" not in row["source"].removeprefix("pip-index:///")


def test_cuda_13_releases_pull_libraries_through_cuda_toolkit(matrix: matrixmod.Matrix) -> None:
    for row in matrix.rows("torch_wheels"):
        if any(k.endswith("-cu13") for k in row["nvidia"]):
            assert "cuda_toolkit" in row and "cudart" in row["cuda_toolkit_extras"], row["torch"]
        if Version(row["torch"]) < Version("2.11"):
            assert "cuda_toolkit" not in row


# --- the fact collector's pure parts ------------------------------------------------------

METADATA = """Metadata-Version: 2.1
Name: torch
Version: 9.9.9
Requires-Dist: filelock
Requires-Dist: nvidia-cudnn-cu12==9.1.0.70; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-cublas-cu12==12.4.5.8; platform_system == "Linux" and python_version < "3.13"
Requires-Dist: nvidia-nccl-cu12==2.21.5; platform_system == "Windows"
Requires-Dist: nvidia-nvjitlink-cu12<13,>=12.4; platform_system == "Linux"
Requires-Dist: nvidia-cufft-cu12==11.2.1.3; extra == "cufft"
Requires-Dist: cuda-toolkit[cudart,cublas]==13.0.2; platform_system == "Linux"
Requires-Dist: triton==3.1.0; platform_system == "Linux"

"""


def test_parse_pins_evaluates_markers_per_python(script: ModuleType) -> None:
    pins = script.parse_pins(METADATA, "3.12")
    assert dict(pins.nvidia) == {"nvidia-cublas-cu12": "12.4.5.8", "nvidia-cudnn-cu12": "9.1.0.70"}
    assert pins.loose == ("nvidia-nvjitlink-cu12<13,>=12.4",)
    assert (pins.cuda_toolkit, pins.cuda_toolkit_extras) == ("13.0.2", ("cublas", "cudart"))
    assert "nvidia-cublas-cu12" not in script.parse_pins(METADATA, "3.13t").nvidia


def test_pick_prefers_the_newest_manylinux(script: ModuleType) -> None:
    from envbuild.upstream.simple_api import parse_simple_page

    names = ["nvidia_x-1.0-py3-none-manylinux1_x86_64.whl",
             "nvidia_x-1.0-py3-none-manylinux_2_27_x86_64.whl",
             "nvidia_x-1.0-py3-none-manylinux_2_27_aarch64.whl",
             "nvidia_x-1.0-py3-none-win_amd64.whl"]
    page = json.dumps({"meta": {"api-version": "1.1"}, "files": [
        {"filename": n, "url": n, "size": i + 1} for i, n in enumerate(names)]}).encode()
    wheels = [w for w in parse_simple_page(page, page_url="https://i.example/x/", project="x")
              if script.linux_x86_64(w)]
    assert script.pick(wheels).filename == names[1]
    assert script.pick([]) is None


# --- the lock ---------------------------------------------------------------------------


def test_default_wheel_lock_pins_nvidia_and_estimates_the_layer(matrix: matrixmod.Matrix) -> None:
    stack = default_stack(matrix)
    lock = render.lock_for(stack, matrix, render.RenderOptions())
    row = lockmod.wheel_row(stack, matrix)
    assert row is not None
    nvidia = {k: v for k, v in lock.packages.items() if k.startswith("nvidia-")}
    assert nvidia == dict(row["nvidia"]) and nvidia
    assert {k: lock.packages[k] for k in ("torch", "torchvision", "torchaudio")} == \
        lockmod.pins(stack)
    cudnn = next(v for k, v in nvidia.items() if k.startswith("nvidia-cudnn"))
    assert cudnn == stack.cudnn  # the resolver's bundled-cuDNN fact, from the same index
    (layer,) = lock.layers
    assert layer.name == "torch" and layer.source == "wheel sizes"
    assert layer.wheels["torch"] == row["bytes"]
    assert layer.bytes == sum(layer.wheels.values()) > row["bytes"]
    assert lockmod.from_json(lock.to_json()) == lock
    data = json.loads(lock.to_json())
    assert data["schema"] == 1 and data["layers"][0]["bytes"] == layer.bytes


def test_without_companions_the_layer_drops_them(matrix: matrixmod.Matrix) -> None:
    lock = render.lock_for(default_stack(matrix), matrix, render.RenderOptions(companions=False))
    assert "torchvision" not in lock.layers[0].wheels and "torchvision" not in lock.packages


def test_pytorch_index_lock_has_no_nvidia_pins_or_layers(matrix: matrixmod.Matrix) -> None:
    stack = top(matrix, driver=DriverVersion.parse("550"))
    assert stack.index_url and stack.index_url.startswith("https://download.pytorch.org/")
    lock = render.lock_for(stack, matrix, render.RenderOptions())
    assert lock.packages == lockmod.pins(stack)
    assert lock.layers == () and "layers" not in json.loads(lock.to_json())


def test_lock_without_layers_still_reads(matrix: matrixmod.Matrix) -> None:
    lock = render.lock_for(default_stack(matrix), matrix, render.RenderOptions())
    data = json.loads(lock.to_json())
    del data["layers"]  # as written before layers existed
    assert lockmod.from_json(json.dumps(data)) == replace(lock, layers=())


@pytest.mark.parametrize("mutate", [
    lambda d: d["layers"][0].update(bytes=d["layers"][0]["bytes"] + 1),  # does not add up
    lambda d: d["layers"][0]["wheels"].update({"evil": 1}),  # not a pin
    lambda d: d["layers"][0].update(name="torch\nRUN id"),
    lambda d: d["layers"][0].update(source="a guess"),
    lambda d: d["layers"][0].pop("wheels"),
    lambda d: d["packages"].update({"nvidia-x; rm -rf /": "1"}),
    lambda d: d["packages"].update({"nvidia-x": "1 --index-url http://evil"}),
    lambda d: d["packages"].update({"requests": "2.0"}),  # only nvidia-* beyond torch's pins
    lambda d: d["packages"].pop("torch"),
])
def test_bad_sizes_or_pins_are_usage_errors(mutate: Any, matrix: matrixmod.Matrix) -> None:
    data = json.loads(render.lock_for(default_stack(matrix), matrix,
                                      render.RenderOptions()).to_json())
    mutate(data)
    with pytest.raises(UsageError):
        lockmod.from_json(json.dumps(data))


def test_pip_package_may_not_override_an_nvidia_pin(matrix: matrixmod.Matrix) -> None:
    options = render.parse_options(pip_packages=["nvidia_cudnn_cu12==8.0.0"])
    with pytest.raises(UsageError, match="override"):
        render.lock_for(default_stack(matrix), matrix, options)


def test_nvidia_pins_reach_the_dockerfile(matrix: matrixmod.Matrix) -> None:
    lock = render.lock_for(default_stack(matrix), matrix, render.RenderOptions())
    text = render.render_docker(lock, render.RenderOptions())["Dockerfile"]
    assert isinstance(text, bytes)
    for name, version in lock.packages.items():
        assert f" {name}=={version}".encode() in text


# --- duplicate CUDA libraries --------------------------------------------------------------


def lock_on(m: matrixmod.Matrix, base: str | None, *, flavor: str = "runtime",
            variant: str = "default") -> lockmod.Lock:
    stack = top(m, driver=DriverVersion.parse("570"), variant=variant, flavor=flavor)
    return render.lock_for(stack, m, render.RenderOptions(base_image=base))


def test_resolver_choice_gives_no_warning(matrix: matrixmod.Matrix) -> None:
    assert lockmod.duplicate_cuda(lock_on(matrix, None)) == []
    assert lockmod.duplicate_cuda(lock_on(matrix, None, flavor="devel")) == []


def test_cudnn_base_under_nvidia_wheels_warns(matrix: matrixmod.Matrix) -> None:
    lock = lock_on(matrix, "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04")
    warnings = lockmod.duplicate_cuda(lock)
    assert len(warnings) == 2  # cuDNN, and the runtime image's math libraries and NCCL
    assert "ships cuDNN" in warnings[0] and "nvidia-cudnn-cu12" in warnings[0]
    assert " MB of wheels" in warnings[0] and "nvidia-cublas-cu12" in warnings[1]
    assert all("\n" not in w for w in warnings)


@pytest.mark.parametrize(("base", "flavor", "count"), [
    ("nvidia/cuda:12.8.1-devel-ubuntu24.04", "runtime", 1),
    ("nvidia/cuda:12.8.1-devel-ubuntu24.04", "devel", 0),  # wanted for building extensions
    ("nvidia/cuda:12.8.1-runtime-ubuntu24.04", "runtime", 1),
    ("registry.example:5000/mirror/cudnn9-runtime:12.8", "runtime", 2),  # the name says cudnn
    ("registry.example:5000/nvidia/cuda@sha256:" + "ab" * 32, "runtime", 0),  # nothing to go by
    ("ubuntu:24.04", "runtime", 0),
])
def test_base_image_kinds(matrix: matrixmod.Matrix, base: str, flavor: str, count: int) -> None:
    assert len(lockmod.duplicate_cuda(lock_on(matrix, base, flavor=flavor))) == count


def test_pytorch_index_and_cpu_wheels(matrix: matrixmod.Matrix) -> None:
    stack = top(matrix, driver=DriverVersion.parse("550"))
    lock = render.lock_for(stack, matrix, render.RenderOptions(
        base_image="nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"))
    warnings = lockmod.duplicate_cuda(lock)
    assert warnings and f"cuDNN {stack.cudnn}" in warnings[0]  # no nvidia pins: the stack's fact
    cpu = top(matrix, variant="cpu")
    cpu_lock = replace(render.lock_for(cpu, matrix, render.parse_options(
        python_url="https://mirror.example/py.tar.gz", python_sha256="0" * 64)),
        base_image="nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04")
    assert lockmod.duplicate_cuda(cpu_lock) == []


def test_cli_prints_the_warning_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"ENVBUILD_NO_CACHE": "1"}
    if "ENVBUILD_MATRICES" in os.environ:
        env["ENVBUILD_MATRICES"] = os.environ["ENVBUILD_MATRICES"]
    out = tmp_path / "envbuild.lock"
    code = main(["lock", "--stack-only", "--driver", "570", "--variant", "default", "--base-image",
                 "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04", "-o", str(out)], env=env)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.err.splitlines()
    assert lines and all(line.startswith("envbuild: warning: base image ") for line in lines)
    assert "warning: " not in captured.out
    code = main(["render", "docker", "--lock", str(out), "-o", str(tmp_path / "ctx")], env=env)
    assert code == 0
    assert capsys.readouterr().err.count("envbuild: warning: ") == len(lines)
