"""envbuild ci github|bake: golden files, schema validation, structure, escaping, bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.commands.cli import main
from envbuild.data import matrix as matrixmod
from envbuild.data.peaks import peaks_json
from envbuild.errors import UsageError
from envbuild.fs import MARKER
from envbuild.render import bake, ci, github
from envbuild.render import docker as render
from envbuild.render.lock import read_lock
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

GOLDEN = Path(__file__).parent / "golden" / "ci"
ENV = {"ENVBUILD_NO_CACHE": "1"}
GHCR = "ghcr.io/acme/envbuild"
PRIVATE = "registry.example:5000/ml/envbuild"

# name -> argv after 'ci'. Selectors pin torch so new releases in matrices/ rarely move them.
CASES: dict[str, list[str]] = {
    # the usual fleet: driver 550, ghcr.io (GITHUB_TOKEN login, packages permissions)
    "github-ghcr-driver550": ["github", "--driver", "550", "--torch", ">=2.4,<2.6",
                              "--registry", GHCR],
    # three CUDA variants, a private registry with a port, two runner labels, a label, a branch
    "github-private-torch241": ["github", "--torch", "2.4.1", "--registry", PRIVATE,
                                "--gpu-runner-label", "gpu", "--gpu-runner-label", "a100",
                                "--label", "org.example.team=ml research", "--branch", "release/1.x"],
    # the same stacks as bake targets: groups cuda11 and cuda12
    "bake-private-torch241": ["bake", "--torch", "2.4.1", "--registry", PRIVATE,
                              "--label", "org.example.team=ml research"],
    # a CPU-only stack: group cpu, Docker Hub repository
    "bake-cpu": ["bake", "--variant", "cpu", "--torch", "2.4.1", "--ubuntu", "22.04",
                 "--registry", "acme/envbuild"],
}
GOLDEN_FILES = (github.WORKFLOW_PATH, github.MATRIX_PATH, bake.BAKE_PATH)


@pytest.fixture(scope="module")
def matrix() -> matrixmod.Matrix:
    return matrixmod.load(matrixmod.default_directory({}))


def run_ci(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["ci", *argv], env=ENV)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tree(root: Path) -> dict[str, bytes]:
    """The rendered files; the writer's own marker (envbuild.fs.MARKER) is no rendered file."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """Each case rendered once through the CLI (module scope: rendering reads smoke.py)."""
    result = {}
    for name, argv in CASES.items():
        out = tmp_path_factory.mktemp(name) / "out"
        assert main(["ci", *argv, "-o", str(out)], env=ENV) == 0, name
        result[name] = tree(out)
    return result


# --- golden files and determinism -----------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, outputs: dict[str, dict[str, bytes]],
                request: pytest.FixtureRequest) -> None:
    files = outputs[name]
    wanted = {f: files[f] for f in GOLDEN_FILES if f in files}
    listing = "".join(f"{path}\n" for path in files).encode()
    folder = GOLDEN / name
    if request.config.getoption("--update-golden"):
        folder.mkdir(parents=True, exist_ok=True)
        for path, data in wanted.items():
            (folder / Path(path).name).write_bytes(data)
        (folder / "files.txt").write_bytes(listing)
    for path, data in wanted.items():
        assert data == (folder / Path(path).name).read_bytes(), \
            f"{name}/{path} differs; review, then --update-golden"
    assert listing == (folder / "files.txt").read_bytes()


def test_same_input_same_bytes(tmp_path: Path, outputs: dict[str, dict[str, bytes]]) -> None:
    for name in ("github-ghcr-driver550", "bake-private-torch241"):
        assert main(["ci", *CASES[name], "-o", str(tmp_path / name)], env=ENV) == 0
        assert tree(tmp_path / name) == outputs[name]


