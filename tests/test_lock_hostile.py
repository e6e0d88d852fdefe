"""docs/faults.md A27 (and A26): a lock is hostile input. Every value read from a lock, found by walking the
lock's own JSON (so a field added later is covered without touching this file), is replaced or
spliced with line breaks, NUL, quotes, shell syntax, wrong types and very long strings. Either
reading it is a UsageError (exit 2), or the Dockerfile keeps the baseline's instruction list (and
each RUN its shell operators) and install.sh keeps the baseline's structure."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.data.versions import DriverVersion, parse_requirement
from envbuild.errors import UsageError
from envbuild.extensions.classify import Recorded
from envbuild.extensions.tree import extension
from envbuild.fleet.placement import KubernetesPlacement, Placement, SlurmPlacement
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render.script import render_script
from envbuild.resolver.model import Request, Stack
from envbuild.resolver.resolve import resolve

SHA = "a" * 64
PY_URL = "https://mirror.example/python/cpython-3.12.4-install_only.tar.gz"
BASE = "mirror.example/nvidia/cuda:12.4.1-base-ubuntu22.04@sha256:" + "b" * 64
# Spliced into (or replacing) a string value: line breaks, NUL, quotes, shell and Dockerfile syntax.
HOSTILE = ["\n", "\r", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\x00", "\nRUN id", "x\nRUN id",
           ";", "; id", "$(id)", "`id`", "${PATH}", "'", '"', "\\", " ", "\t", "&&", "|", "#",
           "\\\nRUN id", "--index-url=https://evil.example/", "=", "@", "\ud800", "\udcff",
           "=x y", "=x\\", "x" * 5000]
# Replacing any value: the wrong JSON type.
WRONG_TYPES: list[Any] = [None, 0, 1.5, True, [], {}, ["x"], {"x": "y"}]

Path_ = tuple[Any, ...]


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def _top(m: matrixmod.Matrix, **request: Any) -> Stack:
    stacks = resolve(Request(**request), m).stacks
    assert stacks, request
    return stacks[0]


@pytest.fixture(scope="module")
def extension_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the closure baseline's extension sources lie (the lock's directory)."""
    global EXTENSION_ROOT
    root = tmp_path_factory.mktemp("extension-root")
    (root / "native" / "addext").mkdir(parents=True)
    (root / "native" / "addext" / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    EXTENSION_ROOT = root
    return root


EXTENSION_ROOT: Path | None = None


@pytest.fixture(scope="module")
def baselines(matrix: matrixmod.Matrix, extension_root: Path) -> dict[str, str]:
    """Locks between them holding every field with a value: the package index's default wheel
    (nvidia-* pins, layers) under a digest-pinned mirror base with every extra option, and a
    standalone Python without companions."""
    default = _top(matrix, driver=DriverVersion.parse("570"), variant="default")
    rich = render.parse_options(base_image=BASE, index_url="https://mirror.example/simple",
                                apt_packages=["git"], pip_packages=["numpy==1.26.4"],
                                env=["KEY=x", "OTHER=1"], user="builder")
    standalone = _top(matrix, driver=DriverVersion.parse("550"),
                      python=parse_requirement("python", "3.12"), ubuntu="22.04")
    alone = render.parse_options(python_url=PY_URL, python_sha256=SHA, companions=False,
                                 compile_toolchain=False)
    closure = render.lock_for(default, matrix, dataclasses.replace(rich, pip_packages=()))
    packages = {**closure.packages, "requests": "2.32.3", "mulext": "0.1"}
    text = pylock_text(packages)
    closure = dataclasses.replace(closure, packages=packages, layers=(), base_offline=True,
                                  pylock=lockmod.PylockRef(
                                      file="pylock.toml", sha256=hashlib.sha256(text.encode()).hexdigest(),
                                      torch_layer=tuple(sorted(set(packages) - {"requests", "mulext"})),
                                      platform="x86_64-manylinux_2_35", exclude_newer="2026-11-01T00:00:00Z"),
                                  extensions=(extension(extension_root, "native/addext", "extension"),),
                                  sdists=tuple(SDISTS), apt_snapshot="20261101T000000Z",
                                  # mulext's kind (lock reads the sdist): a pure one, with its build's
                                  # requirements, so every hostile value is tried on both.
                                  sdist_kinds=(Recorded(name="mulext", pure=True, requires=("setuptools",)),))
    # Where the target's nodes live (docs/fleet.md): every placement field, so each is mutated too.
    fleet = Placement(nodes=4, gpus_per_node=8, runs_on=("self-hosted", "h100"),
                      slurm=SlurmPlacement(partition="h100", gres="gpu:h100", launcher="host"),
                      kubernetes=KubernetesPlacement(node_selector=(("nvidia.com/gpu.product", "H100"),)))
    # build-env (the extensions stage's variables) in the default baseline: every hostile value is
    # tried on it.
    return {"default": dataclasses.replace(render.lock_for(default, matrix, rich), fleet=fleet,
                                           build_env=(("MAX_JOBS", "4"),),
                                           gpu_archs=("sm_80", "sm_90")).to_json(),
            "standalone": render.lock_for(standalone, matrix, alone).to_json(),
            "closure": closure.to_json(),
            # A linux/arm64 stack: the one kind of lock whose stack records its platform.
            "arm64": render.lock_for(_top(matrix, driver=DriverVersion.parse("580"), platform="linux/arm64"),
                                     matrix, render.parse_options()).to_json()}


SDISTS = ["mulext"]  # the closure baseline's build-sdists package: an sdist in its pylock


def pylock_text(packages: dict[str, str]) -> str:
    """A PEP 751 file holding ``packages``, one pure-Python wheel each on a mirror (an sdist
    for ``SDISTS``)."""
    out = ['lock-version = "1.0"', 'created-by = "test"']
    for name, version in sorted(packages.items()):
        if name in SDISTS:
            out += ["", "[[packages]]", f'name = "{name}"', f'version = "{version}"',
                    f'sdist = {{ url = "https://mirror.example/files/{name}-{version}.tar.gz", '
                    f'hashes = {{ sha256 = "{"d" * 64}" }} }}']
            continue
        wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        out += ["", "[[packages]]", f'name = "{name}"', f'version = "{version}"',
                f'wheels = [{{ url = "https://mirror.example/files/{wheel}", '
                f'hashes = {{ sha256 = "{"c" * 64}" }} }}]']
    return "\n".join(out) + "\n"


def with_pylock(lock: lockmod.Lock) -> lockmod.Lock:
    """A closure lock read as ``read_lockset`` reads it: with its pylock's text beside it."""
    if lock.pylock is None:
        return lock
    return dataclasses.replace(lock, pylock=dataclasses.replace(
        lock.pylock, text=pylock_text(dict(lock.packages))))


def leaves(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, str]]:
    """Every value (``"value"``) and every mapping key (``"key"``) below the lock's top."""
    if isinstance(value, dict):
        for key, item in value.items():
            if path:  # the lock's own top-level keys are covered by the unknown-field check
                yield (*path, key), "key"
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    if path:
        yield path, "value"


