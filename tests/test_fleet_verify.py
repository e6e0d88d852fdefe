"""The fleet's flow and report without a scheduler: a stand-in engine (deadline, fewer nodes
answering), the verdict read from each node's smoke report, the HTML page, and the Kubernetes
path through a stand-in ``kubectl`` this test writes, which answers as kubectl does (no API
server installs here)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import schemas
from fleet_lock import IMAGE, write_lock

from envbuild.commands.cli import main
from envbuild.fleet.placement import KubernetesPlacement, Placement
from envbuild.fleet.plan import FleetTarget
from envbuild.fleet.report import FleetReport, NodeResult, TargetResult, node_result, render_html
from envbuild.fleet.verify import run_fleet


def smoke_report(*checks: tuple[str, str, str, str], code: int = 0) -> dict[str, object]:
    return {"schema": "envbuild.smoke/1", "exit_code": code, "tiers": [0, 1, 2],
            "checks": [{"name": n, "status": s, "message": m, "hint": h} for n, s, m, h in checks]}


# What a node must show to pass (docs/faults.md V15): its tiers, torch, the GPUs seen and counted.
PASSING = smoke_report(("torch.import", "pass", "torch 2.13.0", ""), ("gpu.visible", "pass", "8 GPU(s)", ""),
                       ("gpu.count", "pass", "8 GPUs", ""))
SEVEN_OF_EIGHT = smoke_report(("gpu.visible", "pass", "7 GPU(s)", ""),
                              ("gpu.count", "fail", "expected 8 GPUs, 7 visible", "drain the node"), code=7)


def test_node_verdicts_from_smoke_reports() -> None:
    assert node_result("n1", PASSING).status == "pass"
    failed = node_result("n2", SEVEN_OF_EIGHT)
    assert (failed.status, failed.check, failed.message, failed.hint, failed.exit_code) == \
        ("fail", "gpu.count", "expected 8 GPUs, 7 visible", "drain the node", 7)
    warned = node_result("n3", smoke_report(("shm", "warn", "64 MB /dev/shm", "--shm-size")))
    assert (warned.status, warned.check) == ("warn", "shm")
    broken = node_result("n4", {"schema": "envbuild.fleet-node/1", "exit_code": 127}, "python: not found")
    assert broken.status == "fail" and broken.check == "launcher" and "python: not found" in broken.message
    assert node_result("n5", ["not", "a", "report"]).status == "fail"


@dataclass(frozen=True)
class Job:
    target: FleetTarget
    job: str = "1"
    problem: str = ""


class StandInEngine:
    """Answers as an engine would: ``answers`` nodes per target; ``slow`` targets never finish."""

    name = "stand-in"

    def __init__(self, answers: dict[str, list[NodeResult]], slow: tuple[str, ...] = ()) -> None:
        self.answers, self.slow = answers, slow
        self.cancelled: list[str] = []

    def submit(self, target: FleetTarget) -> Job:
        return Job(target=target)

    def finished(self, submission: Job) -> bool:
        return submission.target.name not in self.slow

    def cancel(self, submission: Job) -> None:
        self.cancelled.append(submission.target.name)

    def final_state(self, submission: Job) -> str:
        return "COMPLETED"

    def collect(self, submission: Job) -> tuple[NodeResult, ...]:
        return tuple(self.answers.get(submission.target.name, []))


def fleet_target(name: str, nodes: int) -> FleetTarget:
    return FleetTarget(name=name, placement=Placement(nodes=nodes), nodes=nodes, gpus_per_node=8, image=IMAGE)


def ok(node: str) -> NodeResult:
    return NodeResult(node=node, status="pass")


def test_fewer_nodes_answering_than_declared_fails_naming_the_target() -> None:
    engine = StandInEngine({"h100": [ok("n1"), ok("n2"), ok("n3")], "a10": [ok("m1")]})
    report = run_fleet(engine, [fleet_target("h100", 4), fleet_target("a10", 1)], deadline=60)
    assert not report.passed
    h100, a10 = report.targets
    assert h100.status == "fail" and h100.why() == "target h100: 3 of 4 nodes answered (job 1 COMPLETED)"
    assert a10.status == "pass"


def test_the_deadline_cancels_what_still_runs() -> None:
    ticks = iter(range(0, 1000, 10))
    engine = StandInEngine({"h100": [ok("n1")]}, slow=("h100",))
    report = run_fleet(engine, [fleet_target("h100", 2)], deadline=30, clock=lambda: float(next(ticks)),
                       sleep=lambda s: None)
    assert engine.cancelled == ["h100"]
    assert report.targets[0].why() == \
        "target h100: deadline passed with 1 of 2 nodes answered (job cancelled)"


def test_html_page_is_one_self_contained_grid() -> None:
    report = FleetReport(engine="slurm", targets=(
        TargetResult(target="h100", expected=3, nodes=(ok("n1"), node_result("n2<b>", SEVEN_OF_EIGHT))),
        TargetResult(target="a10", expected=1, nodes=(ok("m1"),))))
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>") and "FAIL" in page
    for external in ("<script", "<link", "src=", "url(", "http://", "https://"):
        assert external not in page
    assert "n2&lt;b&gt;" in page and "<b>n2<b>" not in page  # node names escaped
    assert page.count('class="cell missing"') == 1  # h100's third node never answered
    assert page.count('class="cell pass"') == 2 and page.count('class="cell fail"') == 1


KUBECTL = '''#!{python} -S
"""A stand-in kubectl: answers apply, delete, get job, get pods and logs as kubectl does,
from the pods described in $FAKE_KUBE/pods.json; every argv is appended to $FAKE_KUBE/argv."""
import json, os, sys
state = os.environ["FAKE_KUBE"]
argv = sys.argv[1:]
with open(os.path.join(state, "argv"), "a") as log:
    log.write(json.dumps(argv) + "\\n")
pods = json.load(open(os.path.join(state, "pods.json")))
if argv[0] == "apply":
    name = "envbuild-fleet-" + os.path.basename(argv[2]).split(".")[0]
    print("job.batch/%s created" % name)
elif argv[0] == "delete":
    pass
elif argv[:2] == ["get", "job"]:
    failed = any(p["report"] is None or p["report"].get("exit_code") for p in pods.get(argv[2], []))
    kind = "Failed" if failed else "Complete"
    print(json.dumps({{"kind": "Job", "status": {{"conditions": [{{"type": kind, "status": "True"}}]}}}}))
elif argv[:2] == ["get", "pods"]:
    job = argv[3].split("=", 1)[1]
    items = [{{"metadata": {{"name": "%s-%d" % (job, i)}},
              "spec": {{"nodeName": p["node"]}} if p["node"] else {{}}}}
             for i, p in enumerate(pods.get(job, []))]
    print(json.dumps({{"kind": "List", "items": items}}))
elif argv[0] == "logs":
    job, index = argv[1].rsplit("-", 1)
    print("UserWarning: Failed to initialize NumPy")  # stderr, interleaved as kubectl logs does
    print(json.dumps(pods[job][int(index)]["report"], indent=2))
else:
    sys.stderr.write("error: unknown command %r\\n" % argv)
    sys.exit(1)
'''


def test_kubernetes_verify_through_a_stand_in_kubectl(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    state = tmp_path / "kube"
    state.mkdir()
    (state / "pods.json").write_text(json.dumps({
        "envbuild-fleet-h100": [{"node": "gpu-1", "report": PASSING},
                                {"node": "gpu-2", "report": SEVEN_OF_EIGHT}],
        "envbuild-fleet-l4": [{"node": "l4-1", "report": PASSING}, {"node": "", "report": None}],
    }))
    selector = KubernetesPlacement(node_selector=(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),))
    lock = write_lock(tmp_path, {"h100": Placement(nodes=2, gpus_per_node=8, kubernetes=selector),
                                 "l4": Placement(nodes=2, gpus_per_node=1, kubernetes=selector)})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_KUBE": str(state)}
    code = main(["fleet", "verify", "--engine", "kubernetes", "--lock", str(lock), "--image", f"h100={IMAGE}",
                 "--image", f"l4={IMAGE}", "--dir", str(tmp_path / "fleet"), "--deadline", "30"], env=env)
    out, err = capsys.readouterr()
    assert code == 7
    assert "target h100: failed on gpu-2" in err and "target l4: 1 of 2 nodes answered" in err
    assert "gpu-2                    FAIL  gpu.count: expected 8 GPUs, 7 visible — drain the node" in out
    calls = [json.loads(line) for line in (state / "argv").read_text().splitlines()]
    assert ["apply", "-f", "h100.job.yaml"] in calls and ["logs", "envbuild-fleet-h100-1"] in calls
    assert (tmp_path / "fleet" / "h100.job.yaml").is_file()
    saved = json.loads((tmp_path / "fleet" / "fleet-report.json").read_text())
    schemas.check("fleet.schema.json", saved)
    assert saved["schema"] == "envbuild.fleet/1" and saved["engine"] == "kubernetes"


def test_a_missing_kubectl_is_exit_5(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    selector = KubernetesPlacement(node_selector=(("nvidia.com/gpu.count", "8"),))
    lock = write_lock(tmp_path, {"h100": Placement(nodes=1, gpus_per_node=8, kubernetes=selector)})
    code = main(["fleet", "verify", "--engine", "kubernetes", "--lock", str(lock), "--image", f"h100={IMAGE}",
                 "--dir", str(tmp_path / "fleet")], env={"PATH": str(tmp_path / "nothing")})
    assert code == 5
    assert capsys.readouterr().err.startswith("envbuild: error[scheduler]: kubectl not found")


def test_a_missing_sbatch_is_exit_5(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from envbuild.fleet.placement import SlurmPlacement

    lock = write_lock(tmp_path, {"a": Placement(nodes=1, gpus_per_node=1,
                                                slurm=SlurmPlacement(partition="a", launcher="host"))})
    code = main(["fleet", "verify", "--engine", "slurm", "--lock", str(lock),
                 "--dir", str(tmp_path / "fleet")], env={"PATH": str(tmp_path / "nothing")})
    assert code == 5
    err = capsys.readouterr().err
    assert err.startswith("envbuild: error[scheduler]: sinfo not found — run on a Slurm login node")


def test_the_report_is_found_in_logs_that_interleave_stderr() -> None:
    from envbuild.fleet.kubernetes import report_from_logs

    text = "warning: {not json\n" + json.dumps(SEVEN_OF_EIGHT, indent=2) + "\n"
    assert report_from_logs(text) == SEVEN_OF_EIGHT
    assert report_from_logs(json.dumps(PASSING)) == PASSING
    assert report_from_logs("Error: ImagePullBackOff\n") is None
