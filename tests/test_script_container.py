"""The rendered install.sh run for real as root in a Debian container (no network), with stubs
for apt-get, nvidia-smi, mokutil, lspci and curl first on PATH (tests/stubs/README.md).

The container claims to be Ubuntu 22.04 through /etc/os-release; its python3 (3.11) and
python3-venv are real, and torch comes from a local index served inside the container (a
placeholder wheel), so venv creation, pip pins and their idempotency are the real thing.
Exit codes checked: 0 (done, nothing to change), 1 (a download or the initramfs rebuild failed,
the standalone Python tarball fails its sha256, the container toolkit's key is another, the
NVSwitch fabric does not come up), 9 (not root, unsupported OS, Secure Boot with the DKMS driver,
an older driver without --replace-driver, dpkg lock held), 10 (reboot required: a new driver, or
nouveau blacklisted), 130 (interrupted by SIGINT or SIGTERM).
The host setup around the stack (docs/faults.md M): open or proprietary kernel modules, kernel
headers, nvidia-persistenced, the fabric manager on NVSwitch systems, the NVIDIA Container Toolkit
with the runtime configured and a CDI spec, the GPU container and dcgmi diag in the smoke step.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tarfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import KEYRINGS, TEST_KEY_FINGERPRINT, keyring_deb, with_test_key

from envbuild.data import matrix as matrixmod
from envbuild.data.gpus import find_gpu
from envbuild.data.versions import DriverVersion
from envbuild.render import lock as lockmod
from envbuild.render import script
from envbuild.render.hostsetup import HostSetup, Toolkit
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

pytestmark = pytest.mark.docker

IMAGE = "envbuild-test/bookworm:base"
STUBS = Path(__file__).parent / "stubs"
SRC = "/srv/envbuild"  # where the rendered files land, as a user would copy them
INDEX = "http://127.0.0.1:8765/simple"
TORCH = "2.14.1+cu126"
UBUNTU_2204 = 'ID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04 (envbuild test)"\n'
# What a run may change, and what the snapshot compares (the stubs' log lives elsewhere).
WATCHED = "/etc /opt /usr/share/keyrings /var/lib/dpkg /var/lib/apt /run /tmp /srv"


def _skip_or_fail(reason: str) -> None:
    # .ci/run sets ENVBUILD_REQUIRE_DOCKER: there a missing engine or base is a failure.
    if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def docker_client() -> Any:
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # any transport error means: no usable daemon here
        _skip_or_fail(f"no Docker daemon answers ({type(exc).__name__})")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        _skip_or_fail(f"{IMAGE} is missing; make it with 'bash scripts/base-image.sh'")
    return client


@pytest.fixture(scope="module")
def rendered() -> dict[str, bytes]:
    """install.sh for driver 550's top stack, retargeted at the container's real Python 3.11
    and a local index (a test lock: the script reads these facts, it never checks them)."""
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(driver=DriverVersion.parse("550")), m).stacks[0]
    base = lockmod.make_lock(stack, m)
    lock = replace(base, stack=stack.replace(python="3.11", torchvision=None, torchaudio=None),
                   index_url=INDEX, python_provision="distro", python_standalone=None)
    lock = replace(lock, packages=lockmod.pins(lock.stack))
    lockmod.check_lock(lock)
    assert lock.packages == {"torch": TORCH}, lock.packages
    files = script.render_script(lock)
    # The test host's keyring package holds the test key, not NVIDIA's: the script trusts it instead.
    return {**files, "install.sh": with_test_key(files["install.sh"])}


def _placeholder(name: str, version: str) -> tuple[str, bytes]:
    """A pure-Python wheel holding only its metadata (and a module), like ``_wheel``'s torch."""
    dist = f"{name}-{version}"
    files = {f"{name}/__init__.py": f'__version__ = "{version}"\n',
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: envbuild-test\n"
                                       "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}.dist-info/RECORD,,\n"
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as z:
        for path, text in sorted(files.items()):
            z.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), text)
    return f"{dist}-py3-none-any.whl", data.getvalue()


def _wheel() -> tuple[str, bytes]:
    """A placeholder torch wheel: enough for pip and importlib.metadata, nothing else."""
    return _placeholder("torch", TORCH)


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Host:
    """One throwaway container standing in for a GPU host."""

    def __init__(self, container: Any) -> None:
        self.container = container

    def sh(self, command: str, *, user: str = "root") -> tuple[int, str]:
        code, output = self.container.exec_run(["bash", "-c", command], user=user)
        return code, output.decode("utf-8", "replace")

    def run(self, *options: str, user: str = "root") -> tuple[int, str]:
        return self.sh(f"PATH=/stubs:$PATH bash {SRC}/install.sh {' '.join(options)} 2>&1", user=user)

    def snapshot(self) -> str:
        _, out = self.sh(
            f"find {WATCHED} -xdev -printf '%p %y %m %s\\n' 2>/dev/null | sort; "
            f"find {WATCHED} -xdev -type f -print0 2>/dev/null | sort -z | xargs -0 sha256sum; "
            "apt-mark showhold")
        return out

    def log(self) -> str:
        return self.sh("cat /stub-state/log 2>/dev/null || true")[1]

    def state(self, **files: str) -> None:
        for name, text in files.items():
            self.sh(f"printf '%s' '{text}' > /stub-state/{name}")


@contextlib.contextmanager
def started_host(docker_client: Any, rendered: dict[str, bytes], served: dict[str, bytes],
                 tmp_path: Path) -> Iterator[Host]:
    """A throwaway container with the rendered files in SRC, the stubs, and ``served`` (paths
    below /index) on 127.0.0.1:8765 inside it; removed however the test ends."""
    container = docker_client.containers.run(
        IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
        labels={"dev.envbuild.test": "script"})
    try:
        files = {f"{SRC.lstrip('/')}/{n}": (d, 0o644) for n, d in rendered.items()}
        files |= {f"stubs/{p.name}": (p.read_bytes(), 0o755) for p in STUBS.iterdir()
                  if p.suffix != ".md"}
        files |= {f"index/{path}": (data, 0o644) for path, data in served.items()}
        trusted = keyring_deb(tmp_path, {"cuda-archive-keyring.gpg": (KEYRINGS / "trusted.gpg").read_bytes()})
        files["stubs/cuda-keyring.deb"] = (trusted.read_bytes(), 0o644)
        container.put_archive("/", _tar(files))
        h = Host(container)
        h.sh(f"mkdir -p /stub-state && printf '%s' '{UBUNTU_2204}' > /etc/os-release.ubuntu")
        # The host already has what torch.compile needs (W1), as the Debian base has python3: the
        # tests of what runs before NVIDIA's keyring expect no apt-get install of their own.
        h.sh("/stubs/apt-get install -y g++ python3-dev && : > /stub-state/log")
        # Detached by the engine, not backgrounded by a shell: a shell's background python3 made
        # the engine wait 2 s for the exec's output to close, and the first request 2 s more.
        container.exec_run(["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"],
                           workdir="/index", detach=True)
        first = next(iter(sorted(served))).rsplit("/", 1)[0]
        for _ in range(50):
            probe = f"import urllib.request as u; u.urlopen('http://127.0.0.1:8765/{first}/')"
            if h.sh(f'python3 -c "{probe}"')[0] == 0:
                break
            time.sleep(0.1)
        yield h
    finally:
        container.remove(force=True)


