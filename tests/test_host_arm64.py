"""Host scripts for linux/arm64 (issue 38): GH200, GB200/GB300 NVL72 and DGX Spark get NVIDIA's
sbsa repository, the open modules, the coherent-memory option from R580 on Grace, NVLink 5's IMEX,
NSCQ and NVLSM where the rack has NVLink 5 switches, 64K-page advice; shellcheck clean; the
user-data within EC2's 16 KB; an x86_64 script is unchanged by any of it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envbuild.data import matrix as matrixmod
from envbuild.data.gpus import find_gpu
from envbuild.errors import PreflightFailed
from envbuild.render import cloudinit, script
from envbuild.render.hostsetup import HostSetup, host_setup
from envbuild.render.lock import make_lock
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve
from envbuild.resolver.selection import Selectors, build_request


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def _render(matrix: matrixmod.Matrix, gpu: str, driver: str = "580") -> tuple[str, HostSetup, bytes]:
    request = build_request(Selectors(gpu=[gpu], driver=driver), matrix, {})
    stack = resolve(request, matrix).stacks[0]
    lock = make_lock(stack, matrix)
    host = host_setup(stack.min_driver, matrix.rows("driver_branches"), matrix.rows("container_toolkit"),
                      request.gpus, request.driver.branch if request.driver else None,
                      platform=stack.platform)
    text = script.render_script(lock, host=host)["install.sh"].decode()
    user_data = cloudinit.render_cloud_init(lock, host=host)["user-data"]
    return text, host, user_data


@pytest.mark.parametrize(("gpu", "grace", "nvlink5"), [
    ("GH200", True, False), ("GB200", True, True), ("GB300", True, True), ("GB10", False, False)])
def test_arm64_hosts_get_sbsa_and_what_their_system_needs(matrix: matrixmod.Matrix, gpu: str, grace: bool,
                                                         nvlink5: bool, tmp_path: Path) -> None:
    text, host, user_data = _render(matrix, gpu)
    assert (host.sbsa, host.grace, host.nvlink5, host.modules) == (True, grace, nvlink5, "open")
    assert "/compute/cuda/repos/$NVIDIA_DISTRO/sbsa" in text and "/x86_64\n" not in text
    assert "[[ $arch == aarch64 ]]" in text and "-tegra*" in text  # a Jetson kernel is refused
    assert ("options nvidia NVreg_CoherentGPUMemoryMode=driver" in text) == grace
    assert ("recommends 64K pages" in text) == grace
    assert ("SW_MNG" in text and "install_nvlink5" in text and "nvidia-imex.service" in text) == nvlink5
    assert ("--imex MODE" in text) == nvlink5
    # N1: within EC2's 16 KB
    assert len(user_data) <= cloudinit.USER_DATA_LIMIT, len(user_data)
    checker = shutil.which("shellcheck")
    if checker is None:
        pytest.skip("shellcheck is not installed")
    path = tmp_path / "install.sh"
    path.write_text(text)
    done = subprocess.run([checker, str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_the_imex_option_is_checked_before_anything(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    text, _, _ = _render(matrix, "GB200")
    path = tmp_path / "install.sh"
    path.write_text(text)
    done = subprocess.run(["bash", str(path), "--imex", "bogus"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--imex bogus: give off, dra or host" in done.stderr


def test_an_x86_script_carries_none_of_it(matrix: matrixmod.Matrix) -> None:
    text, host, _ = _render(matrix, "H100")
    assert not (host.sbsa or host.grace or host.nvlink5)
    assert "/repos/$NVIDIA_DISTRO/x86_64" in text
    assert not any(word in text for word in ("sbsa", "CoherentGPUMemoryMode", "SW_MNG", "imex"))


def test_jetson_and_grace_on_amd64_are_refused(matrix: matrixmod.Matrix) -> None:
    rows = matrix.rows("gpus")
    stack = resolve(Request(gpus=(find_gpu(rows, "H100"),)), matrix).stacks[0]
    for name, message in (("Jetson AGX Orin", "is a Jetson module"),
                          ("GH200", "needs a linux/arm64 host script")):
        with pytest.raises(PreflightFailed, match=message):
            host_setup(stack.min_driver, matrix.rows("driver_branches"), matrix.rows("container_toolkit"),
                       [find_gpu(rows, name)], None, platform="linux/amd64")
