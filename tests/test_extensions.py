"""Extensions built against the locked torch (envbuild/extensions): the project key, the
lock's record, the build context and the Dockerfile's build stage."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.extensions import stage, tree
from envbuild.project.config import project_from_text
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render import lockset
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

SHA = "0" * 64
ADD_CPP = "#include <torch/extension.h>\n"
PYPROJECT = '[project]\nname = "Add_Ext"\nversion = "0.1"\n'


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def stack_lock(variant: str) -> lockmod.Lock:
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant=variant, ubuntu="22.04"), m).stacks[0]
    return render.lock_for(stack, m, render.parse_options(companions=False))


def closure(lock: lockmod.Lock) -> lockmod.Lock:
    lines = ['lock-version = "1.0"', 'created-by = "test"']
    for name, version in sorted(lock.packages.items()):
        wheel = f"{name}-{version}-py3-none-any.whl"
        lines += ["", "[[packages]]", f'name = "{name}"', f'version = "{version}"',
                  f'wheels = [{{ url = "https://mirror.example/{wheel}", hashes = {{ sha256 = "{SHA}" }} }}]']
    text = "\n".join(lines) + "\n"
    ref = lockmod.PylockRef(file="pylock.toml", sha256=lockset.sha256_text(text),
                            torch_layer=tuple(sorted(lock.packages)), platform="x86_64-manylinux_2_35",
                            text=text)
    return replace(lock, pylock=ref, layers=())


def project(root: Path, keys: str = 'extensions = ["ext"]\n') -> Path:
    write(root, {"ext/pyproject.toml": PYPROJECT, "ext/add.cpp": ADD_CPP, "envbuild.toml": keys})
    return root / "envbuild.toml"


def loaded(path: Path) -> tuple[tree.Extension, ...]:
    return project_from_text(path.read_text(), path, shown="envbuild.toml").extensions


def test_the_key_records_dir_name_and_source_sha256(tmp_path: Path) -> None:
    (ext,) = loaded(project(tmp_path))
    assert (ext.dir, ext.name) == ("ext", "add-ext")
    (tmp_path / "ext" / "build").mkdir()
    (tmp_path / "ext" / "build" / "leftover.o").write_text("x")  # a build leftover: no source
    assert loaded(tmp_path / "envbuild.toml")[0].sha256 == ext.sha256
    (tmp_path / "ext" / "add.cpp").write_text(ADD_CPP + "// changed\n")
    assert loaded(tmp_path / "envbuild.toml")[0].sha256 != ext.sha256


@pytest.mark.parametrize(("setup", "message"), [
    ("outside", "is outside the project"),
    ("missing", "does not exist"),
    ("no-marker", "holds neither pyproject.toml nor setup.py"),
    ("link", "is a symbolic link or not a regular file"),
    ("dotdot", "is not a plain relative directory"),
])
def test_a_bad_extension_directory_is_exit_2_naming_file_line_key(
        tmp_path: Path, setup: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "p"
    path = project(root, '# extensions\nextensions = ["ext"]\n')
    write(tmp_path, {"outside/setup.py": "SECRET = 1\n"})
    if setup == "outside":
        (root / "ext2").symlink_to(tmp_path / "outside")
        path.write_text('# extensions\nextensions = ["ext2"]\n')
    elif setup == "missing":
        path.write_text('# extensions\nextensions = ["nope"]\n')
    elif setup == "no-marker":
        (root / "ext" / "pyproject.toml").unlink()
    elif setup == "link":
        (root / "ext" / "secret.py").symlink_to(tmp_path / "outside" / "setup.py")
    else:
        path.write_text('# extensions\nextensions = ["ext/../../outside"]\n')
    code = main(["lock", "--project", str(path), "--offline"], {})
    err = capsys.readouterr().err
    assert code == 2, err
    assert "envbuild.toml:2: extensions[0]" in err and message in err, err
    assert "SECRET" not in err and not (root / "envbuild.lock").exists()


def locked_project(root: Path, variant: str) -> tuple[Path, lockmod.Lock]:
    (ext,) = loaded(project(root))
    # without torch.compile's toolchain (docs/compile.md), so that a compiler in the final stage could
    # only have come with the extension
    lock = replace(closure(stack_lock(variant)), extensions=(ext,), compile_toolchain=False)
    lockmod.check_lock(lock)
    assert lockmod.from_json(lock.to_json()) == lock
    for name, data in lockset.LockSet(targets={"default": lock}, project=None).files().items():
        (root / name).write_bytes(data)
    return root / "envbuild.lock", lock


def stages(dockerfile: str) -> list[str]:
    """The Dockerfile's stages, each from its FROM line on."""
    parts = dockerfile.split("\nFROM ")
    return ["FROM " + p for p in parts[1:]]


