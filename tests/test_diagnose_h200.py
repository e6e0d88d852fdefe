"""`envbuild diagnose` on what an NVIDIA H200 recorded (2026-11-28, scripts/gpu-check.sh).

The reports in tests/fixtures/diagnose/h200-2026-11-28 are what diagnose printed for three real
training jobs (bench/gpu_job.py) before the fix below: each report's timeline holds the GPU
utilisation samples as NVML or nvidia-smi gave them, and its probe section the loop's totals.
Replayed here through today's rules. The recorded verdict of the two GPU-bound jobs was
`sync-bound`: the utilisation was averaged over the whole run, 9 s of which were the job's
start (interpreter, `import torch`, CUDA initialisation) with the GPU idle, around an 8 s loop
that kept it 99% busy. The `*-stream.csv` files are nvidia-smi's own lines of the same machine,
idle and under the compute job (pid in busy-pid.txt).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envbuild.diagnose import gpu, report
from envbuild.diagnose.evidence import Recording
from envbuild.diagnose.verdict import GPU_BOUND_PCT

RUN = Path(__file__).resolve().parent / "fixtures" / "diagnose" / "h200-2026-11-28"
PID = 4242


def recorded(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((RUN / f"report-{name}.json").read_text())
    return found


def replay(name: str) -> dict[str, Any]:
    """The recording behind a saved report, rebuilt: every GPU sample of its timeline, and one
    probe window from the first to the last window the probe wrote (their midpoints: inside
    the loop) carrying the loop's recorded totals."""
    saved = recorded(name)
    line, probe, card = saved["timeline"], saved["probe"], saved["gpu"]
    samples = tuple(
        gpu.GpuSample(t=t, index=card["index"], name=card["name"], util_pct=util,
                      mem_total_mib=card["mem_total_mib"], power_limit_w=card["power_limit_w"],
                      processes=((PID, card["job_mem_mib"]),) if card["job_on_gpu"] else ())
        for t, util in line["gpu_util_pct"])
    t0, t1 = line["data_wait_pct"][0][0], line["data_wait_pct"][-1][0]
    span = t1 - t0
    window = {"kind": "window", "pid": PID, "t0": t0, "t1": t1, "batches": probe["batches"],
              "steps": probe["steps"], "periods": probe["steps"],
              "period_s": probe["step_period_ms"] / 1000 * probe["steps"],
              "data_wait_s": probe["data_wait_frac"] * span, "first_wait_s": 0.0,
              "h2d": probe["h2d_per_step"] * probe["steps"], "h2d_bytes": 0,
              "h2d_s": probe["h2d_frac"] * span, "syncs": probe["syncs_per_step"] * probe["steps"],
              "sync_s": probe["sync_frac"] * span, "param_device": probe["param_device"]}
    records = ({"kind": "hello", "pid": PID, "torch_cuda": probe["torch_cuda"]}, window,
               {"kind": "bye", "pid": PID, "cuda_initialized": probe["cuda_initialized"]})
    rec = Recording(seconds=saved["seconds"], gpu=samples, gpu_source=saved["gpu_source"],
                    probe=records, job_pids=frozenset({PID}))
    return report.diagnose(rec, command=saved["command"])


@pytest.mark.parametrize(("name", "expected"), [
    ("compute-0-diag", "gpu-bound"),       # batches made on the GPU, 24 bf16 products a step
    ("compute-smi-diag", "gpu-bound"),     # the same, sampled through nvidia-smi
    ("loader-8-0-diag", "gpu-bound"),      # a slow DataLoader with 8 workers keeps up
    ("loader-0-0-diag", "input-bound"),    # the same DataLoader without workers
])
def test_real_jobs_get_their_verdict(name: str, expected: str) -> None:
    assert replay(name)["verdict"] == expected


@pytest.mark.parametrize("name", ["compute-0-diag", "compute-smi-diag", "loader-8-0-diag"])
def test_utilisation_is_the_loops_not_the_start_ups(name: str) -> None:
    saved, now = recorded(name), replay(name)
    assert saved["verdict"] == "sync-bound" and saved["gpu"]["util_mean"] < 50  # as recorded
    assert now["gpu"]["util_mean"] >= GPU_BOUND_PCT  # 86-99%: the first window holds the workers' start
    assert "sync-bound" not in [f["kind"] for f in now["findings"]]


def test_a_loop_without_enough_samples_falls_back_to_the_whole_run() -> None:
    saved = recorded("compute-0-diag")
    samples = tuple(gpu.GpuSample(t=t, index=0, name="NVIDIA H200", util_pct=u)
                    for t, u in saved["timeline"]["gpu_util_pct"])
    # a loop of 0.3 s holds no two samples (0.55 s apart): every sample counts
    window = {"kind": "window", "pid": PID, "t0": 10.0, "t1": 10.3, "steps": 7, "batches": 0}
    rec = Recording(seconds=17.0, gpu=samples, gpu_source="nvml", job_pids=frozenset({PID}),
                    probe=({"kind": "hello", "pid": PID, "torch_cuda": "13.0"}, window))
    found = report.diagnose(rec, command=["python", "job.py"])
    every = [u for _, u in saved["timeline"]["gpu_util_pct"]]
    assert found["gpu"]["util_mean"] == pytest.approx(sum(every) / len(every), abs=1e-3)


def test_recorded_nvidia_smi_lines_parse() -> None:
    apps = (RUN / "busy-apps.csv").read_text()
    pid = int((RUN / "busy-pid.txt").read_text())
    busy = [s for i, line in enumerate((RUN / "busy-stream.csv").read_text().splitlines())
            for s in gpu.parse_smi_csv(line, float(i), apps)]
    idle = [s for i, line in enumerate((RUN / "idle-stream.csv").read_text().splitlines())
            for s in gpu.parse_smi_csv(line, float(i), "")]
    assert len(busy) == 5 and len(idle) == 4
    assert {s.name for s in busy + idle} == {"NVIDIA H200"}
    assert {s.mem_total_mib for s in busy} == {143771.0} and {s.power_limit_w for s in busy} == {700.0}
    hot = [s for s in busy if s.util_pct == 99.0]
    assert len(hot) == 2 and all(s.throttle == ("sw_power_cap",) for s in hot)
    assert all(s.processes == ((pid, 1564.0),) for s in busy)
    assert idle[-1].throttle == ("gpu_idle",) and idle[-1].sm_clock_mhz == 345.0
