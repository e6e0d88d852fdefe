"""docs/faults.md A28-A32: --ca-bundle, --user, --apt-package and --wheelhouse values that
used to be accepted and fail late, hang, or leak into the image."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.engine.context import context_tar
from envbuild.errors import UsageError
from envbuild.render import docker as render

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
STACK = ["--torch", "2.13.0", "--variant", "cpu", "--python", "3.11", "--ubuntu", "24.04",
         "--python-url", "https://python.example/cpython-3.11.tar.gz", "--python-sha256", "a" * 64]


def _render(tmp_path: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "out"
    code = main(["render", "docker", *STACK, *extra, "-o", str(out)], env={})
    return code, out


def _parse_in_child(ca_bundle: str) -> str:
    """parse_options(ca_bundle=...) in a child with 512 MiB of address space and 20 s: a read
    without limit or a hang fails the test instead of the machine."""
    code = ("import sys; from envbuild.render import docker; from envbuild.errors import UsageError\n"
            "try:\n    docker.parse_options(ca_bundle=sys.argv[1])\n"
            "except UsageError as exc:\n    print('usage:', exc.message)\nelse:\n    print('accepted')\n")

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    try:
        done = subprocess.run([sys.executable, "-c", code, ca_bundle], capture_output=True, text=True,
                              timeout=20, preexec_fn=limit, env={**os.environ, "PYTHONPATH": os.getcwd()})
    except subprocess.TimeoutExpired:
        return "hung"
    return done.stdout.strip() or f"crashed: {done.stderr.strip()[-200:]}"


# --- A28, A29: --ca-bundle -------------------------------------------------------------------------


def test_ca_bundle_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    assert _parse_in_child(str(fifo)).startswith("usage: --ca-bundle"), "a FIFO must not be read"


def test_ca_bundle_device_is_refused_without_reading_it() -> None:
    assert _parse_in_child("/dev/zero") == "usage: --ca-bundle '/dev/zero' is not a regular file"


def test_ca_bundle_over_one_mib_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.pem"
    big.write_text(PEM * (2 * 1024 * 1024 // len(PEM)))
    with pytest.raises(UsageError, match="larger than 1024 KiB"):
        render.parse_options(ca_bundle=str(big))


@pytest.mark.parametrize("key", [KEY, KEY.replace("PRIVATE", "RSA PRIVATE"),
                                 KEY.replace("PRIVATE", "ENCRYPTED PRIVATE")])
def test_ca_bundle_with_a_private_key_is_refused(tmp_path: Path, key: str) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text(PEM + key)
    with pytest.raises(UsageError, match="holds a private key") as info:
        render.parse_options(ca_bundle=str(bundle))
    assert info.value.exit_code == 2


def test_ca_bundle_stays_out_of_the_final_image(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text(PEM)
    code, out = _render(tmp_path, "--ca-bundle", str(bundle), "--pip-package", "pillow")
    assert code == 0
    text = (out / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert len(stages) == 3 and " AS envbuild-system\n" in stages[0]
    system, build, final = stages
    # The system packages once, without the bundle: the stages above share that layer.
    assert text.count("apt-get install") == 1 and "apt-get install" in system
    assert "ca-bundle" not in system and "PIP_CERT" not in system
    assert build.startswith("envbuild-system AS envbuild-build\n")
    assert "COPY ca-bundle.crt " in build and "pip install" in build
    assert final.startswith("envbuild-system\n")
    assert "ca-bundle" not in final and "PIP_CERT" not in final
    assert "COPY --from=envbuild-build /opt/venv /opt/venv" in final
    assert "COPY --from=envbuild-build /opt/python /opt/python" in final  # the standalone CPython
    assert "curl" not in final  # not downloaded twice


# --- A30: --user --------------------------------------------------------------------------------


@pytest.mark.parametrize("user", ["nobody", "ubuntu", "daemon", "bin", "sys", "_apt", "users"])
def test_user_existing_in_base_images_is_refused_at_render(tmp_path: Path, user: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _render(tmp_path, "--user", user)
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.startswith(f"envbuild: error[usage]: user name '{user}' (--user) already exists")


# --- A31: --apt-package -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["foo=~root", "foo=1:~root", "foo=~", "foo=a1.0", "foo=1.0:2"])
def test_apt_versions_bash_could_expand_are_refused(value: str) -> None:
    with pytest.raises(UsageError, match="invalid Debian package name"):
        render.parse_options(apt_packages=[value])


def test_apt_version_with_tilde_reaches_apt_verbatim(tmp_path: Path) -> None:
    value = "libfoo=1:2.0~rc1-1"
    code, out = _render(tmp_path, "--apt-package", value)
    assert code == 0
    text = (out / "Dockerfile").read_text()
    assert f"'{value}'" in text  # one quoted shell word
    run = re.search(r"^RUN (apt-get update .*?)$(?<!\\)", text.replace("\\\n", " "), re.MULTILINE)
    assert run is not None
    argv = subprocess.run(
        ["bash", "-c", 'apt-get() { printf "%s\\n" "$@"; }; rm() { :; }; ' + run.group(1)],
        capture_output=True, text=True, check=True, env={"HOME": "/home/someone", "PATH": os.environ["PATH"]},
    ).stdout.splitlines()
    assert value in argv

    script_out = tmp_path / "script"
    assert main(["render", "script", *STACK, "--apt-package", value, "-o", str(script_out)], env={}) == 0
    script = next(p for p in script_out.rglob("install.sh"))
    subprocess.run(["bash", "-n", str(script)], check=True)
    line = next(x for x in script.read_text().splitlines()
                if x.startswith(("readonly -a APT_EXTRA", "APT_EXTRA")))
    printed = subprocess.run(["bash", "-c", line + '\nprintf "%s\\n" "${APT_EXTRA[@]}"'],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert printed == [value]


# --- A32: --wheelhouse --------------------------------------------------------------------------


def test_wheelhouse_symlink_named_like_a_wheel_is_refused(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"PK")
    secret = tmp_path / "secret"
    secret.write_text("not for the daemon\n")
    (wheels / "evil-1.0-py3-none-any.whl").symlink_to(secret)
    with pytest.raises(UsageError, match="is a symbolic link"):
        render.parse_options(wheelhouse=str(wheels))


def test_wheelhouse_takes_only_regular_files(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    real = wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    real.write_bytes(b"PK")
    (wheels / "dir-1.0-py3-none-any.whl").mkdir()
    os.mkfifo(wheels / "fifo-1.0-py3-none-any.whl")
    assert render.parse_options(wheelhouse=str(wheels)).wheelhouse == (real,)


def test_context_tar_refuses_a_symlink_swapped_in_after_render(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not for the daemon\n")
    wheel = tmp_path / "evil-1.0-py3-none-any.whl"
    wheel.symlink_to(secret)
    with pytest.raises(UsageError, match="is a symbolic link"):
        context_tar({"wheelhouse/evil-1.0-py3-none-any.whl": wheel}, io.BytesIO())
    plain = tmp_path / "ok-1.0-py3-none-any.whl"
    plain.write_bytes(b"PK")
    buffer = io.BytesIO()
    context_tar({"wheelhouse/ok-1.0-py3-none-any.whl": plain}, buffer)
    with tarfile.open(fileobj=buffer) as tar:
        assert tar.extractfile("wheelhouse/ok-1.0-py3-none-any.whl").read() == b"PK"  # type: ignore[union-attr]
