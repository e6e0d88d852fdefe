"""An extension built against the locked torch, for real: a tiny C++ extension
(``torch.utils.cpp_extension.CppExtension``, a function adding two tensors) in a sample project
→ ``lock`` (its source tree's sha256 in the lock) → ``build`` (a build stage compiles it against
the CPU torch 2.13.0 of the ``$PIP_FIND_LINKS`` wheelhouse) → imported and called inside the
image, which holds no compiler; a source that does not compile is exit 6 naming the step.

Beside it, a requirement that exists only as an sdist (``mulext``, a CppExtension multiplying two
tensors, served from a 127.0.0.1 find-links page): ``build-sdists`` locks the sdist's sha256 in
the pylock and the same stage builds it against the same torch; the build records both wheels'
sha256 in envbuild.built.json, ``lock --check`` prints them, and a record that differs is exit 6.
A third, ``puresd``, is a pure-Python sdist: lock classifies it pure and it is built in the
envbuild-sdists stage, whose venv has no torch (its setup.py fails the build where torch is
importable), and installed with its wheel's sha256 recorded like the others (#37 item 2).

The fixtures (the wheelhouse served as torch's index on 127.0.0.1, the base image in a
loopback registry) are test_lock_e2e's. Needs dockerd, docker-registry and the index.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tagged
from test_lock_command import serve_directory
from test_lock_e2e import client, envbuild, pushed_base, torch_index, wheelhouse

__all__ = ["client", "pushed_base", "torch_index", "wheelhouse"]  # fixtures, used by name

pytestmark = [pytest.mark.docker, pytest.mark.network]

TAG = tagged("envbuild-test/extension:1")
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


# mulext 0.1: on the index as an sdist only (as flash-attn is), with static metadata (PKG-INFO 2.2,
# nothing dynamic), which uv reads without building it.
MUL_FILES = {
    "PKG-INFO": "Metadata-Version: 2.2\nName: mulext\nVersion: 0.1\n",
    "pyproject.toml": EXT_PYPROJECT.replace("addext", "mulext"),
    "setup.py": SETUP_PY.replace("addext", "mulext").replace("add.cpp", "mul.cpp"),
    "mul.cpp": ADD_CPP.replace("add", "mul").replace("a + b", "a * b"),
}


# puresd 0.1: a pure-Python sdist (no native source, nothing of torch in its build), which lock
# classifies pure: built in the envbuild-sdists stage, which has no torch. Its setup.py proves it:
# the build fails where torch is importable.
PURE_FILES = {
    "PKG-INFO": "Metadata-Version: 2.2\nName: puresd\nVersion: 0.1\n",
    "setup.py": ("import importlib.util\nfrom setuptools import setup\n\n"
                 "if importlib.util.find_spec('torch') is not None:\n"
                 "    raise SystemExit('puresd: built where torch is installed')\n"
                 "setup(name='puresd', version='0.1', py_modules=['puresd'])\n"),
    "puresd.py": "def twice(x):\n    return 2 * x\n",
}


# mulext 0.2: the same, but its source does not compile.
BROKEN_FILES = {**MUL_FILES, "PKG-INFO": MUL_FILES["PKG-INFO"].replace("0.1", "0.2"),
                "mul.cpp": MUL_FILES["mul.cpp"].replace("a * b;", "a * ;")}


def sdist_bytes(files: dict[str, str], version: str = "0.1", name: str = "mulext") -> bytes:
    """The sdist, the same bytes every time (gzip's header time 0)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{path}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue(), mtime=0)


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A find-links page on 127.0.0.1 (a directory listing) holding mulext's sdist alone."""
    root = tmp_path_factory.mktemp("sdist-links")
    (root / "mulext-0.1.tar.gz").write_bytes(sdist_bytes(MUL_FILES))
    (root / "mulext-0.2.tar.gz").write_bytes(sdist_bytes(BROKEN_FILES, "0.2"))
    (root / "puresd-0.1.tar.gz").write_bytes(sdist_bytes(PURE_FILES, name="puresd"))
    with serve_directory(root) as url:
        yield f"{url}/"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, pushed_base: str, torch_index: str, links: str) -> Path:
    """A project of torch 2.13.0 (cpu) and setuptools (what the build stage builds with: the
    extension is built without isolation, against the lock's own packages), one extension, and
    mulext, a requirement only an sdist provides (build-sdists)."""
    directory = tmp_path_factory.mktemp("extension-project")
    ext = directory / "native" / "addext"
    ext.mkdir(parents=True)
    (ext / "add.cpp").write_text(ADD_CPP)
    (ext / "setup.py").write_text(SETUP_PY)
    (ext / "pyproject.toml").write_text(EXT_PYPROJECT)
    (directory / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{pushed_base}"\ntorch-index-url = "{torch_index}"\n'
        f'dependencies = ["setuptools>=70.1", "mulext==0.1", "puresd==0.1"]\nextensions = ["native/addext"]\n'
        f'build-sdists = ["mulext", "puresd"]\nfind-links = ["{links}"]\n'
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


def test_the_extension_is_built_against_the_lock_and_called_in_the_image(client: Any, project: Path,
                                                                         links: str) -> None:
    done = envbuild("lock", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    target = json.loads((project / "envbuild.lock").read_text())["targets"]["default"]
    (ext,) = target["extensions"]
    assert ext["dir"] == "native/addext" and ext["name"] == "addext" and len(ext["sha256"]) == 64
    assert target["packages"]["torch"] == "2.13.0+cpu" and "addext" not in target["packages"]
    # The sdist-only requirement: locked by its sdist's sha256, as uv writes it in the pylock.
    assert target["sdists"] == ["mulext", "puresd"] and target["packages"]["mulext"] == "0.1"
    # mulext compiles against torch (a .cpp, torch in its build); puresd is pure Python
    assert target["sdist_kinds"] == {"mulext": {"kind": "native"},
                                     "puresd": {"kind": "pure", "requires": ["setuptools"]}}
    pylock = (project / target["pylock"]["file"]).read_text()
    digest = hashlib.sha256(sdist_bytes(MUL_FILES)).hexdigest()
    assert f'sdist = {{ url = "{links}mulext-0.1.tar.gz"' in pylock and f'sha256 = "{digest}"' in pylock
    built = build(project, TAG)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    assert "extension wheels: 3 recorded in envbuild.built.json" in built.stdout, built.stdout[-2000:]
    code = ("import torch, addext, mulext, puresd; a, b = torch.ones(3), torch.full((3,), 2.0); "
            "print(addext.add(a, b).tolist(), mulext.mul(b, b).tolist(), puresd.twice(21))")
    assert in_image(TAG, "/opt/venv/bin/python", "-c", code).strip() == \
        "[3.0, 3.0, 3.0] [4.0, 4.0, 4.0] 42"
    # puresd's setup.py stops where torch is importable: it was built in the stage without torch
    # The built wheels' sha256, printed by the build stage, are kept in the image and recorded
    # beside the lock under their build key (source sha256, torch, CUDA, arch list, Python).
    sums = dict(reversed(line.split()) for line in
                in_image(TAG, "cat", "/opt/envbuild/extension-wheels.sha256").splitlines())
    assert sorted(w.split("-")[0] for w in sums) == ["addext", "mulext", "puresd"], sums
    record = json.loads((project / "envbuild.built.json").read_text())
    assert {(w["name"], w["wheel"], w["sha256"]) for w in record["wheels"]} == \
        {(w.split("-")[0], w, sha) for w, sha in sums.items()}
    mul = next(w for w in record["wheels"] if w["name"] == "mulext")
    assert (mul["source_sha256"], mul["torch"], mul["cuda"], mul["archs"]) == (digest, "2.13.0+cpu", None, "")
    checked = envbuild("lock", "--check", cwd=project)
    assert checked.returncode == 0 and "mulext (source" in checked.stdout, checked.stdout
    assert f"built wheel recorded, {mul['wheel']} sha256 {mul['sha256']}" in checked.stdout
    # No compiler reached the image, and its installed set (extension included) is the lock's.
    assert in_image(TAG, "sh", "-c", "command -v g++ c++ cc || echo none").strip() == "none"
    assert in_image(TAG, "/opt/venv/bin/python", "/opt/envbuild/smoke.py", "--installed-only",
                    "--lock", "/opt/envbuild/envbuild.lock").startswith("installed set matches")


def test_a_rebuilt_wheel_that_differs_from_the_record_is_exit_6(client: Any, project: Path) -> None:
    """docs/faults.md Z: the stage checks its wheels against envbuild.built.json; never replaced."""
    path = project / "envbuild.built.json"
    original = path.read_text()
    record = json.loads(original)
    record["wheels"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(record))
    try:
        built = build(project, tagged("envbuild-test/extension:differs"))
        assert built.returncode == 6, (built.stdout + built.stderr)[-4000:]
        assert "differs from envbuild.built.json" in built.stderr, built.stderr[-4000:]
        assert json.loads(path.read_text()) == record  # the record stays as it was
    finally:
        path.write_text(original)


def test_an_sdist_that_does_not_compile_is_exit_6_naming_the_step(client: Any, project: Path) -> None:
    settings = project / "envbuild.toml"
    original = settings.read_text()
    settings.write_text(original.replace('"mulext==0.1"', '"mulext==0.2"'))
    record = (project / "envbuild.built.json").read_bytes()
    try:
        done = envbuild("lock", cwd=project)
        assert done.returncode == 0, done.stderr[-3000:]
        built = build(project, tagged("envbuild-test/extension:broken-sdist"))
        assert built.returncode == 6, (built.stdout + built.stderr)[-4000:]
        errors = [line for line in built.stderr.splitlines() if line.startswith("envbuild: error[")]
        assert len(errors) == 1 and "envbuild-ext-sdist/*/" in built.stderr, built.stderr[-4000:]
        assert "mul.cpp" in built.stderr  # the build log's tail: the compiler's error
        assert (project / "envbuild.built.json").read_bytes() == record
    finally:
        settings.write_text(original)


def test_an_extension_that_does_not_compile_is_exit_6_naming_the_step(client: Any,
                                                                      project: Path) -> None:
    source = project / "native" / "addext" / "add.cpp"
    source.write_text(ADD_CPP.replace("return a + b;", "return a + ;"))
    try:
        assert envbuild("lock", cwd=project).returncode == 0
        built = build(project, tagged("envbuild-test/extension:broken"))
        assert built.returncode == 6, (built.stdout + built.stderr)[-4000:]
        assert "pip wheel" in built.stderr, built.stderr[-4000:]
    finally:
        source.write_text(ADD_CPP)
