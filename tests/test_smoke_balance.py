"""The speed tier's honesty (docs/faults.md W7-W10): no timing passes while the proofs of GPU work
failed, and the host-balance verdict (can this CPU feed these GPUs) on measured CPU figures here
and on given GPU figures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from envbuild.smoke import balance, runner, suite, t1_correctness, t2_speed

torch = pytest.importorskip("torch")

REF = {"python_loop_us": balance.REFERENCE_PYTHON_US, "torch_dispatch_us": balance.REFERENCE_DISPATCH_US}


def scaled(factor: float) -> dict[str, float]:
    return {k: v * factor for k, v in REF.items()}


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def test_timing_checks_never_pass_on_a_torch_faked_onto_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """W7: the torch of tests/test_smoke.py that claims an H100 and computes on the CPU."""
    if torch.version.cuda is not None:
        pytest.skip("needs the CPU torch wheel (libcuda must not be loaded for real)")
    from test_smoke import fake_cuda_torch

    fake_cuda_torch(monkeypatch)
    monkeypatch.setattr(t1_correctness, "list_device_nodes", lambda: [])
    monkeypatch.setattr(t1_correctness, "dxg_present", lambda: False)
    report = suite.run_smoke(runner.Options(tier=2), env=dict(os.environ))
    checks = by_name(report)
    assert checks["gpu.libcuda"]["status"] == "fail"  # the proofs failed...
    for name in ("h2d_d2h.bandwidth@cuda:0", "launch.latency@cuda:0", "matmul.tflops.bf16@cuda:0",
                 "matmul.tflops.fp32@cuda:0"):
        check = checks[name]  # ... so no timing is passed, or even taken
        assert check["status"] == "skip", check
        assert check["message"].startswith("blocked: the proofs that work ran on the GPU failed")
        assert "gpu.libcuda" in check["message"] and check["hint"].startswith("fix ")
    assert report["exit_code"] == 7


def test_bandwidth_and_latency_refuse_buffers_off_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """W8: even ungated, the timed buffers themselves must live on a CUDA device."""
    fake = fake_torch(monkeypatch)
    run = runner.Run(runner.Options(tier=2), {})
    run.torch = fake
    bandwidth = t2_speed._check_bandwidth(run, 0)
    assert bandwidth.status == "fail"
    assert bandwidth.message.startswith("device buffer result is on cpu, not a CUDA device")
    latency = t2_speed._check_latency(run, 0)
    assert latency.status == "fail" and latency.message.startswith("launch target result is on cpu")


def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    from test_smoke import fake_cuda_torch

    return fake_cuda_torch(monkeypatch)


@pytest.mark.parametrize(
    ("cpu", "cores", "gpus", "pinned", "launch", "status", "words"),
    [
        # 16 cores, one GPU, the reference's speed, a Gen4 x16 link's pinned rate
        (REF, 16, 1, 24.0, 8.0, "pass", "this host can feed 1 GPU at small batch sizes"),
        (REF, 32, 8, 24.0, 8.0, "pass", "this host can feed 8 GPUs"),
        (REF, 8, 4, 24.0, 8.0, "warn", "2.0 cores per GPU (fewer than 4)"),
        (REF, 3, 2, None, None, "fail", "3 cores for 2 GPUs (1.5 per GPU, needs 2)"),
        (scaled(2.5), 16, 1, None, None, "warn", "single-thread speed 2.5x slower"),
        (scaled(4.5), 16, 1, None, None, "fail", "single-thread speed 4.5x slower than the reference"),
        (REF, 16, 1, 3.0, 8.0, "warn", "pinned host-to-device 3.0 GB/s, below a PCIe Gen3 x4 link"),
        (REF, 16, 1, 24.0, 80.0, "warn", "80 us per kernel launch"),
        (REF, 2, 0, None, None, "pass", "no GPU here; by its 2 cores"),
    ],
)
def test_balance_verdicts_on_figures(cpu: dict[str, float], cores: int, gpus: int, pinned: float | None,
                                     launch: float | None, status: str, words: str) -> None:
    """W9: the verdict and its thresholds (docs/host-balance.md), on given figures."""
    verdict = balance.judge_balance(cpu=cpu, cores=cores, gpus=gpus, pinned_h2d_gbs=pinned,
                                    pageable_h2d_gbs=None if pinned is None else pinned / 2,
                                    launch_us=launch)
    assert verdict.status == status, verdict.message
    assert words in verdict.message
    assert status == "pass" or verdict.hint
    assert verdict.value["feedable_gpus"] == (min(gpus, cores // 2) if gpus else cores // 2)


def test_cpu_figures_are_measured_for_real_and_judged() -> None:
    """W10: the CPU parts run here: CPU time per unit, so a busy machine does not move them much."""
    first, second = balance.measure_cpu(torch), balance.measure_cpu(torch)
    for key in ("python_loop_us", "torch_dispatch_us"):
        assert first[key] > 0 and second[key] > 0
        assert max(first[key], second[key]) / min(first[key], second[key]) < 3, (first, second)
    run = runner.Run(runner.Options(tier=2, cpu_ok=True), {})
    run.torch, run.host["usable_cpus"], run.gpu_block = torch, 2, "torch is CPU-only"
    verdict = t2_speed._check_balance(run)
    assert verdict.value["gpus"] == 0 and verdict.value["cores"] == 2
    assert verdict.status == balance.judge_balance(
        cpu={k: verdict.value[k] for k in REF}, cores=2, gpus=0).status


def test_host_balance_is_not_judged_under_emulation() -> None:
    """T15: verify's container under qemu (ENVBUILD_SMOKE_EMULATED set): host balance is a skip
    naming the emulation, never a fail for the emulator's slowness."""
    run = runner.Run(runner.Options(tier=2, cpu_ok=True),
                     {t2_speed.EMULATED_ENV: "linux/arm64 on a linux/amd64 host"})
    run.torch, run.host["usable_cpus"], run.gpu_block = torch, 2, "torch is CPU-only"
    verdict = t2_speed._check_balance(run)
    assert verdict.status == "skip"
    assert "under emulation (linux/arm64 on a linux/amd64 host)" in verdict.message
    assert verdict.value == {"emulated": "linux/arm64 on a linux/amd64 host"}