@pytest.mark.parametrize("variant", ["cpu", "cu121"])
def test_render_builds_the_extension_in_a_stage_and_the_image_installs_only_its_wheel(
        tmp_path: Path, variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    path, lock = locked_project(tmp_path, variant)
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out")], {})
    assert code == 0, capsys.readouterr().err
    out = tmp_path / "out"
    assert (out / "extensions" / "ext" / "add.cpp").read_text() == ADD_CPP
    assert "!extensions" in (out / ".dockerignore").read_text()
    system, build, final = stages((out / "Dockerfile").read_text())
    # The image's system packages once, in a stage both others start from.
    assert system.startswith(f"FROM {lock.base_image} AS envbuild-system\n")
    assert system.count("apt-get install") == 1 and "torch.txt" not in system
    assert build.startswith("FROM envbuild-system AS envbuild-extensions\n")
    assert final.startswith("FROM envbuild-system\n") and "apt-get" not in final
    # The same hash-pinned torch layer as the image's, then the compiler, then the wheel.
    for text in (build, final):
        assert "--require-hashes" in text and "-r /tmp/envbuild/torch.txt" in text
    assert "apt-get install -y --no-install-recommends g++ python3-dev" in build
    assert ("pip wheel --no-cache-dir --no-deps --no-build-isolation --no-index --wheel-dir /wheels "
            "/tmp/envbuild-ext/ext") in build and "sha256sum -- *.whl" in build
    archs = stage.torch_cuda_arch_list(lock.stack.cuda, lock.stack.arch_list)
    if variant == "cpu":
        assert archs is None and "TORCH_CUDA_ARCH_LIST" not in build
    else:
        assert archs and archs.startswith(lock.stack.arch_list[0][3] + ".")
        assert f'ENV TORCH_CUDA_ARCH_LIST="{archs}"' in build
    # The image: the built wheels only, no deps, no compiler, no sources.
    assert "COPY --from=envbuild-extensions /wheels/ /tmp/envbuild-ext/" in final
    assert "pip install --no-cache-dir --no-deps --no-index /tmp/envbuild-ext/*.whl" in final
    assert "g++" not in final and "python3-dev" not in final and "COPY extensions/" not in final


def test_arch_list_spelling() -> None:
    assert stage.torch_cuda_arch_list("12.8", ("sm_80", "sm_90a", "sm_100", "sm_120")) == \
        "8.0;9.0a;10.0;12.0"
    assert stage.torch_cuda_arch_list(None, ("sm_80",)) is None


def test_sources_changed_since_the_lock_are_a_stale_lock(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = locked_project(tmp_path, "cpu")
    (tmp_path / "ext" / "add.cpp").write_text(ADD_CPP + "int changed;\n")
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out")], {})
    assert code == 11
    assert "extension 'ext': its sources changed since the lock" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_lock_naming_an_extension_badly_is_refused(tmp_path: Path) -> None:
    _, lock = locked_project(tmp_path, "cpu")
    data = json.loads(lock.to_json())
    data["extensions"][0]["dir"] = "../outside"
    with pytest.raises(lockmod.UsageError, match="not a plain relative directory"):
        lockmod.check_lock(lockmod.from_json(json.dumps(data)))
    data["extensions"][0].update(dir="ext", name="torch")
    with pytest.raises(lockmod.UsageError, match="invalid extension name"):
        lockmod.check_lock(lockmod.from_json(json.dumps(data)))


def test_the_installed_set_check_requires_each_extension_and_nothing_else(tmp_path: Path) -> None:
    from envbuild.smoke.installed import compare_installed

    def dist(name: str, version: str) -> None:
        write(tmp_path, {f"{name}-{version}.dist-info/METADATA":
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"})

    lock = {"packages": {"torch": "2.13.0+cpu"}, "extensions": [{"name": "add-ext"}]}
    dist("torch", "2.13.0+cpu")
    assert compare_installed(lock, paths=[str(tmp_path)], bootstrap=()) == \
        ["add-ext: an extension of the lock, not installed"]
    dist("Add_Ext", "0.1")
    assert compare_installed(lock, paths=[str(tmp_path)], bootstrap=()) == []
    dist("other", "1.0")
    assert compare_installed(lock, paths=[str(tmp_path)], bootstrap=()) == \
        ["other: installed 1.0, not in the lock"]
