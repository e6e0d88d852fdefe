from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/ from the current renderer instead of comparing")


KEYRINGS = Path(__file__).parent / "fixtures" / "keyring"
# What gpg printed for the two test keys when they were made (gpg --with-colons, fpr), so that
# the script's own fingerprint reader is checked against gpg's.
TEST_KEY_FINGERPRINT = "97FDD92058D1466C2FC61FB379AA14564AE80F21"
OTHER_KEY_FINGERPRINT = "00A8462B8DB6647CD39FA44C02BE1E6AA9D55265"
NVIDIA_KEY_LINE = "readonly NVIDIA_KEY_FINGERPRINT=EB693B3035CD5710E231E123A4B469963BF863CC"


def keyring_deb(directory: Path, keyrings: dict[str, bytes]) -> Path:
    """A cuda-keyring-like .deb holding ``keyrings`` (file name -> bytes) under
    /usr/share/keyrings, built by dpkg-deb as NVIDIA's is."""
    import shutil
    import subprocess

    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs dpkg-deb")
    root = directory / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
        "Maintainer: envbuild tests <tests@envbuild.invalid>\nDescription: test keyring\n")
    (root / "usr" / "share" / "keyrings").mkdir(parents=True)
    for name, data in keyrings.items():
        (root / "usr" / "share" / "keyrings" / name).write_bytes(data)
    deb = directory / "cuda-keyring_1.1-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


def with_test_key(script: bytes) -> bytes:
    """The rendered install.sh trusting the test key in place of NVIDIA's (nothing else changes)."""
    assert script.count(NVIDIA_KEY_LINE.encode()) == 1
    return script.replace(NVIDIA_KEY_LINE.encode(),
                          f"readonly NVIDIA_KEY_FINGERPRINT={TEST_KEY_FINGERPRINT}".encode())


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def loopback_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real registry (Debian's ``docker-registry``, the distribution project's server) on
    127.0.0.1, plain HTTP, anonymous, storing in a temporary directory; yields "127.0.0.1:PORT".
    Docker treats loopback registries as insecure ones, so ``docker push`` needs no TLS.
    Skipped without the binary, unless ENVBUILD_REQUIRE_DOCKER is set (CI): then it fails."""
    import os
    import shutil
    import subprocess
    import time
    import urllib.error
    import urllib.request

    binary = shutil.which("docker-registry")
    if binary is None:
        message = "no docker-registry binary (apt-get install docker-registry)"
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail(f"ENVBUILD_REQUIRE_DOCKER is set but there is {message}")
        pytest.skip(message)
    root = tmp_path_factory.mktemp("registry")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    log_path = root / "registry.log"
    for _ in range(3):  # another process may take the port between the probe and the start
        port = free_port()
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            "storage:\n"
            f"  filesystem:\n    rootdirectory: {root / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n",
            encoding="utf-8")
        with log_path.open("ab") as log:
            process = subprocess.Popen([binary, "serve", str(config)], stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        ready = False
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with opener.open(f"http://127.0.0.1:{port}/v2/", timeout=2) as answer:
                    ready = answer.status == 200
            except (urllib.error.URLError, OSError):
                ready = False
            if ready:
                break
            time.sleep(0.1)
        if ready:
            break
        process.terminate()
        process.wait(10)
    else:
        pytest.fail("docker-registry did not start: "
                    + log_path.read_text(encoding="utf-8", errors="replace")[-2000:])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