def wrong_types(path: Path_, original: Any) -> list[Any]:
    """WRONG_TYPES less the ordinary edits: the same type (a list for a list), or null where the
    field may be null (an index_url edited to null is pip's configured index, not an attack)."""
    owner = {1: lockmod.Lock.__annotations__, 2: Stack.__annotations__ if path[0] == "stack"
             else {}}.get(len(path), {})
    nullable = "None" in str(owner.get(path[-1], ""))
    return [v for v in WRONG_TYPES
            if type(v) is not type(original) and not (v is None and nullable)]


def mutated(text: str, path: Path_, kind: str, new: Any) -> str:
    data = json.loads(text)
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if kind == "key":
        parent[new if isinstance(new, str) else str(new)] = parent.pop(last)
    else:
        parent[last] = new
    return json.dumps(data)


def _logical(text: str) -> list[str]:
    return [line for line in re.sub(r"\\\n", " ", text).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _words(arguments: str) -> str:
    """How many words, and which shell operators (';', '&&', '|', '(' of '$(' ...) in order."""
    lexer = shlex.shlex(arguments, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    return " ".join([str(len(tokens)), *(t for t in tokens if set(t) <= set("();<>|&"))])


def dockerfile_structure(text: str) -> list[str]:
    """Each instruction's keyword, the number of its words (an ENV or LABEL pair each) and the
    shell operators among them."""
    shape = []
    for line in _logical(text):
        keyword, _, rest = line.strip().partition(" ")
        shape.append(f"{keyword} {_words(rest)}")
    return shape


def script_structure(text: str) -> list[str]:
    """install.sh line by line: comments as '#', each fact line as its name and word count."""
    shape = []
    for line in text.splitlines():
        fact = re.fullmatch(r"readonly (-a )?([A-Z_]+)=(.*)", line)
        if fact and fact.group(1):
            words = shlex.split(fact.group(3).removeprefix("(").removesuffix(")"))
            shape.append(f"readonly -a {fact.group(2)} {len(words)}")
        elif fact and line.startswith("readonly ") and fact.group(2).isupper():
            shape.append(f"readonly {fact.group(2)} {len(shlex.split(fact.group(3)))}")
        else:
            shape.append("#" if line.lstrip().startswith("#") else line)
    return shape


def rendered(text: str) -> tuple[list[str], list[str] | None]:
    """Read and render a lock as ``render docker --lock`` and ``render script --lock`` do."""
    lock = with_pylock(lockmod.from_json(text))
    files = render.render_docker(lock, render.RenderOptions(extension_root=EXTENSION_ROOT))
    docker = files["Dockerfile"]
    assert isinstance(docker, bytes)
    try:
        script: list[str] | None = script_structure(render_script(lock)["install.sh"].decode())
    except UsageError:
        script = None  # not a host-scriptable lock: the script renderer refuses it
    return dockerfile_structure(docker.decode("utf-8")), script


def assert_refused_or_same(base: str, text: str) -> None:
    try:
        shape = rendered(text)
    except UsageError as exc:
        # One stderr line: a refused value is shown escaped, never with its own line breaks.
        assert not re.search("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]", exc.message + exc.hint)
        return
    docker, script = rendered(base)
    assert shape[0] == docker
    assert shape[1] is None or shape[1] == script


# --- the baselines cover the lock's structure ----------------------------------------------


def test_baselines_hold_every_field(baselines: dict[str, str]) -> None:
    """A new Lock or Stack field must get a value in a baseline, or nothing here would mutate it."""
    docs = [json.loads(text) for text in baselines.values()]
    fields = {f.name for f in dataclasses.fields(lockmod.Lock)} | {"schema"}
    assert set().union(*docs) == fields
    empty: list[Any] = [None, [], {}, False, ""]
    for name in fields - {"companions", "compile_toolchain"}:
        assert any(doc.get(name) not in empty for doc in docs), name
    assert any(doc.get("companions") is False for doc in docs)
    assert any(doc.get("compile_toolchain") is False for doc in docs)
    for name in Stack.fields():
        assert any(doc["stack"].get(name) not in empty for doc in docs) or name == "notes", name
    for text in baselines.values():
        docker, script = rendered(text)
        # A host script builds no extension: it refuses a lock that has one.
        assert "RUN" in " ".join(docker) and (script is None) == ("extensions" in json.loads(text))


# --- every field, every hostile value --------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "standalone", "arm64"])
def test_every_field_refuses_hostile_strings(name: str, baselines: dict[str, str]) -> None:
    base = baselines[name]
    for path, kind in leaves(json.loads(base)):
        current = path[-1] if kind == "key" else json.loads(base)
        if kind == "value":
            for step in path:
                current = current[step]
        original = current if isinstance(current, str) else ""
        for bad in HOSTILE:
            for value in (bad, original + bad, bad + original,
                          original[:1] + bad + original[1:]):
                assert_refused_or_same(base, mutated(base, path, kind, value))


@pytest.mark.parametrize("name", ["default", "standalone", "arm64"])
def test_every_field_refuses_wrong_types(name: str, baselines: dict[str, str]) -> None:
    base = baselines[name]
    for path, kind in leaves(json.loads(base)):
        if kind == "value":
            original = json.loads(base)
            for step in path:
                original = original[step]
            for value in wrong_types(path, original):
                assert_refused_or_same(base, mutated(base, path, kind, value))


@pytest.mark.parametrize("name", ["default", "standalone", "arm64"])
def test_line_breaks_are_refused_everywhere(name: str, baselines: dict[str, str]) -> None:
    """A line break in any string of a lock is a usage error, rendered or not."""
    base = baselines[name]
    for path, kind in leaves(json.loads(base)):
        for bad in ("\n", "\u2028", "\x00"):
            with pytest.raises(UsageError):
                lockmod.from_json(mutated(base, path, kind, f"x{bad}RUN id"))


# --- random splices ---------------------------------------------------------------------------

_splice = st.tuples(st.text(max_size=8), st.sampled_from(HOSTILE) | st.text(min_size=1, max_size=8),
                    st.text(max_size=8))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_hostile_values(data: st.DataObject, baselines: dict[str, str]) -> None:
    name = data.draw(st.sampled_from(sorted(baselines)))
    base = baselines[name]
    path, kind = data.draw(st.sampled_from(list(leaves(json.loads(base)))))
    before, bad, after = data.draw(_splice)
    value = data.draw(st.sampled_from([f"{before}{bad}{after}", bad]))
    if kind == "value" and data.draw(st.booleans()):
        original = json.loads(base)
        for step in path:
            original = original[step]
        value = data.draw(st.sampled_from(wrong_types(path, original)))
    assert_refused_or_same(base, mutated(base, path, kind, value))


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize("field", ["base_image", "index_url", "notes"])
def test_render_docker_refuses_a_hostile_stack_value(field: str, baselines: dict[str, str],
                                                     tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The reported case: stack.base_image 'x\\nRUN id' became a RUN of its own in the Dockerfile."""
    data = json.loads(baselines["standalone"])  # a PyTorch-index stack: its pins follow the index
    assert data["stack"]["index_url"]
    data["stack"][field] = {"base_image": "x\nRUN id", "index_url": data["stack"]["index_url"]
                            + "/$(id)", "notes": ["a\nRUN id"]}[field]
    lock = tmp_path / "envbuild.lock"
    lock.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert main(["render", "docker", "--lock", str(lock), "-o", str(out)], env={}) == 2
    err = capsys.readouterr().err
    assert err.startswith("envbuild: error[usage]: ") and err.count("\n") == 1
    assert not out.exists()


def test_undecodable_env_value_is_a_usage_error(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A byte of argv that is not UTF-8 arrives as a lone surrogate: it wrote a lock that no
    renderer could encode (exit 70 at render time), now exit 2 and no lock."""
    lock = tmp_path / "envbuild.lock"
    assert main(["lock", "--stack-only", "--driver", "550", "--env", "A=\udcff", "-o", str(lock)],
                env={}) == 2
    assert capsys.readouterr().err.startswith("envbuild: error[usage]: ") and not lock.exists()


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"schema": 1, "stack": ' * 50_000])
def test_deeply_nested_lock_is_a_usage_error(text: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """JSON nested past the parser's recursion limit was a RecursionError: exit 1, internal."""
    lock = tmp_path / "envbuild.lock"
    lock.write_text(text)
    out = tmp_path / "out"
    assert main(["render", "docker", "--lock", str(lock), "-o", str(out)], env={}) == 2
    assert capsys.readouterr().err.startswith("envbuild: error[usage]: invalid lock")
    assert not out.exists()


def test_a_refused_name_is_shown_escaped(baselines: dict[str, str]) -> None:
    """The wrong-type message names the package: a line break in its name stays escaped."""
    data = json.loads(baselines["default"])
    data["packages"]["x\nRUN id"] = 5
    with pytest.raises(UsageError) as caught:
        lockmod.from_json(json.dumps(data))
    assert "\n" not in caught.value.message and "\\n" in caught.value.message
