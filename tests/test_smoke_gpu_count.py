"""``smoke --expect-gpus N``: a node with fewer visible GPUs than its type has fails, naming
how many were expected and seen (and which the driver lists that this process does not)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_smoke import by_name, fake_cuda_torch

from envbuild.smoke import __main__ as cli
from envbuild.smoke import runner, suite, t1_correctness
from envbuild.smoke.gpu_count import judge_gpu_count

H100 = "NVIDIA H100 80GB HBM3"

TWO_GPU_SMI = f"""#!/bin/sh
# A stand-in nvidia-smi: the driver lists two H100s, whatever it is asked.
echo "0, {H100}, 550.54.15, 81559"
echo "1, {H100}, 550.54.15, 81559"
"""


def test_seven_of_eight_fails_naming_expected_and_seen() -> None:
    verdict = judge_gpu_count(8, [H100] * 7, [H100] * 7, {})
    assert verdict.status == "fail" and verdict.exit_code == 7
    assert verdict.message == "expected 8 GPUs, 7 visible"
    assert "lost a GPU" in verdict.hint
    assert verdict.value["expected"] == 8 and verdict.value["seen"] == 7


def test_driver_listing_more_than_the_process_sees_names_the_mask() -> None:
    verdict = judge_gpu_count(2, [H100], [H100, H100], {"CUDA_VISIBLE_DEVICES": "0"})
    assert verdict.status == "fail"
    assert verdict.message == (f"expected 2 GPUs, 1 visible; the driver lists 2 ({H100}, {H100}), "
                               "this process sees 1")
    assert "CUDA_VISIBLE_DEVICES=0" in verdict.hint


def test_all_visible_passes_and_more_than_declared_warns() -> None:
    assert judge_gpu_count(2, [H100, H100], None, {}).status == "pass"
    more = judge_gpu_count(1, [H100, H100], None, {})
    assert more.status == "warn" and "gpus-per-node to 2" in more.hint


@pytest.mark.parametrize("text", ["0", "-1", "two", "2.5", "99999"])
def test_expect_gpus_must_be_a_positive_count(text: str) -> None:
    assert cli.main(["--expect-gpus", text, "--tier", "0"]) == 2


def test_smoke_run_fails_on_a_node_missing_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through the whole tier 1 run: torch sees one H100, the driver lists two."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("needs the CPU torch wheel (libcuda must not be loaded for real)")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(TWO_GPU_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    fake_cuda_torch(monkeypatch)
    monkeypatch.setattr(t1_correctness, "list_device_nodes", lambda: [])
    monkeypatch.setattr(t1_correctness, "dxg_present", lambda: False)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
    report = suite.run_smoke(runner.Options(tier=1, expect_gpus=2), env=env)
    count = by_name(report)["gpu.count"]
    assert count["status"] == "fail"
    assert count["message"].startswith("expected 2 GPUs, 1 visible; the driver lists 2")
    assert "CUDA_VISIBLE_DEVICES=1" in count["hint"]
    assert report["exit_code"] == 7
    without = suite.run_smoke(runner.Options(tier=1), env=env)
    assert "gpu.count" not in by_name(without)


def test_cpu_ok_never_applies_the_count() -> None:
    """--cpu-ok on a host without a GPU: the count is a GPU check, skipped, never passed or failed."""
    report = suite.run_smoke(runner.Options(tier=1, cpu_ok=True, expect_gpus=8), env={})
    count = by_name(report)["gpu.count"]
    assert count["status"] == "skip"
