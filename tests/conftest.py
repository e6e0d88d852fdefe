from __future__ import annotations

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
