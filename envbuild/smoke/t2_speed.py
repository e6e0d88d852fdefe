"""T2 why GPUs idle: matmul vs peak, host<->device bandwidth, launch latency, whether the host
can feed its GPUs (host balance), /dev/shm."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping

from .balance import judge_balance, measure_cpu
from .numeric import match_peak
from .proof import check_on_cuda, judge_tflops
from .report import Outcome, fail, ok, skip, warn
from .runner import Run, bind, indices
from .t1_correctness import dtype_of, no_tf32

# Heuristic thresholds (not vendor facts): where a reading stops being "fine".
SHM_MIN_BYTES = 1 << 30
PEAK_FRACTION_WARN = 0.25
# Set by 'envbuild verify' when the engine runs the image under emulation (engine/verify.py).
EMULATED_ENV = "ENVBUILD_SMOKE_EMULATED"
PINNED_H2D_WARN_GBS = 5.0
LAUNCH_LATENCY_WARN_US = 50.0

def tier2(run: Run) -> None:
    peaks, peaks_path = load_peaks(run.options.peaks)
    for index in indices(run):
        suffix = "" if index is None else "@cuda:%d" % index
        for dtype in ("bf16", "fp32"):
            run.check(
                "matmul.tflops.%s%s" % (dtype, suffix),
                2,
                bind(proven(_tflops_on(dtype, peaks, peaks_path)), run, index),
                gpu=True,
                device=index,
                heavy=True,
            )
        run.check(
            "h2d_d2h.bandwidth" + suffix,
            2,
            bind(proven(_check_bandwidth), run, index),
            gpu=True,
            device=index,
            heavy=True,
        )
    first = indices(run)[0]
    run.check(
        "launch.latency" + ("" if first is None else "@cuda:%d" % first),
        2,
        bind(proven(_check_latency), run, first),
        gpu=True,
        device=first,
        heavy=True,
    )
    run.check("host.balance", 2, lambda: _check_balance(run), heavy=True)
    run.check("shm.size", 2, lambda: check_shm(run.host.get("shm_bytes")))


# The tier-1 checks that prove work ran on a GPU (proof.py): while one of them failed, a timing
# is of whatever ran instead (a CPU behind a stub), and no timing check may pass.
PROOFS = ("gpu.kernel@cuda:%d", "gpu.dev_nodes", "gpu.libcuda")


def failed_proofs(run: Run, index: int) -> list[str]:
    names = {name % index if "%" in name else name for name in PROOFS}
    return [c.name for c in run.checks if c.name in names and c.status == "fail"]


def proven(fn: Callable[[Run, int], Outcome]) -> Callable[[Run, int], Outcome]:
    """``fn`` run only once the proofs of GPU work for its device have not failed."""

    def check(run: Run, index: int) -> Outcome:
        failed = failed_proofs(run, index)
        if failed:
            return skip(
                "blocked: the proofs that work ran on the GPU failed (%s); a timing would time "
                "something else" % ", ".join(failed),
                {"failed_proofs": failed},
                "fix %s first" % failed[0],
            )
        return fn(run, index)

    return check


def payload_dir() -> str:
    """The folder the payload lies in. Run as the zipapp (/opt/envbuild/smoke.py),
    ``__file__`` is a path inside the archive (.../smoke.py/envbuild_smoke/t2_speed.py):
    the zip importer names the archive itself, whose folder holds smoke_peaks.json."""
    archive = getattr(__spec__.loader if __spec__ else None, "archive", None)
    return os.path.dirname(os.path.abspath(archive or os.path.dirname(os.path.abspath(__file__))))


def load_peaks(path: str | None) -> tuple[dict[str, Any], str | None]:
    """The peaks table: --peaks FILE, else smoke_peaks.json beside the payload, else empty."""
    candidate = path or os.path.join(payload_dir(), "smoke_peaks.json")
    try:
        with open(candidate, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}, None
    return (data if isinstance(data, dict) else {}), candidate


def _tflops_on(dtype: str, peaks: Mapping[str, Any], peaks_path: str | None) -> Callable[[Run, int], Outcome]:
    def check(run: Run, index: int) -> Outcome:
        return _check_tflops(run, index, dtype, peaks, peaks_path)

    return check


def _check_tflops(
    run: Run, index: int, dtype_name: str, peaks: Mapping[str, Any], peaks_path: str | None
) -> Outcome:
    torch = run.torch
    if dtype_name == "bf16" and tuple(torch.cuda.get_device_capability(index)) < (8, 0):
        dtype_name = "fp16"  # pre-Ampere GPUs have no bf16 tensor cores
    device = "cuda:%d" % index
    n = 8192 if dtype_name != "fp32" else 4096
    dtype = dtype_of(torch, dtype_name)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    with no_tf32(torch):
        elsewhere = check_on_cuda("%s matmul" % dtype_name, torch.matmul(a, b))
        if elsewhere is not None:
            return elsewhere
        seconds = _time_cuda(torch, index, lambda: torch.matmul(a, b), min_seconds=0.3)
    tflops = 2.0 * n**3 / seconds / 1e12
    name = torch.cuda.get_device_name(index)
    value: dict[str, Any] = {
        "tflops": round(tflops, 2),
        "dtype": dtype_name,
        "n": n,
        "device": name,
    }
    found = match_peak(name, peaks)
    peak = found[1].get("%s_tflops" % dtype_name) if found else None
    text = "%s matmul %.1f TFLOPS" % (dtype_name, tflops)
    if peak and found:
        fraction = tflops / float(peak)
        value.update({"peak_tflops": peak, "fraction": round(fraction, 3), "peak_row": found[0]})
        text += " = %.0f%% of %s peak %.0f" % (100 * fraction, found[0], peak)
    where = peaks_path or "no peaks table (--peaks FILE or smoke_peaks.json)"
    return judge_tflops(
        text, tflops, peak, value, name=name, where=where, warn_fraction=PEAK_FRACTION_WARN
    )


def _time_cuda(
    torch: Any, index: int, fn: Callable[[], Any], *, min_seconds: float, max_iters: int = 200
) -> float:
    """Seconds per call of ``fn`` on the GPU, timed with CUDA events after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize(index)
    iters = 0
    total = 0.0
    while total < min_seconds and iters < max_iters:
        batch = max(1, min(10, max_iters - iters))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        total += start.elapsed_time(end) / 1000.0
        iters += batch
    return total / iters