def test_contexts_are_what_render_docker_writes(outputs: dict[str, dict[str, bytes]],
                                                matrix: matrixmod.Matrix, tmp_path: Path) -> None:
    files = outputs["github-private-torch241"]
    ids = sorted({p.split("/")[1] for p in files if p.startswith("stacks/") and p.count("/") == 2})
    assert len(ids) == 3
    for sid in ids:
        lock_path = tmp_path / f"{sid}.lock"
        lock_path.write_bytes(files[f"stacks/{sid}/envbuild.lock"])
        lock = read_lock(lock_path)
        assert ci.stack_id(lock.stack) == sid
        again = render.render_docker(lock, render.RenderOptions(), peaks=peaks_json(matrix))
        assert {f"stacks/{sid}/{n}": d for n, d in again.items()} == \
            {p: d for p, d in files.items() if p.startswith(f"stacks/{sid}/")}


def test_verify_reruns_the_images_cmd(outputs: dict[str, dict[str, bytes]]) -> None:
    """The CPU-only verify step repeats the Dockerfile's CMD: catch the two drifting apart."""
    dockerfile = next(d for p, d in outputs["bake-cpu"].items() if p.endswith("/Dockerfile"))
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile.decode(), re.MULTILINE)
    assert cmd is not None
    assert " ".join(json.loads(cmd[1])) == github.SMOKE_COMMAND


# --- the workflow: GitHub's schema and its structure ----------------------------------


