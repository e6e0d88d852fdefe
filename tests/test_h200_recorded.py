"""What a real NVIDIA H200 host printed (2026-11-28, scripts/gpu-check.sh through the device
tool: driver 580.159.04, torch 2.11.0+cu130, Python 3.12.3, Ubuntu 24.04), held against the
contracts and the bundled data.

The documents are envbuild's own output there (smoke reports, detect and resolve JSON,
diagnose reports), so each must fit its published schema; and the stack that machine really
runs must be one `resolve` offers for its driver and GPU, with the same cuDNN, companions and
compiled architectures. docs/reports/gpu-h200-2026-11-28.md tells the whole run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import schemas

from envbuild.commands.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMOKE = FIXTURES / "smoke" / "h200-2026-11-28"
HOST = FIXTURES / "host"
DIAGNOSE = FIXTURES / "diagnose" / "h200-2026-11-28"


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", sorted(SMOKE.glob("*.json")), ids=lambda p: p.name)
def test_recorded_smoke_reports_fit_the_schema(path: Path) -> None:
    schemas.check("smoke.schema.json", load(path))


@pytest.mark.parametrize("name", ["h200_580_detect_nvml.json", "h200_580_detect_smi.json"])
def test_recorded_detect_fits_the_schema(name: str) -> None:
    schemas.check("detect.schema.json", load(HOST / name))


def test_recorded_resolve_fits_the_schema() -> None:
    schemas.check("resolve.schema.json", load(HOST / "h200_580_resolve_host.json"))


@pytest.mark.parametrize("path", sorted(DIAGNOSE.glob("report-*.json")), ids=lambda p: p.name)
def test_recorded_diagnose_reports_fit_the_schema(path: Path) -> None:
    schemas.check("diagnose.schema.json", load(path))


def test_the_machines_own_stack_is_one_resolve_offers(capsys: pytest.CaptureFixture[str]) -> None:
    """torch, CUDA, cuDNN and the compiled architectures as torch reported them on the H200,
    against `resolve --driver <its driver> --gpu <its GPU> --torch <its torch>`."""
    smoke = load(SMOKE / "tier-4-cold.json")
    torch, host = smoke["torch"], smoke["host"]
    driver = next(c for c in smoke["checks"] if c["name"] == "driver")["value"]["version"]
    version, variant = torch["version"].split("+")
    gpu = torch["devices"][0]["name"]
    code = main(["resolve", "--json", "--driver", driver, "--gpu", gpu, "--torch", version,
                 "--variant", variant], env={})
    assert code == 0
    stacks = json.loads(capsys.readouterr().out)["stacks"]
    python = ".".join(host["python"].split(".")[:2])
    mine = [s for s in stacks if s["python"] == python and s["ubuntu"] == "24.04"]
    assert len(mine) == 1, stacks
    stack = mine[0]
    assert stack["cuda"] == torch["cuda"] == "13.0"
    major, minor, patch = stack["cudnn"].split(".")[:3]
    assert int(major) * 10000 + int(minor) * 100 + int(patch) == torch["cudnn"] == 91900
    assert stack["arch_list"] == torch["arch_list"]
    assert stack["compat"] == "native"
    machine = (HOST / "h200_580_machine.txt").read_text(encoding="utf-8")
    assert f"torch {torch['version']} cuda {torch['cuda']} cudnn {torch['cudnn']}" in machine
    assert 'VERSION_ID="24.04"' in machine


def test_recorded_smoke_on_the_h200() -> None:
    report = load(SMOKE / "tier-4-cold.json")
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert report["exit_code"] == 0 and report["summary"]["fail"] == 0
    assert status["torch.compile"] == "pass" and status["gpu.arch@cuda:0"] == "pass"
    # No NVIDIA-sourced H200 row in matrices/gpu_peaks.yaml (GAPS-gpus.md): measured, not judged
    for dtype in ("bf16", "fp32"):
        check = next(c for c in report["checks"] if c["name"] == f"matmul.tflops.{dtype}@cuda:0")
        assert check["status"] == "warn" and "no peak row for NVIDIA H200" in check["message"]
        assert check["value"]["peak_tflops"] is None and check["value"]["tflops"] > 0
    assert {status[n] for n in ("p2p.access", "topology", "nccl.allreduce")} == {"skip"}  # one GPU


def test_recorded_node_missing_a_gpu_fails_the_count() -> None:
    report = load(SMOKE / "expect-2-gpus.json")
    count = next(c for c in report["checks"] if c["name"] == "gpu.count")
    assert report["exit_code"] == 7 and count["status"] == "fail"
    assert count["message"] == "expected 2 GPUs, 1 visible" and "drain it" in count["hint"]