def _check_bandwidth(run: Run, index: int) -> Outcome:
    torch = run.torch
    nbytes = 64 << 20
    device = "cuda:%d" % index
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    elsewhere = check_on_cuda("device buffer", dev)
    if elsewhere is not None:
        return elsewhere
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    result: dict[str, float] = {}
    for label, host in (("pinned", pinned), ("pageable", pageable)):

        def upload(h: Any = host) -> Any:
            return dev.copy_(h, non_blocking=True)

        def download(h: Any = host) -> Any:
            return h.copy_(dev, non_blocking=True)

        h2d = _time_cuda(torch, index, upload, min_seconds=0.1, max_iters=20)
        d2h = _time_cuda(torch, index, download, min_seconds=0.1, max_iters=20)
        result["h2d_%s_gbs" % label] = round(nbytes / h2d / 1e9, 2)
        result["d2h_%s_gbs" % label] = round(nbytes / d2h / 1e9, 2)
    text = "H2D pinned %.1f / pageable %.1f GB/s, D2H pinned %.1f / pageable %.1f GB/s" % (
        result["h2d_pinned_gbs"],
        result["h2d_pageable_gbs"],
        result["d2h_pinned_gbs"],
        result["d2h_pageable_gbs"],
    )
    if result["h2d_pinned_gbs"] < PINNED_H2D_WARN_GBS:
        return warn(
            text,
            result,
            "low host-to-device bandwidth: check the PCIe link generation and width "
            "(nvidia-smi -q -d PCIE) and that the GPU sits in a full-width slot",
        )
    return ok(text + "; use pin_memory=True in DataLoader for the pinned rate", result)


def _check_latency(run: Run, index: int) -> Outcome:
    torch = run.torch
    x = torch.zeros(1, device="cuda:%d" % index)
    elsewhere = check_on_cuda("launch target", x)
    if elsewhere is not None:
        return elsewhere
    for _ in range(50):
        x.add_(1)
    torch.cuda.synchronize(index)
    launches = 2000
    start = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    torch.cuda.synchronize(index)
    micros = (time.perf_counter() - start) / launches * 1e6
    if float(x.item()) != 50.0 + launches:
        return fail("numerical check failed: %d launches of x += 1 gave %s" % (launches + 50, x.item()))
    value = {"microseconds_per_launch": round(micros, 2)}
    if micros > LAUNCH_LATENCY_WARN_US:
        return warn(
            "%.1f us per small kernel launch" % micros,
            value,
            "high per-op overhead makes small batches CPU-bound: check CPU contention and "
            "frequency; CUDA graphs or torch.compile batch launches",
        )
    return ok("%.1f us per small kernel launch (host dispatch + launch)" % micros, value)


def _check_balance(run: Run) -> Outcome:
    """Can the host feed its GPUs at small batch sizes (balance.py)? CPU parts measured here;
    bandwidth and launch latency taken from this tier's GPU checks when they passed."""
    torch = run.torch
    if torch is None:
        return skip("torch is not importable", hint="fix torch.import first")
    emulated = run.env.get(EMULATED_ENV)
    if emulated:  # qemu's speed, not this CPU's (18x slow measured here): no verdict
        return skip("under emulation (%s): single-thread speed is the emulator's, host balance not "
                    "judged" % emulated, {"emulated": emulated},
                    "verify on a host of the image's own architecture to judge host balance")
    gpus = len(run.devices) if run.gpu_block is None else 0
    figures = {c.name.split("@")[0]: c.value for c in run.checks
               if c.status in ("pass", "warn") and isinstance(c.value, dict)}
    bandwidth = figures.get("h2d_d2h.bandwidth") or {}
    latency = figures.get("launch.latency") or {}
    return judge_balance(
        cpu=measure_cpu(torch), cores=int(run.host.get("usable_cpus") or 1), gpus=gpus,
        pinned_h2d_gbs=bandwidth.get("h2d_pinned_gbs"), pageable_h2d_gbs=bandwidth.get("h2d_pageable_gbs"),
        launch_us=latency.get("microseconds_per_launch"),
    )


def check_shm(size: int | None) -> Outcome:
    if size is None:
        return warn(
            "/dev/shm is missing",
            None,
            "DataLoader workers need /dev/shm: mount a tmpfs there or run the container with --ipc=host",
        )
    mib = size / (1 << 20)
    if size < SHM_MIN_BYTES:
        return warn(
            "/dev/shm is %.0f MiB (< 1 GiB): DataLoader workers will crash or stall" % mib,
            {"bytes": size},
            "run the container with --shm-size=8g (or --ipc=host); Docker's default is 64 MB",
        )
    return ok("/dev/shm is %.1f GiB" % (size / (1 << 30)), {"bytes": size})
