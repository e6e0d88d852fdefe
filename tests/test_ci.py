"""envbuild ci github|bake: golden files, schema validation, structure, escaping, bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
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
from envbuild.data.versions import parse_requirement
from envbuild.errors import DataError, UsageError
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
    # a CPU-only stack with GitHub's Actions cache and keyless signing (docs/faults.md I2)
    "github-cpu-gha-sign": ["github", "--variant", "cpu", "--torch", "2.4.1", "--ubuntu", "22.04",
                            "--registry", GHCR, "--cache", "gha", "--sign"],
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


def steps_of(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A job's steps by name (or by action, for an unnamed step)."""
    return {step.get("name") or step["uses"].split("@")[0]: step for step in job["steps"]}


def test_workflow_structure(outputs: dict[str, dict[str, bytes]]) -> None:
    """docs/faults.md I1: build pushes by digest only, verify runs that digest, promote tags it
    after every verify passed; no expression is expanded inside a shell script."""
    wf = workflow_of(outputs, "github-ghcr-driver550")
    jobs = wf["jobs"]
    assert list(jobs) == ["matrix", "build", "verify", "promote"]
    assert wf["permissions"] == {}
    assert jobs["matrix"]["permissions"] == {"contents": "read"}
    assert jobs["build"]["permissions"] == {"contents": "read", "packages": "write"}
    assert jobs["verify"]["permissions"] == {"packages": "read"}
    assert jobs["promote"]["permissions"] == {"packages": "write"}  # no id-token without --sign
    matrix_expr = "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    for name in ("build", "verify", "promote"):
        assert jobs[name]["strategy"]["matrix"] == matrix_expr
    assert "cat stacks/matrix.json" in jobs["matrix"]["steps"][1]["run"]
    uses = [s["uses"] for job in jobs.values() for s in job["steps"] if "uses" in s]
    assert {u.split("@")[0] for u in uses} == {
        "actions/checkout", "actions/upload-artifact", "actions/download-artifact",
        "docker/setup-buildx-action", "docker/login-action", "docker/metadata-action",
        "docker/build-push-action"}
    assert all(re.fullmatch(r"[a-z-]+/[a-z-]+@[0-9a-f]{40}", u) for u in uses), uses
    for job in ("matrix", "build"):
        assert steps_of(jobs[job])["actions/checkout"]["with"] == {"persist-credentials": False}
    build_steps = steps_of(jobs["build"])
    build = build_steps["Build and push by digest"]["with"]
    assert "tags" not in build  # nothing is tagged before the GPU verify
    assert build["outputs"] == ("type=image,name=${{ env.IMAGE }},push-by-digest=true,"
                                "name-canonical=true,push=${{ github.event_name != 'pull_request' }}")
    assert build["sbom"] is True and build["provenance"] == "mode=max"
    assert build["labels"] == "${{ steps.meta.outputs.labels }}"
    assert build["cache-from"] == "type=registry,ref=${{ env.IMAGE }}:cache-${{ matrix.id }}"
    assert build["cache-to"].startswith("${{ github.event_name != 'pull_request' && format(")
    assert "type=gha" not in outputs["github-ghcr-driver550"][github.WORKFLOW_PATH].decode()
    meta = build_steps["Tags and labels"]["with"]
    assert meta["images"] == "${{ env.IMAGE }}"
    assert meta["tags"].splitlines() == ["type=raw,value=${{ matrix.id }}",
                                         "type=raw,value=${{ matrix.id }}-${{ github.sha }}"]
    assert build_steps["Record the digest"]["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    assert wf["env"]["IMAGE"] == "${{ inputs.image || 'ghcr.io/acme/envbuild' }}"
    assert wf["on"]["workflow_dispatch"]["inputs"]["image"]["default"] == GHCR
    verify = jobs["verify"]
    assert verify["runs-on"] == ["self-hosted", "gpu"] and verify["needs"] == ["matrix", "build"]
    gpu_step = steps_of(verify)["Smoke test on the GPU"]
    assert 'ref="$IMAGE@$digest"' in gpu_step["run"]
    assert gpu_step["run"].splitlines()[-1].endswith('--gpus all "$ref"')
    promote = jobs["promote"]
    assert promote["needs"] == ["matrix", "verify"] and promote["runs-on"] == github.HOSTED_RUNNER
    tag_step = steps_of(promote)["Tag the verified digest"]
    assert tag_step["env"]["TAGS"] == "${{ steps.meta.outputs.tags }}"
    assert 'docker buildx imagetools create "${args[@]}" "$ref"' in tag_step["run"]
    assert "cosign" not in outputs["github-ghcr-driver550"][github.WORKFLOW_PATH].decode()
    # No expression is expanded inside a shell script: values reach run steps as variables.
    for job in jobs.values():
        for step in job["steps"]:
            assert "${{" not in step.get("run", "")


def test_gha_cache_and_signing_are_opt_in(outputs: dict[str, dict[str, bytes]]) -> None:
    """docs/faults.md I2: --cache gha and --sign change only what they name."""
    wf = workflow_of(outputs, "github-cpu-gha-sign")
    build = steps_of(wf["jobs"]["build"])["Build and push by digest"]["with"]
    assert build["cache-from"] == "type=gha,scope=${{ matrix.id }}"
    assert build["cache-to"] == "type=gha,mode=max,scope=${{ matrix.id }}"
    promote = wf["jobs"]["promote"]
    assert promote["permissions"] == {"packages": "write", "id-token": "write"}
    names = [s.get("name") for s in promote["steps"]]
    assert names[-2:] == ["Install cosign", "Sign the digest (keyless)"]
    assert promote["steps"][-1]["run"].splitlines()[-1] == 'cosign sign --yes "$ref"'
    assert all("id-token" not in job.get("permissions", {})
               for name, job in wf["jobs"].items() if name != "promote")


def test_actions_pinned_from_the_table(outputs: dict[str, dict[str, bytes]],
                                       matrix: matrixmod.Matrix) -> None:
    """docs/faults.md I3: every 'uses:' is the SHA matrices/ci_actions.yaml records, with its
    release tag as the line's comment."""
    table = {r["action"]: (r["version"], r["sha"]) for r in matrix.rows("ci_actions")}
    seen = set()
    for name in [n for n in CASES if n.startswith("github")]:
        for line in outputs[name][github.WORKFLOW_PATH].decode().splitlines():
            if "uses:" not in line:
                continue
            match = re.fullmatch(r" *(?:- )?uses: ([^@ ]+)@([0-9a-f]{40}) # (v[0-9.]+)", line)
            assert match is not None, line
            assert table[match[1]] == (match[3], match[2]), line
            seen.add(match[1])
    assert seen == set(table)  # every row is used, and --sign reaches the cosign installer


def test_missing_action_row_is_a_data_error(matrix: matrixmod.Matrix) -> None:
    actions = [a for a in ci.pinned_actions(matrix) if a[0] != "docker/metadata-action"]
    with pytest.raises(DataError, match="no row for docker/metadata-action"):
        github.workflow(ci.parse_ci_options(registry=GHCR, actions=actions))


def test_ci_actions_rows_are_checked(tmp_path: Path) -> None:
    """A short SHA, a tag that is no release, an action without owner, a version bumped
    without its source: each one problem."""
    data = tmp_path / "matrices"
    shutil.copytree(matrixmod.default_directory({}), data)
    (data / "manifest.json").unlink(missing_ok=True)
    text = (data / "ci_actions.yaml").read_text()
    text = text.replace("sha: 3d3c42e5aac5ba805825da76410c181273ba90b1", "sha: 3d3c42e", 1)
    text = text.replace('version: "v4.1.0"', 'version: "main"', 1)
    text = text.replace("action: sigstore/cosign-installer", "action: cosign-installer", 1)
    text = text.replace('version: "v6.2.0"', 'version: "v6.3.0"', 1)
    (data / "ci_actions.yaml").write_text(text)
    with pytest.raises(DataError) as info:
        matrixmod.load(data)
    problems = [p for p in info.value.details if p.startswith("ci_actions.yaml")]
    assert len(problems) == 4, problems
    assert any("sha must be a full 40-hex commit SHA" in p for p in problems)
    assert any("source must be https://github.com/docker/metadata-action/tree/v6.3.0" in p
               for p in problems)


def test_private_registry_and_runner_labels(outputs: dict[str, dict[str, bytes]]) -> None:
    wf = workflow_of(outputs, "github-private-torch241")
    jobs = wf["jobs"]
    assert jobs["verify"]["runs-on"] == ["self-hosted", "gpu", "a100"]
    assert jobs["build"]["permissions"] == {"contents": "read"}  # no GITHUB_TOKEN packages
    assert jobs["verify"]["permissions"] == {}
    login = steps_of(jobs["build"])["Log in to registry.example:5000"]
    assert login["with"] == {"registry": "registry.example:5000",
                             "username": "${{ secrets.REGISTRY_USERNAME }}",
                             "password": "${{ secrets.REGISTRY_PASSWORD }}"}
    assert wf["on"]["push"]["branches"] == ["release/1.x"]
    labels = steps_of(jobs["build"])["Tags and labels"]["with"]["labels"].splitlines()
    assert "org.example.team=ml research" in labels


@pytest.mark.parametrize(("registry", "host"), [
    ("ghcr.io/acme/envbuild", "ghcr.io"), ("acme/envbuild", None), ("envbuild", None),
    ("localhost/envbuild", "localhost"), ("localhost:5000/x", "localhost:5000"),
    ("registry.example:5000/ml/envbuild", "registry.example:5000"), ("docker.io/acme/x", "docker.io"),
])
def test_registry_host(registry: str, host: str | None) -> None:
    assert github.registry_host(registry) == host
    options = ci.parse_ci_options(registry=registry, actions=ci.pinned_actions(
        matrixmod.load(matrixmod.default_directory({}))))
    login = github.workflow(options)["jobs"]["build"]["steps"][2]
    assert login["with"].get("registry") == host
    assert login["name"] == f"Log in to {host or 'Docker Hub'}"


# --- zizmor: no high-severity finding in any generated workflow -------------------------


def zizmor_binary() -> str | None:
    """zizmor (the test extra installs it); absent, the test skips unless CI requires it."""
    found = shutil.which("zizmor")
    if found is None and (os.environ.get("ENVBUILD_REQUIRE_DOCKER") or os.environ.get("CI")):
        pytest.fail("zizmor is required here (pip install -e '.[test]')")
    return found


def zizmor_findings(path: Path) -> list[dict[str, Any]]:
    zizmor = zizmor_binary()
    if zizmor is None:
        pytest.skip("zizmor not installed (pip install -e '.[test]' brings it)")
    done = subprocess.run([zizmor, "--offline", "--no-progress", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 11, 12, 13, 14), done.stderr  # 1x: findings of some severity
    findings: list[dict[str, Any]] = json.loads(done.stdout)
    return findings


def high(findings: list[dict[str, Any]]) -> list[str]:
    return [f["ident"] for f in findings
            if f["determinations"]["severity"] == "High" and not f.get("ignored")]


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if n.startswith("github")])
def test_zizmor_finds_nothing_high(name: str, outputs: dict[str, dict[str, bytes]],
                                   tmp_path: Path) -> None:
    """docs/faults.md I4: every workflow variant, audited offline."""
    path = tmp_path / ".github" / "workflows" / "envbuild.yml"
    path.parent.mkdir(parents=True)
    path.write_bytes(outputs[name][github.WORKFLOW_PATH])
    assert high(zizmor_findings(path)) == []


