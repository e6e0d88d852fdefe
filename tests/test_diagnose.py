"""``envbuild diagnose``: the verdict rules on constructed GPU samples (no GPU here), the
probe's hooks, and real CPU-torch jobs whose bottleneck is known (tests/fixtures/diagnose)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import schemas

from envbuild.commands import cli
from envbuild.diagnose import gpu, probe, report, session
from envbuild.diagnose.evidence import Recording, read_probe_lines
from envbuild.diagnose.procfs import CpuSnapshot, ThreadTicks, alive, parse_thread, split_stat

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "diagnose"
JOB = FIXTURES / "job.py"
PID = 4242  # the job's pid in the constructed samples


def smi_samples(name: str, apps: str) -> tuple[gpu.GpuSample, ...]:
    lines = [line for line in (FIXTURES / name).read_text().splitlines() if not line.startswith("#")]
    return tuple(s for i, line in enumerate(lines)
                 for s in gpu.parse_smi_csv(line, 1000.0 + i, (FIXTURES / apps).read_text()))


def windows(n: int, *, wait: float = 0.005, period: float = 0.05, h2d_s: float = 0.0, sync_s: float = 0.0,
            device: str = "cuda", torch_cuda: str | None = "12.4",
            launches: float | None = None) -> tuple[dict[str, Any], ...]:
    """Probe lines for ``n`` windows of 0.5 s, each 10 steps of ``period`` s (constructed)."""
    records: list[dict[str, Any]] = [{"kind": "hello", "pid": PID, "torch_cuda": torch_cuda}]
    for i in range(n):
        records.append({"kind": "window", "pid": PID, "t0": 1000.0 + 0.5 * i, "t1": 1000.5 + 0.5 * i,
                        "batches": 10, "data_wait_s": 10 * wait, "steps": 10, "step_s": 0.1,
                        "periods": 10, "period_s": 10 * period, "h2d": 10 if h2d_s else 0,
                        "h2d_bytes": 4e6 if h2d_s else 0, "h2d_s": h2d_s, "syncs": 10 if sync_s else 0,
                        "sync_s": sync_s, "param_device": device})
    if launches is not None:
        records.append({"kind": "profile", "pid": PID, "steps": 5, "launches_per_step": launches})
    return tuple(records)


def cpu(main_pct: float, *, seconds: float = 4.0, system_share: float = 0.05) -> tuple[CpuSnapshot, ...]:
    """Two snapshots of a job whose main thread used ``main_pct`` of a core (100 Hz ticks)."""
    ticks = main_pct * seconds
    used = ThreadTicks(pid=PID, tid=PID, comm="python", utime=round(ticks * (1 - system_share)),
                       stime=round(ticks * system_share))
    start = ThreadTicks(pid=PID, tid=PID, comm="python", utime=0, stime=0)
    return (CpuSnapshot(t=1000.0, threads=(start,), blkio={}, machine=(0, 0, 0)),
            CpuSnapshot(t=1000.0 + seconds, threads=(used,), blkio={}, machine=(0, 0, 0)))


def diagnose(samples: tuple[gpu.GpuSample, ...], probe_records: tuple[dict[str, Any], ...],
             snapshots: tuple[CpuSnapshot, ...] = (), **extra: Any) -> dict[str, Any]:
    rec = Recording(seconds=4.0, gpu=samples, gpu_source="nvidia-smi" if samples else None,
                    cpu=snapshots, probe=probe_records, job_pids=frozenset({PID}), **extra)
    return report.diagnose(rec, command=["python", "train.py"])


def kinds(found: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in found["findings"]]


def finding(found: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(f for f in found["findings"] if f["kind"] == kind)


# --- the rules on constructed GPU samples ------------------------------------------------


def test_smi_csv_is_read_whole() -> None:
    first = smi_samples("gpu-bound.csv", "gpu-bound-apps.csv")[0]
    assert (first.name, first.util_pct, first.mem_total_mib, first.power_limit_w) == \
        ("NVIDIA A100-SXM4-40GB", 97.0, 40960.0, 400.0)
    assert first.throttle == ("sw_power_cap",) and first.mig is False
    assert first.processes == ((PID, 29800.0),)
    idle = smi_samples("idle.csv", "idle-apps.csv")[0]
    assert idle.throttle == ("gpu_idle",) and idle.mig is None  # "[N/A]": not a MIG-capable GPU


def test_smi_that_refuses_the_older_throttle_field_is_asked_again() -> None:
    line = (FIXTURES / "gpu-bound.csv").read_text().splitlines()[1]
    asked: list[str] = []

    def run(argv: Sequence[str]) -> str | None:
        asked.append(argv[1])
        if "clocks_throttle_reasons" in argv[1]:
            return None  # 'Field "clocks_throttle_reasons.active" is not a valid field to query.'
        return line if argv[1].startswith("--query-gpu") else ""

    (sample,) = gpu.read_smi(run, 1.0) or []
    assert sample.throttle == ("sw_power_cap",) and "clocks_event_reasons.active" in asked[1]


def test_busy_gpu_is_gpu_bound_and_names_the_power_cap() -> None:
    found = diagnose(smi_samples("gpu-bound.csv", "gpu-bound-apps.csv"), windows(8), cpu(60.0))
    assert found["verdict"] == "gpu-bound"
    evidence = finding(found, "gpu-bound")["evidence"]
    assert evidence["gpu_util_pct"] == 97.5 and evidence["throttle"] == ["sw_power_cap"]
    assert any("power" in fix for fix in finding(found, "gpu-bound")["fixes"])
    assert found["headroom"]["jobs"] == 1 and found["headroom"]["share"] == "none"


def test_idle_gpu_with_a_saturated_main_thread_is_overhead_bound_with_headroom() -> None:
    found = diagnose(smi_samples("idle.csv", "idle-apps.csv"), windows(8, launches=900.0), cpu(98.0))
    assert found["verdict"] == "overhead-bound"
    evidence = finding(found, "overhead-bound")["evidence"]
    assert evidence["busiest_thread_pct"] == 98.0 and evidence["launches_per_step"] == 900.0
    # 24564 MiB / 2100 MiB = 11 by memory; 100 / 24% (the p90) = 4 by utilisation
    assert found["headroom"] == {**found["headroom"], "jobs": 4, "by_memory": 11, "by_util": 4,
                                 "share": "mps"}


def test_copies_taking_the_loop_are_transfer_bound() -> None:
    found = diagnose(smi_samples("idle.csv", "idle-apps.csv"), windows(8, h2d_s=0.2), cpu(70.0))
    assert found["verdict"] == "transfer-bound"
    assert finding(found, "transfer-bound")["evidence"]["h2d_pct"] == 40.0
    assert "overhead-bound" not in kinds(found)


def test_item_every_step_with_an_idle_gpu_is_sync_bound() -> None:
    found = diagnose(smi_samples("idle.csv", "idle-apps.csv"), windows(8, sync_s=0.3), cpu(70.0))
    assert found["verdict"] == "sync-bound"
    assert finding(found, "sync-bound")["evidence"]["syncs_per_step"] == 1.0
    # the same syncs on a busy GPU are the GPU's own time, not a cause
    busy = diagnose(smi_samples("gpu-bound.csv", "gpu-bound-apps.csv"), windows(8, sync_s=0.3))
    assert "sync-bound" not in kinds(busy)


def test_a_job_absent_from_a_present_gpu_is_not_on_gpu_first() -> None:
    found = diagnose(smi_samples("idle.csv", "other-job-apps.csv"),
                     windows(8, wait=0.03, device="cpu"), cpu(90.0))
    assert found["verdict"] == "not-on-gpu"
    assert finding(found, "not-on-gpu")["evidence"] == {
        "gpu_seen": True, "torch_cuda": "12.4", "param_device": "cpu", "job_on_gpu": False}
    assert "input-bound" in kinds(found) and found["headroom"] is None


class FakeNvml(types.SimpleNamespace):
    """A ``pynvml`` stand-in: one A100 40GB with MIG on (constructed values)."""

    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_GPU_INSTANCE_PROFILE_COUNT = 3
    shut = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: self.shut = True
    def nvmlDeviceGetCount(self) -> int: return 1
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str: return "h0"
    def nvmlDeviceGetName(self, h: str) -> bytes: return b"NVIDIA A100-SXM4-40GB"
    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any: return types.SimpleNamespace(gpu=12, memory=3)
    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return types.SimpleNamespace(used=3000 * 2**20, total=40960 * 2**20)
    def nvmlDeviceGetPowerUsage(self, h: str) -> int: return 90_000
    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int: return 400_000
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: str) -> int: return 0x1 | 0x40
    def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]: return (1, 1)
    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int: return 1410
    def nvmlDeviceGetMaxClockInfo(self, h: str, kind: int) -> int: return 1410
    def nvmlDeviceGetPcieThroughput(self, h: str, kind: int) -> int: return 250_000 if kind else 1_000
    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [types.SimpleNamespace(pid=PID, usedGpuMemory=2500 * 2**20)]
    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: str, profile: int) -> Any:
        sizes = {0: (1, 4864), 1: (2, 9856), 2: (3, 19968)}  # 1g.5gb, 2g.10gb, 3g.20gb
        return types.SimpleNamespace(sliceCount=sizes[profile][0], memorySizeMB=sizes[profile][1])


def test_nvml_samples_and_mig_profiles_through_a_fake_pynvml() -> None:
    nvml = FakeNvml()
    gpus = session.open_gpus({"PATH": ""}, nvml)
    assert gpus.source == "nvml" and gpus.read is not None
    (sample,) = gpus.read(1000.0)
    assert (sample.util_pct, sample.mem_total_mib, sample.power_w, sample.pcie_rx_mbs) == \
        (12.0, 40960.0, 90.0, 250.0)
    assert sample.throttle == ("gpu_idle", "hw_thermal_slowdown") and sample.mig is True
    found = diagnose((sample,), windows(4), cpu(95.0), mig_profiles=tuple(gpus.mig_profiles(0)))
    # 2500 MiB with a 10% margin fits every profile listed; MIG, not MPS, shares it
    assert found["headroom"]["share"] == "mig"
    assert found["headroom"]["mig_profiles"] == ["1g.5gb", "2g.10gb", "3g.20gb"]
    gpus.close()
    assert nvml.shut


def test_no_gpu_and_no_nvidia_smi_is_said_not_guessed(tmp_path: Path) -> None:
    gpus = session.open_gpus({"PATH": str(tmp_path)}, None)
    assert gpus.read is None and gpus.source is None
    found = diagnose((), windows(4, torch_cuda=None, device="cpu"))
    assert found["verdict"] == "not-on-gpu" and found["gpu"] is None
    assert "no GPU seen" in report.text(found)


def test_html_is_self_contained_and_draws_the_three_series() -> None:
    found = diagnose(smi_samples("idle.csv", "idle-apps.csv"), windows(8, wait=0.03), cpu(50.0))
    page = report.page(found)
    assert page.count("<polyline") == 3 and "<script" not in page
    outside = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert [u for u in ("http://", "https://", "src=", "href=") if u in outside] == []
    assert json.loads(json.dumps(found))["schema"] == "envbuild.diagnose/1"
    schemas.check("diagnose.schema.json", json.loads(json.dumps(found)))


# --- the probe and /proc -------------------------------------------------------------------


class FakeTensor:
    def __init__(self, cuda: bool) -> None:
        self.is_cuda = cuda

    def to(self, device: str) -> FakeTensor:
        time.sleep(0.001)
        return FakeTensor(device == "cuda")

    def item(self) -> float:
        return 1.0

    def numel(self) -> int:
        return 1000

    def element_size(self) -> int:
        return 4


def test_probe_counts_host_to_device_copies_and_syncs(tmp_path: Path) -> None:
    rec = probe.Recorder(str(tmp_path / "out.jsonl"))
    to, item = probe.wrap_copy(FakeTensor.to, rec), probe.wrap_sync(FakeTensor.item, rec)
    on_gpu = to(FakeTensor(False), "cuda")
    to(FakeTensor(False), "cpu")  # not a host→device copy
    to(on_gpu, "cuda")  # already there
    item(on_gpu)
    item(FakeTensor(False))  # a CPU value: no wait for a GPU
    assert (rec.sums["h2d"], rec.sums["h2d_bytes"], rec.sums["syncs"]) == (1, 4000, 1)
    assert rec.sums["h2d_s"] >= 0.001


def test_probe_windows_span_the_loop_not_the_start_up(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rec = probe.Recorder(str(out))
    time.sleep(0.3)  # the job's imports: not part of any window
    wait = probe.wrap_next(lambda self: time.sleep(0.02) or "batch", rec)
    iterator = types.SimpleNamespace()
    for _ in range(3):
        assert wait(iterator) == "batch"
    rec.flush()
    (window,) = read_probe_lines(out.read_text().splitlines())
    assert window["batches"] == 3 and window["first_wait_s"] >= 0.02  # the iterator's first batch
    assert 0.04 <= window["data_wait_s"] < window["t1"] - window["t0"]
    assert window["t1"] - window["t0"] < 0.2


def test_probe_file_as_sitecustomize_chains_the_one_it_shadows(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    (ours / "sitecustomize.py").write_bytes(Path(probe.__file__).read_bytes())
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    done = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ.get('THEIRS'), "
                           "any(type(f).__name__ == 'AfterImport' for f in sys.meta_path))"],
                          env={**os.environ, "PYTHONPATH": f"{ours}{os.pathsep}{theirs}",
                               probe.ENV_OUT: str(tmp_path / "out.jsonl")},
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split() == ["ran", "True"]
    assert not (tmp_path / "out.jsonl").exists()  # nothing written before torch is imported


def test_proc_stat_with_a_hostile_comm() -> None:
    line = "77 (a) b (c) R 1 77 77 0 -1 4194304 1 0 0 0 250 31 0 0 20 0 3 0 1 2 3 4"
    assert split_stat(line) is not None
    found = parse_thread(77, 78, line)
    assert found is not None
    assert (found.comm, found.utime, found.stime, found.state) == ("a) b (c", 250, 31, "R")
    assert parse_thread(77, 78, "garbage") is None


# --- real jobs on CPU torch, each with a known cause -----------------------------------------

torch_here = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (CPU build)")


def run_job(mode: str, seconds: float = 3.0, **env: str) -> dict[str, Any]:
    outcome = session.run_command([sys.executable, str(JOB), mode, str(seconds)], seconds=120,
                                  env={**os.environ, **env}, gpus=session.Gpus(read=None, source=None),
                                  interval=0.2)
    assert outcome.exit_code == 0
    return report.diagnose(outcome.recording, command=[mode], exit_code=outcome.exit_code)


@torch_here
def test_slow_getitem_without_workers_is_input_bound() -> None:
    found = run_job("slow-input", 2.0)
    assert found["verdict"] == "input-bound"
    # 8 samples x 5 ms of waiting per batch against a 40 ms step: about half the loop
    assert finding(found, "input-bound")["evidence"]["data_wait_pct"] >= 35
    assert found["probe"]["batches"] >= 10 and found["probe"]["param_device"] == "cpu"


@torch_here
def test_slow_getitem_with_workers_is_not_input_bound() -> None:
    found = run_job("workers", 3.0)
    assert "input-bound" not in kinds(found)
    assert found["probe"]["data_wait_frac"] < 0.2 and found["probe"]["batches"] >= 10


@torch_here
def test_disk_bound_reader_shows_kernel_mode_or_blocked_time() -> None:
    found = run_job("disk", 4.0)
    evidence = finding(found, "input-bound")["evidence"]
    assert evidence["disk_bound"] is True, evidence
    assert evidence["cpu_system_pct"] > 0
    assert "large chunks" in finding(found, "input-bound")["fixes"][0]


@torch_here
def test_job_that_never_moves_to_cuda_is_not_on_gpu() -> None:
    # the profiler window forced on (a CPU build skips it): it runs, and finds no kernel launch
    found = run_job("cpu-only", 1.5, **{probe.ENV_PROFILE: "always"})
    assert found["verdict"] == "not-on-gpu" and kinds(found) == ["not-on-gpu"]
    assert found["probe"]["steps"] > probe.PROFILE_WARMUP_STEPS + probe.PROFILE_STEPS
    assert found["probe"]["torch_cuda"] is None and found["probe"]["launches_per_step"] == 0.0


# --- the command's faults (docs/faults.md section X) -------------------------------------------


def test_no_such_pid_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diagnose", "--pid", "999999999", "--seconds", "1"], {"PATH": ""}) == 2
    assert capsys.readouterr().err.startswith("envbuild: error[usage]: no such process: 999999999 — ")


def test_command_not_found_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diagnose", "--", "no-such-program-x"], {"PATH": ""}) == 2
    err = capsys.readouterr().err
    assert err.startswith("envbuild: error[usage]: command not found: no-such-program-x — ")
    assert len(err.splitlines()) == 1


def test_job_exit_code_is_passed_through_with_the_report(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    code = cli.main(["diagnose", "--report", str(out), "--", sys.executable, "-c", "import sys; sys.exit(3)"],
                    {"PATH": str(tmp_path)})  # no nvidia-smi: no GPU
    assert code == 3
    assert json.loads(out.read_text())["exit_code"] == 3
    assert "no GPU seen" in capsys.readouterr().out


def test_json_output_is_the_report_alone(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "envbuild", "diagnose", "--json", "--", sys.executable, "-c",
                           "print('the job talks')"], capture_output=True, text=True, timeout=120,
                          env={"PATH": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "not-on-gpu"
    schemas.check("diagnose.schema.json", json.loads(done.stdout))
    assert "the job talks" in done.stderr


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                    (signal.SIGTERM, 143, "terminated by SIGTERM")])
def test_ctrl_c_kills_the_jobs_process_group(tmp_path: Path, sig: int, code: int, said: str) -> None:
    pids = tmp_path / "pids"
    # a background child of a non-interactive shell ignores SIGINT: only the group kill ends it
    job = ["sh", "-c", f'sleep 300 & echo "$$ $!" > {pids}.tmp; mv {pids}.tmp {pids}; wait']
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    envbuild = subprocess.Popen([sys.executable, "-m", "envbuild", "diagnose", "--", *job], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not pids.exists() and time.time() < deadline:
        time.sleep(0.1)
    shell, child = (int(p) for p in pids.read_text().split())
    envbuild.send_signal(sig)
    _, err = envbuild.communicate(timeout=60)
    assert envbuild.returncode == code and said in err
    # signalled before envbuild returned; a signal takes effect when the process next runs,
    # which on a loaded machine can be later than a fixed moment (a zombie counts as ended)
    deadline = time.time() + 10
    while (alive(shell) or alive(child)) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(shell) and not alive(child)


def test_torn_or_foreign_probe_lines_are_skipped() -> None:
    lines = ['{"kind": "hello", "pid": 1}', '{"kind": "window", "pid": 1, "t0": 1', "[1, 2]",
             '{"no": "kind"}', "\x00garbage", '{"kind": "bye", "pid": 1}']
    assert [r["kind"] for r in read_probe_lines(lines)] == ["hello", "bye"]


def test_command_and_pid_together_or_neither_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diagnose"], {"PATH": ""}) == 2
    assert cli.main(["diagnose", "--pid", str(os.getpid()), "--", "true"], {"PATH": ""}) == 2
    assert cli.main(["diagnose", "--seconds", "0", "--", "true"], {"PATH": ""}) == 2
    assert capsys.readouterr().err.count("envbuild: error[usage]: ") == 3


def test_pid_is_sampled_and_left_alone() -> None:
    job = subprocess.Popen(["sleep", "30"])
    try:
        outcome = session.watch_pid(job.pid, seconds=1.0, gpus=session.Gpus(read=None, source=None),
                                    interval=0.2)
        assert job.poll() is None  # still running: --pid never touches the process
    finally:
        job.kill()
        job.wait()
    assert outcome.exit_code is None and len(outcome.recording.cpu) >= 3
    assert {t.comm for s in outcome.recording.cpu for t in s.threads} == {"sleep"}
    found = report.diagnose(outcome.recording, pid=job.pid)
    assert found["probe"] is None and found["cpu"]["process_pct"] < 50


def test_a_container_hiding_the_gpu_processes_is_not_called_off_the_gpu() -> None:
    busy = tuple(gpu.GpuSample(t=1000.0 + i, index=0, name="NVIDIA A10", util_pct=30.0, mem_used_mib=6000.0,
                               mem_total_mib=23028.0) for i in range(4))  # no process listed
    found = diagnose(busy, windows(8), cpu(97.0))
    assert "not-on-gpu" not in kinds(found) and found["verdict"] == "overhead-bound"
    assert found["headroom"]["by_memory"] == 3 and "not listed" in found["headroom"]["memory_basis"]
    # with --pid (no probe) the same: a busy GPU whose processes are hidden is not called unused
    assert kinds(diagnose(busy, (), cpu(97.0))) == ["overhead-bound"]