def schema_errors(document: Any, name: str = "vendor/github-workflows.json") -> list[str]:
    """Errors from check-jsonschema's vendored schema (offline), via jsonschema directly."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("check_jsonschema")
    path = resources.files("check_jsonschema") / "builtin_schemas" / name
    schema = json.loads(path.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(document)]


def workflow_of(outputs: dict[str, dict[str, bytes]], name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(outputs[name][github.WORKFLOW_PATH])
    return data


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if n.startswith("github")])
def test_workflow_passes_the_github_schema(name: str, outputs: dict[str, dict[str, bytes]]) -> None:
    document = workflow_of(outputs, name)
    assert schema_errors(document) == []
    assert schema_errors(document, "custom/github-workflows-require-timeout.json") == []


def test_schema_check_has_teeth(outputs: dict[str, dict[str, bytes]]) -> None:
    document = workflow_of(outputs, "github-ghcr-driver550")
    document["jobs"]["build"]["runs_on"] = document["jobs"]["build"].pop("runs-on")
    assert schema_errors(document)
    document = workflow_of(outputs, "github-ghcr-driver550")
    document["jobs"]["build"]["permissions"]["packages"] = "push"
    assert schema_errors(document)
    document = workflow_of(outputs, "github-ghcr-driver550")
    del document["jobs"]["verify"]["timeout-minutes"]
    assert schema_errors(document, "custom/github-workflows-require-timeout.json")


def test_check_jsonschema_cli_accepts_the_file(tmp_path: Path,
                                               outputs: dict[str, dict[str, bytes]]) -> None:
    pytest.importorskip("check_jsonschema")
    path = tmp_path / "envbuild.yml"
    path.write_bytes(outputs["github-private-torch241"][github.WORKFLOW_PATH])
    for schema in ("vendor.github-workflows", "custom.github-workflows-require-timeout"):
        done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema,
                               str(path)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


def test_matrix_has_one_entry_per_stack(outputs: dict[str, dict[str, bytes]]) -> None:
    for name in ("github-ghcr-driver550", "github-private-torch241"):
        files = outputs[name]
        include = json.loads(files[github.MATRIX_PATH])["include"]
        dirs = {p.split("/")[1] for p in files if p.startswith("stacks/") and p.count("/") == 2}
        assert sorted(e["id"] for e in include) == sorted(dirs)
        assert len(include) == len(dirs) >= 2
        for entry in include:
            assert entry["context"] == f"stacks/{entry['id']}"
            assert f"{entry['context']}/Dockerfile" in files
            assert entry["gpu"] is True and entry["group"] == f"cuda{entry['cuda'].split('.')[0]}"
    assert len(json.loads(outputs["github-ghcr-driver550"][github.MATRIX_PATH])["include"]) == 4


def test_workflow_structure(outputs: dict[str, dict[str, bytes]]) -> None:
    wf = workflow_of(outputs, "github-ghcr-driver550")
    jobs = wf["jobs"]
    assert list(jobs) == ["matrix", "build", "verify"]
    assert wf["permissions"] == {"contents": "read"}
    assert jobs["build"]["permissions"] == {"contents": "read", "packages": "write"}
    assert jobs["verify"]["permissions"] == {"packages": "read"}
    assert "permissions" not in jobs["matrix"]
    matrix_expr = "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert jobs["build"]["strategy"]["matrix"] == jobs["verify"]["strategy"]["matrix"] == matrix_expr
    assert "cat stacks/matrix.json" in jobs["matrix"]["steps"][1]["run"]
    uses = [s["uses"] for job in jobs.values() for s in job["steps"] if "uses" in s]
    assert {u.split("@")[0] for u in uses} == {"actions/checkout", "docker/setup-buildx-action",
                                               "docker/login-action", "docker/build-push-action"}
    assert all(re.fullmatch(r"[a-z-]+/[a-z-]+@v[0-9]+", u) for u in uses), uses
    build = jobs["build"]["steps"][-1]["with"]
    assert build["cache-from"] == "type=gha,scope=${{ matrix.id }}"
    assert build["cache-to"] == "type=gha,mode=max,scope=${{ matrix.id }}"
    assert build["tags"].splitlines() == ["${{ env.IMAGE }}:${{ matrix.id }}",
                                          "${{ env.IMAGE }}:${{ matrix.id }}-${{ github.sha }}"]
    assert wf["env"]["IMAGE"] == "${{ inputs.image || 'ghcr.io/acme/envbuild' }}"
    assert wf["on"]["workflow_dispatch"]["inputs"]["image"]["default"] == GHCR
    verify = jobs["verify"]
    assert verify["runs-on"] == ["self-hosted", "gpu"] and verify["needs"] == ["matrix", "build"]
    gpu_step = verify["steps"][1]
    assert "docker run" in gpu_step["run"] and "--gpus all" in gpu_step["run"]
    assert gpu_step["env"]["REF"] == "${{ env.IMAGE }}:${{ matrix.id }}-${{ github.sha }}"
    # No expression is expanded inside a shell script: values reach run steps as variables.
    for job in jobs.values():
        for step in job["steps"]:
            assert "${{" not in step.get("run", "")


def test_private_registry_and_runner_labels(outputs: dict[str, dict[str, bytes]]) -> None:
    wf = workflow_of(outputs, "github-private-torch241")
    jobs = wf["jobs"]
    assert jobs["verify"]["runs-on"] == ["self-hosted", "gpu", "a100"]
    assert jobs["build"]["permissions"] == {"contents": "read"}  # no GITHUB_TOKEN packages
    assert jobs["verify"]["permissions"] == {}
    login = jobs["build"]["steps"][2]
    assert login["with"] == {"registry": "registry.example:5000",
                             "username": "${{ secrets.REGISTRY_USERNAME }}",
                             "password": "${{ secrets.REGISTRY_PASSWORD }}"}
    assert wf["on"]["push"]["branches"] == ["release/1.x"]
    labels = jobs["build"]["steps"][-1]["with"]["labels"].splitlines()
    assert "org.example.team=ml research" in labels


@pytest.mark.parametrize(("registry", "host"), [
    ("ghcr.io/acme/envbuild", "ghcr.io"), ("acme/envbuild", None), ("envbuild", None),
    ("localhost/envbuild", "localhost"), ("localhost:5000/x", "localhost:5000"),
    ("registry.example:5000/ml/envbuild", "registry.example:5000"), ("docker.io/acme/x", "docker.io"),
])
def test_registry_host(registry: str, host: str | None) -> None:
    assert github.registry_host(registry) == host
    login = github.workflow(ci.parse_ci_options(registry=registry))["jobs"]["build"]["steps"][2]
    assert login["with"].get("registry") == host
    assert login["name"] == f"Log in to {host or 'Docker Hub'}"


# --- bake: structure through a small HCL reader, and the escaper ----------------------


def hcl_cook(raw: str, variables: dict[str, str]) -> str:
    """A quoted string's body as HCL reads it: escapes, $${ / %%{ literals, ${VAR}."""
    out, i = [], 0
    simple = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
    while i < len(raw):
        if raw[i] == "\\":
            kind = raw[i + 1]
            if kind in simple:
                out.append(simple[kind])
                i += 2
            else:
                width = {"u": 4, "U": 8}[kind]
                out.append(chr(int(raw[i + 2:i + 2 + width], 16)))
                i += 2 + width
        elif raw.startswith(("$${", "%%{"), i):
            out.append(raw[i + 1:i + 3])
            i += 3
        elif raw.startswith("${", i):
            end = raw.index("}", i)
            out.append(variables[raw[i + 2:end]])
            i = end + 1
        else:
            assert not raw.startswith("%{", i), "template directive"
            out.append(raw[i])
            i += 1
    return "".join(out)