@pytest.fixture
def host(docker_client: Any, rendered: dict[str, bytes], tmp_path: Path) -> Iterator[Host]:
    wheel_name, wheel = _wheel()
    with started_host(docker_client, rendered, {f"simple/torch/{wheel_name}": wheel}, tmp_path) as h:
        yield h


def ubuntu(h: Host) -> None:
    h.sh("rm -f /etc/os-release && cp /etc/os-release.ubuntu /etc/os-release")


KEYRING_URL = ("https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
               "cuda-keyring_1.1-1_all.deb")
UU_CONF = "/etc/apt/apt.conf.d/51envbuild-nvidia-driver"
NOUVEAU_CONF = "/etc/modprobe.d/envbuild-blacklist-nouveau.conf"
NVIDIA_PACKAGES = ("nvidia-driver-525", "libnvidia-compute-525")


def curl_calls(h: Host) -> int:
    """How many times the script ran curl (the stub logs each call, then each attempt inside it)."""
    return sum(1 for line in h.log().splitlines()
               if line.startswith("curl ") and not line.startswith("curl attempt:"))


def reboot(h: Host) -> None:
    """The new driver is loaded, nouveau is not, the flag is gone; the stubs' log starts empty."""
    h.sh("rm -f /var/run/reboot-required /stub-state/nouveau")
    h.state(driver="525.60.13")
    h.sh(": > /stub-state/log")


def test_not_root_exits_9_and_changes_nothing(host: Host) -> None:
    ubuntu(host)
    before = host.snapshot()
    code, out = host.run("--yes", user="nobody")
    assert code == 9, out
    assert "must run as root" in out
    assert host.snapshot() == before


def test_unsupported_os_exits_9(host: Host) -> None:
    host.state(gpu="1")
    before = host.snapshot()
    code, out = host.run("--yes")  # the container's own os-release: Debian 12
    assert code == 9, out
    assert "unsupported OS 'debian 12'" in out
    assert host.snapshot() == before
    assert "apt-get" not in host.log()