def test_zizmor_check_has_teeth(outputs: dict[str, dict[str, bytes]], tmp_path: Path) -> None:
    """The same audit on a tag-pinned action and an expression in a run block: both high."""
    text = outputs["github-ghcr-driver550"][github.WORKFLOW_PATH].decode()
    text = re.sub(r"docker/login-action@[0-9a-f]{40} # v[0-9.]+", "docker/login-action@v4", text)
    text = text.replace('printf \'%s\\n\' "$DIGEST"', 'printf \'%s\\n\' "${{ github.head_ref }}"')
    assert "${{ github.head_ref }}" in text
    path = tmp_path / ".github" / "workflows" / "envbuild.yml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    found = high(zizmor_findings(path))
    assert "unpinned-uses" in found and "template-injection" in found, found


# --- bake: plain JSON ------------------------------------------------------------------


def bake_of(outputs: dict[str, dict[str, bytes]], name: str) -> dict[str, Any]:
    """The bake file with ${REGISTRY} expanded to its default, as bake reads it."""
    data: dict[str, Any] = json.loads(outputs[name][bake.BAKE_PATH])
    registry = data["variable"]["REGISTRY"]["default"]
    expanded: dict[str, Any] = json.loads(json.dumps(data).replace("${REGISTRY}", registry))
    return expanded


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