_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<str>"(?:[^"\\]|\\.)*")|(?P<ident>[A-Za-z_][A-Za-z0-9_-]*)'
                    r"|(?P<punct>[{}\[\]=,])")


def hcl_tokens(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        assert match is not None, f"unexpected {text[pos:pos + 20]!r}"
        pos = match.end()
        if match.lastgroup:
            tokens.append((match.lastgroup, match[match.lastgroup]))
    return tokens


def hcl_parse(text: str) -> list[tuple[str, list[str], dict[str, Any]]]:
    """The subset bake files here use: blocks of attributes with string, list and map values.
    Strings stay raw (quotes stripped); ``hcl_cook`` reads them."""
    tokens = hcl_tokens(text)
    pos = 0

    def take(kind: str, value: str | None = None) -> str:
        nonlocal pos
        got_kind, got = tokens[pos]
        assert got_kind == kind and (value is None or got == value), (tokens[pos], kind, value)
        pos += 1
        return got

    def value() -> Any:
        nonlocal pos
        kind, got = tokens[pos]
        if kind == "str":
            pos += 1
            return got[1:-1]
        if got == "[":
            pos += 1
            items = []
            while tokens[pos][1] != "]":
                items.append(value())
                if tokens[pos][1] == ",":
                    pos += 1
            pos += 1
            return items
        take("punct", "{")
        mapping = {}
        while tokens[pos][1] != "}":
            key = take("str")[1:-1]
            take("punct", "=")
            mapping[key] = value()
        pos += 1
        return mapping

    blocks = []
    while pos < len(tokens):
        kind = take("ident")
        labels = []
        while tokens[pos][0] == "str":
            labels.append(take("str")[1:-1])
        take("punct", "{")
        body: dict[str, Any] = {}
        while tokens[pos][1] != "}":
            name = take("ident")
            take("punct", "=")
            body[name] = value()
        pos += 1
        blocks.append((kind, labels, body))
    return blocks


def bake_of(outputs: dict[str, dict[str, bytes]], name: str) -> dict[str, dict[str, Any]]:
    """{"variable"|"group"|"target": {label: cooked body}} with ${REGISTRY} expanded."""
    blocks = hcl_parse(outputs[name][bake.BAKE_PATH].decode("ascii"))
    variables = {labels[0]: hcl_cook(body["default"], {}) for kind, labels, body in blocks
                 if kind == "variable"}

    def cook(v: Any) -> Any:
        if isinstance(v, str):
            return hcl_cook(v, variables)
        if isinstance(v, list):
            return [cook(x) for x in v]
        return {hcl_cook(k, variables): cook(x) for k, x in v.items()}

    parsed: dict[str, dict[str, Any]] = {"variable": {}, "group": {}, "target": {}}
    for kind, labels, body in blocks:
        parsed[kind][hcl_cook(labels[0], {})] = cook(body)
    return parsed


def test_bake_targets_and_groups(outputs: dict[str, dict[str, bytes]]) -> None:
    files = outputs["bake-private-torch241"]
    ids = sorted({p.split("/")[1] for p in files if p.startswith("stacks/") and p.count("/") == 2})
    parsed = bake_of(outputs, "bake-private-torch241")
    assert parsed["variable"] == {"REGISTRY": {"default": PRIVATE}}
    assert sorted(parsed["target"]) == sorted(ci.target_name(i) for i in ids)
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]+", t) for t in parsed["target"])  # buildx's rule
    for sid in ids:
        target = parsed["target"][ci.target_name(sid)]
        assert target["context"] == f"stacks/{sid}" and f"stacks/{sid}/Dockerfile" in files
        assert target["dockerfile"] == "Dockerfile"
        assert target["tags"] == [f"{PRIVATE}:{sid}"]
        assert target["labels"] == {"dev.envbuild.stack": sid, "org.example.team": "ml research"}
        assert target["cache-from"] == [f"type=registry,ref={PRIVATE}:cache-{sid}"]
        assert target["cache-to"] == [f"type=registry,ref={PRIVATE}:cache-{sid},mode=max"]
    groups = {name: body["targets"] for name, body in parsed["group"].items()}
    assert sorted(groups["default"]) == sorted(parsed["target"])
    assert set(groups) == {"default", "cuda11", "cuda12"}
    assert sorted(groups["cuda11"] + groups["cuda12"]) == sorted(groups["default"])
    assert all("cu118" in t for t in groups["cuda11"])
    cpu = bake_of(outputs, "bake-cpu")
    assert set(cpu["group"]) == {"default", "cpu"}