def test_dry_run_prints_plan_and_changes_nothing(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1")
    before = host.snapshot()
    code, out = host.run("--dry-run")
    assert code == 0, out
    assert "plan:" in out and "nvidia-driver-525" in out and "cuda-keyring_1.1-1_all.deb" in out
    assert f"pip install torch=={TORCH}" in out
    assert "dry run: nothing was changed" in out
    assert host.snapshot() == before
    assert "apt-get" not in host.log() and "curl" not in host.log()


def test_install_reboot_then_second_run_changes_nothing(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1")
    code, out = host.run("--yes", "--no-smoke")
    assert code == 10, out  # a driver was installed: reboot required
    assert "REBOOT REQUIRED" in out
    log = host.log()
    assert "cuda-keyring_1.1-1_all.deb" in log and "install -y nvidia-driver-525" in log
    assert "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/" in log
    held = host.sh("apt-mark showhold")[1].split()
    assert {"nvidia-driver-525", "libnvidia-compute-525"} <= set(held)
    version = host.sh("/opt/envbuild/venv/bin/python -c 'import torch; print(torch.__version__)'")[1]
    assert version.strip() == TORCH
    # The reboot: the new driver is loaded, the flag gone.
    host.sh("rm -f /var/run/reboot-required")
    host.state(driver="525.60.13")
    host.sh(": > /stub-state/log")
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 0, out
    assert "nothing to change" in out
    assert host.snapshot() == before
    assert "apt-get" not in host.log() and "curl" not in host.log()
    code, out = host.run("--yes", "--no-smoke")  # and a third time, the same
    assert code == 0 and host.snapshot() == before, out
    # No unattended-upgrades on this host: no blacklist file for it (D14 writes one only beside it).
    assert host.sh(f"test -e {UU_CONF}")[0] != 0


def test_sufficient_driver_is_kept(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", driver="550.54.15")
    code, out = host.run("--yes", "--no-smoke")
    assert code == 0, out
    assert "driver 550.54.15 runs CUDA 12.6" in out
    assert "nvidia-driver" not in host.log() and "curl" not in host.log()
    # The smoke test runs from /opt/envbuild with the lock; the placeholder torch must fail it.
    code, out = host.run("--yes")
    assert code in (7, 8), out
    assert "smoke test failed" in out


def test_keyring_404_stops_before_any_repository_entry(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", **{"http-404": "1"})
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 1, out
    assert ("cannot download https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
            "cuda-keyring_1.1-1_all.deb") in out
    assert "apt-get install" not in host.log()
    assert host.snapshot() == before  # no keyring, no sources entry, no temporary file left
    assert curl_calls(host) == 1  # an HTTP error is not a network drop: not retried


def test_keyring_with_another_key_is_not_installed(host: Host, tmp_path: Path) -> None:
    ubuntu(host)
    host.state(gpu="1")
    other = keyring_deb(tmp_path / "other",
                        {"cuda-archive-keyring.gpg": (KEYRINGS / "other.gpg").read_bytes()})
    host.container.put_archive("/", _tar({"stubs/cuda-keyring.deb": (other.read_bytes(), 0o644)}))
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 1, out
    assert f"holds a key other than NVIDIA's repository key {TEST_KEY_FINGERPRINT}; not installed" in out
    assert "apt-get install" not in host.log().replace("apt-get install -y curl", "")
    assert host.snapshot() == before  # no keyring, no sources entry, no temporary file left


def test_secure_boot_with_dkms_driver_exits_9(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", secureboot="1")
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 9, out
    assert "Secure Boot is enabled" in out and "MOK" in out
    assert host.snapshot() == before
    assert "apt-get" not in host.log()


def test_older_driver_needs_replace_driver(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", driver="470.82.01")
    code, out = host.run("--yes", "--no-smoke")
    assert code == 9, out
    assert "--replace-driver" in out
    assert "apt-get" not in host.log()


def test_no_gpu_exits_9(host: Host) -> None:
    ubuntu(host)
    code, out = host.run("--yes", "--no-smoke")
    assert code == 9, out
    assert "no NVIDIA GPU" in out


def test_dpkg_lock_held_beyond_timeout_exits_9(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", driver="550.54.15")
    pid = host.sh("flock /var/lib/dpkg/lock-frontend sleep 60 >/dev/null 2>&1 & echo $!")[1].strip()
    assert pid.isdigit(), pid
    code, out = host.run("--yes", "--no-smoke", "--lock-timeout", "2")
    assert code == 9, out
    assert "dpkg lock held" in out and pid in out


def test_failed_step_names_the_line(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", **{"fail-install": "nvidia-driver-525"})
    code, out = host.run("--yes", "--no-smoke")
    assert code == 100, out
    assert "error: line" in out and "failed (exit 100)" in out


def test_rendered_files_match_the_lock(rendered: dict[str, bytes]) -> None:
    lock = json.loads(rendered["envbuild.lock"])
    assert lock["index_url"] == INDEX
    assert f"readonly INDEX_URL={INDEX}" in rendered["install.sh"].decode()


# --- D6: the network drops mid-download ---------------------------------------------------------


def test_download_cut_midway_is_retried(host: Host) -> None:
    ubuntu(host)
    # Two attempts cut mid-body (curl exit 18, then 56); curl's own --retry does not repeat those.
    host.state(gpu="1", **{"curl-fail": "18 56"})
    code, out = host.run("--yes", "--no-smoke")
    assert code == 10, out  # the driver went in after the third attempt
    assert curl_calls(host) == 3
    assert "curl exit 18); retrying" in out and "curl exit 56); retrying" in out
    assert "install -y /tmp/" in host.log()  # the downloaded keyring package was installed
    assert host.sh("ls -A /tmp")[1].strip() == ""  # no download directory or .part file left


def test_download_failing_throughout_names_the_url_and_leaves_nothing(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", **{"curl-fail": "18 56 18 56 18 56"})
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 1, out
    assert f"cannot download {KEYRING_URL} (curl exit 18)" in out
    assert curl_calls(host) == 3  # the script's tries, then it gives up
    assert "stub half" not in host.sh("cat /tmp/*/* 2>/dev/null")[1]
    assert "apt-get install" not in host.log()
    assert host.snapshot() == before  # the half-written file and its directory are gone


# --- D5: a download that fails its sha256 (the standalone Python tarball) ------------------------

PYTHON_TARBALL = "files/cpython-3.11-install_only.tar.gz"  # below the loopback server's root
PYTHON_URL = f"https://127.0.0.1:8765/{PYTHON_TARBALL}"  # the stub curl fetches it from that server


def _standalone_tarball() -> bytes:
    """An install_only tarball's shape (python/bin/python3) whose python3 is the container's own, so
    that the venv it makes is real."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        data = b'#!/bin/sh\nexec /usr/bin/python3 "$@"\n'
        info = tarfile.TarInfo("python/bin/python3")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_python_tarball_failing_its_sha256_installs_nothing_then_the_right_one_does(
        docker_client: Any, rendered: dict[str, bytes], tmp_path: Path) -> None:
    """D5: the tarball served is not the one the lock pins: the script stops non-zero at the check,
    the tarball (in TEMP_PATHS) and its .part are gone, no Python, venv or package is installed;
    served right, the same script installs from it and removes it."""
    good = _standalone_tarball()
    lock = lockmod.from_json(rendered["envbuild.lock"].decode())
    lock = replace(lock, python_provision="standalone", python_standalone=lockmod.Standalone(
        url=PYTHON_URL, sha256=hashlib.sha256(good).hexdigest()))
    lockmod.check_lock(lock)
    files = script.render_script(lock)
    files = {**files, "install.sh": with_test_key(files["install.sh"])}
    wheel_name, wheel = _wheel()
    served = {f"simple/torch/{wheel_name}": wheel, PYTHON_TARBALL: good + b"tampered"}
    with started_host(docker_client, files, served, tmp_path) as h:
        ubuntu(h)
        h.state(gpu="1", driver="550.54.15")  # the driver is kept: the venv is the first change seen
        before = h.snapshot()
        code, out = h.run("--yes", "--no-smoke")
        assert code == 1, out
        assert "computed checksum did NOT match" in out  # sha256sum -c's own report, then the ERR trap's
        assert "error: line " in out and "failed (exit 1): sha256sum -c -" in out
        assert f"curl -fsSL --proto =https --proto-redir =https --retry 3 --connect-timeout 30 -o " \
               f"/opt/envbuild/python.tar.gz.part {PYTHON_URL}" in h.log()  # it was downloaded
        assert h.sh("ls -A /opt/envbuild")[1] == ""  # no tarball, .part, python or venv
        # The one change: the venv step's empty prefix directory.
        assert h.snapshot().replace("/opt/envbuild d 755 4096\n", "") == before

        h.sh(f"cp /index/{PYTHON_TARBALL} /stub-state/tampered && head -c {len(good)} "
             f"/stub-state/tampered > /index/{PYTHON_TARBALL}")  # now the pinned bytes
        code, out = h.run("--yes", "--no-smoke")
        assert code == 0, out
        installed = h.sh("ls -A /opt/envbuild")[1].split()
        assert sorted(installed) == ["envbuild.lock", "python", "smoke.py", "venv"], out  # no tarball
        version = h.sh("/opt/envbuild/venv/bin/python -c 'import torch; print(torch.__version__)'")[1]
        assert version.strip() == TORCH


# --- D15: interrupted mid-run ---------------------------------------------------------------------

# Starts the script in a session of its own, as a terminal's foreground job is, and records its
# process id, output and exit status under /stub-state (outside what the snapshot compares).
LAUNCH = """import os, subprocess, sys
with open("/stub-state/run.out", "wb") as out:
    run = subprocess.Popen(sys.argv[1:], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    with open("/stub-state/run.pid.part", "w") as f:
        f.write(str(run.pid))
    os.rename("/stub-state/run.pid.part", "/stub-state/run.pid")
    code = run.wait()
with open("/stub-state/run.rc.part", "w") as f:
    f.write(str(code))
os.rename("/stub-state/run.rc.part", "/stub-state/run.rc")
"""


def wait_for(h: Host, path: str, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        code, text = h.sh(f"cat {path} 2>/dev/null")
        if code == 0:
            return text
        time.sleep(0.2)
    pytest.fail(f"{path} did not appear in {seconds}s; output so far:\n{h.sh('cat /stub-state/run.out')[1]}")


@pytest.mark.parametrize("signal", ["INT", "TERM"])
def test_interrupted_mid_run_exits_130_leaves_no_temporary_path_then_a_rerun_finishes(
        host: Host, signal: str) -> None:
    """D15: the signal reaches the script while a step blocks (the keyring package's install, its
    download's directory in TEMP_PATHS): exit 130 with the one line, no temporary path left, nothing
    else changed; run again, it completes."""
    ubuntu(host)
    host.state(gpu="1", **{"hang-install": "cuda-keyring"})
    before = host.snapshot()
    host.container.exec_run(["python3", "-c", LAUNCH, "bash", f"{SRC}/install.sh", "--yes", "--no-smoke"],
                            detach=True, environment={"PATH": "/stubs:/usr/sbin:/usr/bin:/sbin:/bin"})
    wait_for(host, "/stub-state/hanging")
    pid = wait_for(host, "/stub-state/run.pid")
    assert host.sh("ls -A /tmp")[1].strip(), "the download's directory should exist mid-run"
    # Ctrl-C signals the terminal's whole foreground process group: the blocked step and the script.
    host.sh(f"kill -{signal} -- -{pid}")
    code = int(wait_for(host, "/stub-state/run.rc", seconds=30))
    out = host.sh("cat /stub-state/run.out")[1]
    assert code == 130, out
    assert "envbuild-install: interrupted; run the script again to finish" in out
    assert "error:" not in out, out  # the interrupt alone, not a failed step as well
    assert host.sh("ls -A /tmp")[1] == ""
    assert host.snapshot() == before  # the keyring was not installed; nothing half-done remains

    host.sh("rm /stub-state/hang-install")
    code, out = host.run("--yes", "--no-smoke")
    assert code == 10 and "REBOOT REQUIRED" in out, out
    assert "nvidia-driver-525" in host.sh("apt-mark showhold")[1].split()


# --- D14: unattended-upgrades present ----------------------------------------------------------


def test_unattended_upgrades_keep_off_the_driver(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", upgradable=" ".join((*NVIDIA_PACKAGES, "python3")))
    host.sh("/stubs/apt-get install -y unattended-upgrades && : > /stub-state/log")
    host.sh("printf '%s\\n' 'Unattended-Upgrade::Package-Blacklist {' '  \"linux-\";' '};' "
            "> /etc/apt/apt.conf.d/50unattended-upgrades")
    before = host.snapshot()
    code, out = host.run("--dry-run")
    assert code == 0 and "keep unattended-upgrades away from the held NVIDIA packages" in out, out
    assert host.snapshot() == before

    code, out = host.run("--yes", "--no-smoke")
    assert code == 10, out
    blacklist = host.sh("apt-config dump --format '%v%n' Unattended-Upgrade::Package-Blacklist")[1]
    # apt itself reads the file and adds its entries to the list the distribution's file starts.
    assert blacklist.split() == ["linux-", "^libnvidia-compute-525$", "^nvidia-driver-525$"], blacklist
    assert host.sh(f"stat -c %a {UU_CONF}")[1].strip() == "644"
    simulated = host.sh("/stubs/apt-get -s upgrade")[1]
    assert "Inst python3 " in simulated  # the simulation does upgrade what is free to move
    assert "Inst nvidia" not in simulated and "Inst libnvidia" not in simulated, simulated
    assert "kept back" in simulated
    dry = host.sh("/stubs/unattended-upgrade --dry-run")[1]
    assert "Would upgrade python3" in dry
    assert not any(f"Would upgrade {p}" in dry for p in NVIDIA_PACKAGES), dry

    # Second run after the reboot: the file byte-identical, nothing else changed.
    digest = host.sh(f"sha256sum {UU_CONF}")[1]
    reboot(host)
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 0 and "nothing to change" in out, out
    assert host.snapshot() == before and host.sh(f"sha256sum {UU_CONF}")[1] == digest

    # Without the holds apt-get would move the driver; the blacklist alone still keeps
    # unattended-upgrades off it.
    host.sh(f"apt-mark unhold {' '.join(NVIDIA_PACKAGES)}")
    assert "Inst nvidia-driver-525 " in host.sh("/stubs/apt-get -s upgrade")[1]
    dry = host.sh("/stubs/unattended-upgrade --dry-run")[1]
    assert all(f"Package {p} is blacklisted" in dry for p in NVIDIA_PACKAGES), dry


# --- D17: nouveau loaded -------------------------------------------------------------------------


def test_nouveau_blacklisted_then_reboot(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", nouveau="1")
    before = host.snapshot()
    code, out = host.run("--dry-run")
    assert code == 0, out
    assert f"blacklist nouveau in {NOUVEAU_CONF} and run update-initramfs -u" in out
    assert host.snapshot() == before and "update-initramfs" not in host.log()

    code, out = host.run("--yes", "--no-smoke")
    assert code == 10, out
    assert "REBOOT REQUIRED: nouveau is loaded" in out
    lines = host.sh(f"cat {NOUVEAU_CONF}")[1].splitlines()
    assert lines[1:] == ["blacklist nouveau", "options nouveau modeset=0"]
    assert "update-initramfs -u" in host.log()
    # The initramfs was rebuilt with the blacklist already in place.
    assert "blacklist nouveau" in host.sh("cat /stub-state/initramfs-modprobe")[1]

    # Run again before rebooting: nothing changes, and the reboot is still asked for.
    host.sh(": > /stub-state/log")
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 10 and "REBOOT REQUIRED: nouveau is loaded" in out, out
    assert host.snapshot() == before
    assert "update-initramfs" not in host.log() and "apt-get" not in host.log()

    reboot(host)
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 0 and "nothing to change" in out, out
    assert host.snapshot() == before


def test_nouveau_initramfs_failure_is_undone(host: Host) -> None:
    ubuntu(host)
    host.state(gpu="1", nouveau="1", **{"fail-initramfs": "1"})
    code, out = host.run("--yes", "--no-smoke")
    assert code == 1, out
    assert "update-initramfs -u failed" in out
    assert host.sh(f"test -e {NOUVEAU_CONF}")[0] != 0  # so that the next run rebuilds again
    host.sh("rm -f /stub-state/fail-initramfs && : > /stub-state/log")
    code, out = host.run("--yes", "--no-smoke")
    assert code == 10 and "REBOOT REQUIRED: nouveau is loaded" in out, out
    assert "update-initramfs -u" in host.log() and host.sh(f"test -e {NOUVEAU_CONF}")[0] == 0


# --- a locked closure: the same files, installed by hash, checked as a set (docs/faults.md H44) ----


@pytest.fixture
def closure_host(docker_client: Any, rendered: dict[str, bytes], tmp_path: Path) -> Iterator[Host]:
    """The host fixture's container with a closure's files instead: torch and one project
    dependency, both served from 127.0.0.1:8765/files/ and named by URL and sha256 in a pylock."""
    import hashlib

    from envbuild.render.lockset import LockSet, sha256_text

    wheels = dict([_wheel(), _placeholder("tinydep", "1.0")])
    rows = []
    for filename, data in sorted(wheels.items()):
        name, version = filename.split("-")[:2]
        rows.append(f'[[packages]]\nname = "{name}"\nversion = "{version}"\nwheels = [{{ url = '
                    f'"http://127.0.0.1:8765/files/{filename.replace("+", "%2B")}", hashes = {{ sha256 = '
                    f'"{hashlib.sha256(data).hexdigest()}" }} }}]\n')
    text = 'lock-version = "1.0"\ncreated-by = "test"\n\n' + "\n".join(rows)
    base = lockmod.from_json(rendered["envbuild.lock"].decode())
    lock = replace(base, packages={"tinydep": "1.0", "torch": TORCH}, layers=(), pylock=lockmod.PylockRef(
        file="pylock.toml", sha256=sha256_text(text), torch_layer=("torch",),
        platform="x86_64-manylinux_2_35", text=text))
    lockmod.check_lock(lock)
    files = script.render_script(lock, LockSet(targets={"default": lock}).to_json())
    files = {**files, "install.sh": with_test_key(files["install.sh"])}
    with started_host(docker_client, files, {f"files/{n}": d for n, d in wheels.items()}, tmp_path) as h:
        yield h


def test_a_locked_closure_installs_exactly_the_lock_then_changes_nothing(closure_host: Host) -> None:
    host = closure_host
    ubuntu(host)
    host.state(gpu="1")
    code, out = host.run("--yes", "--no-smoke")
    assert code == 10, out  # the driver, as for any lock; the packages came with it
    script_text = host.sh(f"cat {SRC}/install.sh")[1]
    assert "install --no-cache-dir --no-deps --no-index --require-hashes" in script_text
    listed = host.sh("/opt/envbuild/venv/bin/python -m pip list --format=freeze 2>/dev/null")[1]
    assert f"torch=={TORCH}" in listed and "tinydep==1.0" in listed
    reboot(host)
    before = host.snapshot()
    code, out = host.run("--yes", "--no-smoke")
    assert code == 0 and "nothing to change" in out, out
    assert host.snapshot() == before
    # A locked distribution removed by hand: the pins step runs again and puts exactly it back.
    host.sh("/opt/envbuild/venv/bin/pip uninstall -y tinydep >/dev/null 2>&1")
    code, out = host.run("--yes", "--no-smoke")
    assert code == 0, out
    assert "tinydep==1.0" in host.sh("/opt/envbuild/venv/bin/python -m pip list --format=freeze")[1]


def test_a_wheel_that_does_not_match_its_hash_is_not_installed(closure_host: Host) -> None:
    host = closure_host
    ubuntu(host)
    host.state(gpu="1")
    host.sh("printf 'x' >> /index/files/tinydep-1.0-py3-none-any.whl")  # the served file changed
    code, out = host.run("--yes", "--no-smoke")
    assert code not in (0, 10), out
    assert "HASHES" in out.upper() or "hash" in out
    assert "tinydep" not in host.sh("/opt/envbuild/venv/bin/python -m pip list --format=freeze 2>&1")[1]


# --- M: the host setup around the stack -----------------------------------------------------------

# The GPU container check's image as the data pins it (docs/faults.md T10).
_CTK_ROWS = yaml.safe_load((Path(__file__).parents[1] / "matrices" / "container_toolkit.yaml").read_text())
SMOKE_IMAGE = _CTK_ROWS["rows"][0]["smoke_image"]
TOOLKIT = Toolkit(version="1.20.0-1", repository="https://nvidia.github.io/libnvidia-container/stable/deb",
                  key_url="https://nvidia.github.io/libnvidia-container/gpgkey",
                  key_fingerprint=TEST_KEY_FINGERPRINT, smoke_image=SMOKE_IMAGE)
CTK_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                "libnvidia-container1")


def code_first(out: str) -> int:
    """The exit code the script's last error line reports (``smoke.py (exit N)``)."""
    return int(out.split("smoke.py (exit ")[1].split(")")[0])


def _armored(key: bytes) -> bytes:
    """``key`` ASCII-armored as gpg --armor writes it (RFC 4880, 6: base64 lines and a CRC-24)."""
    import base64

    crc = 0xB704CE
    for byte in key:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    text = base64.b64encode(key).decode()
    lines = [text[i:i + 64] for i in range(0, len(text), 64)]
    checksum = base64.b64encode((crc & 0xFFFFFF).to_bytes(3, "big")).decode()
    return ("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n" + "\n".join(lines) + f"\n={checksum}\n"
            "-----END PGP PUBLIC KEY BLOCK-----\n").encode()


@contextlib.contextmanager
def setup_host(docker_client: Any, rendered: dict[str, bytes], tmp_path: Path,
               **setup: Any) -> Iterator[Host]:
    """The host fixture's container with the same lock rendered for ``setup`` (a HostSetup's fields)."""
    lock = lockmod.from_json(rendered["envbuild.lock"].decode())
    files = script.render_script(lock, host=HostSetup(**{"why": "test", **setup}))
    files = {**files, "install.sh": with_test_key(files["install.sh"])}
    wheel_name, wheel = _wheel()
    with started_host(docker_client, files, {f"simple/torch/{wheel_name}": wheel}, tmp_path) as h:
        ubuntu(h)
        key = _armored((KEYRINGS / "trusted.gpg").read_bytes())
        h.container.put_archive("/", _tar({"stubs/gpgkey.asc": (key, 0o644)}))
        yield h


def test_open_modules_headers_and_persistenced(docker_client: Any, rendered: dict[str, bytes],
                                               tmp_path: Path) -> None:
    """M1, M3: a Blackwell setup installs nvidia-driver-620-open with the running kernel's headers,
    holds it, enables nvidia-persistenced; after the reboot a second run changes nothing."""
    with setup_host(docker_client, rendered, tmp_path, branch="620", modules="open", runtime="none") as h:
        h.state(gpu="1")
        code, out = h.run("--yes", "--no-smoke")
        assert code == 10, out
        assert "error" not in out  # no probe's failure surfaces (ERR trap in a command substitution)
        kernel = h.sh("uname -r")[1].strip()
        assert f"install -y nvidia-driver-620-open linux-headers-{kernel}" in h.log()
        held = set(h.sh("apt-mark showhold")[1].split())
        assert {"nvidia-driver-620-open", "libnvidia-compute-620"} <= held
        assert "systemctl enable nvidia-persistenced" in h.log()  # not --now: no driver loaded yet
        h.sh("rm -f /var/run/reboot-required && : > /stub-state/log")
        h.state(driver="620.40.01")
        before = h.snapshot()
        code, out = h.run("--yes", "--no-smoke")
        assert code == 0 and "nothing to change" in out, out
        assert h.snapshot() == before and "apt-get" not in h.log()


def test_proprietary_modules_by_default_before_560(host: Host) -> None:
    """M1: the test lock's own branch (525) predates the open default: nvidia-driver-525."""
    ubuntu(host)
    host.state(gpu="1")
    code, out = host.run("--dry-run")
    assert code == 0, out
    assert "install nvidia-driver-525 and linux-headers-" in out and "525-open" not in out


# (how, branch, loaded driver, the package and version installed)
FABRIC_CASES = [
    ("pci", "580", "580.95.05", "nvidia-fabricmanager", "580.95.05-1"),
    ("hgx-names", "580", "580.95.05", "nvidia-fabricmanager", "580.95.05-1"),
    # Ubuntu's archive builds a real nvidia-fabricmanager-580 (NVIDIA's repository lacks this version).
    ("ubuntu-archive", "580", "580.95.05", "nvidia-fabricmanager-580", "580.95.05-0ubuntu1"),
    ("r570", "570", "570.195.03", "nvidia-fabricmanager-570", "570.195.03-1"),
]


@pytest.mark.parametrize(("how", "branch", "driver", "package", "version"), FABRIC_CASES)
def test_nvswitch_gets_the_fabric_manager_of_the_driver_version(docker_client: Any,
                                                                 rendered: dict[str, bytes],
                                                                 tmp_path: Path, how: str, branch: str,
                                                                 driver: str, package: str,
                                                                 version: str) -> None:
    """M2, T9: an NVSwitch found on the PCI bus, or eight B200s (Blackwell HGX, with nvlsm): the fabric
    manager of exactly the loaded driver's version, held, enabled and started, the fabric
    Completed; a second run changes nothing. From R580 NVIDIA's repository names it
    nvidia-fabricmanager (nvidia-fabricmanager-580 is virtual there: the stub apt-get refuses it at
    any version, as apt does, NVIDIA/gpu-driver-container#451); Ubuntu's archive keeps the
    versioned name."""
    with setup_host(docker_client, rendered, tmp_path, branch=branch, modules="open", runtime="none") as h:
        h.state(gpu="1", driver=driver, nvswitch="1")
        if how == "hgx-names":
            h.sh("printf 'NVIDIA B200\\n%.0s' 1 2 3 4 5 6 7 8 > /stub-state/gpu-names")
        else:
            h.state(**{"nvswitch-pci": "1"})
        if how == "ubuntu-archive":
            h.state(**{"fm-missing": "1", "fm-ubuntu": "1"})
        code, out = h.run("--yes", "--no-smoke")
        assert code == 0, out
        log = h.log()
        assert f"install -y {package}={version}" in log
        assert "was not found" not in out
        assert ("nvlsm" in log) == (how == "hgx-names")
        assert "systemctl enable --now nvidia-fabricmanager" in log
        assert "NVSwitch fabric: Completed" in out
        assert "error" not in out
        assert package in h.sh("apt-mark showhold")[1].split()
        h.sh(": > /stub-state/log")
        before = h.snapshot()
        code, out = h.run("--yes", "--no-smoke")
        assert code == 0 and "nothing to change" in out, out
        assert h.snapshot() == before and "apt-get" not in h.log()


def test_nvswitch_fabric_that_stays_in_progress_exits_1(docker_client: Any,
                                                         rendered: dict[str, bytes],
                                                         tmp_path: Path) -> None:
    """M2: the fabric manager runs but the fabric never completes: exit 1 naming the state; no
    fabric manager of the driver's version: exit 1 before anything is installed."""
    with setup_host(docker_client, rendered, tmp_path, branch="580", modules="open", runtime="none",
                    nvswitch=True) as h:
        h.state(gpu="1", driver="580.95.05", nvswitch="1", **{"fabric-stuck": "1", "fm-missing": "1"})
        code, out = h.run("--yes", "--no-smoke")
        assert code == 1, out
        assert ("no fabric manager of version 580.95.05 (the loaded driver's) in the apt sources: tried "
                "nvidia-fabricmanager nvidia-fabricmanager-580") in out
        assert "install -y nvidia-fabricmanager" not in h.log()
        h.sh("rm /stub-state/fm-missing")
        code, out = h.sh(f"ENVBUILD_FABRIC_WAIT=2 PATH=/stubs:$PATH bash {SRC}/install.sh --yes --no-smoke "
                         "2>&1")
        assert code == 1, out
        assert "NVSwitch fabric state is 'In Progress' after 2s" in out


def test_container_toolkit_docker_cdi_gpu_container_and_dcgm(docker_client: Any,
                                                             rendered: dict[str, bytes],
                                                             tmp_path: Path) -> None:
    """M4, M7: the toolkit's key checked and installed as a signed-by keyring, its four packages at
    the pinned version and held, docker configured and restarted, the CDI spec generated; the smoke
    step runs a GPU container and dcgmi diag at the level asked and reports both; a second run
    changes nothing."""
    with setup_host(docker_client, rendered, tmp_path, branch="580", modules="open", toolkit=TOOLKIT) as h:
        h.state(gpu="1", driver="580.95.05")
        h.sh("cp /stubs/docker.optional /stubs/docker && cp /stubs/dcgmi.optional /stubs/dcgmi")
        code, out = h.run("--yes", "--no-smoke")
        assert code == 0, out
        log = h.log()
        assert "curl -fsSL" in log and "https://nvidia.github.io/libnvidia-container/gpgkey" in log
        assert "install -y " + " ".join(f"{p}=1.20.0-1" for p in CTK_PACKAGES) in log
        assert set(CTK_PACKAGES) <= set(h.sh("apt-mark showhold")[1].split())
        listed = h.sh("cat /etc/apt/sources.list.d/nvidia-container-toolkit.list")[1]
        assert listed == ("deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
                          "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n")
        keyring = h.sh("sha256sum < /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg")[1].split()[0]
        assert keyring == hashlib.sha256((KEYRINGS / "trusted.gpg").read_bytes()).hexdigest()  # unarmored
        assert "nvidia-ctk runtime configure --runtime=docker" in log and "systemctl restart docker" in log
        assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in log
        # The smoke step: the placeholder torch fails smoke.py, the GPU container and dcgmi still run.
        h.sh(": > /stub-state/log")
        code, out = h.run("--yes", "--dcgm-level", "2")
        assert code in (7, 8), out
        # The check's image by the digest the data records (matrices/container_toolkit.yaml), never a tag.
        assert re.fullmatch(r"ubuntu:24\.04@sha256:[0-9a-f]{64}", SMOKE_IMAGE)
        assert f"docker run --rm --runtime=nvidia --gpus all {SMOKE_IMAGE} nvidia-smi -L" in h.log()
        assert "dcgmi diag -r 2: passed" in out
        assert "smoke test failed: smoke.py (exit" in out and "GPU container" not in out.split("failed:")[-1]
        # Both fail too: each is listed; the exit code stays smoke.py's, the first failure's.
        h.state(**{"docker-fail": "1", "dcgmi-rc": "3"})
        code, again = h.run("--yes")
        assert code == code_first(out), again
        assert "dcgmi diag -r 1: failed (exit 3)" in again
        assert "GPU container (exit 1), dcgmi diag -r 1 (exit 3);" in again
        h.sh("rm /stub-state/docker-fail /stub-state/dcgmi-rc")
        h.sh(": > /stub-state/log")
        before = h.snapshot()
        code, out = h.run("--yes", "--no-smoke")
        assert code == 0 and "nothing to change" in out, out
        assert h.snapshot() == before and "apt-get" not in h.log() and "curl" not in h.log()


def test_container_toolkit_key_of_another_is_refused(docker_client: Any, rendered: dict[str, bytes],
                                                     tmp_path: Path) -> None:
    """M4: the key served is not the pinned one: exit 1, no keyring, no apt source, no package."""
    with setup_host(docker_client, rendered, tmp_path, branch="580", modules="open", toolkit=TOOLKIT) as h:
        h.state(gpu="1", driver="580.95.05")
        key = _armored((KEYRINGS / "other.gpg").read_bytes())
        h.container.put_archive("/", _tar({"stubs/gpgkey.asc": (key, 0o644)}))
        code, out = h.run("--yes", "--no-smoke")
        assert code == 1, out
        assert f"is not the key {TEST_KEY_FINGERPRINT}" in out
        assert out.count("error:") == 1, out  # the one line naming the key, nothing spurious
        assert h.sh("ls /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg "
                    "/etc/apt/sources.list.d/nvidia-container-toolkit.list 2>/dev/null")[1] == ""
        assert "nvidia-container-toolkit=" not in h.log()


def test_user_data_first_boot_runs_the_embedded_script_and_exports_env(
        docker_client: Any, rendered: dict[str, bytes], tmp_path: Path) -> None:
    """The user-data's files as cloud-init writes them (install.sh without its comments, gunzipped),
    then firstboot.sh as runcmd runs it: install.sh installs (--env pairs in /etc/profile.d, read
    back by a login shell), then check.py runs and fails on the placeholder torch (no torch.cuda),
    exit 7; a second boot changes nothing; a lock without --env removes the file again."""
    import gzip

    import yaml

    from envbuild.render import cloudinit

    base = lockmod.from_json(rendered["envbuild.lock"].decode())
    lock = replace(base, env=(("HF_HOME", "/data/hf"), ("QUOTED", "it's $HOME")))
    files = {}
    user_data = cloudinit.render_cloud_init(lock)["user-data"]
    for entry in yaml.safe_load(gzip.decompress(user_data))["write_files"]:  # as cloud-init reads it
        files[entry["path"].rsplit("/", 1)[1]] = entry["content"].encode()
    files["install.sh"] = with_test_key(files["install.sh"])
    files["install-noenv.sh"] = rendered["install.sh"]
    wheel_name, wheel = _wheel()
    with started_host(docker_client, files, {f"simple/torch/{wheel_name}": wheel}, tmp_path) as h:
        ubuntu(h)
        h.state(gpu="1", driver="550.54.15")
        h.sh(f"mkdir -p /opt/envbuild && cd {SRC} && cp install.sh firstboot.sh check.py /opt/envbuild/")
        boot = "PATH=/stubs:$PATH bash /opt/envbuild/firstboot.sh 2>&1"
        code, out = h.sh(boot)
        assert code == 7, out
        assert "envbuild-check: FAILED AttributeError" in out  # the chain reached check.py
        assert "export the lock's --env pairs in /etc/profile.d/envbuild-env.sh" in out
        code, shown = h.sh("sh -lc 'printf \"%s|%s\" \"$HF_HOME\" \"$QUOTED\"'")
        assert shown == "/data/hf|it's $HOME", shown
        before = h.snapshot()
        code, out = h.sh(boot)
        assert code == 7 and "nothing to change" in out, out
        assert h.snapshot() == before
        code, out = h.sh(f"PATH=/stubs:$PATH bash {SRC}/install-noenv.sh --yes --no-smoke 2>&1")
        assert code == 0 and "remove /etc/profile.d/envbuild-env.sh" in out, out
        assert h.sh("test -e /etc/profile.d/envbuild-env.sh")[0] != 0


@pytest.fixture(scope="module")
def forward_rendered() -> dict[str, bytes]:
    """install.sh of a forward-compatibility stack (B200 on driver 570.124.06, a CUDA 13 wheel),
    retargeted like ``rendered`` at the container's Python 3.11, Ubuntu 22.04 and a local index;
    smoke.py is a stand-in that prints the LD_LIBRARY_PATH and --env value it was started with."""
    m = matrixmod.load(matrixmod.default_directory({}))
    gpu = find_gpu(m.rows("gpus"), "B200")
    stack = next(s for s in resolve(Request(driver=DriverVersion.parse("570.124.06"), gpus=(gpu,)), m).stacks
                 if s.compat == "forward")
    stack = stack.replace(python="3.11", ubuntu="22.04", torchvision=None, torchaudio=None)
    base = lockmod.make_lock(stack, m)
    lock = replace(base, stack=stack, index_url=INDEX, python_provision="distro", python_standalone=None,
                   env=(("HF_HOME", "/data/hf"),))
    lock = replace(lock, packages=lockmod.pins(lock.stack))
    lockmod.check_lock(lock)
    files = script.render_script(lock, host=HostSetup(branch="570", modules="open", why="test",
                                                      runtime="none"))
    stand_in = (b"import os\nprint('smoke-env LD_LIBRARY_PATH=%s HF_HOME=%s' % "
                b"(os.environ.get('LD_LIBRARY_PATH'), os.environ.get('HF_HOME')))\n")
    return {**files, "install.sh": with_test_key(files["install.sh"]), "smoke.py": stand_in}


@contextlib.contextmanager
def forward_host(docker_client: Any, files: dict[str, bytes], tmp_path: Path) -> Iterator[Host]:
    lock = json.loads(files["envbuild.lock"])
    wheel_name, wheel = _placeholder("torch", lock["packages"]["torch"])
    with started_host(docker_client, files, {f"simple/torch/{wheel_name}": wheel}, tmp_path) as h:
        ubuntu(h)
        h.sh("printf 'NVIDIA B200\\n' > /stub-state/gpu-names")
        yield h


COMPAT = "/usr/local/cuda-13.2/compat"


def test_forward_compat_installs_cuda_compat_and_reaches_the_smoke_test(
        docker_client: Any, forward_rendered: dict[str, bytes], tmp_path: Path) -> None:
    """docs/faults.md P1: on the branch the stack was resolved for (570), the driver is kept and
    cuda-compat-13-2 comes from NVIDIA's repository (its keyring first); the compat directory is
    first on LD_LIBRARY_PATH for the smoke test, in the venv's activate script and for login
    shells (once, with both); a second run changes nothing."""
    assert b"readonly COMPAT_PACKAGE=cuda-compat-13-2\n" in forward_rendered["install.sh"]
    with forward_host(docker_client, forward_rendered, tmp_path) as h:
        h.state(gpu="1", driver="570.124.06")
        code, out = h.run("--dry-run")
        assert code == 0, out
        assert ("install cuda-compat-13-2 (forward compatibility: CUDA 13.2 on driver branch 570; its "
                f"libcuda in {COMPAT})") in out
        assert ("driver 570.124.06 runs CUDA 13.2 through forward compatibility (cuda-compat-13-2): "
                "unchanged") in out
        code, out = h.run("--yes")
        assert code == 0, out
        log = h.log()
        assert "cuda-keyring_1.1-1_all.deb" in log and "install -y cuda-compat-13-2" in log
        assert log.index("cuda-keyring") < log.index("install -y cuda-compat-13-2")
        assert "nvidia-driver" not in log  # the driver branch is kept
        assert f"smoke-env LD_LIBRARY_PATH={COMPAT} HF_HOME=/data/hf" in out
        assert h.sh(f"test -e {COMPAT}/libcuda.so.1")[0] == 0
        activate = '. /opt/envbuild/venv/bin/activate && printf %s "$LD_LIBRARY_PATH"'
        assert h.sh(f"env -u LD_LIBRARY_PATH bash -c '{activate}'")[1] == COMPAT
        assert h.sh(f"LD_LIBRARY_PATH=/opt/x bash -c '{activate}'")[1] == f"{COMPAT}:/opt/x"
        assert h.sh(f"env -u LD_LIBRARY_PATH bash -lc '{activate}'")[1] == COMPAT  # profile.d, then activate
        login = "env -u LD_LIBRARY_PATH sh -lc 'printf %s \"$LD_LIBRARY_PATH|$HF_HOME\"'"
        assert h.sh(login)[1] == f"{COMPAT}|/data/hf"
        h.sh(": > /stub-state/log")
        before = h.snapshot()
        code, out = h.run("--yes", "--no-smoke")
        assert code == 0 and "nothing to change" in out, out
        assert h.snapshot() == before and "apt-get" not in h.log() and "curl" not in h.log()


def test_forward_compat_refuses_another_branch_and_a_geforce(
        docker_client: Any, forward_rendered: dict[str, bytes], tmp_path: Path) -> None:
    """docs/faults.md P2: a loaded driver of another branch than the stack was resolved for (even
    with --skip-driver or --replace-driver), or a GeForce GPU: exit 9, one error line, nothing changed."""
    with forward_host(docker_client, forward_rendered, tmp_path) as h:
        before = h.snapshot()
        for driver, names, options, message in (
                ("580.95.05", "NVIDIA B200", (), "driver 580.95.05 is branch 580; this stack runs CUDA 13.2 "
                 "through forward compatibility (cuda-compat-13-2) resolved for branch 570"),
                ("580.95.05", "NVIDIA B200", ("--skip-driver",), "driver 580.95.05 is branch 580"),
                ("535.104.05", "NVIDIA B200", ("--replace-driver",), "driver 535.104.05 is branch 535"),
                ("570.124.06", "NVIDIA GeForce RTX 4090", (), "NVIDIA GeForce RTX 4090 is not a datacenter "
                 "GPU: forward compatibility (cuda-compat-13-2) runs on datacenter GPUs only")):
            h.state(gpu="1", driver=driver)
            h.sh(f"printf '%s\\n' '{names}' > /stub-state/gpu-names")
            code, out = h.run("--yes", *options)
            assert code == 9, out
            assert message in out and out.count("error:") == 1, out
        assert h.snapshot() == before
        assert "apt-get" not in h.log() and "curl" not in h.log()