def test_bake_file_is_plain_json(outputs: dict[str, dict[str, bytes]]) -> None:
    """docs/faults.md I5: no HCL beside it; its one interpolation is the REGISTRY variable."""
    for name in ("bake-private-torch241", "bake-cpu"):
        files = outputs[name]
        assert "docker-bake.hcl" not in files
        text = files[bake.BAKE_PATH].decode("ascii")
        assert re.findall(r"\$\{[^}]*\}", text) and set(re.findall(r"\$\{[^}]*\}", text)) == {"${REGISTRY}"}
        assert "$$" not in text and "\\u" not in text


def test_bake_refuses_an_interpolation(matrix: matrixmod.Matrix) -> None:
    """Past the validators (built by hand), a '$' in a label still never reaches the file."""
    stacks, _ = ci.select_stacks(resolve(Request(), matrix).stacks, matrix, top=1)
    options = ci.CiOptions(registry=GHCR, labels=(("org.example.x", "${HOME}"),))
    with pytest.raises(UsageError, match="interpolation"):
        bake.bake_json(stacks, options)


# --- user values: labels can't break YAML, HCL or Actions expressions -----------------


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=30))
@settings(max_examples=200, deadline=None)
def test_label_values_are_rejected_or_kept_verbatim(value: str) -> None:
    try:
        options = ci.parse_ci_options(registry=GHCR, labels=[f"org.example.v={value}"])
    except UsageError:
        return
    actions = ci.pinned_actions(matrixmod.load(matrixmod.default_directory({})))
    baseline = github.workflow_yaml(ci.parse_ci_options(registry=GHCR, actions=actions)).decode()
    text = github.workflow_yaml(replace(options, actions=actions)).decode()
    labels = yaml.safe_load(text)["jobs"]["build"]["steps"][3]["with"]["labels"].splitlines()
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


