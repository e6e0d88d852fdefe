"""``envbuild fleet verify --engine slurm`` against a real Slurm (tests/slurm_cluster.py): two
node types as two partitions, each node running the smoke test with the ``host`` launcher.
A node planted to fail (its host-python is an interpreter without torch) fails the fleet and
is named; a target asking for more nodes than its partition has fails, naming the target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_lock import write_lock
from slurm_cluster import Cluster, missing_binaries, slurm_cluster

from envbuild.commands.cli import main
from envbuild.fleet.placement import Placement, SlurmPlacement

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = missing_binaries()
    if missing:
        message = f"no {', '.join(missing)} (apt-get install slurm-wlm munge)"
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail(f"ENVBUILD_REQUIRE_DOCKER is set but there is {message}")
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("the test Slurm runs its daemons as root (mknod, SlurmUser=root)")
    pytest.importorskip("torch")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def target(partition: str, python: str, nodes: int = 1) -> Placement:
    return Placement(nodes=nodes, gpus_per_node=1,
                     slurm=SlurmPlacement(partition=partition, gres=f"gpu:{partition}", launcher="host",
                                          host_python=python))


def verify(cluster: Cluster, tmp_path: Path, placements: dict[str, Placement],
           capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    lock = write_lock(tmp_path, placements)
    code = main(["fleet", "verify", "--engine", "slurm", "--lock", str(lock), "--cpu-ok", "--tier", "1",
                 "--dir", str(tmp_path / "fleet"), "--deadline", "240", *extra], env=cluster.env)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_node_planted_to_fail_fails_the_fleet_and_is_named(cluster: Cluster, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    bare = tmp_path / "bare"  # an interpreter without torch: the planted node's host-python
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    placements = {"typea": target("typea", sys.executable), "typeb": target("typeb", f"{bare}/bin/python")}
    code, out, err = verify(cluster, tmp_path, placements, capsys, "--json")
    assert code == 7, err
    assert err.startswith("envbuild: error[smoke]: fleet verify failed: target typeb: failed on nodeb")
    report = json.loads(out)
    assert report["schema"] == "envbuild.fleet/1" and report["engine"] == "slurm" and not report["passed"]
    by_target = {t["target"]: t for t in report["targets"]}
    assert by_target["typea"]["status"] == "pass"
    assert [n["node"] for n in by_target["typea"]["nodes"]] == ["nodea"]
    nodeb = by_target["typeb"]["nodes"][0]
    assert (nodeb["node"], nodeb["status"], nodeb["check"]) == ("nodeb", "fail", "torch.import")
    assert "No module named 'torch'" in nodeb["message"] and f"{bare}/bin/python" in nodeb["hint"]
    page = (tmp_path / "fleet" / "fleet-report.html").read_text()
    assert "nodeb" in page and 'class="cell fail"' in page and "<link" not in page and "<script" not in page


def test_every_node_passing_exits_0_with_the_table(cluster: Cluster, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    placements = {"typea": target("typea", sys.executable), "typeb": target("typeb", sys.executable)}
    code, out, err = verify(cluster, tmp_path, placements, capsys)
    assert code == 0, err + out
    lines = out.splitlines()
    assert lines[0] == "fleet (slurm): PASS"
    assert any(line.split()[:2] == ["nodea", "PASS"] for line in lines)
    assert any(line.split()[:2] == ["nodeb", "PASS"] for line in lines)


def test_more_nodes_than_the_partition_has_fails_naming_the_target(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = verify(cluster, tmp_path, {"typea": target("typea", sys.executable, nodes=2)}, capsys)
    assert code == 7
    assert "target typea: partition typea has 1 node, the target declares 2" in err
    assert "typea: FAIL (0 of 2 nodes answered)" in out