def test_bake_parses_with_python_hcl2(outputs: dict[str, dict[str, bytes]]) -> None:
    """A second, independent HCL reader (optional: python-hcl2) agrees on the block names."""
    hcl2 = pytest.importorskip("hcl2")
    data = hcl2.loads(outputs["bake-private-torch241"][bake.BAKE_PATH].decode())
    names = {k.strip('"') for block in data["target"] for k in block}
    assert names == set(bake_of(outputs, "bake-private-torch241")["target"])


ADVERSARIAL = ['"', "\\", '\\"', "${REGISTRY}", "$${x}", "$", "$$", "%{if x}", "%%{", "a\nb",
               "\r\t", "}\n}\ntarget \"x\" {", "\u2028", "\x00", "é", "\U0001f600", '" = "', "#"]


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_hcl_string_round_trips(value: str) -> None:
    quoted = bake.hcl_string(value)
    assert hcl_tokens(quoted) == [("str", quoted)]  # one token: nothing ended the string
    assert hcl_cook(quoted[1:-1], {}) == value  # and no interpolation: {} has no variables
    assert quoted.isascii() and "\n" not in quoted


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_hcl_string_round_trips_any_text(value: str) -> None:
    quoted = bake.hcl_string(value)
    assert hcl_tokens(quoted) == [("str", quoted)]
    assert hcl_cook(quoted[1:-1], {}) == value


# --- user values: labels can't break YAML, HCL or Actions expressions -----------------


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=30))
@settings(max_examples=200, deadline=None)
def test_label_values_are_rejected_or_kept_verbatim(value: str) -> None:
    try:
        options = ci.parse_ci_options(registry=GHCR, labels=[f"org.example.v={value}"])
    except UsageError:
        return
    baseline = github.workflow_yaml(ci.parse_ci_options(registry=GHCR)).decode()
    text = github.workflow_yaml(options).decode()
    labels = yaml.safe_load(text)["jobs"]["build"]["steps"][-1]["with"]["labels"].splitlines()
    assert labels[0] == f"org.example.v={value}"
    assert text.count("${{") == baseline.count("${{")  # no expression from the user
    assert not re.search(r"[\"'$#,{}\\]", value) and value == value.strip()


# --- bad input: exit 2, nothing written -------------------------------------------------

