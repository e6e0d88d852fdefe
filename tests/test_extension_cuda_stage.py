"""Extensions that really have their kernels (issue 37 item 3): the distribution name a setup.py
alone gives, CUDA sources recorded in the lock, the stage's FORCE_CUDA/CUDA_HOME and the
project's build-env (that stage only), its compiling steps with no network under buildx, and a
runtime base refused for a CUDA extension."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_extensions import closure, stages, write

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.errors import UsageError
from envbuild.extensions import tree
from envbuild.project.config import project_from_text
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render import lockset
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

KERNEL = "__global__ void k(float *x) { x[0] = 1; }\n"


def stack_lock(flavor: str) -> lockmod.Lock:
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant="cu121", ubuntu="22.04", flavor=flavor), m).stacks[0]
    return render.lock_for(stack, m, render.parse_options(companions=False))


@pytest.mark.parametrize(("files", "name"), [
    ({"setup.py": 'from setuptools import setup\nsetup(name="barsext", version="0.1")\n'}, "barsext"),
    ({"setup.py": 'import setuptools\nsetuptools.setup(\n    name="Bars_Ext",\n)\n'}, "bars-ext"),
    ({"setup.py": "from setuptools import setup\nsetup()\n", "setup.cfg": "[metadata]\nname = cfgext\n"},
     "cfgext"),
    ({"setup.py": 'setup(name="fromsetup")\n', "pyproject.toml": '[project]\nname = "frompyproject"\n'},
     "frompyproject"),
    # not a literal, two calls that disagree, not Python: the directory's own name
    ({"setup.py": 'NAME = "x"\nsetup(name=NAME)\n'}, "ext"),
    ({"setup.py": 'setup(name="a")\nsetup(name="b")\n'}, "ext"),
    ({"setup.py": "setup(name=\n"}, "ext"),
    ({"setup.py": 'setup(name="../../etc")\n'}, "ext"),
])
def test_a_setup_py_only_extension_is_recorded_by_the_name_its_build_installs(
        tmp_path: Path, files: dict[str, str], name: str) -> None:
    write(tmp_path, {f"ext/{k}": v for k, v in files.items()})
    assert tree.extension(tmp_path, "ext", "extension 'ext'").name == name


def test_cuda_sources_are_recorded_and_read_back(tmp_path: Path) -> None:
    write(tmp_path, {"ext/setup.py": 'setup(name="barsext")\n', "ext/k.cu": KERNEL})
    ext = tree.extension(tmp_path, "ext", "extension 'ext'")
    assert ext.cuda and ext.to_json()["cuda"] is True
    write(tmp_path, {"cpp/setup.py": 'setup(name="cppext")\n', "cpp/a.cpp": "int a;\n"})
    plain = tree.extension(tmp_path, "cpp", "extension 'cpp'")
    assert not plain.cuda and "cuda" not in plain.to_json()  # old locks read the same
    lock = replace(closure(stack_lock("devel")), extensions=(ext,), build_env=(("MAX_JOBS", "4"),))
    assert lockmod.from_json(lock.to_json()) == lock
    data = json.loads(lock.to_json())
    data["extensions"][0]["cuda"] = "yes"
    with pytest.raises(UsageError, match="cuda: true optional"):
        lockmod.from_json(json.dumps(data))


def cuda_lock(root: Path, flavor: str = "devel", build_env: tuple[tuple[str, str], ...] = ()) -> Path:
    write(root, {"ext/setup.py": 'setup(name="barsext")\n', "ext/k.cu": KERNEL})
    ext = tree.extension(root, "ext", "extension 'ext'")
    lock = replace(closure(stack_lock(flavor)), extensions=(ext,), build_env=build_env,
                   compile_toolchain=False)
    lockmod.check_lock(lock)
    for name, data in lockset.LockSet(targets={"default": lock}, project=None).files().items():
        (root / name).write_bytes(data)
    return root / "envbuild.lock"


def test_the_stage_compiles_cuda_with_force_cuda_and_the_build_env_stays_in_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = cuda_lock(tmp_path, build_env=(("FLASH_ATTENTION_FORCE_BUILD", "TRUE"), ("MAX_JOBS", "4 2")))
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out")], {})
    assert code == 0, capsys.readouterr().err
    _, build, final = stages((tmp_path / "out" / "Dockerfile").read_text())
    assert "ENV FORCE_CUDA=1 CUDA_HOME=/usr/local/cuda\n" in build
    assert "ENV FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS='4 2'\n" in build
    assert "TORCH_CUDA_ARCH_LIST" in build
    for word in ("FORCE_CUDA", "MAX_JOBS", "FLASH_ATTENTION"):
        assert word not in final  # build stages only
    assert "--network=none" not in build  # the classic builder: the build's network throughout


def test_under_buildx_the_compiling_steps_have_no_network(tmp_path: Path) -> None:
    path = cuda_lock(tmp_path)
    lock = lockset.read_lockset(path).targets["default"]
    lock = replace(lock, sdists=())
    options = render.RenderOptions(buildkit=True, offline_steps=True, extension_root=tmp_path)
    dockerfile = render.render_docker(lock, options)["Dockerfile"]
    assert isinstance(dockerfile, bytes)
    _, build, _ = stages(dockerfile.decode())
    assert "RUN --network=none mkdir -p /wheels" in build
    assert build.count("--network=none") == 1  # the torch layer's installs keep theirs


def test_a_runtime_base_is_refused_for_a_cuda_extension(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = cuda_lock(tmp_path, flavor="runtime")
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out")], {})
    err = capsys.readouterr().err
    assert code == 2
    assert "extension barsext has CUDA sources (.cu), but the image's flavor is runtime" in err
    assert 'flavor = "devel"' in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("table", "message"), [
    ('[build-env]\nHF_TOKEN = "x"\n', "build-env.HF_TOKEN"),
    ('[build-env]\n"A=B" = "x"\n', "build-env"),
    ('build-env = "MAX_JOBS=4"\n', "build-env"),
])
def test_build_env_is_checked_as_env_is(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "envbuild.toml"
    path.write_text(table)
    with pytest.raises(UsageError, match=message) as caught:
        project_from_text(table, path, shown="envbuild.toml")
    assert "envbuild.toml:" in caught.value.message
    good = '[build-env]\nMAX_JOBS = "4"\nFLASH_ATTENTION_FORCE_BUILD = "TRUE"\n'
    path.write_text(good)
    assert project_from_text(good, path, shown="envbuild.toml").build_env == (
        ("FLASH_ATTENTION_FORCE_BUILD", "TRUE"), ("MAX_JOBS", "4"))
