"""Hardening, round four (issue 39): names that become identifiers elsewhere, what CI builds
against the lock, credentials on redirects, bounded reads, fleet verdicts, FIFOs as file
arguments, and the small ones. Each test failed on the tree before its fix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from fleet_lock import IMAGE, matching_lock, write_lock
from test_project import refused

from envbuild.commands.cli import main
from envbuild.fleet.placement import KubernetesPlacement, Placement
from envbuild.render.lockset import LockSet

KUBE = Placement(nodes=1, gpus_per_node=1, kubernetes=KubernetesPlacement(
    node_selector=(("nvidia.com/gpu.product", "NVIDIA-L4"),)))


# --- 1. names that become identifiers (docs/faults.md V14) --------------------------------


def test_targets_that_become_one_job_name_are_refused_at_lock(tmp_path: Path) -> None:
    files = {"envbuild.toml": '[[targets]]\nname = "gpu-a"\n\n[[targets]]\nname = "gpu_a"\n'}
    line = refused(tmp_path, files)
    assert "envbuild.toml:1: targets: targets 'gpu-a' and 'gpu_a' of the project would share the " \
           "Kubernetes Job name 'envbuild-fleet-gpu-a'" in line
    files = {"envbuild.toml": '[[targets]]\nname = "gpu"\n\n[[targets]]\nname = "gpu-"\n'}
    assert "targets 'gpu' and 'gpu-'" in refused(tmp_path, files)


def test_targets_that_become_one_job_name_are_refused_at_fleet_render(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = matching_lock()
    lockset = LockSet(targets={name: replace(base, fleet=KUBE) for name in ("gpu-a", "gpu_a")})
    (tmp_path / "envbuild.lock").write_text(lockset.to_json())
    code = main(["fleet", "render", "--engine", "kubernetes", "--lock", str(tmp_path / "envbuild.lock"),
                 "--image", f"gpu-a={IMAGE}", "--image", f"gpu_a={IMAGE}", "-o", str(tmp_path / "out")],
                env={})
    err = capsys.readouterr().err
    assert code == 2, err
    assert "targets 'gpu-a' and 'gpu_a' of the lock would share the Kubernetes Job name" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gpu-", "a_", "x_-_", "0" * 32, "l4_" + "z" * 29])
def test_every_target_name_gives_a_valid_job(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             name: str) -> None:
    validator = pytest.importorskip("kubernetes_validate")
    lock = write_lock(tmp_path, {name: KUBE})
    out = tmp_path / "out"
    code = main(["fleet", "render", "--engine", "kubernetes", "--lock", str(lock), "--image",
                 f"{name}={IMAGE}", "-o", str(out)], env={})
    assert code == 0, capsys.readouterr().err
    job = yaml.safe_load((out / f"{name}.job.yaml").read_text())
    validator.validate(job, validator.latest_version(), strict=True)
    job_name = job["metadata"]["name"]
    # DNS-1123 label: what the Job's pods carry as their job-name label value (63 at most).
    assert len(job_name) <= 63 and job_name[-1].isalnum() and job_name[0].isalnum()
    assert set(job_name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert json.dumps(job)  # rendered whole
