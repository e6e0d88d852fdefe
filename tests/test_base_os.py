"""A --base-image's own OS at build time (#29): read from the image (engine/baseos.py) for its
labels, and a closure locked for a newer glibc than the base's stops the build (docs/faults.md I8-I9)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import docker.errors
import pytest

from envbuild.commands.build import _base_os
from envbuild.data import matrix as matrixmod
from envbuild.data.versions import DriverVersion
from envbuild.engine.baseos import BaseOs, parse_base_os, read_base_os
from envbuild.errors import BuildFailed
from envbuild.render import docker as render
from envbuild.render.lock import PylockRef, make_lock
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

DEBIAN = ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n'
          "ID=debian\n---\nldd (Debian GLIBC 2.36-9+deb12u10) 2.36\n")


@pytest.mark.parametrize(("text", "expected"), [
    (DEBIAN, BaseOs(name="Debian GNU/Linux 12 (bookworm)", glibc="2.36")),
    ('PRETTY_NAME="Ubuntu 24.04.3 LTS"\n---\nldd (Ubuntu GLIBC 2.39-0ubuntu8.6) 2.39\n',
     BaseOs(name="Ubuntu 24.04.3 LTS", glibc="2.39")),
    ('PRETTY_NAME="Alpine Linux v3.20"\n---\nmusl libc (x86_64)\n',
     BaseOs(name="Alpine Linux v3.20", glibc=None)),
    ("PRETTY_NAME=Plain\n---\nsh: ldd: not found\n", BaseOs(name="Plain", glibc=None)),
    ("---\nldd (GNU libc) 2.28\n", None),  # no os-release: nothing claimed
    ('PRETTY_NAME="$(curl evil) `x`"\n---\nldd (GNU libc) 2.28\n', None),  # never shown
    (f'PRETTY_NAME="{"A" * 200}"\n---\n', None),
])
def test_the_probe_output_is_read_only_when_plain(text: str, expected: BaseOs | None) -> None:
    assert parse_base_os(text) == expected


class ProbeClient:
    """Enough of docker.APIClient for read_base_os."""

    def __init__(self, output: str = DEBIAN, *, missing: bool = False, code: int = 0) -> None:
        self.output, self.missing, self.code = output, missing, code
        self.created: list[dict[str, Any]] = []
        self.removed: list[str] = []

    def inspect_image(self, image: str) -> dict[str, Any]:
        if self.missing:
            raise docker.errors.ImageNotFound("no such image")
        return {}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def create_container(self, image: str, **kwargs: Any) -> dict[str, str]:
        self.created.append(kwargs)
        return {"Id": "c1"}

    def start(self, cid: str) -> None:
        pass

    def wait(self, cid: str, timeout: float) -> dict[str, int]:
        return {"StatusCode": self.code}

    def logs(self, cid: str, stdout: bool, stderr: bool) -> bytes:
        return self.output.encode()

    def remove_container(self, cid: str, force: bool) -> None:
        self.removed.append(cid)


def test_the_probe_runs_without_network_and_leaves_no_container() -> None:
    client = ProbeClient()
    assert read_base_os(client, "debian:bookworm") == BaseOs(name="Debian GNU/Linux 12 (bookworm)",
                                                             glibc="2.36")
    created = client.created[0]
    assert created["network_disabled"] and created["host_config"] == {"network_mode": "none"}
    assert created["labels"] == {"dev.envbuild.managed": "base-os"} and client.removed == ["c1"]
    assert read_base_os(ProbeClient(missing=True), "debian:bookworm") is None  # nothing pulled for it
    failing = ProbeClient(code=127)
    assert read_base_os(failing, "debian:bookworm") is None and failing.removed == ["c1"]


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def pylock_text(python: str, *tags: str) -> str:
    """One package, ``new`` 2.0, with a wheel for each manylinux ``tags`` (2_28, 2_39)."""
    abi = f"cp3{python.split('.')[1]}"
    wheels = ", ".join(f'{{ url = "https://files.example/new-2.0-{abi}-{abi}-manylinux_{t}_x86_64.whl", '
                       f'hashes = {{ sha256 = "{"a" * 64}" }} }}' for t in tags)
    return ('lock-version = "1.0"\ncreated-by = "uv"\n\n[[packages]]\nname = "new"\nversion = "2.0"\n'
            f"wheels = [{wheels}]\n")


def debian_lock(matrix: matrixmod.Matrix, *tags: str) -> Any:
    """A lock on a Debian --base-image; with ``tags``, a closure resolved for glibc 2.39."""
    stack = resolve(Request(driver=DriverVersion.parse("550"), variant="cpu"), matrix).stacks[0]
    lock = make_lock(stack, matrix, base_image=f"debian:bookworm@sha256:{'c' * 64}")
    if not tags:
        return lock
    return replace(lock, pylock=PylockRef(file="pylock.toml", sha256="0" * 64, torch_layer=(),
                                          platform="x86_64-manylinux_2_39",
                                          text=pylock_text(stack.python, *tags)))


def test_a_wheel_too_new_for_the_bases_glibc_stops_the_build(
        matrix: matrixmod.Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    """The build picks each wheel for the lock's platform (glibc 2.39): where that wheel needs
    more than the base's 2.36, pip would fail mid-build; it stops before, naming the wheel."""
    for tags in (("2_39",), ("2_28", "2_39")):  # an older wheel beside it is not the one picked
        with pytest.raises(BuildFailed) as caught:
            _base_os(debian_lock(matrix, *tags), ProbeClient())
        message = caught.value.message
        assert "has glibc 2.36" in message and "resolved for glibc 2.39" in message
        assert "new 2.0 (new-2.0-" in message and "manylinux_2_39_x86_64.whl)" in message
        assert 'set base-glibc = "2.36"' in caught.value.hint and "--base-glibc 2.36" in caught.value.hint
    found = _base_os(debian_lock(matrix, "2_28"), ProbeClient())  # runs on 2.36: the build goes on
    assert found == BaseOs(name="Debian GNU/Linux 12 (bookworm)", glibc="2.36")
    assert "base image debian:bookworm: Debian GNU/Linux 12 (bookworm), glibc 2.36" in capsys.readouterr().err
    assert _base_os(debian_lock(matrix), ProbeClient()) is not None  # a stack lock: no closure
    assert _base_os(debian_lock(matrix, "2_39"), None) is None  # buildah without a daemon: not read
    own = make_lock(debian_lock(matrix).stack, matrix)
    assert _base_os(own, ProbeClient()) is None  # the stack's own base is its Ubuntu: not probed


def test_the_labels_name_what_the_build_read(matrix: matrixmod.Matrix) -> None:
    lock = debian_lock(matrix)
    files = render.render_docker(lock, render.RenderOptions(base_image=lock.base_image,
                                                            base_os="Debian GNU/Linux 12 (bookworm)"))
    text = bytes(files["Dockerfile"]).decode()  # type: ignore[arg-type]
    assert 'on Python 3.14, Debian GNU/Linux 12 (bookworm)"' in text and "Ubuntu" not in text.split("\n")[0]


@pytest.mark.docker
def test_the_debian_base_image_is_read_as_debian(docker_api: Any) -> None:
    found = read_base_os(docker_api, "envbuild-test/bookworm:base")
    assert found is not None, "envbuild-test/bookworm:base is made by scripts/base-image.sh"
    assert found.name.startswith("Debian GNU/Linux 12") and found.glibc == "2.36"
