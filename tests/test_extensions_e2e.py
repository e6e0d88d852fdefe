"""An extension built against the locked torch, for real: a tiny C++ extension
(``torch.utils.cpp_extension.CppExtension``, a function adding two tensors) in a sample project
→ ``lock`` (its source tree's sha256 in the lock) → ``build`` (a build stage compiles it against
the CPU torch 2.13.0 of the ``$PIP_FIND_LINKS`` wheelhouse) → imported and called inside the
image, which holds no compiler; a source that does not compile is exit 6 naming the step.

The fixtures (the wheelhouse served as torch's index on 127.0.0.1, the base image in a
loopback registry) are test_lock_e2e's. Needs dockerd, docker-registry and the index.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_lock_e2e import client, envbuild, pushed_base, torch_index, wheelhouse

__all__ = ["client", "pushed_base", "torch_index", "wheelhouse"]  # fixtures, used by name

pytestmark = [pytest.mark.docker, pytest.mark.network]

TAG = "envbuild-test/extension:1"
ADD_CPP = """#include <torch/extension.h>

torch::Tensor add(torch::Tensor a, torch::Tensor b) { return a + b; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add", &add, "a + b"); }
"""
SETUP_PY = """from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(name="addext", version="0.1", packages=[],
      ext_modules=[CppExtension("addext", ["add.cpp"])], cmdclass={"build_ext": BuildExtension})
"""
EXT_PYPROJECT = """[build-system]
requires = ["setuptools", "torch"]
build-backend = "setuptools.build_meta"

[project]
name = "addext"
version = "0.1"
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, pushed_base: str, torch_index: str) -> Path:
    """A project of torch 2.13.0 (cpu) and setuptools (what the build stage builds with: the
    extension is built without isolation, against the lock's own packages), one extension."""
    directory = tmp_path_factory.mktemp("extension-project")
    ext = directory / "native" / "addext"
    ext.mkdir(parents=True)
    (ext / "add.cpp").write_text(ADD_CPP)
    (ext / "setup.py").write_text(SETUP_PY)
    (ext / "pyproject.toml").write_text(EXT_PYPROJECT)
    (directory / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{pushed_base}"\ntorch-index-url = "{torch_index}"\n'
        f'dependencies = ["setuptools>=70.1"]\nextensions = ["native/addext"]\n'
        # without torch.compile's toolchain, so that a compiler in the image could only have come
        # with the extension (it must not)
        'compile-toolchain = false\n')
    return directory


def build(project: Path, tag: str) -> subprocess.CompletedProcess[str]:
    args = ["build", "--lock", "envbuild.lock", "--network", "host", "--tag", tag]
    cert = os.environ.get("PIP_CERT")
    if cert:  # TLS here goes through an inspecting proxy whose CA the build must trust
        args += ["--ca-bundle", cert]
    return envbuild(*args, cwd=project)


def in_image(image: str, *command: str) -> str:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, *command],
                          capture_output=True, text=True, check=True, timeout=300).stdout


def test_the_extension_is_built_against_the_lock_and_called_in_the_image(client: Any,
                                                                         project: Path) -> None:
    done = envbuild("lock", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    target = json.loads((project / "envbuild.lock").read_text())["targets"]["default"]
    (ext,) = target["extensions"]
    assert ext["dir"] == "native/addext" and ext["name"] == "addext" and len(ext["sha256"]) == 64
    assert target["packages"]["torch"] == "2.13.0+cpu" and "addext" not in target["packages"]
    built = build(project, TAG)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    code = "import torch, addext; print(addext.add(torch.ones(3), torch.full((3,), 2.0)).tolist())"
    assert in_image(TAG, "/opt/venv/bin/python", "-c", code).strip() == "[3.0, 3.0, 3.0]"
    # The built wheel's sha256, printed by the build stage, is kept in the image.
    sums = in_image(TAG, "cat", "/opt/envbuild/extension-wheels.sha256").split()
    assert len(sums[0]) == 64 and sums[1].startswith("addext-0.1-cp311-cp311-"), sums
    # No compiler reached the image, and its installed set (extension included) is the lock's.
    assert in_image(TAG, "sh", "-c", "command -v g++ c++ cc || echo none").strip() == "none"
    assert in_image(TAG, "/opt/venv/bin/python", "/opt/envbuild/smoke.py", "--installed-only",
                    "--lock", "/opt/envbuild/envbuild.lock").startswith("installed set matches")


def test_an_extension_that_does_not_compile_is_exit_6_naming_the_step(client: Any,
                                                                      project: Path) -> None:
    source = project / "native" / "addext" / "add.cpp"
    source.write_text(ADD_CPP.replace("return a + b;", "return a + ;"))
    try:
        assert envbuild("lock", cwd=project).returncode == 0
        built = build(project, "envbuild-test/extension:broken")
        assert built.returncode == 6, (built.stdout + built.stderr)[-4000:]
        assert "pip wheel" in built.stderr, built.stderr[-4000:]
    finally:
        source.write_text(ADD_CPP)
