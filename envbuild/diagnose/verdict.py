"""Why the GPU idles: one rule per kind over ``Evidence``, each with its threshold and why.

The kinds are the contract (docs/diagnose.md): ``input-bound``, ``overhead-bound``,
``transfer-bound``, ``sync-bound``, ``gpu-bound``, ``not-on-gpu``. Every rule returns a
``Finding`` (its evidence numbers and its fixes) or None; ``verdict`` picks the main one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from envbuild.diagnose.evidence import Evidence

Kind = Literal["input-bound", "overhead-bound", "transfer-bound", "sync-bound", "gpu-bound",
               "not-on-gpu"]

# A loop that waits this share of its time for the next batch leaves the GPU idle at least
# that long each step: at 20% it cannot pass 80% utilisation, and the usual remedies
# (workers, prefetch) take the wait to a few percent (the workers case in the tests: <5%).
INPUT_WAIT_FRAC = 0.20
# Compute work (Python, torch's CPU kernels) runs in user mode; a data reader that spends
# this share of its CPU in the kernel (read syscalls, page faults, copies), or whose
# processes sit blocked on block I/O this share of the time, is bound by the disk.
KERNEL_SHARE = 0.30
BLOCKED_IO_PCT = 10.0
# One Python thread can use one core: at 90% of it, the thread is the ceiling.
SATURATED_PCT = 90.0
# Utilisation is the share of time a kernel ran. A GPU busy 80% of the time is the
# healthy case (the rest is launch gaps no host change recovers); below 60%, a host-side
# cause is worth finding.
GPU_BOUND_PCT = 80.0
GPU_IDLE_PCT = 60.0
# Copies and synchronisations that take this share of the loop are a cause of their own.
TRANSFER_FRAC = 0.15
SYNC_FRAC = 0.15
# Launches per step past which launch overhead (a few microseconds each on the host) is
# the likely ceiling of a saturated main thread: CUDA graphs and torch.compile fuse them.
MANY_LAUNCHES = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    kind: Kind
    summary: str
    evidence: dict[str, Any]
    fixes: tuple[str, ...]
    weight: float  # the share of the loop this cause costs: the main verdict is the heaviest


def r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def not_on_gpu(ev: Evidence) -> Finding | None:
    p, g = ev.probe, ev.gpu
    cpu_build = p is not None and p.torch_cuda is None
    params_cpu = p is not None and p.param_device == "cpu" and p.h2d_per_step == 0 \
        and not p.cuda_initialized and not (g is not None and g.job_on_gpu)
    # the job's pid missing from the GPU's process list counts only where the list shows
    # processes at all (inside a container NVML lists none, or the host's pids) or the GPU idles
    unseen = g is not None and not g.job_on_gpu and (g.processes_listed or g.util_mean < 1)
    absent = unseen and (p is None or params_cpu or cpu_build)
    if not (cpu_build or params_cpu or absent or g is None):
        return None
    evidence = {"gpu_seen": g is not None, "torch_cuda": p.torch_cuda if p else None,
                "param_device": p.param_device if p else None,
                "job_on_gpu": g.job_on_gpu if g else False}
    fixes = ("install a CUDA build of torch (envbuild resolve --driver … names the wheel index)"
             if cpu_build else "check torch.cuda.is_available() in the job's environment",
             "move the model and every batch to the GPU: model.to('cuda'), batch.to('cuda', "
             "non_blocking=True)", "envbuild smoke tells a CPU-only wheel or a hidden GPU apart")
    where = "no GPU was seen on this host" if g is None else "the job uses no GPU"
    return Finding(kind="not-on-gpu", summary=f"the job runs on the CPU: {where}",
                   evidence=evidence, fixes=fixes, weight=1.0 if g is not None or not cpu_build else 0.0)


def input_bound(ev: Evidence) -> Finding | None:
    p, c = ev.probe, ev.cpu
    if p is None or max(p.data_wait_frac, p.epoch_start_frac) < INPUT_WAIT_FRAC:
        return None
    wait = p.data_wait_frac + p.epoch_start_frac
    fixes = ["DataLoader(num_workers=N) with N up to the free cores, persistent_workers=True, "
             "prefetch_factor=2-4", "pin_memory=True, and .to('cuda', non_blocking=True)",
             "ship uint8 (or fp16) batches and normalise on the GPU",
             "give the container enough shared memory for workers (--shm-size, /dev/shm)"]
    disk = c is not None and (c.system_pct >= KERNEL_SHARE * max(c.process_pct, 1e-9)
                              or c.blocked_io_pct >= BLOCKED_IO_PCT)
    if disk:
        fixes.insert(0, "the reader is in the kernel or blocked on the disk: read in large chunks "
                        "(sharded files, WebDataset/tar), cache the data on local NVMe or in RAM")
    if p.epoch_start_frac >= INPUT_WAIT_FRAC:
        fixes.insert(0, "each epoch waits for its workers to start: persistent_workers=True")
    evidence = {"data_wait_pct": r(100 * p.data_wait_frac),
                "epoch_start_wait_pct": r(100 * p.epoch_start_frac), "batches": p.batches,
                "step_period_ms": r(p.step_period_ms), "disk_bound": disk}
    if c is not None:
        evidence |= {"cpu_system_pct": r(c.system_pct), "cpu_user_pct": r(c.user_pct),
                     "blocked_io_pct": r(c.blocked_io_pct), "machine_iowait_pct": r(c.machine_iowait_pct)}
    return Finding(kind="input-bound", summary=f"the loop waits for data {100 * wait:.0f}% of its time",
                   evidence=evidence, fixes=tuple(fixes), weight=wait)


def transfer_bound(ev: Evidence) -> Finding | None:
    p = ev.probe
    if p is None or p.h2d_frac < TRANSFER_FRAC:
        return None
    evidence = {"h2d_pct": r(100 * p.h2d_frac), "h2d_per_step": r(p.h2d_per_step),
                "h2d_mb_per_step": r(p.h2d_mb_per_step, 2),
                "pcie_rx_mbs": r(ev.gpu.pcie_rx_mbs) if ev.gpu else None}
    fixes = ("pin_memory=True in the DataLoader and .to('cuda', non_blocking=True)",
             "send uint8 / fp16 instead of fp32 and convert on the GPU",
             "keep data that every step reuses on the GPU instead of copying it again")
    return Finding(kind="transfer-bound", summary=f"host→device copies take {100 * p.h2d_frac:.0f}% of "
                   "the loop", evidence=evidence, fixes=fixes, weight=p.h2d_frac)


def sync_bound(ev: Evidence) -> Finding | None:
    p, g = ev.probe, ev.gpu
    if p is None or p.sync_frac < SYNC_FRAC or (g is not None and g.util_mean >= GPU_IDLE_PCT):
        return None
    evidence = {"sync_pct": r(100 * p.sync_frac), "syncs_per_step": r(p.syncs_per_step),
                "gpu_util_pct": r(g.util_mean) if g else None}
    fixes = ("call .item() / .cpu() on losses and metrics every N steps, not every step",
             "accumulate metrics on the GPU (torch.stack, a running sum) and read them once",
             "avoid data-dependent Python branches on GPU values inside the step")
    return Finding(kind="sync-bound", summary=f"the host waits in .item()/.cpu() {100 * p.sync_frac:.0f}% "
                   "of the loop while the GPU idles", evidence=evidence, fixes=fixes, weight=p.sync_frac)


def overhead_bound(ev: Evidence, taken: float) -> Finding | None:
    g, c, p = ev.gpu, ev.cpu, ev.probe
    hidden = not g.processes_listed and g.util_mean > 0 if g is not None else False  # a container
    if g is None or not (g.job_on_gpu or hidden or (p is not None and p.param_device == "cuda")):
        return None
    if g.util_mean >= GPU_IDLE_PCT or taken >= INPUT_WAIT_FRAC:
        return None
    saturated = c is not None and c.busiest_thread_pct >= SATURATED_PCT
    launches = p.launches_per_step if p else None
    if not saturated and not (launches and launches >= MANY_LAUNCHES) and p is None:
        return None
    evidence = {"gpu_util_pct": r(g.util_mean), "busiest_thread_pct": r(c.busiest_thread_pct) if c else None,
                "busiest_thread": c.busiest_thread if c else None, "launches_per_step": r(launches),
                "step_period_ms": r(p.step_period_ms) if p else None,
                "by_elimination": not saturated and not (launches and launches >= MANY_LAUNCHES)}
    fixes = ("larger batches (fewer, larger kernels per sample)",
             "torch.compile(model) to fuse small kernels; CUDA graphs (mode='reduce-overhead')",
             "move per-batch Python work out of the step; a faster CPU core")
    return Finding(kind="overhead-bound", summary=f"the GPU is {g.util_mean:.0f}% busy while the host "
                   "issues the work", evidence=evidence, fixes=fixes, weight=1 - g.util_mean / 100)


def gpu_bound(ev: Evidence) -> Finding | None:
    g = ev.gpu
    if g is None or g.util_mean < GPU_BOUND_PCT:
        return None
    evidence = {"gpu_util_pct": r(g.util_mean), "clock_ratio": r(g.clock_ratio, 2),
                "throttle": list(g.throttle), "power_w": r(g.power_mean_w), "power_limit_w": g.power_limit_w}
    fixes = ["healthy: faster now means less GPU work (mixed precision bf16/fp16, torch.compile) "
             "or a faster GPU"]
    if g.throttle:
        fixes.append(f"the clocks are held back ({', '.join(g.throttle)}): check cooling and power limits")
    return Finding(kind="gpu-bound", summary=f"the GPU is busy {g.util_mean:.0f}% of the time",
                   evidence=evidence, fixes=tuple(fixes), weight=g.util_mean / 100)


def findings(ev: Evidence) -> list[Finding]:
    causes = [f for f in (input_bound(ev), transfer_bound(ev), sync_bound(ev)) if f]
    taken = sum(f.weight for f in causes)
    extra = [not_on_gpu(ev), overhead_bound(ev, taken), gpu_bound(ev)]
    return sorted([*causes, *(f for f in extra if f)], key=lambda f: -f.weight)


def verdict(found: list[Finding]) -> Kind:
    """The heaviest finding. A job off the GPU on a host that has one, or with a CUDA build
    of torch, weighs 1 (nothing else matters until it is on the GPU); on a host without a
    GPU and a CPU build its weight is 0: the loop's own bottleneck comes first."""
    return found[0].kind if found else "gpu-bound"


