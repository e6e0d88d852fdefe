"""Can this host's CPU feed its GPUs at small batch sizes? The host-balance check.

Small-batch training is bound by the host: every op is dispatched by one Python thread per GPU
(one process per GPU, as DDP runs), the GPU finishes a small kernel in a few microseconds, and
data loading needs cores of its own. This measures what decides it and says how many GPUs the
host can feed, or what limits it. Every threshold below names where its number comes from
(docs/host-balance.md has the reasoning and the recorded figures).

Measured here: single-thread speed (a fixed pure-Python loop and the eager dispatch of a tiny
torch op on the CPU, best of several runs, so a briefly busy core does not decide), cores per
GPU. Read from the tier-2 GPU checks when they ran: pinned and pageable host-to-device
bandwidth (h2d_d2h.bandwidth) and the kernel launch latency (launch.latency).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional

from .report import Outcome, fail, ok, warn

# Reference figures, measured 2026-11-25 with these functions on the development VM ("AMD EPYC"
# cloud vCPU, 2 cores, torch 2.13.0+cpu, Python 3.11): the lowest of four runs, each best of 7,
# of 0.125-0.132 us and 3.36-3.79 us (CPU time, so the other jobs running then did not count).
# A cloud vCPU of today, the kind GPU boxes are rented with.
REFERENCE_PYTHON_US = 0.125  # python_loop_us: CPU microseconds per loop iteration
REFERENCE_DISPATCH_US = 3.36  # torch_dispatch_us: CPU microseconds per tiny in-place CPU op
REFERENCE_HOST = "AMD EPYC cloud vCPU (development VM), 2026-11-25"
# A host N times slower per thread than the reference dispatches every op N times later, so at
# small batch its GPU waits N times as long for each kernel. The multiples are a policy, not a
# measurement: WARN at 2x (half the reference's rate), FAIL at 4x (a quarter: the GPU then idles
# at least three quarters of the time it is busy on the reference host).
SLOW_WARN = 2.0
SLOW_FAIL = 4.0
# Cores per GPU: one process per GPU dispatches its kernels from one Python thread (the GIL),
# and its DataLoader workers are separate processes: below 2 cores per GPU the dispatching
# thread and data loading share a core (FAIL); below 4 there is no room for the pin-memory
# thread and two workers (the fewest that overlap loading with a step) (WARN).
CORES_PER_GPU_FAIL = 2
CORES_PER_GPU_WARN = 4
# PCIe 3.0 moves 8 GT/s per lane with 128b/130b encoding: 0.985 GB/s per lane, so 3.94 GB/s on
# x4 (PCI-SIG's published rates). Pinned host-to-device below that is no better than a Gen3 x4
# link: a narrow slot, a riser, or a link trained down.
PINNED_H2D_MIN_GBS = 3.94
# The same tiny op launched on the GPU (launch.latency) costs its CPU dispatch plus the CUDA
# launch. Above 50 us (launch.latency's own warning level, about 15x the reference host's CPU
# dispatch of that op) something besides the CPU's speed slows every launch: contention, a
# power-saving clock, a virtualised GPU path (WARN).
LAUNCH_US_MAX = 50.0


def python_loop(iterations: int) -> int:
    """A fixed pure-Python workload: integer arithmetic, a dict store, a branch."""
    table: dict[int, int] = {}
    total = 0
    for i in range(iterations):
        total += (i * i) % 7
        table[i & 255] = total
        if total & 1:
            total -= 1
    return total


def best_us(fn: Callable[[], Any], per: int, repeats: int = 7) -> float:
    """CPU microseconds per unit of ``fn``'s work (``per`` units a call), best of ``repeats``.
    This thread's CPU time, not the wall clock: other processes on a busy host lengthen the
    wall time, not the work a core does, and the check is of the core, not of the load."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best / per * 1e6


def measure_cpu(torch: Any) -> dict[str, float]:
    """Single-thread speed: the pure-Python loop and torch's eager dispatch on the CPU."""
    iterations, ops = 50000, 2000
    x = torch.zeros(1)

    def dispatch() -> None:
        for _ in range(ops):
            x.add_(1)

    return {
        "python_loop_us": round(best_us(lambda: python_loop(iterations), iterations), 4),
        "torch_dispatch_us": round(best_us(dispatch, ops), 3),
    }


