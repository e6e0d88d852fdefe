"""``envbuild ci github --lock envbuild.lock``: one image per target of the lock, each verified on
its own runs-on labels, a 'lock --check' job before any build, disk freed on the hosted builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fleet_lock import write_lock
from test_ci import ENV, high, schema_errors, tree, zizmor_findings

from envbuild.commands.cli import main
from envbuild.fleet.placement import Placement
from envbuild.render import github

H100_LABELS = ("self-hosted", "gpu", "h100")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("ci-lock")
    lock = write_lock(root, {"h100": Placement(nodes=4, gpus_per_node=8, runs_on=H100_LABELS),
                             "a10": Placement(nodes=2)})
    out = root / "out"
    assert main(["ci", "github", "--lock", str(lock), "--registry", "ghcr.io/acme/app", "-o", str(out)],
                env=ENV) == 0
    return tree(out)


def test_one_stack_per_target_verified_on_its_runners(rendered: dict[str, bytes]) -> None:
    entries = {e["id"]: e for e in json.loads(rendered[github.MATRIX_PATH])["include"]}
    assert set(entries) == {"h100", "a10"}
    assert entries["h100"]["runs_on"] == list(H100_LABELS)
    assert entries["a10"]["runs_on"] == ["self-hosted", "gpu"]  # no runs-on: the --gpu-runner-label default
    assert entries["h100"]["context"] == "stacks/h100"
    lock = json.loads(rendered["stacks/h100/envbuild.lock"])
    assert lock["schema"] == 1 and lock["stack"]["variant"] == "cpu"  # the target's own lock, baked in


def test_lock_check_first_free_disk_and_promotion_after_verify(rendered: dict[str, bytes]) -> None:
    wf = yaml.safe_load(rendered[github.WORKFLOW_PATH])
    jobs = wf["jobs"]
    assert list(jobs) == ["lock-check", "matrix", "build", "verify", "promote"]
    check = jobs["lock-check"]["steps"][-1]
    assert check["run"].splitlines()[-1] == \
        'python3 -P -m envbuild lock --check --output "$LOCK" --stacks stacks'
    assert check["env"]["LOCK"] == "envbuild.lock"
    assert jobs["build"]["needs"] == ["matrix", "lock-check"]
    assert jobs["build"]["steps"][0]["name"] == "Free disk space"
    assert jobs["verify"]["runs-on"] == "${{ matrix.runs_on }}"
    assert jobs["promote"]["needs"] == ["matrix", "verify"]
    assert "envbuild.lock" in wf["on"]["pull_request"]["paths"]
    for job in jobs.values():
        for step in job["steps"]:
            assert "${{" not in step.get("run", "")


def test_the_lock_check_command_runs_envbuild_not_the_checkouts_own(rendered: dict[str, bytes],
                                                                    tmp_path: Path) -> None:
    """The job runs in a pull request's checkout: ``python3 -m`` would import its own
    ``envbuild/`` first (the working directory leads sys.path); ``-P`` leaves it out. The
    command's interpreter options, run here against a checkout holding a hostile package."""
    import os
    import subprocess
    import sys

    line = yaml.safe_load(rendered[github.WORKFLOW_PATH])["jobs"]["lock-check"]["steps"][-1]["run"]
    options = line.splitlines()[-1].split(" -m envbuild ")[0].split()[1:]
    assert options == ["-P"]
    (tmp_path / "envbuild").mkdir()
    (tmp_path / "envbuild" / "__init__.py").write_text("raise SystemExit('the checkout ran its own')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = [subprocess.run([sys.executable, *given, "-m", "envbuild", "--version"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60, check=False)
            for given in (list[str](), options)]
    assert done[0].returncode == 1 and "the checkout ran its own" in done[0].stderr  # what -P prevents
    assert done[1].returncode == 0 and done[1].stdout.startswith("envbuild "), done[1].stderr


def test_the_lock_workflow_passes_the_schema_and_zizmor(rendered: dict[str, bytes], tmp_path: Path) -> None:
    document = yaml.safe_load(rendered[github.WORKFLOW_PATH])
    assert schema_errors(document) == []
    assert schema_errors(document, "custom/github-workflows-require-timeout.json") == []
    path = tmp_path / ".github" / "workflows" / "envbuild.yml"
    path.parent.mkdir(parents=True)
    path.write_bytes(rendered[github.WORKFLOW_PATH])
    assert high(zizmor_findings(path)) == []


def test_selectors_cannot_be_combined_with_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = write_lock(tmp_path, {"h100": Placement(nodes=1)})
    code = main(["ci", "github", "--lock", str(lock), "--driver", "550", "--registry", "ghcr.io/acme/app",
                 "-o", str(tmp_path / "out")], env=ENV)
    assert code == 2 and "stack selectors cannot be combined with --lock" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_selector_mode_picks_distinct_torch_cuda_families(tmp_path: Path) -> None:
    """Without a lock, the top stacks are one per torch × CUDA family: driver 550's ranking puts
    2.5.0 cu124 right after 2.5.1 cu124 (a patch-release neighbour); 2.4.1 cu124 takes its place."""
    out = tmp_path / "out"
    assert main(["ci", "github", "--driver", "550", "--torch", ">=2.4,<2.6", "--registry", "ghcr.io/acme/app",
                 "-o", str(out)], env=ENV) == 0
    include = json.loads((out / github.MATRIX_PATH).read_text())["include"]
    families = [(".".join(e["torch"].split(".")[:2]), e["variant"]) for e in include]
    assert len(set(families)) == len(families) == 4
    ids = [e["id"] for e in include]
    assert "torch2.5.1-cu124-py3.10-ubuntu22.04" in ids and "torch2.5.0-cu124-py3.10-ubuntu22.04" not in ids