def headroom(ev: Evidence, mig_profiles: tuple[tuple[str, float], ...] = ()) -> dict[str, Any] | None:
    """How many jobs like this one the GPU could hold: by memory and by utilisation."""
    g, p = ev.gpu, ev.probe
    on_gpu = g is not None and (g.job_on_gpu or (p is not None and p.param_device == "cuda"))
    if g is None or not on_gpu or not g.mem_total_mib or not g.job_mem_mib:
        return None
    by_memory = math.floor(g.mem_total_mib / g.job_mem_mib)
    by_util = math.floor(100 / max(g.util_p90, 5.0))  # p90: room for the busy moments, not the mean
    jobs = max(1, min(by_memory, by_util))
    out: dict[str, Any] = {"jobs": jobs, "by_memory": by_memory, "by_util": by_util,
                           "memory_free_mib": r(g.mem_total_mib - g.job_mem_mib),
                           "util_free_pct": r(100 - g.util_p90),
                           "memory_basis": "the job's processes" if g.job_on_gpu else
                           "all memory in use (the job's processes are not listed: a container?)"}
    if g.mig:
        fits = [name for name, mib in mig_profiles if mib >= g.job_mem_mib * 1.1]
        out |= {"share": "mig", "mig_profiles": fits,
                "note": "MIG is on: one job per GPU instance of a profile that fits its memory"
                        + ("" if mig_profiles else " (nvidia-smi mig -lgip lists the profiles)")}
    elif jobs > 1:
        out |= {"share": "mps", "note": f"{jobs} such jobs could share the GPU through MPS "
                "(nvidia-cuda-mps-control -d) with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per job"}
    else:
        out |= {"share": "none", "note": "the GPU has no room for a second such job"}
    return out