def slowdown(cpu: Mapping[str, float]) -> float:
    """How many times slower per thread than the reference host (the worse of the two)."""
    return max(cpu["python_loop_us"] / REFERENCE_PYTHON_US,
               cpu["torch_dispatch_us"] / REFERENCE_DISPATCH_US)


def judge_balance(
    *, cpu: Mapping[str, float], cores: int, gpus: int, pinned_h2d_gbs: Optional[float] = None,
    pageable_h2d_gbs: Optional[float] = None, launch_us: Optional[float] = None,
) -> Outcome:
    """The verdict over recorded figures: how many GPUs this host can feed, or what limits it."""
    slow = slowdown(cpu)
    feedable = min(gpus, cores // CORES_PER_GPU_FAIL) if gpus else cores // CORES_PER_GPU_FAIL
    value: dict[str, Any] = dict(cpu, slowdown=round(slow, 2), cores=cores, gpus=gpus,
                                 feedable_gpus=feedable, reference=REFERENCE_HOST)
    if pinned_h2d_gbs is not None:
        value.update(pinned_h2d_gbs=pinned_h2d_gbs, pageable_h2d_gbs=pageable_h2d_gbs)
    if launch_us is not None:
        value.update(launch_us=launch_us, launches_per_s=round(1e6 / launch_us) if launch_us else None)
    limits, warnings = _limits(slow, cores, gpus, pinned_h2d_gbs, launch_us)
    speed = "single-thread %.1fx the reference's time" % slow
    if limits:
        return fail("this host cannot feed %s at small batch sizes: %s"
                    % (_gpus(gpus) if gpus else "a GPU", "; ".join(limits)), value, _hint(limits + warnings))
    if warnings:
        return warn("this host can feed %s at small batch sizes, limited by: %s (%s)"
                    % (_gpus(feedable), "; ".join(warnings), speed), value, _hint(warnings))
    if not gpus:
        return ok("no GPU here; by its %d cores and speed (%s) this host can feed %s at small "
                  "batch sizes" % (cores, speed, _gpus(feedable)), value)
    return ok("this host can feed %s at small batch sizes (%d cores, %s)" % (_gpus(gpus), cores, speed),
              value)


def _gpus(n: int) -> str:
    return "%d GPU%s" % (n, "" if n == 1 else "s")


def _limits(slow: float, cores: int, gpus: int, pinned: Optional[float],
            launch_us: Optional[float]) -> tuple[list[str], list[str]]:
    limits: list[str] = []
    warnings: list[str] = []
    per_gpu = cores / gpus if gpus else float(cores)
    if gpus and per_gpu < CORES_PER_GPU_FAIL:
        limits.append("%d cores for %s (%.1f per GPU, needs %d)"
                      % (cores, _gpus(gpus), per_gpu, CORES_PER_GPU_FAIL))
    elif gpus and per_gpu < CORES_PER_GPU_WARN:
        warnings.append("%.1f cores per GPU (fewer than %d)" % (per_gpu, CORES_PER_GPU_WARN))
    if slow >= SLOW_FAIL:
        limits.append("single-thread speed %.1fx slower than the reference (fails at %gx)"
                      % (slow, SLOW_FAIL))
    elif slow >= SLOW_WARN:
        warnings.append("single-thread speed %.1fx slower than the reference" % slow)
    if pinned is not None and pinned < PINNED_H2D_MIN_GBS:
        warnings.append("pinned host-to-device %.1f GB/s, below a PCIe Gen3 x4 link" % pinned)
    if launch_us is not None and launch_us > LAUNCH_US_MAX:
        warnings.append("%.0f us per kernel launch (more than %g)" % (launch_us, LAUNCH_US_MAX))
    return limits, warnings


def _hint(problems: list[str]) -> str:
    fixes = []
    text = " ".join(problems)
    if "cores" in text:
        fixes.append("give each GPU at least %d cores (fewer GPUs per job, or a host with more vCPUs "
                     "per GPU); lower num_workers to the cores left" % CORES_PER_GPU_WARN)
    if "speed" in text or "launch" in text:
        fixes.append("a faster CPU, or fewer launches per step: larger batches, torch.compile "
                     "(fuses kernels), CUDA graphs (mode='reduce-overhead')")
    if "PCIe" in text:
        fixes.append("check the link: nvidia-smi -q -d PCIE (generation and width), a full-width slot")
    return "; ".join(fixes) or "see the message"
