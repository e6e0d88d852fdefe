"""The recorded samples (GPU, /proc, the probe's lines) summed into the numbers the verdict
rules read. Plain functions over values: every rule is tested on recorded or built data."""

from __future__ import annotations

import collections
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envbuild.diagnose.gpu import GpuSample
from envbuild.diagnose.procfs import CpuSnapshot

INTERVAL_SLACK_S = 1.0  # a snapshot up to one sampling interval after the loop's last window
PROBE_LINE_LIMIT = 200_000  # lines read back from the probe's file (a long job: ~1 line / 0.5 s)


@dataclass(frozen=True, slots=True, kw_only=True)
class Recording:
    """Everything one diagnosis saw: the raw material of the report."""

    seconds: float
    gpu: tuple[GpuSample, ...] = ()
    gpu_source: str | None = None  # "nvml", "nvidia-smi" or None (no GPU seen)
    cpu: tuple[CpuSnapshot, ...] = ()
    probe: tuple[dict[str, Any], ...] = ()
    job_pids: frozenset[int] = frozenset()
    tick_hz: int = 100
    mig_profiles: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuUse:
    process_pct: float  # of one core, every thread of the job's processes together
    user_pct: float
    system_pct: float
    busiest_thread_pct: float
    busiest_thread: str
    blocked_io_pct: float  # wall time the job's processes spent blocked on block I/O (delay
    # accounting where the kernel keeps it, else the share of snapshots with a thread in D state)
    machine_iowait_pct: float  # share of every CPU of the machine waiting for I/O


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuUse:
    name: str
    index: int
    util_mean: float
    util_p90: float
    mem_total_mib: float | None
    job_mem_mib: float | None
    job_on_gpu: bool
    processes_listed: bool  # any compute process listed at all (a container's PID namespace hides them)
    power_mean_w: float | None
    power_limit_w: float | None
    clock_ratio: float | None  # mean SM clock / max SM clock
    throttle: tuple[str, ...]
    pcie_rx_mbs: float | None
    mig: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeUse:
    torch_cuda: str | None
    param_device: str | None
    cuda_initialized: bool
    batches: int
    steps: int
    loop_s: float
    data_wait_frac: float  # the steady state: every batch but each iterator's first
    epoch_start_frac: float  # each iterator's first batch (worker start-up, unless persistent)
    step_period_ms: float | None
    h2d_per_step: float
    h2d_mb_per_step: float
    h2d_frac: float
    syncs_per_step: float
    sync_frac: float
    launches_per_step: float | None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    seconds: float
    gpu_source: str | None
    gpu: GpuUse | None
    cpu: CpuUse | None
    probe: ProbeUse | None
    windows: tuple[dict[str, Any], ...] = field(default=())


def read_probe_lines(lines: Iterable[str]) -> tuple[dict[str, Any], ...]:
    """The probe's JSON lines; a torn or foreign line is skipped, not trusted."""
    found = []
    for number, line in enumerate(lines):
        if number >= PROBE_LINE_LIMIT:
            break
        try:
            record = json.loads(line, parse_constant=_no_constant, parse_float=_plausible,
                                parse_int=_plausible)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and isinstance(record.get("kind"), str):
            found.append(record)
    return tuple(found)


# A probe's counts and seconds are far below this; a line beyond it (1e308, which sums to
# infinity) is foreign, as NaN and Infinity (JSON has neither) are.
PLAUSIBLE = 1e15


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _plausible(text: str) -> float | int:
    value = float(text) if any(c in text for c in ".eE") else int(text)
    if not abs(value) <= PLAUSIBLE:
        raise ValueError("a number no probe writes")
    return value


def summarise(rec: Recording) -> Evidence:
    windows = tuple(r for r in rec.probe if r["kind"] == "window")
    return Evidence(seconds=rec.seconds, gpu_source=rec.gpu_source, gpu=gpu_use(rec, windows),
                    cpu=cpu_use(loop_span(rec.cpu, windows), rec.tick_hz), probe=probe_use(rec.probe),
                    windows=windows)


