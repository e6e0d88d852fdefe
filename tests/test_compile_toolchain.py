"""What torch.compile needs at run time in every rendered image and host script (docs/faults.md
W1, W2): g++ and the Python headers by default, left out only by the lock's opt-out, which the
image and the host record for the smoke test."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.data.versions import parse_requirement
from envbuild.errors import UsageError
from envbuild.project.config import load_project
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render.script import render_script
from envbuild.resolver.model import Request, Stack
from envbuild.resolver.resolve import resolve
from envbuild.smoke.rules import COMPILE_TOOLCHAIN_ENV

APT_LINE = re.compile(r"apt-get install -y --no-install-recommends([^\\\n]*)")


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def stack(m: matrixmod.Matrix, python: str | None = None) -> Stack:
    """The best CPU stack for Ubuntu 24.04 (whose python3 is 3.12), for ``python`` if given."""
    request: dict[str, Any] = {"variant": "cpu", "ubuntu": "24.04",
                               "torch": parse_requirement("torch", "2.13.0")}
    if python:
        request["python"] = parse_requirement("python", python)
    stacks = resolve(Request(**request), m).stacks
    assert stacks, request
    return stacks[0]


def dockerfile(lock: lockmod.Lock, **options: Any) -> str:
    files = render.render_docker(lock, render.RenderOptions(**options))
    data = files["Dockerfile"]
    assert isinstance(data, bytes)
    return data.decode()


def apt_words(text: str) -> list[list[str]]:
    return [line.split() for line in APT_LINE.findall(text)]


def test_every_image_gets_gxx_and_the_python_headers_by_default(matrix: matrixmod.Matrix) -> None:
    lock = render.lock_for(stack(matrix, "3.12"),
                           matrix, render.RenderOptions())
    assert lock.compile_toolchain and "compile_toolchain" not in lock.to_mapping()
    text = dockerfile(lock)
    assert apt_words(text) == [["ca-certificates", "python3", "python3-venv", "g++", "python3-dev"]]
    assert COMPILE_TOOLCHAIN_ENV not in text and "compile-toolchain" not in text
    # with a wheelhouse stage, one apt step still, in the stage both others start from
    wheel = Path("torch-2.13.0+cpu-cp312-cp312-linux_x86_64.whl")
    two = dockerfile(lock, wheelhouse=(wheel,))
    assert apt_words(two) == apt_words(text)
    assert two.index("apt-get install") < two.index("FROM envbuild-system AS envbuild-wheelhouse")


def test_a_standalone_python_brings_its_own_headers(matrix: matrixmod.Matrix) -> None:
    s = stack(matrix, "3.13")
    lock = render.lock_for(s, matrix, render.RenderOptions())
    assert lock.python_provision == "standalone"
    assert apt_words(dockerfile(lock)) == [["ca-certificates", "curl", "g++"]]


def test_opting_out_leaves_them_out_and_records_it(matrix: matrixmod.Matrix) -> None:
    options = render.RenderOptions(compile_toolchain=False)
    lock = render.lock_for(stack(matrix, "3.12"),
                           matrix, options)
    assert lock.to_mapping()["compile_toolchain"] is False
    text = dockerfile(lock)
    assert apt_words(text) == [["ca-certificates", "python3", "python3-venv"]]
    assert f"ENV {COMPILE_TOOLCHAIN_ENV}=0" in text
    assert 'dev.envbuild.compile-toolchain="false"' in text
    script = render_script(lock)["install.sh"].decode()
    assert "readonly -a COMPILE_PACKAGES=()" in script
    assert f"readonly -a ENV_PAIRS=({COMPILE_TOOLCHAIN_ENV}=0)" in script
    default = render_script(render.lock_for(lock.stack, matrix, render.RenderOptions()))
    default = default["install.sh"].decode()
    assert "readonly -a COMPILE_PACKAGES=(g++ python3-dev)" in default
    assert '"${APT_EXTRA[@]}" "${COMPILE_PACKAGES[@]}"' in default


def test_lock_field_round_trips_and_must_be_a_boolean(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    lock = render.lock_for(stack(matrix, "3.12"),
                           matrix, render.RenderOptions(compile_toolchain=False))
    path = tmp_path / "envbuild.lock"
    path.write_text(lock.to_json())
    assert lockmod.read_lock(path).compile_toolchain is False
    data = json.loads(lock.to_json())
    data["compile_toolchain"] = "no"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="lock 'compile_toolchain' must be true or false"):
        lockmod.read_lock(path)


def test_project_key_and_cli_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "envbuild.toml").write_text('driver = "550"\ncompile-toolchain = false\n')
    assert load_project(None, tmp_path).compile_toolchain is False
    (tmp_path / "envbuild.toml").write_text('driver = "550"\ncompile-toolchain = "no"\n')
    with pytest.raises(UsageError):
        load_project(None, tmp_path)
    out = tmp_path / "out"
    code = main(["render", "docker", "--driver", "550", "--torch", "2.13.0", "--variant", "cpu",
                 "--ubuntu", "24.04", "--no-compile-toolchain", "-o", str(out)])
    assert code == 0
    assert json.loads((out / "envbuild.lock").read_text())["compile_toolchain"] is False
    code = main(["render", "docker", "--lock", str(out / "envbuild.lock"), "--no-compile-toolchain",
                 "-o", str(tmp_path / "again")])
    assert code == 2 and "cannot be combined with --lock" in capsys.readouterr().err
