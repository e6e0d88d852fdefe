"""The lock file as a set of targets (schema 2) and the pylock files beside it (render/lockset.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from envbuild.data import matrix as matrixmod
from envbuild.errors import UsageError
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render import lockset
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

PYLOCK = 'lock-version = "1.0"\ncreated-by = "test"\n'


@pytest.fixture(scope="module")
def stack_lock() -> lockmod.Lock:
    m = matrixmod.load(matrixmod.default_directory({}))
    stack = resolve(Request(variant="cpu", ubuntu="22.04"), m).stacks[0]
    return render.lock_for(stack, m, render.parse_options(companions=False))


def closure(lock: lockmod.Lock, text: str = PYLOCK, file: str = "pylock.toml") -> lockmod.Lock:
    packages = {**lock.packages, "filelock": "3.16.1", "sympy": "1.13.3", "requests": "2.32.3"}
    ref = lockmod.PylockRef(file=file, sha256=lockset.sha256_text(text),
                            torch_layer=("filelock", "sympy", "torch"),
                            platform="x86_64-manylinux_2_35", text=text)
    return replace(lock, packages=packages, pylock=ref, layers=())


def test_a_closure_lock_round_trips_and_keeps_its_torch_layer(stack_lock: lockmod.Lock) -> None:
    lock = closure(stack_lock)
    lockmod.check_lock(lock)
    back = lockmod.from_json(lock.to_json())
    assert back == lock and back.pylock is not None
    assert back.pylock.torch_layer == ("filelock", "sympy", "torch") and back.pylock.glibc == "2.35"
    assert json.loads(lock.to_json())["packages"]["requests"] == "2.32.3"


def test_a_stack_only_lock_still_refuses_packages_beyond_torch(stack_lock: lockmod.Lock) -> None:
    with pytest.raises(UsageError, match="do not match its stack"):
        lockmod.check_lock(replace(stack_lock, packages={**stack_lock.packages, "requests": "2.32.3"}))


@pytest.mark.parametrize("change", [
    {"torch_layer": ("sympy",)},                      # torch not in its own layer
    {"torch_layer": ("torch", "absent")},             # a name outside the closure
    {"torch_layer": ("torch", "filelock")},           # not sorted
    {"file": "../pylock.toml"},                       # a path, not a file beside the lock
    {"file": "requirements.txt"},
    {"sha256": "ABC"},
    {"platform": "x86_64-manylinux_2_35;rm"},
])
def test_a_hostile_pylock_entry_is_refused(stack_lock: lockmod.Lock, change: dict[str, object]) -> None:
    lock = closure(stack_lock)
    assert lock.pylock is not None
    with pytest.raises(UsageError):
        lockmod.check_lock(replace(lock, pylock=replace(lock.pylock, **change)))  # type: ignore[arg-type]


def test_a_closure_takes_no_pip_packages(stack_lock: lockmod.Lock) -> None:
    with pytest.raises(UsageError, match="no pip_packages"):
        lockmod.check_lock(replace(closure(stack_lock), pip_packages=("numpy",)))


def test_a_schema_1_file_reads_as_one_default_target(stack_lock: lockmod.Lock) -> None:
    read = lockset.from_json(stack_lock.to_json())
    assert read.select(None) == ("default", stack_lock)
    assert read.project is None


def write_set(directory: Path, locks: dict[str, lockmod.Lock]) -> Path:
    s = lockset.LockSet(targets=locks, project=lockset.ProjectRef(file="pyproject.toml",
                                                                   inputs_sha256="0" * 64))
    for name, data in s.files().items():
        (directory / name).write_bytes(data)
    return directory / "envbuild.lock"


def test_two_targets_write_read_and_select(stack_lock: lockmod.Lock, tmp_path: Path) -> None:
    a = closure(stack_lock, PYLOCK + "# a\n", "pylock.a.toml")
    b = closure(stack_lock, PYLOCK + "# b\n", "pylock.b.toml")
    path = write_set(tmp_path, {"a": a, "b": b})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.lock", "pylock.a.toml", "pylock.b.toml"]
    read = lockset.read_lockset(path)
    assert read.select("b")[1] == b and read.select("b")[1].pylock.text.endswith("# b\n")  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="holds 2 targets"):
        read.select(None)
    with pytest.raises(UsageError, match="no target 'c'"):
        read.select("c")
    only = lockset.from_json(read.only("a").to_json())
    assert list(only.targets) == ["a"] and only.project == read.project
    assert read.to_json() == path.read_text()  # the same inputs give the same bytes


def test_an_edited_or_missing_pylock_is_refused(stack_lock: lockmod.Lock, tmp_path: Path) -> None:
    path = write_set(tmp_path, {"default": closure(stack_lock)})
    (tmp_path / "pylock.toml").write_text(PYLOCK + "# edited\n")
    with pytest.raises(UsageError, match="changed since"):
        lockset.read_lockset(path)
    (tmp_path / "pylock.toml").unlink()
    with pytest.raises(UsageError, match="cannot read"):
        lockset.read_lockset(path)


@pytest.mark.parametrize("doc", [
    {"schema": 2, "project": None, "targets": {}},
    {"schema": 2, "project": None},
    {"schema": 2, "project": {"file": "../x", "inputs_sha256": "0" * 64}, "targets": {"a": {}}},
    {"schema": 3, "project": None, "targets": {}},
    {"schema": True, "project": None, "targets": {}},
])
def test_malformed_lock_sets_are_usage_errors(doc: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        lockset.from_json(json.dumps(doc))


def test_target_names_and_a_shared_pylock_are_refused(stack_lock: lockmod.Lock) -> None:
    lock = closure(stack_lock)
    raw = lockset.LockSet(targets={"a": lock}).to_json()
    with pytest.raises(UsageError, match="invalid target name"):
        lockset.from_json(raw.replace('"a":', '"A b":'))
    twice = json.loads(raw)
    twice["targets"]["b"] = twice["targets"]["a"]
    with pytest.raises(UsageError, match="share"):
        lockset.from_json(json.dumps(twice))


def test_pylock_names_follow_pep_751() -> None:
    assert lockset.pylock_name("default", 1) == "pylock.toml"
    assert lockset.pylock_name("default", 2) == "pylock.default.toml"
    assert lockset.pylock_name("h100", 1) == "pylock.h100.toml"


@pytest.mark.parametrize("url", [
    "https://mirror.example/x --index-url https://evil.example/six-1.17.0-py3-none-any.whl",
    "https://mirror.example/x\nevil==1 @ https://evil.example/six-1.17.0-py3-none-any.whl",
    "ftp://mirror.example/six-1.17.0-py3-none-any.whl",
])
def test_a_pylock_url_that_would_add_an_option_is_refused(stack_lock: lockmod.Lock, url: str) -> None:
    """docs/faults.md H43: a pylock edited (and its digest in the lock with it) to smuggle a pip
    option or a second requirement into the requirements file the build reads."""
    from envbuild.render.closure import install_files

    packages = {**stack_lock.packages, "six": "1.17.0"}
    def wheel(name: str, version: str) -> str:
        return url if name == "six" else f"https://mirror.example/{name}-{version}-py3-none-any.whl"

    rows = [f'[[packages]]\nname = "{n}"\nversion = "{v}"\nwheels = [{{ url = {json.dumps(wheel(n, v))}, '
            f'hashes = {{ sha256 = "{"c" * 64}" }} }}]\n' for n, v in sorted(packages.items())]
    text = 'lock-version = "1.0"\ncreated-by = "test"\n\n' + "\n".join(rows)
    lock = replace(closure(stack_lock), packages=packages)
    assert lock.pylock is not None
    lock = replace(lock, pylock=replace(lock.pylock, torch_layer=("torch",), text=text))
    with pytest.raises(UsageError, match="not a plain http"):
        install_files(lock, local_dir=None)