BAD = [
    ["github", "--registry", "ghcr.io/Acme/envbuild"],  # uppercase repository
    ["github", "--registry", "ghcr.io/acme/envbuild:v1"],  # a tag: tags are the stack ids
    ["github", "--registry", "ghcr.io/acme/envbuild@sha256:" + "0" * 64],
    ["github", "--registry", "ghcr.io/acme/envbuild\nrun: id"],
    ["bake", "--registry", 'acme/x" { }'],
    ["bake", "--registry", "acme/${{ secrets.X }}"],
    ["github", "--registry", GHCR, "--gpu", "RTX 9999"],  # unknown GPU
    ["github", "--registry", GHCR, "--gpu-runner-label", "gpu, linux"],
    ["github", "--registry", GHCR, "--gpu-runner-label", "${{ github.actor }}"],
    ["github", "--registry", GHCR, "--branch", "main\nx"],
    ["github", "--registry", GHCR, "--branch", "ma*in"],
    ["github", "--registry", GHCR, "--label", "org.example.x=${{ secrets.TOKEN }}"],
    ["github", "--registry", GHCR, "--label", 'org.example.x=a"b'],
    ["bake", "--registry", GHCR, "--label", "org.example.x=a\u2028b"],
    ["bake", "--registry", GHCR, "--label", "dev.envbuild.torch=1"],  # reserved
    ["bake", "--registry", GHCR, "--label", "Org.Example=1"],
    ["bake", "--registry", GHCR, "--label", "novalue"],
    ["bake", "--registry", GHCR, "--top", "0"],
    ["bake", "--registry", GHCR, "--torch", "2.3.1; rm -rf /"],
    ["github"],  # --registry is required
]


@pytest.mark.parametrize("argv", BAD)
def test_bad_input_exits_2_and_writes_nothing(argv: list[str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, _, err = run_ci(capsys, *argv, "-o", str(out))
    assert code == 2, err
    assert err.startswith("envbuild: error[usage]: ") and len(err.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_no_distro_python_stack_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_ci(capsys, "github", "--driver", "550", "--python", "3.12",
                          "--registry", GHCR, "-o", str(tmp_path / "out"))
    assert code == 2 and "python3" in err and not (tmp_path / "out").exists()


def test_existing_output_untouched_without_force(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = [*CASES["bake-cpu"], "-o", str(out)]
    assert run_ci(capsys, *argv)[0] == 0  # --force replaces only a directory envbuild wrote
    (out / "keep").write_text("mine")
    before = tree(out)
    code, _, err = run_ci(capsys, *argv)
    assert code == 2 and "not empty" in err and tree(out) == before
    code, stdout, _ = run_ci(capsys, *argv, "--force")
    assert code == 0 and "1 stack:" in stdout
    assert "keep" not in tree(out) and bake.BAKE_PATH in tree(out)


def test_skipped_stacks_are_reported(matrix: matrixmod.Matrix) -> None:
    stacks = resolve(Request(), matrix).stacks
    chosen, skipped = ci.select_stacks(stacks, matrix, top=2)
    assert len(chosen) == 2
    ranked = [ci.stack_id(s) for s in stacks]
    # Order kept; whatever was passed over before the last chosen stack is reported.
    assert ranked.index(chosen[0].id) < ranked.index(chosen[1].id)
    assert sorted(ranked[:ranked.index(chosen[1].id) + 1]) == sorted([c.id for c in chosen] + skipped)


@pytest.mark.parametrize("sid", ["torch2.4.1-cu121-py3.11-ubuntu22.04",
                                 "torch2.14.1-cpu-py3.13t-ubuntu24.04-devel"])
def test_target_names_follow_buildx(sid: str) -> None:
    assert re.fullmatch(r"[a-zA-Z0-9_-]+", ci.target_name(sid))


def test_resolve_does_not_import_ci() -> None:
    code = ("import sys; from envbuild.commands.cli import main; "
            "main(['resolve', '--top', '1']); "
            "print(any(m in sys.modules for m in ('envbuild.render.ci', 'envbuild.commands.ci')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"ENVBUILD_NO_CACHE": "1", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_cuda_groups_sort_numerically() -> None:
    names = ["cpu", "cuda12", "cuda9", "gpu", "cuda11"]
    assert sorted(names, key=bake._group_order) == ["cuda9", "cuda11", "cuda12", "cpu", "gpu"]