def test_standalone_python_stack_renders_the_recorded_build(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], matrix: matrixmod.Matrix) -> None:
    code, _, err = run_ci(capsys, "github", "--driver", "550", "--python", "3.12", "--ubuntu", "22.04",
                          "--registry", GHCR, "-o", str(tmp_path / "out"))
    assert code == 0, err
    row = next(r for r in matrix.rows("python_standalone") if r["python"] == "3.12" and r["arch"] == "x86_64")
    dockerfiles = [p.read_text() for p in (tmp_path / "out").rglob("Dockerfile")]
    assert dockerfiles and all(f'echo "{row["sha256"]}  /tmp/python.tar.gz" | sha256sum -c -' in text
                               and row["url"] in text for text in dockerfiles)


def test_no_python_source_stack_exits_2(matrix: matrixmod.Matrix) -> None:
    """Data without the recorded build (edited after resolving): skipped, then a one-line error."""
    stacks = resolve(Request(python=parse_requirement("python", "3.12"), ubuntu="22.04"), matrix).stacks
    bare = matrixmod.Matrix(directory=matrix.directory, digest=matrix.digest,
                            relations={**matrix.relations, "python_standalone": ()})
    with pytest.raises(UsageError, match="python3 or a recorded standalone build") as info:
        ci.select_stacks(stacks, bare, top=2)
    assert info.value.exit_code == 2


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


def test_action_pins_are_not_in_the_locks_matrices_digest(tmp_path: Path) -> None:
    """Refreshing ci_actions.yaml leaves every lock current (lock --check compares the matrices
    digest); the parsed-rows cache still sees the new rows."""
    data = tmp_path / "matrices"
    shutil.copytree(matrixmod.default_directory({}), data)
    (data / "manifest.json").unlink(missing_ok=True)
    cache = tmp_path / "cache"
    before = matrixmod.load(data, cache_dir=cache)
    path = data / "ci_actions.yaml"
    path.write_text(path.read_text().replace("v7.0.1", "v7.0.0", 2))
    matrixmod.load.cache_clear()
    after = matrixmod.load(data, cache_dir=cache)
    assert after.digest == before.digest
    assert dict((a, v) for a, v, _ in ci.pinned_actions(after))["actions/checkout"] == "v7.0.0"
    (data / "ubuntu_python.yaml").write_text((data / "ubuntu_python.yaml").read_text() + "\n")
    matrixmod.load.cache_clear()
    assert matrixmod.load(data, cache_dir=cache).digest != before.digest
