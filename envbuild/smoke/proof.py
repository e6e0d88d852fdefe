"""Proof that work ran on a GPU, not only that torch says so.

A torch that reports CUDA but computes on the CPU (a stub, a patched build, a wrapper
that moves tensors back), with a fake ``nvidia-smi`` on PATH, passes every numerical
check: the CPU gets the right answers. These checks look for what such a setup cannot
fake cheaply: where result tensors live, the device nodes the driver creates, the
driver library mapped into this process, and a speed a CPU cannot reach.

Pure functions take texts and lists so the verdicts are tested without a GPU.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Mapping, Sequence

from .report import Outcome, fail, ok, warn

# Heuristic bounds (not vendor facts), as fractions of the datasheet peak.
# Below PEAK_FRACTION_IMPLAUSIBLE the reading is what a CPU, not the named GPU, produces
# (0.4 TFLOPS on an H100 is 0.04% of its dense bf16 peak); above PEAK_FRACTION_IMPOSSIBLE
# it beats the datasheet, so the timer did not time GPU work.
PEAK_FRACTION_IMPLAUSIBLE = 0.02
PEAK_FRACTION_IMPOSSIBLE = 1.10

STUB_HINT = (
    "torch reports CUDA but the work ran elsewhere: a stub or patched torch, a wrapper that "
    "moves tensors to the CPU, or a monkeypatched torch.cuda; check torch.__file__ and "
    "reinstall the CUDA wheel"
)


def tensor_device(tensor: Any) -> str | None:
    """None when ``tensor`` lives on a CUDA device by both accounts, else where it lives."""
    device = getattr(tensor, "device", None)
    kind = getattr(device, "type", None)
    if kind == "cuda" and getattr(tensor, "is_cuda", False) is True:
        return None
    if kind == "cuda":
        return "cuda device but is_cuda=%r" % (getattr(tensor, "is_cuda", None),)
    return str(device if device is not None else type(tensor).__name__)


def check_on_cuda(label: str, tensor: Any) -> Outcome | None:
    """A fail when a result that should be on the GPU is not; None when it is."""
    where = tensor_device(tensor)
    if where is None:
        return None
    return fail(
        "%s result is on %s, not a CUDA device: the work did not run on the GPU" % (label, where),
        {"device": where},
        STUB_HINT,
    )


def is_wsl(proc_version: str | None, dxg_exists: bool) -> bool:
    """WSL2 exposes GPUs through /dev/dxg, not /dev/nvidia*."""
    text = (proc_version or "").lower()
    return dxg_exists or "microsoft" in text or "wsl" in text


def list_device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia*"))


def dxg_present() -> bool:
    return os.path.exists("/dev/dxg")


def judge_device_nodes(nodes: Sequence[str], *, wsl: bool, dxg_exists: bool, gpus: int) -> Outcome:
    """/dev/nvidiaN (or /dev/dxg under WSL) must exist when torch counts GPUs."""
    numbered = sorted(n for n in nodes if re.match(r"^/dev/nvidia\d+$", n))
    value: dict[str, Any] = {"nodes": list(nodes), "wsl": wsl, "dxg": dxg_exists}
    if wsl:
        if dxg_exists:
            return ok("WSL: /dev/dxg present (GPUs reach WSL2 through it, not /dev/nvidia*)", value)
        return fail(
            "WSL without /dev/dxg although torch reports %d GPU(s)" % gpus,
            value,
            "WSL2 exposes the GPU as /dev/dxg: install the Windows NVIDIA driver with WSL support; "
            "in Docker Desktop enable the WSL2 backend and run with --gpus all",
        )
    if numbered and "/dev/nvidiactl" in nodes:
        return ok("device nodes %s and /dev/nvidiactl present" % " ".join(numbered), value)
    missing = "no /dev/nvidia[0-9]* device node" if not numbered else "no /dev/nvidiactl"
    return fail(
        "%s although torch reports %d GPU(s): no GPU is reachable from this process" % (missing, gpus),
        value,
        "the driver creates these nodes and the NVIDIA Container Toolkit passes them in: run the "
        "container with --gpus all (or --device /dev/nvidia0 --device /dev/nvidiactl); on a host, "
        "load the driver (nvidia-smi, nvidia-modprobe)",
    )


def libcuda_mappings(maps_text: str) -> list[str]:
    """Paths of libcuda.so* mapped in a /proc/<pid>/maps text."""
    paths = []
    for line in maps_text.splitlines():
        if "/" not in line:
            continue
        path = line[line.index("/") :].strip()
        if os.path.basename(path).startswith("libcuda.so") and path not in paths:
            paths.append(path)
    return paths


def judge_libcuda(maps_text: str | None) -> Outcome:
    """After a kernel ran, the CUDA driver library must be mapped into this process."""
    if maps_text is None:
        return fail(
            "cannot read /proc/self/maps: whether libcuda is loaded cannot be established",
            None,
            "the smoke test proves GPU use on Linux only: run it in a Linux container or host with /proc",
        )
    paths = libcuda_mappings(maps_text)
    if paths:
        return ok("libcuda mapped after a kernel ran: %s" % ", ".join(paths), {"paths": paths})
    return fail(
        "libcuda.so is not mapped into this process after a kernel ran: no CUDA driver call was made",
        {"paths": []},
        STUB_HINT + "; in a container, NVIDIA_DRIVER_CAPABILITIES must include compute so libcuda is mounted",
    )


def judge_tflops(
    text: str,
    tflops: float,
    peak: float | None,
    value: Mapping[str, Any],
    *,
    name: str,
    where: str,
    warn_fraction: float,
) -> Outcome:
    """A matmul rate against the GPU's datasheet peak.

    No peak row: WARN naming the missing row. A floor derived from the architecture
    alone would be an unsourced number, and a fail on every GPU the table lacks would
    punish the table, not the image; the device, device-node and libcuda proofs already
    fail a CPU-backed run, so the missing row is reported, never passed silently.
    """
    data = dict(value)
    if not peak:
        data["peak_tflops"] = None
        return warn(
            "%s; plausibility not established: no peak row for %s in %s" % (text, name, where),
            data,
            "add the GPU to matrices/gpu_peaks.yaml from its NVIDIA datasheet and re-render, "
            "or pass --peaks FILE with its fp32/fp16/bf16 dense TFLOPS",
        )
    fraction = tflops / float(peak)
    if fraction < PEAK_FRACTION_IMPLAUSIBLE:
        return fail(
            "%s: implausibly slow for %s (below %.0f%% of its peak): the matmul did not run on that GPU"
            % (text, name, 100 * PEAK_FRACTION_IMPLAUSIBLE),
            data,
            STUB_HINT + "; or a MIG slice/throttled GPU far below its datasheet (see --tier 4)",
        )
    if fraction > PEAK_FRACTION_IMPOSSIBLE:
        return fail(
            "%s: faster than %s's datasheet peak, impossible: the timer did not time GPU work" % (text, name),
            data,
            STUB_HINT + "; or a wrong peaks row (check its source)",
        )
    if fraction < warn_fraction:
        return warn(
            text,
            data,
            "far below peak: power cap, thermal throttling, a MIG slice, another process on the "
            "GPU, or a wrong peaks row (see the health tier: --tier 4)",
        )
    return ok(text, data)
