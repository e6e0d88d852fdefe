"""Numbers: GPU results against CPU references, bus bandwidth, peak-table lookup."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from .report import Outcome, fail, ok


def relative_error(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| over two CPU float64 tensors; inf for NaN/Inf."""
    diff = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    if not math.isfinite(diff):
        return math.inf
    return float(diff) / max(float(scale), 1e-30)


def compare_result(label: str, got: Any, ref: Any, tolerance: float) -> Outcome:
    """The numerical verdict for one GPU result against its CPU reference."""
    if tuple(got.shape) != tuple(ref.shape):
        return fail(
            "numerical check failed: %s shape %s, expected %s" % (label, tuple(got.shape), tuple(ref.shape)),
            hint="the GPU kernel returned a wrong shape: a broken torch build or library mix",
        )
    error = relative_error(got.double(), ref.double())
    value = {"max_rel_error": error if math.isfinite(error) else None, "tolerance": tolerance}
    if error <= tolerance:
        return ok("%s max relative error %.2e (tolerance %.0e)" % (label, error, tolerance), value)
    return fail(
        "numerical check failed: %s max relative error %s > tolerance %.0e"
        % (label, "%.3e" % error if math.isfinite(error) else "non-finite", tolerance),
        value,
        "the GPU computes wrong results: check for Xid errors (dmesg), ECC errors "
        "(nvidia-smi -q -d ECC), overclocking, or a mismatched cuBLAS/cuDNN on LD_LIBRARY_PATH",
    )


def bus_bandwidth_gbs(nbytes: int, seconds: float, ranks: int) -> float:
    """All-reduce bus bandwidth as nccl-tests defines it: algbw * 2(n-1)/n.

    source: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
    retrieved: 2026-11-21
    """
    if seconds <= 0 or ranks < 1:
        return 0.0
    return nbytes / seconds / 1e9 * (2.0 * (ranks - 1) / ranks)


def _name_tokens(name: str) -> list[str]:
    tokens = re.sub(r"[^a-z0-9]+", " ", name.lower()).split()
    return [t for t in tokens if t not in ("nvidia", "geforce", "tesla")]


def match_peak(device_name: str, peaks: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """Find the peaks-table row for a device name: exact name/alias first, then the
    row whose name tokens all appear in the device name (most tokens wins)."""
    want = _name_tokens(device_name)
    best: tuple[int, str] | None = None
    for key, row in peaks.items():
        if not isinstance(row, dict):
            continue
        names = [key] + [str(a) for a in row.get("aliases", []) or []]
        for name in names:
            tokens = _name_tokens(name)
            if tokens == want:
                return key, row
            if tokens and all(t in want for t in tokens) and (best is None or len(tokens) > best[0]):
                best = (len(tokens), key)
    if best is None:
        return None
    return best[1], peaks[best[1]]
