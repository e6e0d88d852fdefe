"""The fleet keys of a target (nodes, gpus-per-node, runs-on, slurm, kubernetes): validated like
every other key (exit 2 naming FILE:LINE: KEY) and carried into the lock (schema 2 targets)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_lock_command import env, indexes, project, run  # noqa: F401 (fixtures used below)
from test_project import load, refused

from envbuild.fleet.placement import DEFAULT_HOST_PYTHON, KubernetesPlacement, Placement, SlurmPlacement
from envbuild.render import lock as lockmod
from envbuild.render import lockset

H100 = """
[[targets]]
name = "h100"
gpus = ["H100"]
nodes = 4
gpus-per-node = 8
runs-on = ["self-hosted", "gpu", "h100"]
slurm = { partition = "h100", gres = "gpu:h100", launcher = "docker" }
kubernetes = { node-selector = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3" } }

[[targets]]
name = "a10"
gpus = ["A10"]
"""


def test_the_issue_example_reads_into_placements(tmp_path: Path) -> None:
    project = load(tmp_path, {"envbuild.toml": H100})
    h100 = project.target("h100").placement
    assert h100 == Placement(
        nodes=4, gpus_per_node=8, runs_on=("self-hosted", "gpu", "h100"),
        slurm=SlurmPlacement(partition="h100", gres="gpu:h100", launcher="docker",
                             host_python=DEFAULT_HOST_PYTHON),
        kubernetes=KubernetesPlacement(node_selector=(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),)))
    assert project.target("a10").placement.is_empty()


def test_single_target_file_takes_them_at_the_top(tmp_path: Path) -> None:
    text = 'nodes = 2\ngpus-per-node = 1\nslurm = { partition = "debug", launcher = "host" }\n'
    placement = load(tmp_path, {"envbuild.toml": text}).target("default").placement
    assert placement.nodes == 2 and placement.slurm is not None
    assert placement.slurm.gres == "gpu" and placement.slurm.host_python == DEFAULT_HOST_PYTHON


@pytest.mark.parametrize(("line", "where", "problem"), [
    ("nodes = 0", "envbuild.toml:4: targets[0].nodes", "nodes must be a whole number from 1 to 10000"),
    ("nodes = true", "envbuild.toml:4: targets[0].nodes", "whole number"),
    ('gpus-per-node = "8"', "envbuild.toml:4: targets[0].gpus-per-node", "whole number from 1 to 1024"),
    ('runs-on = ["gpu", "a b"]', "envbuild.toml:4: targets[0].runs-on[1]", "invalid runner label 'a b'"),
    ('slurm = { partition = "h100", launcher = "srun" }', "envbuild.toml:4: targets[0].slurm.launcher",
     "unknown launcher 'srun' — docker | pyxis | apptainer | host"),
    ('slurm = { partition = "h100; rm -rf /" }', "envbuild.toml:4: targets[0].slurm.partition",
     "invalid Slurm partition"),
    ('slurm = { partition = "h100", gres = "gpu:h100:8" }', "envbuild.toml:4: targets[0].slurm.gres",
     "the count comes from gpus-per-node"),
    ('slurm = { launcher = "host" }', "envbuild.toml:4: targets[0].slurm", "needs a partition"),
    ('slurm = { partition = "p", host-python = "venv/bin/python" }',
     "envbuild.toml:4: targets[0].slurm.host-python", "an absolute path"),
    ('slurm = { partition = "p", host-python = "/opt/../bin/sh" }',
     "envbuild.toml:4: targets[0].slurm.host-python", "invalid host-python"),
    ('slurm = { partition = "p", launchr = "host" }', "envbuild.toml:4: targets[0].slurm.launchr",
     "did you mean 'launcher'?"),
    ('slurm = "h100"', "envbuild.toml:4: targets[0].slurm", "expected a table"),
    ('kubernetes = { node-selector = { "bad key!" = "x" } }',
     'envbuild.toml:4: targets[0].kubernetes.node-selector."bad key!"', "invalid node label key"),
    ('kubernetes = { node-selector = { "nvidia.com/gpu.product" = "H100 80GB" } }',
     "envbuild.toml:4: targets[0].kubernetes.node-selector", "invalid node label value"),
    ("kubernetes = { node-selector = {} }", "envbuild.toml:4: targets[0].kubernetes.node-selector",
     "expected a table of node labels"),
])
def test_bad_fleet_values_name_file_line_and_key(tmp_path: Path, line: str, where: str, problem: str) -> None:
    text = f'[[targets]]\nname = "h100"\ngpus = ["H100"]\n{line}\n'
    message = refused(tmp_path, {"envbuild.toml": text})
    assert message.startswith(f"envbuild: error[usage]: {where}"), message
    assert problem in message


def test_fleet_keys_at_the_top_cannot_be_combined_with_targets(tmp_path: Path) -> None:
    message = refused(tmp_path, {"envbuild.toml": 'nodes = 2\n[[targets]]\nname = "a"\n'})
    assert "envbuild.toml:1: nodes: cannot be combined with targets" in message


def _lock_mapping() -> dict[str, object]:
    """A valid per-target lock object (from the golden schema-1 lock in the tests' fixtures)."""
    for path in sorted(Path(__file__).parent.joinpath("golden").rglob("envbuild.lock")):
        data = json.loads(path.read_text())
        if data.get("schema") == 1:
            return dict(data)
    pytest.skip("no schema-1 golden lock")


def test_the_lock_carries_the_placement_and_reads_it_back() -> None:
    placement = Placement(nodes=2, gpus_per_node=1, runs_on=("gpu",),
                          slurm=SlurmPlacement(partition="debug", launcher="host"),
                          kubernetes=KubernetesPlacement(node_selector=(("nvidia.com/gpu.count", "1"),)))
    lock = lockmod.from_json(json.dumps(_lock_mapping()))
    written = lockset.LockSet(targets={"h100": replace(lock, fleet=placement)}).to_json()
    assert json.loads(written)["targets"]["h100"]["fleet"]["slurm"]["launcher"] == "host"
    again = lockset.from_json(written)
    assert again.targets["h100"].fleet == placement
    # A lock written before the fleet keys reads the same, with no placement.
    assert lockmod.from_json(json.dumps(_lock_mapping())).fleet is None


@pytest.mark.parametrize("fleet", [
    {"slurm": {"partition": "p", "gres": "gpu", "launcher": "host", "host-python": "/bin/sh -c id"}},
    {"slurm": {"partition": "p", "gres": "gpu", "launcher": "ssh", "host-python": DEFAULT_HOST_PYTHON}},
    {"nodes": "4"},
    {"kubernetes": {"node-selector": {"a": "b\nc"}}},
    {"rack": 3},
])
def test_a_hostile_lock_placement_is_refused(fleet: dict[str, object]) -> None:
    data = {**_lock_mapping(), "fleet": fleet}
    with pytest.raises(lockmod.UsageError):
        lockmod.from_json(json.dumps(data))


def test_envbuild_lock_carries_the_fleet_keys_to_fleet_render(
        tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811 (test_lock_command's fixtures)
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Project file → envbuild lock → fleet render, through the commands (uv on local indexes)."""
    keys = 'nodes = 2\ngpus-per-node = 1\nslurm = { partition = "debug", launcher = "host" }\n'
    monkeypatch.chdir(project(tmp_path, indexes, targets=keys))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    fleet = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["fleet"]
    assert fleet == {"nodes": 2, "gpus-per-node": 1, "slurm": {
        "partition": "debug", "gres": "gpu", "launcher": "host", "host-python": DEFAULT_HOST_PYTHON}}
    assert run(capsys, env, "lock", "--check")[0] == 0
    code, _, err = run(capsys, env, "fleet", "render", "--engine", "slurm", "-o", "out")
    assert code == 0, err
    assert "#SBATCH --nodes=2" in (tmp_path / "out" / "default.sbatch").read_text().splitlines()
    assert "--expect-gpus 1" in (tmp_path / "out" / "default.node.sh").read_text()
    # ci github --lock: the target's context installs exactly its pylock (docs/faults.md V12).
    code, _, err = run(capsys, env, "ci", "github", "--lock", "envbuild.lock",
                       "--registry", "ghcr.io/acme/app", "-o", "ci")
    assert code == 0, err
    context = tmp_path / "ci" / "stacks" / "default"
    assert (context / "pylock.toml").read_bytes() == (tmp_path / "pylock.toml").read_bytes()
    baked = json.loads((context / "envbuild.lock").read_text())
    assert baked["targets"]["default"]["pylock"]["sha256"] == \
        json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["pylock"]["sha256"]
    assert "--require-hashes" in (context / "Dockerfile").read_text()