def loop_bounds(windows: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """When the probe saw the training loop run (its first window with batches or steps to
    its last); None when it saw none (no probe, a job with no loop it hooks)."""
    active = [w for w in windows if _num(w.get("batches")) or _num(w.get("steps"))]
    if not active:
        return None
    return min(_num(w.get("t0")) for w in active), max(_num(w.get("t1")) for w in active)


def loop_span(snapshots: Sequence[CpuSnapshot], windows: Sequence[dict[str, Any]]) -> list[CpuSnapshot]:
    """The snapshots taken while the training loop ran (the probe saw batches or steps):
    the interpreter's start-up and ``import torch`` are user-mode work of their own that
    would blur the loop's user/kernel split. Every snapshot when the probe saw no loop."""
    bounds = loop_bounds(windows)
    if bounds is None:
        return list(snapshots)
    inside = [s for s in snapshots if bounds[0] <= s.t <= bounds[1] + INTERVAL_SLACK_S]
    return inside if len(inside) >= 2 else list(snapshots)


def gpu_in_loop(samples: Sequence[GpuSample], windows: Sequence[dict[str, Any]]) -> list[GpuSample]:
    """The GPU samples taken while the training loop ran. The GPU idles while the job's
    interpreter starts, imports torch and initialises CUDA, and while it exits: on an H200
    host that was 9 s of a 17 s run around an 8 s loop that kept the GPU 99% busy, and the
    mean over the whole run (41%) made a GPU-bound job read as sync-bound. Every sample when
    the probe saw no loop, or when fewer than two of some GPU's fall inside it."""
    bounds = loop_bounds(windows)
    if bounds is None:
        return list(samples)
    inside = [s for s in samples if bounds[0] <= s.t <= bounds[1]]
    per_gpu = collections.Counter(s.index for s in inside)
    everyone = {s.index for s in samples}
    if not inside or set(per_gpu) != everyone or min(per_gpu.values()) < 2:
        return list(samples)
    return inside


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else 0.0


def gpu_use(rec: Recording, windows: Sequence[dict[str, Any]] = ()) -> GpuUse | None:
    """The job's GPU: the one whose compute processes include a job pid, else the busiest;
    its figures over the training loop (``gpu_in_loop``) when the probe saw one."""
    by_index: dict[int, list[GpuSample]] = {}
    for sample in gpu_in_loop(rec.gpu, windows):
        by_index.setdefault(sample.index, []).append(sample)
    if not by_index:
        return None

    def job_mem(samples: list[GpuSample]) -> float:
        return max((sum(m for p, m in s.processes if p in rec.job_pids) for s in samples), default=0.0)

    def rank(samples: list[GpuSample]) -> tuple[bool, float]:
        on = any(p in rec.job_pids for s in samples for p, _ in s.processes)
        return on, statistics.fmean([s.util_pct or 0.0 for s in samples])

    samples = max(by_index.values(), key=rank)
    listed = any(s.processes for s in rec.gpu)
    return _gpu_of(samples, on_gpu=rank(samples)[0], job_mem=job_mem(samples), listed=listed)


def _gpu_of(samples: list[GpuSample], *, on_gpu: bool, job_mem: float, listed: bool) -> GpuUse:
    util = [s.util_pct for s in samples if s.util_pct is not None]
    ratios = [s.sm_clock_mhz / s.sm_clock_max_mhz for s in samples
              if s.sm_clock_mhz is not None and s.sm_clock_max_mhz]
    throttle = sorted({r for s in samples for r in s.throttle if r != "gpu_idle"})
    used = [s.mem_used_mib for s in samples if s.mem_used_mib is not None]
    last = samples[-1]
    return GpuUse(
        name=last.name, index=last.index, util_mean=_mean(util) or 0.0, util_p90=_p90(util),
        mem_total_mib=last.mem_total_mib,
        job_mem_mib=job_mem if on_gpu else (max(used) if used else None), job_on_gpu=on_gpu,
        processes_listed=listed,
        power_mean_w=_mean([s.power_w for s in samples if s.power_w is not None]),
        power_limit_w=last.power_limit_w, clock_ratio=_mean(ratios), throttle=tuple(throttle),
        pcie_rx_mbs=_mean([s.pcie_rx_mbs for s in samples if s.pcie_rx_mbs is not None]),
        mig=last.mig)


def cpu_use(snapshots: Sequence[CpuSnapshot], hz: int) -> CpuUse | None:
    """CPU between the first and the last snapshot that saw the job, per thread alive in both
    or born since (a thread that ended between them is not counted)."""
    snapshots = [s for s in snapshots if s.threads]
    if len(snapshots) < 2:
        return None
    first, last = snapshots[0], snapshots[-1]
    wall = last.t - first.t
    if wall <= 0:
        return None
    before = {(t.pid, t.tid): t for t in first.threads}
    scale = 100.0 / (hz * wall)
    user = system = 0.0
    busiest, busiest_name = 0.0, ""
    for t in last.threads:
        b = before.get((t.pid, t.tid))
        du, ds = t.utime - (b.utime if b else 0), t.stime - (b.stime if b else 0)
        user, system = user + du, system + ds
        if (du + ds) > busiest:
            busiest, busiest_name = du + ds, f"{t.comm} (pid {t.pid}, tid {t.tid})"
    blkio = sum(v - first.blkio.get(p, 0) for p, v in last.blkio.items()) * scale
    in_d = 100.0 * sum(any(t.state == "D" for t in s.threads) for s in snapshots) / len(snapshots)
    io0, _, total0 = first.machine
    io1, _, total1 = last.machine
    iowait = 100.0 * (io1 - io0) / (total1 - total0) if total1 > total0 else 0.0
    return CpuUse(process_pct=(user + system) * scale, user_pct=user * scale, system_pct=system * scale,
                  busiest_thread_pct=busiest * scale, busiest_thread=busiest_name,
                  blocked_io_pct=max(blkio, in_d), machine_iowait_pct=iowait)


def probe_use(records: Sequence[dict[str, Any]]) -> ProbeUse | None:
    hello = [r for r in records if r["kind"] == "hello"]
    if not hello:
        return None
    windows = [r for r in records if r["kind"] == "window"]

    def total(key: str) -> float:
        return float(sum(_num(w.get(key)) for w in windows))

    loop_s = sum(_num(w.get("t1")) - _num(w.get("t0")) for w in windows
                 if _num(w.get("batches")) or _num(w.get("steps")))
    steps, periods = total("steps"), total("periods")
    per_step = max(steps, 1.0)
    profiles = [r for r in records if r["kind"] == "profile"]
    devices = [w.get("param_device") for w in windows if w.get("param_device")]
    return ProbeUse(
        torch_cuda=hello[0].get("torch_cuda") or None,
        param_device=str(devices[-1]) if devices else None,
        cuda_initialized=any(r.get("cuda_initialized") for r in records if r["kind"] == "bye"),
        batches=int(total("batches")), steps=int(steps), loop_s=loop_s,
        data_wait_frac=_frac(total("data_wait_s"), loop_s),
        epoch_start_frac=_frac(total("first_wait_s"), loop_s),
        step_period_ms=1000 * total("period_s") / periods if periods else None,
        h2d_per_step=total("h2d") / per_step, h2d_mb_per_step=total("h2d_bytes") / per_step / 1e6,
        h2d_frac=_frac(total("h2d_s"), loop_s), syncs_per_step=total("syncs") / per_step,
        sync_frac=_frac(total("sync_s"), loop_s),
        launches_per_step=_num(profiles[0].get("launches_per_step")) if profiles else None,
        errors=tuple(str(r.get("what", "?")) for r in records if r["kind"] == "error"))


def _num(value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    return float(value) if math.isfinite(value) else 0.0


def _frac(part: float, whole: float) -> float:
    return min(1.0, part / whole) if whole > 0 else 0.0
