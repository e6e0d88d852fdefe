"""A fleet with x86 H100 nodes and a GB200 rack (issue 38): ``ci github --lock`` builds each
target's image on a hosted runner of its own platform and verifies it on its platform's runners;
``fleet render`` places each target on nodes of its architecture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fleet_lock import IMAGE, write_lock
from test_ci import ENV, schema_errors, tree

from envbuild.commands.cli import main
from envbuild.fleet.placement import KubernetesPlacement, Placement, SlurmPlacement
from envbuild.render import github

PLATFORMS = {"gb200": "linux/arm64"}


def test_ci_lock_builds_aarch64_targets_on_arm_runners(tmp_path: Path) -> None:
    gh200 = Placement(nodes=2, gpus_per_node=1, runs_on=("self-hosted", "gh200"))
    lock = write_lock(tmp_path, {"h100": Placement(nodes=4, gpus_per_node=8),
                                 "gb200": Placement(nodes=18, gpus_per_node=4), "gh200": gh200},
                      platforms={**PLATFORMS, "gh200": "linux/arm64"})
    out = tmp_path / "out"
    assert main(["ci", "github", "--lock", str(lock), "--registry", "ghcr.io/acme/app", "-o", str(out)],
                env=ENV) == 0
    rendered = tree(out)
    entries = {e["id"]: e for e in json.loads(rendered[github.MATRIX_PATH])["include"]}
    assert entries["gb200"]["build_on"] == "ubuntu-24.04-arm"
    assert entries["gb200"]["platform"] == "linux/arm64"
    assert entries["gb200"]["runs_on"] == ["self-hosted", "ARM64", "gpu"]  # GitHub's label of arm64 runners
    assert entries["gh200"]["runs_on"] == ["self-hosted", "gh200"]  # the target's own runs-on wins
    assert entries["h100"]["build_on"] == "ubuntu-24.04"
    assert entries["h100"]["runs_on"] == ["self-hosted", "gpu"]
    workflow = yaml.safe_load(rendered[github.WORKFLOW_PATH])
    build = workflow["jobs"]["build"]
    assert build["runs-on"] == "${{ matrix.build_on }}"
    step = next(s for s in build["steps"] if s.get("id") == "build")
    assert step["with"]["platforms"] == "${{ matrix.platform }}"  # no emulated cross-build
    assert schema_errors(workflow) == []


def test_fleet_render_places_each_target_on_nodes_of_its_architecture(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kube = KubernetesPlacement(node_selector=(("nvidia.com/gpu.product", "NVIDIA-GB200"),))
    plain = KubernetesPlacement(node_selector=())
    lock = write_lock(tmp_path, {"gb200": Placement(nodes=18, gpus_per_node=4, kubernetes=kube),
                                 "h100": Placement(nodes=4, gpus_per_node=8, kubernetes=plain)},
                      platforms=PLATFORMS)
    out = tmp_path / "k8s"
    code = main(["fleet", "render", "--lock", str(lock), "--engine", "kubernetes",
                 "--image", f"gb200={IMAGE}", "--image", f"h100={IMAGE}", "-o", str(out)], env=ENV)
    assert code == 0, capsys.readouterr().err
    selectors = {name: yaml.safe_load((out / f"{name}.job.yaml").read_text())["spec"]["template"]["spec"]
                 ["nodeSelector"] for name in ("gb200", "h100")}
    assert selectors["gb200"] == {"nvidia.com/gpu.product": "NVIDIA-GB200", "kubernetes.io/arch": "arm64"}
    assert selectors["h100"] == {"kubernetes.io/arch": "amd64"}


def test_a_node_selector_of_the_other_architecture_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kube = KubernetesPlacement(node_selector=(("kubernetes.io/arch", "amd64"),))
    lock = write_lock(tmp_path, {"gb200": Placement(nodes=18, gpus_per_node=4, kubernetes=kube)},
                      platforms=PLATFORMS)
    code = main(["fleet", "render", "--lock", str(lock), "--engine", "kubernetes",
                 "--image", f"gb200={IMAGE}", "-o", str(tmp_path / "k8s")], env=ENV)
    err = capsys.readouterr().err
    assert code == 2 and "node-selector kubernetes.io/arch=amd64, but its stack is linux/arm64" in err
    assert not (tmp_path / "k8s").exists()


def test_slurm_docker_launcher_names_the_platform(tmp_path: Path) -> None:
    slurm = SlurmPlacement(partition="gb200", gres="gpu", launcher="docker", host_python="/usr/bin/python3")
    lock = write_lock(tmp_path, {"gb200": Placement(nodes=18, gpus_per_node=4, slurm=slurm)},
                      platforms=PLATFORMS)
    out = tmp_path / "slurm"
    assert main(["fleet", "render", "--lock", str(lock), "--engine", "slurm",
                 "--image", f"gb200={IMAGE}", "-o", str(out)], env=ENV) == 0
    assert "#SBATCH --partition=gb200" in (out / "gb200.sbatch").read_text()
    assert "docker run --rm --platform linux/arm64 " in (out / "gb200.node.sh").read_text()