def test_sourced_peaks_judge_a_cpu_speed_on_an_a100_as_implausible() -> None:
    """W11: A100, V100, P100 rows from NVIDIA's A100 whitepaper, found by the names torch reports."""
    from envbuild.data import matrix as matrixmod
    from envbuild.data.peaks import peaks_table
    from envbuild.smoke import numeric, proof

    table = peaks_table(matrixmod.load(matrixmod.default_directory({})))
    a100 = table["NVIDIA A100-SXM4-40GB"]
    assert (a100["fp32_tflops"], a100["bf16_tflops"], a100["fp16_tflops"]) == (19.5, 312, 312)
    assert a100["source"].endswith("nvidia-ampere-architecture-whitepaper.pdf")
    assert table["Tesla V100"]["fp32_tflops"] == 15.7 and table["Tesla P100"]["fp16_tflops"] == 21.2
    found = numeric.match_peak("NVIDIA A100-SXM4-80GB", table)  # what torch reports on an 80 GB board
    assert found is not None and found[0] == "NVIDIA A100-SXM4-40GB"
    cpu_like = proof.judge_tflops("bf16 matmul 0.4 TFLOPS", 0.4, found[1]["bf16_tflops"], {},
                                  name="NVIDIA A100-SXM4-80GB", where="smoke_peaks.json",
                                  warn_fraction=t2_speed.PEAK_FRACTION_WARN)
    assert cpu_like.status == "fail" and "implausibly slow" in cpu_like.message
    found = numeric.match_peak("Tesla P100-PCIE-16GB", table)
    assert found is not None and found[0] == "Tesla P100"
