"""``smoke --expect-gpus N``: a node with fewer visible GPUs than its type has fails, naming
how many were expected and seen (and which the driver lists that this process does not)."""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

import pytest

from envbuild.smoke import __main__ as cli
from envbuild.smoke import runner, t0_environment, t1_correctness
from envbuild.smoke.compiling import Pending
from envbuild.smoke.gpu_count import judge_gpu_count
from envbuild.smoke.report import skip

H100 = "NVIDIA H100 80GB HBM3"

TWO_GPU_SMI = f"""#!/bin/sh
# A stand-in nvidia-smi: the driver lists two H100s, whatever it is asked.
echo "0, {H100}, 550.54.15, 81559"
echo "1, {H100}, 550.54.15, 81559"
"""


def one_h100_torch() -> Any:
    """What _check_visible asks of torch, answered for one visible H100 (no torch imported)."""
    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, init=lambda: None,
        get_device_capability=lambda i=0: (9, 0), get_device_name=lambda i=0: H100,
        get_device_properties=lambda i=0: types.SimpleNamespace(total_memory=80 << 30,
                                                                multi_processor_count=132),
        get_arch_list=lambda: ["sm_90"])
    return types.SimpleNamespace(cuda=cuda, version=types.SimpleNamespace(cuda="12.4", hip=None))


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
    """The run's own facts: torch (a stand-in) sees one H100, the driver (a stand-in nvidia-smi) lists
    two. The checks run as tier 0 and 1 run them, without tier 1's CPU-heavy rest."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(TWO_GPU_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    fake = one_h100_torch()
    run = runner.Run(runner.Options(tier=1, expect_gpus=2), {**os.environ, "CUDA_VISIBLE_DEVICES": "1"})
    run.torch = fake
    assert run.check("driver", 0, lambda: t0_environment._check_driver(run)).status == "pass"
    assert run.check("gpu.visible", 1, lambda: t1_correctness._check_visible(run), gpu=True).status == "pass"
    count = run.check("gpu.count", 1, lambda: t1_correctness._check_count(run), gpu=True)
    assert count.status == "fail" and count.exit_code == 7
    assert count.message.startswith("expected 2 GPUs, 1 visible; the driver lists 2")
    assert "CUDA_VISIBLE_DEVICES=1" in count.hint


def test_cpu_ok_never_applies_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tier 1 adds gpu.count only with --expect-gpus; on a host without a GPU under --cpu-ok it
    is a GPU check, skipped: never passed, never failed. Tier 1's real compile (a child process,
    15 s) proves nothing here: tests/test_smoke.py's --cpu-ok run compiles for real."""
    monkeypatch.setattr(t1_correctness, "check_compile", lambda *args: skip("not compiled in this test"))
    monkeypatch.setattr(t1_correctness, "begin_compile",
                        lambda torch, device, env: Pending(device, skip("not compiled in this test")))
    for expect, present in ((8, True), (None, False)):
        run = runner.Run(runner.Options(tier=1, cpu_ok=True, expect_gpus=expect), {})
        run.torch = one_h100_torch()
        run.torch.cuda.is_available = lambda: False
        run.torch.cuda.device_count = lambda: 0
        t1_correctness.tier1(run)
        checks = {c.name: c for c in run.checks}
        assert ("gpu.count" in checks) is present
        if present:
            assert checks["gpu.count"].status == "skip"
