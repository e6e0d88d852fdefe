"""envbuild smoke test: prove the GPU really works, and say why it idles.

This one file is copied into every image and host script, so it runs standalone:
the standard library plus torch, Python 3.8 or newer, and it never imports the
rest of envbuild. ``torch.cuda.is_available()`` is not verification: this runs
real kernels, compares them with a CPU reference and names each failure.

Tiers (``--tier N`` runs 0..N):
  T0 environment   driver, container GPU variables, torch build, CPUs, lock
  T1 correctness   GPU visible, arch coverage, kernels, matmul, cuDNN conv, optimizer
  T2 idle causes   matmul vs peak, host<->device bandwidth, launch latency,
                   DataLoader workers, /dev/shm
  T3 several GPUs  peer access, topology, NCCL all-reduce bus bandwidth
  T4 health        temperature, power, clocks, throttle reasons, ECC, MIG

Exit codes: 0 pass (warnings allowed), 7 a check failed, 8 the GPU runtime or
driver is missing. The classification logic (arch coverage, CUDA error texts,
nvidia-smi parsing, lock diff, aggregation) is pure functions at the top.
"""

# Runs on Python 3.8: zip(strict=...) is 3.10+ (B905), and the imports follow the
# sys.path guard below on purpose (E402).
# ruff: noqa: B905, E402
from __future__ import annotations

import os
import sys

# Run as a script, Python puts this file's folder first on sys.path; a sibling named
# like a standard module (as envbuild/selectors.py once was) would shadow it. This file
# imports nothing from its folder, so drop that entry before importing anything else.
_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    del sys.path[0]

import argparse
import contextlib
import copy
import ctypes
import dataclasses
import glob
import json
import math
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

SCHEMA = "envbuild.smoke/1"
EXIT_PASS = 0
EXIT_FAILED = 7
EXIT_GPU_MISSING = 8
EXIT_INTERRUPTED = 130
STATUSES = ("pass", "warn", "fail", "skip")
MAX_TIER = 4
PYTORCH_INDEX = "https://download.pytorch.org/whl"

# Integrated (Tegra/Jetson) GPUs do not run SASS built for the discrete GPUs of the
# same major, nor the reverse; sm_101 code also runs on 11.0 (the renamed Thor).
# source: https://github.com/pytorch/pytorch/blob/main/torch/cuda/__init__.py
# (DEVICE_REQUIREMENT, read in the torch 2.13.0 wheel), retrieved: 2026-11-21
INTEGRATED_CCS = frozenset({(5, 3), (6, 2), (7, 2), (8, 7), (10, 1)})
RENAMED_CCS = {(10, 1): (11, 0)}

# NVML clock event ("throttle") reason bits.
# source: https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksThrottleReasons.html
# retrieved: 2026-11-21
THROTTLE_REASONS = (
    (0x1, "gpu_idle", False),
    (0x2, "applications_clocks_setting", False),
    (0x4, "sw_power_cap", False),
    (0x8, "hw_slowdown", True),
    (0x10, "sync_boost", False),
    (0x20, "sw_thermal_slowdown", True),
    (0x40, "hw_thermal_slowdown", True),
    (0x80, "hw_power_brake_slowdown", True),
    (0x100, "display_clock_setting", False),
)

# Heuristic thresholds (not vendor facts): where a reading stops being "fine".
TEMPERATURE_WARN_C = 85.0  # the brief: throttling starts around 84-90 C
SHM_MIN_BYTES = 1 << 30
PEAK_FRACTION_WARN = 0.25
PINNED_H2D_WARN_GBS = 5.0
LAUNCH_LATENCY_WARN_US = 50.0

# Matmul tolerances: max |got - ref| / max |ref|, ref in float64 from the same
# (already rounded) inputs. Loose enough for TF32 and reduced-precision
# reductions, far below what a wrong kernel produces (errors of order 1).
MATMUL_TOLERANCE = {"fp32": 2e-3, "fp16": 1e-2, "bf16": 3e-2}
CONV_TOLERANCE = 1e-3
OPTIMIZER_TOLERANCE = 1e-4


# --------------------------------------------------------------------------- values


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    tier: int
    status: str
    message: str = ""
    value: Any = None
    hint: str = ""
    seconds: float = 0.0
    exit_code: int = 0
    gpu: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tier": self.tier,
            "status": self.status,
            "message": self.message,
            "value": self.value,
            "hint": self.hint,
            "seconds": round(self.seconds, 4),
            "exit_code": self.exit_code,
            "gpu": self.gpu,
        }


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a check function returns; the runner adds name, tier and timing."""

    status: str
    message: str = ""
    value: Any = None
    hint: str = ""
    exit_code: int = 0


def ok(message: str = "", value: Any = None) -> Outcome:
    return Outcome("pass", message, value)


def warn(message: str, value: Any = None, hint: str = "") -> Outcome:
    return Outcome("warn", message, value, hint)


def fail(message: str, value: Any = None, hint: str = "", exit_code: int = EXIT_FAILED) -> Outcome:
    return Outcome("fail", message, value, hint, exit_code)


def skip(message: str, value: Any = None, hint: str = "") -> Outcome:
    return Outcome("skip", message, value, hint)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """A CUDA/NVML failure recognised from its error text."""

    kind: str
    message: str
    hint: str
    exit_code: int


@dataclasses.dataclass(frozen=True)
class ArchEntry:
    """One entry of torch.cuda.get_arch_list(): sm_XY (SASS) or compute_XY (PTX)."""

    text: str
    ptx: bool
    major: int
    minor: int
    suffix: str  # "", "a" (arch-specific) or "f" (family-specific)


@dataclasses.dataclass(frozen=True)
class Coverage:
    covered: bool
    how: str  # "sass-exact", "sass-compatible", "ptx-jit" or "none"
    entry: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Topology:
    gpus: tuple[str, ...]
    links: dict[str, dict[str, str]]
    cpu_affinity: dict[str, str]


@dataclasses.dataclass(frozen=True)
class HealthReading:
    """One GPU's health, from NVML or nvidia-smi; None where not available."""

    index: int
    name: str = ""
    uuid: str = ""
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    throttle_mask: int | None = None
    ecc_mode: str | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    mig_current: str | None = None
    mig_pending: str | None = None
    mig_instances: tuple[str, ...] = ()


# --------------------------------------------------------------------------- pure: arch


_ARCH_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")


def parse_arch(text: str) -> ArchEntry | None:
    """``sm_86`` -> SASS 8.6; ``compute_90`` -> PTX 9.0; ``sm_100a`` -> 10.0 arch-specific."""
    match = _ARCH_RE.match(text.strip())
    if match is None:
        return None
    digits = match.group(2)
    return ArchEntry(
        text=text.strip(),
        ptx=match.group(1) == "compute",
        major=int(digits[:-1]),
        minor=int(digits[-1]),
        suffix=match.group(3),
    )


def _sass_runs_on(entry: ArchEntry, device: tuple[int, int]) -> str:
    """'exact', 'compatible' or '' for a SASS entry on a device."""
    code = (entry.major, entry.minor)
    if code == device or RENAMED_CCS.get(code) == device:
        return "exact"
    if entry.suffix == "a" or device in INTEGRATED_CCS or code in INTEGRATED_CCS:
        return ""
    # A cubin for X.y runs on X.z with z >= y (same major only).
    if entry.major == device[0] and entry.minor <= device[1]:
        return "compatible"
    return ""


def _ptx_runs_on(entry: ArchEntry, device: tuple[int, int]) -> bool:
    code = (entry.major, entry.minor)
    if entry.suffix == "a":
        return code == device
    if entry.suffix == "f":
        return entry.major == device[0] and entry.minor <= device[1]
    # PTX is JIT-compiled by the driver for any device of equal or newer capability.
    return code <= device


def arch_coverage(capability: tuple[int, int], arch_list: Sequence[str]) -> Coverage:
    """Does a wheel built for ``arch_list`` run on a device of ``capability``?"""
    entries = [e for e in (parse_arch(a) for a in arch_list) if e is not None]
    sm = "sm_%d%d" % capability
    for wanted in ("exact", "compatible"):
        for entry in entries:
            if not entry.ptx and _sass_runs_on(entry, capability) == wanted:
                how = "sass-exact" if wanted == "exact" else "sass-compatible"
                detail = (
                    "SASS %s built for this GPU" % entry.text
                    if wanted == "exact"
                    else "SASS %s is binary-compatible with %s (same major)" % (entry.text, sm)
                )
                return Coverage(True, how, entry.text, detail)
    ptx = [e for e in entries if e.ptx and _ptx_runs_on(e, capability)]
    if ptx:
        best = max(ptx, key=lambda e: (e.major, e.minor))
        detail = "only PTX %s, JIT-compiled by the driver at first use" % best.text
        return Coverage(True, "ptx-jit", best.text, detail)
    return Coverage(False, "none", "", "%s not in torch arch list [%s]" % (sm, " ".join(arch_list)))


def arch_hint(capability: tuple[int, int], arch_list: Sequence[str], variant: str = "") -> str:
    """Which way to move: the GPU is newer or older than everything in the wheel."""
    sm = "sm_%d%d" % capability
    entries = [e for e in (parse_arch(a) for a in arch_list) if e is not None]
    current = " (this is %s)" % variant if variant else ""
    pick = "`envbuild resolve --arch %s` names the variants that include it" % sm
    if entries and all((e.major, e.minor) < capability for e in entries):
        return "this GPU is newer than every architecture in the wheel%s: use a newer CUDA variant; %s" % (
            current,
            pick,
        )
    if entries and all((e.major, e.minor) > capability for e in entries):
        return "the wheel dropped this older architecture%s: use an older CUDA variant; %s" % (
            current,
            pick,
        )
    return "use a torch variant whose arch list includes %s%s; %s" % (sm, current, pick)


# --------------------------------------------------------------------------- pure: errors

_FOUND_VERSION_RE = re.compile(r"found version (\d{4,6})")
_ERROR_CODE_RE = re.compile(r"\berror[\s:]*(\d{2,3})\b", re.IGNORECASE)


def cuda_version_from_int(value: int) -> str:
    """12040 -> '12.4' (the CUDA driver API encoding: 1000*major + 10*minor)."""
    return "%d.%d" % (value // 1000, (value % 1000) // 10)


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


def classify_cuda_error(
    text: str,
    *,
    torch_cuda: str | None = None,
    driver_version: str | None = None,
    driver_cuda: str | None = None,
) -> Diagnosis | None:
    """Recognise a CUDA/NVML/cuDNN error text; None when it is not one we know."""
    low = text.lower()
    codes = {int(c) for c in _ERROR_CODE_RE.findall(text)}
    first = _first_line(text)
    if "no kernel image is available" in low or "nokernelimagefordevice" in low or 209 in codes:
        return Diagnosis(
            "arch-missing",
            "kernel launch failed: %s" % first,
            "the wheel has no SASS or usable PTX for this GPU: install a torch variant whose arch "
            "list covers it (envbuild resolve --arch sm_XY)",
            EXIT_FAILED,
        )
    if "invalid device function" in low or 98 in codes:
        return Diagnosis(
            "arch-missing",
            "kernel launch failed: %s" % first,
            "the kernel was not built for this GPU: install a variant whose arch list covers it",
            EXIT_FAILED,
        )
    if (
        "forward compatibility was attempted on non supported hw" in low
        or 804 in codes
        or ("compatnotsupportedondevice" in low)
    ):
        return Diagnosis(
            "forward-compat",
            "forward compatibility not supported on this GPU (CUDA error 804)",
            "remove cuda-compat (drop /usr/local/cuda/compat from LD_LIBRARY_PATH and ld.so.conf): "
            "forward compatibility works on datacenter GPUs only; or upgrade the host driver",
            EXIT_FAILED,
        )
    if "unsupported toolchain" in low or 222 in codes or "unsupportedptxversion" in low:
        return Diagnosis(
            "ptx-too-new",
            "PTX compiled with newer toolkit than driver (CUDA error 222)",
            "upgrade the host driver to one supporting CUDA %s, or use a variant with SASS for "
            "this GPU so no JIT is needed" % (torch_cuda or "of the wheel"),
            EXIT_FAILED,
        )
    if (
        "driver on your system is too old" in low
        or "driver version is insufficient" in low
        or "insufficientdriver" in low
        or 35 in codes
    ):
        found = _FOUND_VERSION_RE.search(text)
        supports = cuda_version_from_int(int(found.group(1))) if found else driver_cuda
        drv = "driver %s" % driver_version if driver_version else "the host driver"
        return Diagnosis(
            "driver-too-old",
            "%s supports CUDA %s but torch was built with CUDA %s (driver too old)"
            % (drv, supports or "?", torch_cuda or "?"),
            "upgrade the host driver, or use a torch variant built for CUDA <= %s "
            "(envbuild resolve --driver <version>)" % (supports or "the driver's CUDA"),
            EXIT_GPU_MISSING,
        )
    if "version mismatch" in low:
        return Diagnosis(
            "driver-mismatch",
            "NVIDIA driver/library version mismatch: host needs reboot",
            "the loaded kernel module differs from the user-space driver libraries (usually an "
            "upgrade without reboot): reboot the host or reload the nvidia modules",
            EXIT_GPU_MISSING,
        )
    if "unsupported display driver / cuda driver combination" in low or 803 in codes:
        return Diagnosis(
            "driver-mismatch",
            "libcuda does not match the loaded kernel driver (CUDA error 803)",
            "a stale libcuda (often a cuda-compat package) shadows the host driver's: remove it, "
            "or reboot after a driver upgrade",
            EXIT_GPU_MISSING,
        )
    if "system not yet initialized" in low or 802 in codes:
        return Diagnosis(
            "fabric-manager",
            "CUDA system not yet initialized (CUDA error 802)",
            "NVSwitch systems need nvidia-fabricmanager running, at the driver's version",
            EXIT_GPU_MISSING,
        )
    if "found no nvidia driver" in low or "driver not loaded" in low:
        return Diagnosis(
            "no-driver",
            "no NVIDIA driver found: %s" % first,
            "install the NVIDIA driver on the host (envbuild render script), or start the "
            "container with a GPU device request (docker run --gpus all)",
            EXIT_GPU_MISSING,
        )
    if "no cuda-capable device is detected" in low or "no cuda gpus are available" in low or (100 in codes):
        return Diagnosis(
            "no-device",
            "no CUDA-capable device is detected",
            "start the container with a GPU device request (docker run --gpus all) and check "
            "CUDA_VISIBLE_DEVICES",
            EXIT_GPU_MISSING,
        )
    if "busy or unavailable" in low or 46 in codes:
        return Diagnosis(
            "device-busy",
            "GPU busy or unavailable: %s" % first,
            "the compute mode is exclusive and another process holds the GPU, or the GPU needs a "
            "reset (nvidia-smi -q -d COMPUTE)",
            EXIT_FAILED,
        )
    if "out of memory" in low:
        return Diagnosis(
            "out-of-memory",
            "GPU out of memory: %s" % first,
            "other processes hold GPU memory (nvidia-smi), or the MIG slice is too small",
            EXIT_FAILED,
        )
    if "ecc error" in low:
        return Diagnosis(
            "ecc",
            "uncorrectable ECC error: %s" % first,
            "drain this GPU and check nvidia-smi -q -d ECC,ROW_REMAPPER",
            EXIT_FAILED,
        )
    if "cudnn_status" in low or "cudnn error" in low:
        return Diagnosis(
            "cudnn",
            "cuDNN failed: %s" % first,
            "check that the cuDNN wheel matches torch (pip show nvidia-cudnn-cu12) and that no "
            "other libcudnn shadows it on LD_LIBRARY_PATH",
            EXIT_FAILED,
        )
    if "cublas_status" in low:
        return Diagnosis(
            "cublas",
            "cuBLAS failed: %s" % first,
            "check that no other libcublas shadows the wheel's on LD_LIBRARY_PATH",
            EXIT_FAILED,
        )
    if (
        "illegal memory access" in low
        or "unspecified launch failure" in low
        or "device-side assert" in low
        or "launch failure" in low
        or "launch timed out" in low
    ):
        return Diagnosis(
            "kernel-failure",
            "kernel launch failure: %s" % first,
            "rerun with CUDA_LAUNCH_BLOCKING=1; check dmesg for Xid errors",
            EXIT_FAILED,
        )
    return None


def diagnose_no_gpu(
    *,
    env: Mapping[str, str],
    dev_nodes: Sequence[str],
    in_container: bool,
    init_error: str | None,
    torch_cuda: str | None = None,
    driver_version: str | None = None,
    driver_cuda: str | None = None,
) -> Diagnosis:
    """Why does a CUDA build of torch see no GPU? The most specific reason first."""
    if init_error:
        known = classify_cuda_error(
            init_error,
            torch_cuda=torch_cuda,
            driver_version=driver_version,
            driver_cuda=driver_cuda,
        )
        if known is not None and known.kind not in ("no-driver", "no-device"):
            return known
    where = "in container" if in_container else "on this host"
    request = (
        "start the container with a GPU device request: docker run --gpus all (Docker SDK: "
        "device_requests=[DeviceRequest(count=-1, capabilities=[['gpu']])]; Kubernetes: "
        "resources.limits nvidia.com/gpu); needs nvidia-container-toolkit on the host"
    )
    nvd = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvd is not None and nvd.strip().lower() in ("void", "none", ""):
        shown = nvd.strip() or "(empty)"
        return Diagnosis(
            "no-gpu-visible",
            "no GPU visible %s: NVIDIA_VISIBLE_DEVICES=%s" % (where, shown),
            "%s; NVIDIA_VISIBLE_DEVICES=%s tells the NVIDIA runtime to expose no GPU" % (request, shown),
            EXIT_GPU_MISSING,
        )
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        return Diagnosis(
            "no-gpu-visible",
            "no GPU visible %s: CUDA_VISIBLE_DEVICES=%r hides every GPU" % (where, cvd),
            "unset CUDA_VISIBLE_DEVICES or set it to device indices or UUIDs",
            EXIT_GPU_MISSING,
        )
    if not dev_nodes:
        if in_container:
            unset = "" if nvd is not None else "; NVIDIA_VISIBLE_DEVICES is unset"
            return Diagnosis(
                "no-gpu-visible",
                "no GPU visible in container: no /dev/nvidia* device nodes%s" % unset,
                request,
                EXIT_GPU_MISSING,
            )
        return Diagnosis(
            "no-driver",
            "no GPU visible on this host: no /dev/nvidia* device nodes (NVIDIA driver not loaded)",
            "install the NVIDIA driver (envbuild render script) or load it (modprobe nvidia); "
            "check dmesg | grep -i nvrm",
            EXIT_GPU_MISSING,
        )
    if init_error:
        known = classify_cuda_error(init_error, torch_cuda=torch_cuda)
        if known is not None:
            return known
        return Diagnosis(
            "cuda-init",
            "no GPU visible %s: CUDA initialisation failed: %s" % (where, _first_line(init_error)),
            "check the driver (nvidia-smi) and dmesg for Xid errors",
            EXIT_GPU_MISSING,
        )
    return Diagnosis(
        "no-gpu-visible",
        "no GPU visible %s: CUDA reports 0 devices although %s exists" % (where, dev_nodes[0]),
        "NVIDIA_DRIVER_CAPABILITIES must include compute (or all) so libcuda is mounted; check "
        "CUDA_VISIBLE_DEVICES",
        EXIT_GPU_MISSING,
    )


# --------------------------------------------------------------------------- pure: parsing

_NA_VALUES = frozenset({"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"})


def _na(text: str) -> str | None:
    text = text.strip()
    return None if text.lower() in _NA_VALUES else text


def parse_smi_csv(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``."""
    rows: list[dict[str, str | None]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ValueError("expected %d fields, got %d: %r" % (len(fields), len(cells), line))
        rows.append({f: _na(c) for f, c in zip(fields, cells)})
    return rows


def parse_float(text: str | None) -> float | None:
    if text is None:
        return None
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_GPU_LABEL_RE = re.compile(r"^GPU\d+$")


def parse_topo(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m``: the GPU x GPU link matrix and each GPU's CPU affinity."""
    lines = [_ANSI_RE.sub("", line) for line in text.splitlines()]
    header: list[str] | None = None
    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, str] = {}
    for line in lines:
        if line.strip().startswith("Legend"):
            break
        tokens = line.split()
        if not tokens:
            continue
        if header is None:
            if _GPU_LABEL_RE.match(tokens[0]) and line[:1] in ("\t", " "):
                # Device columns (GPUs, then NICs/HCAs) come before "CPU Affinity".
                end = tokens.index("CPU") if "CPU" in tokens else len(tokens)
                header = tokens[:end]
            continue
        if not _GPU_LABEL_RE.match(tokens[0]):
            continue
        cells = tokens[1 : 1 + len(header)]
        links[tokens[0]] = {col: cell for col, cell in zip(header, cells) if _GPU_LABEL_RE.match(col)}
        rest = tokens[1 + len(header) :]
        if rest:
            affinity[tokens[0]] = rest[0]
    gpus = tuple(sorted(links, key=lambda g: int(g[3:])))
    return Topology(gpus=gpus, links=links, cpu_affinity=affinity)


def link_rank(link: str) -> int:
    """Higher is faster: NV# (NVLink) > PIX > PXB > PHB > NODE > SYS."""
    link = link.upper()
    if link.startswith("NV"):
        return 10
    return {"PIX": 5, "PXB": 4, "PHB": 3, "NODE": 2, "SYS": 1, "SOC": 1}.get(link, 0)


def summarize_topology(topo: Topology) -> dict[str, Any]:
    pairs: dict[str, str] = {}
    for i, a in enumerate(topo.gpus):
        for b in topo.gpus[i + 1 :]:
            pairs["%s-%s" % (a, b)] = topo.links.get(a, {}).get(b, "?")
    kinds = sorted({v for v in pairs.values()}, key=lambda k: -link_rank(k))
    return {
        "pairs": pairs,
        "link_kinds": kinds,
        "all_nvlink": bool(pairs) and all(v.upper().startswith("NV") for v in pairs.values()),
        "cross_socket_pairs": sorted(p for p, v in pairs.items() if v.upper() in ("SYS", "SOC")),
    }


_PROC_VERSION_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_proc_driver_version(text: str) -> str | None:
    """``/proc/driver/nvidia/version`` -> '550.54.15' (proprietary and open modules)."""
    match = _PROC_VERSION_RE.search(text)
    return match.group(1) if match else None


_SMI_L_GPU_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)")
_SMI_L_MIG_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)")


def parse_smi_list(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi -L``: GPUs with their MIG devices."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        gpu = _SMI_L_GPU_RE.match(line)
        if gpu:
            gpus.append({"index": int(gpu.group(1)), "name": gpu.group(2), "uuid": gpu.group(3), "mig": []})
            continue
        mig = _SMI_L_MIG_RE.match(line)
        if mig and gpus:
            gpus[-1]["mig"].append({"profile": mig.group(1), "uuid": mig.group(3)})
    return gpus


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name, _ in THROTTLE_REASONS if mask & bit]


def bad_throttle(mask: int) -> list[str]:
    return [name for bit, name, bad in THROTTLE_REASONS if bad and mask & bit]


# --------------------------------------------------------------------------- pure: lock


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def canonical_version(version: str) -> str:
    """Equal PEP 440 release spellings compare equal: '2.4' == '2.4.0', case-insensitive."""
    version = version.strip().lower().lstrip("v")
    public, _, local = version.partition("+")
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", public)
    if match:
        release = match.group(1).split(".")
        while len(release) > 1 and release[-1] == "0":
            release.pop()
        public = ".".join(str(int(p)) for p in release) + match.group(2)
    return public + ("+" + local if local else "")


def _major_minor(version: str | None) -> str | None:
    if version is None:
        return None
    match = re.match(r"^(\d+)\.(\d+)", str(version).strip())
    return "%s.%s" % (match.group(1), match.group(2)) if match else str(version).strip()


class LockError(ValueError):
    """The lock file is unreadable or has an unknown shape."""


def validate_lock(lock: Any) -> dict[str, Any]:
    if not isinstance(lock, dict):
        raise LockError("lock is not a JSON object")
    if lock.get("schema") != 1:
        raise LockError("unknown lock schema %r (expected 1)" % (lock.get("schema"),))
    if not isinstance(lock.get("packages", {}), dict) or not isinstance(lock.get("stack", {}), dict):
        raise LockError("lock 'packages' and 'stack' must be objects")
    return lock


def diff_lock(
    lock: Mapping[str, Any],
    installed: Mapping[str, str | None],
    *,
    torch_cuda: str | None,
    python_version: str,
) -> list[str]:
    """Each way the running stack differs from the lock, as one readable line."""
    differences: list[str] = []
    packages = lock.get("packages") or {}
    for name in sorted(packages):
        want = str(packages[name])
        have = installed.get(canonical_name(name))
        if have is None:
            differences.append("%s: lock %s, not installed" % (name, want))
        elif canonical_version(have) != canonical_version(want):
            differences.append("%s: lock %s, installed %s" % (name, want, have))
    stack = lock.get("stack") or {}
    if "cuda" in stack:
        want_cuda = _major_minor(stack["cuda"]) if stack["cuda"] else None
        if want_cuda != _major_minor(torch_cuda):
            differences.append("cuda: lock %s, torch.version.cuda=%s" % (stack["cuda"], torch_cuda))
    if stack.get("python") and _major_minor(str(stack["python"])) != _major_minor(python_version):
        differences.append("python: lock %s, running %s" % (stack["python"], python_version))
    if stack.get("torch") and "torch" not in {canonical_name(n) for n in packages}:
        have = installed.get("torch")
        if have is None or canonical_version(have.split("+")[0]) != canonical_version(
            str(stack["torch"]).split("+")[0]
        ):
            differences.append("torch: lock %s, installed %s" % (stack["torch"], have))
    return differences


# --------------------------------------------------------------------------- pure: numbers


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


# --------------------------------------------------------------------------- pure: aggregation


def summarize(checks: Sequence[Check]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for check in checks:
        counts[check.status] += 1
    return counts


def exit_code_for(checks: Sequence[Check]) -> int:
    """8 when the GPU runtime/driver is missing, else 7 when anything failed, else 0."""
    codes = {c.exit_code or EXIT_FAILED for c in checks if c.status == "fail"}
    if EXIT_GPU_MISSING in codes:
        return EXIT_GPU_MISSING
    return EXIT_FAILED if codes else EXIT_PASS


def evaluate_health(reading: HealthReading) -> list[tuple[str, Outcome]]:
    """Turn one GPU's readings into (check suffix, outcome) pairs."""
    out: list[tuple[str, Outcome]] = []
    temp = reading.temperature_c
    if temp is None:
        out.append(
            ("temperature", skip("temperature not reported", hint="not exposed by this GPU or driver"))
        )
    elif temp >= TEMPERATURE_WARN_C:
        out.append(
            (
                "temperature",
                warn(
                    "GPU at %.0f C (>= %.0f C): clocks throttle around here" % (temp, TEMPERATURE_WARN_C),
                    {"celsius": temp},
                    "check airflow, fan speed and the data-centre inlet temperature",
                ),
            )
        )
    else:
        out.append(("temperature", ok("%.0f C" % temp, {"celsius": temp})))

    power = {
        "draw_w": reading.power_w,
        "limit_w": reading.power_limit_w,
        "default_limit_w": reading.power_default_limit_w,
    }
    if reading.power_w is None and reading.power_limit_w is None:
        out.append(("power", skip("power not reported", hint="not exposed by this GPU or driver")))
    elif (
        reading.power_limit_w is not None
        and reading.power_default_limit_w is not None
        and reading.power_limit_w < reading.power_default_limit_w - 1
    ):
        out.append(
            (
                "power",
                warn(
                    "power limit %.0f W is below the default %.0f W"
                    % (reading.power_limit_w, reading.power_default_limit_w),
                    power,
                    "a lowered power limit caps clocks: nvidia-smi -pl <watts> (root) restores it",
                ),
            )
        )
    else:
        out.append(
            (
                "power",
                ok("%s W of %s W" % (_fmt(reading.power_w), _fmt(reading.power_limit_w)), power),
            )
        )

    clocks: dict[str, Any] = {
        "sm_mhz": reading.sm_clock_mhz,
        "sm_max_mhz": reading.sm_clock_max_mhz,
        "reasons": decode_throttle(reading.throttle_mask) if reading.throttle_mask is not None else None,
    }
    slow = bad_throttle(reading.throttle_mask) if reading.throttle_mask is not None else []
    clock_text = "SM %s of %s MHz" % (_fmt(reading.sm_clock_mhz), _fmt(reading.sm_clock_max_mhz))
    if slow:
        out.append(
            (
                "clocks",
                warn(
                    "%s; clocks held down by %s" % (clock_text, ", ".join(slow)),
                    clocks,
                    "thermal or power-brake slowdown: check cooling and the power supply "
                    "(nvidia-smi -q -d PERFORMANCE)",
                ),
            )
        )
    else:
        out.append(("clocks", ok(clock_text, clocks)))

    ecc = {
        "mode": reading.ecc_mode,
        "volatile_uncorrected": reading.ecc_volatile_uncorrected,
        "aggregate_uncorrected": reading.ecc_aggregate_uncorrected,
    }
    if reading.ecc_volatile_uncorrected is None and reading.ecc_aggregate_uncorrected is None:
        out.append(("ecc", skip("ECC not supported or disabled on this GPU", ecc, "nothing to check")))
    elif (reading.ecc_volatile_uncorrected or 0) > 0:
        out.append(
            (
                "ecc",
                fail(
                    "%d uncorrected ECC errors since the driver loaded"
                    % (reading.ecc_volatile_uncorrected or 0),
                    ecc,
                    "drain this GPU; check nvidia-smi -q -d ECC,ROW_REMAPPER; reset or replace it",
                ),
            )
        )
    elif (reading.ecc_aggregate_uncorrected or 0) > 0:
        out.append(
            (
                "ecc",
                warn(
                    "%d uncorrected ECC errors over the GPU's lifetime"
                    % (reading.ecc_aggregate_uncorrected or 0),
                    ecc,
                    "watch for new errors; check retired pages / remapped rows "
                    "(nvidia-smi -q -d ECC,ROW_REMAPPER)",
                ),
            )
        )
    else:
        out.append(("ecc", ok("no uncorrected ECC errors", ecc)))

    mig = {
        "current": reading.mig_current,
        "pending": reading.mig_pending,
        "instances": list(reading.mig_instances),
    }
    if reading.mig_current is None:
        out.append(("mig", skip("MIG not supported on this GPU", mig, "nothing to check")))
    elif reading.mig_pending is not None and reading.mig_pending != reading.mig_current:
        out.append(
            (
                "mig",
                warn(
                    "MIG mode change pending (%s -> %s)" % (reading.mig_current, reading.mig_pending),
                    mig,
                    "reset the GPU (nvidia-smi -r) or reboot to apply the MIG mode",
                ),
            )
        )
    elif reading.mig_current.lower() == "enabled":
        out.append(
            (
                "mig",
                ok(
                    "MIG enabled, %d instance(s): each instance must be verified on its own"
                    % len(reading.mig_instances),
                    mig,
                ),
            )
        )
    else:
        out.append(("mig", ok("MIG %s" % reading.mig_current.lower(), mig)))
    return out


def _fmt(value: float | None) -> str:
    return "?" if value is None else "%.0f" % value


# --------------------------------------------------------------------------- host probes
# Small functions that return None instead of raising.


def run_command(argv: Sequence[str], timeout: float = 20.0) -> tuple[int, str]:
    """(exit status, stdout+stderr); 127 when the tool is missing."""
    if shutil.which(argv[0]) is None:
        return 127, ""
    try:
        proc = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return 126, str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def detect_container(env: Mapping[str, str]) -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    if env.get("container") or env.get("KUBERNETES_SERVICE_HOST"):
        return True
    cgroup = read_text("/proc/1/cgroup") or ""
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod"))


def gpu_device_nodes() -> list[str]:
    return sorted(p for p in glob.glob("/dev/nvidia*") if re.match(r"^/dev/nvidia\d+$", p))


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return int(stat.f_blocks * stat.f_frsize)


def usable_cpus() -> int:
    """CPUs this process may use: affinity, then a cgroup v2 quota."""
    try:
        count = len(os.sched_getaffinity(0))  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = (read_text("/sys/fs/cgroup/cpu.max") or "").split()
    if len(quota) == 2 and quota[0] != "max":
        with contextlib.suppress(ValueError, ZeroDivisionError):
            count = min(count, max(1, math.ceil(int(quota[0]) / int(quota[1]))))
    return count


def libcuda_info() -> dict[str, Any]:
    """The libcuda this process would load: its path and the CUDA version it supports.

    cuDriverGetVersion needs no cuInit, so this works before torch touches the GPU.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return {}
    info: dict[str, Any] = {}
    version = ctypes.c_int(0)
    try:
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
            info["cuda_version"] = cuda_version_from_int(version.value)
    except (AttributeError, OSError):
        pass
    for line in (read_text("/proc/self/maps") or "").splitlines():
        if "libcuda.so" in line and "/" in line:
            path = line[line.index("/") :].strip()
            info["path"] = os.path.realpath(path)
            # A libcuda under .../compat/ is NVIDIA's forward-compatibility package.
            info["forward_compat"] = "/compat/" in path or "/compat/" in info["path"]
            break
    return info


def probe_driver() -> dict[str, Any]:
    """Driver facts from NVML, else nvidia-smi, else /proc; 'error' when one failed."""
    facts: dict[str, Any] = {"source": None, "version": None}
    nvml = _import_pynvml()
    if nvml is not None:
        try:
            nvml.nvmlInit()
            try:
                facts["version"] = _text(nvml.nvmlSystemGetDriverVersion())
                facts["source"] = "nvml"
                cuda = _try(nvml.nvmlSystemGetCudaDriverVersion)
                if cuda:
                    facts["cuda_version"] = cuda_version_from_int(int(cuda))
                facts["gpus"] = _nvml_gpu_names(nvml)
            finally:
                _try(nvml.nvmlShutdown)
        except Exception as exc:  # NVMLError subclasses; keep the text for classification
            facts["error"] = "NVML: %s" % exc
    if facts["version"] is None:
        rc, out = run_command(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total",
                "--format=csv,noheader,nounits",
            ]
        )
        if rc == 0:
            try:
                rows = parse_smi_csv(out, ("index", "name", "driver_version", "memory.total"))
            except ValueError:
                rows = []
            if rows:
                facts["version"] = rows[0]["driver_version"]
                facts["source"] = "nvidia-smi"
                facts["gpus"] = [r["name"] for r in rows]
        elif rc != 127 and out.strip():
            facts.setdefault("error", "nvidia-smi: %s" % _first_line(out))
    if facts["version"] is None:
        version = parse_proc_driver_version(read_text("/proc/driver/nvidia/version") or "")
        if version:
            facts["version"] = version
            facts["source"] = "/proc/driver/nvidia/version"
    kernel = parse_proc_driver_version(read_text("/proc/driver/nvidia/version") or "")
    if kernel:
        facts["kernel_module"] = kernel
    lib = libcuda_info()
    if lib:
        facts["libcuda"] = lib
        facts.setdefault("cuda_version", lib.get("cuda_version"))
    return facts


def _import_pynvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except Exception:
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _nvml_gpu_names(nvml: Any) -> list[str]:
    names = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        names.append(_text(nvml.nvmlDeviceGetName(handle)))
    return names


def installed_versions(names: Sequence[str]) -> dict[str, str | None]:
    """Installed distribution versions by canonical name (None when missing)."""
    try:
        from importlib import metadata
    except ImportError:  # Python 3.7 and older: nothing to compare with
        return {}
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[canonical_name(name)] = metadata.version(name)
        except Exception:
            out[canonical_name(name)] = None
    return out


# --------------------------------------------------------------------------- the run


class CheckTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Best effort: SIGALRM interrupts Python code (not a blocked CUDA call)."""
    usable = (
        seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CheckTimeout("timed out after %g s" % float(seconds or 0))

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds or 0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclasses.dataclass
class Options:
    json: bool = False
    tier: int = 2
    lock: str | None = None
    cpu_ok: bool = False
    peaks: str | None = None
    report: str | None = None
    timeout: float | None = None


# Which check explains each reason the GPU checks stop.
BLOCK_SOURCES = {
    "torch is not importable": "torch.import",
    "torch is CPU-only": "torch.cuda_build",
    "no GPU visible": "gpu.visible",
}


class Run:
    """Mutable state of one smoke run: facts gathered so far and why GPU checks stop."""

    def __init__(self, options: Options, env: Mapping[str, str]) -> None:
        self.options = options
        self.env = env
        self.checks: list[Check] = []
        self.host: dict[str, Any] = {}
        self.torch_facts: dict[str, Any] = {}
        self.torch: Any = None
        self.driver: dict[str, Any] = {}
        self.gpu_block: str | None = None  # why GPU checks cannot run
        self.devices: list[int] = []
        self.device_block: dict[int, str] = {}
        self.variant = ""

    # -- running one check -------------------------------------------------------

    def check(
        self,
        name: str,
        tier: int,
        fn: Callable[[], Outcome],
        *,
        gpu: bool = False,
        device: int | None = None,
        heavy: bool = False,
        standalone: bool = False,
    ) -> Check:
        """Run one check. ``gpu``: skipped (never passed) when no GPU is usable, unless
        ``standalone`` (it reads the driver, not torch, so a pass there is real)."""
        blocked = None if standalone else self._blocked(gpu, device)
        start = time.perf_counter()
        outcome = self._call(fn, heavy) if blocked is None else skip(*blocked)
        if (
            gpu
            and not standalone
            and self.options.cpu_ok
            and self.gpu_block is not None
            and outcome.status == "pass"
        ):
            outcome = skip(outcome.message)  # never let a GPU check pass without a GPU
        if outcome.status != "pass" and not outcome.hint:
            # Every non-pass carries a hint; a check that forgot one must not ship empty.
            outcome = dataclasses.replace(outcome, hint="see the message; rerun with --json for values")
        result = Check(
            name=name,
            tier=tier,
            status=outcome.status,
            message=outcome.message,
            value=outcome.value,
            hint=outcome.hint,
            seconds=time.perf_counter() - start,
            exit_code=outcome.exit_code if outcome.status == "fail" else 0,
            gpu=gpu,
        )
        self.checks.append(result)
        return result

    def _blocked(self, gpu: bool, device: int | None) -> tuple[str, Any, str] | None:
        """(message, value, hint) of the skip when a check cannot run, else None."""
        if not gpu or self.gpu_block is None:
            if device is not None and device in self.device_block:
                return (
                    "blocked: %s" % self.device_block[device],
                    None,
                    "fix gpu.arch@cuda:%d first" % device,
                )
            return None
        source = BLOCK_SOURCES.get(self.gpu_block, "the first failure above")
        if self.options.cpu_ok:
            return (
                "no GPU (--cpu-ok): %s" % self.gpu_block,
                None,
                "a GPU check: it runs on a GPU host (see %s)" % source,
            )
        return ("blocked: %s" % self.gpu_block, None, "fix %s first" % source)

    def _call(self, fn: Callable[[], Outcome], heavy: bool) -> Outcome:
        try:
            with deadline(self.options.timeout if heavy else None):
                return fn()
        except CheckTimeout as exc:
            return fail(
                str(exc),
                hint="the check hung: a stuck GPU, a deadlocked worker, or a "
                "very slow host; rerun with a larger --timeout to tell them apart",
            )
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            return self.outcome_from_error(exc)

    def outcome_from_error(self, exc: BaseException) -> Outcome:
        text = "%s: %s" % (type(exc).__name__, exc)
        known = classify_cuda_error(
            str(exc),
            torch_cuda=self.torch_facts.get("cuda"),
            driver_version=self.driver.get("version"),
            driver_cuda=self.driver.get("cuda_version"),
        )
        if known is not None:
            return fail(known.message, {"error": _first_line(text)}, known.hint, known.exit_code)
        return fail(
            "unexpected error: %s" % _first_line(text),
            hint="see the error text; rerun with CUDA_LAUNCH_BLOCKING=1 for CUDA errors",
        )

    # -- the report --------------------------------------------------------------

    def report(self, tier_seconds: Mapping[int, float]) -> dict[str, Any]:
        code = exit_code_for(self.checks)
        return {
            "schema": SCHEMA,
            "tiers": list(range(self.options.tier + 1)),
            "cpu_ok": self.options.cpu_ok,
            "host": self.host,
            "torch": self.torch_facts,
            "checks": [c.to_json() for c in self.checks],
            "summary": summarize(self.checks),
            "exit_code": code,
            "tier_seconds": {str(t): round(s, 3) for t, s in tier_seconds.items()},
        }


# --------------------------------------------------------------------------- T0 environment


def tier0(run: Run) -> None:
    run.host.update(
        {
            "python": platform.python_version(),
            "executable": sys.executable,
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "usable_cpus": usable_cpus(),
            "shm_bytes": shm_bytes(),
            "in_container": detect_container(run.env),
            "dev_nodes": gpu_device_nodes(),
            "env": {
                k: run.env.get(k)
                for k in (
                    "NVIDIA_VISIBLE_DEVICES",
                    "CUDA_VISIBLE_DEVICES",
                    "NVIDIA_DRIVER_CAPABILITIES",
                    "NVIDIA_REQUIRE_CUDA",
                    "LD_LIBRARY_PATH",
                )
            },
        }
    )
    if run.options.lock:
        # The lock names the variant the image was built for: hints can name its index.
        run.variant = lock_variant(run.options.lock)
    run.check("python", 0, lambda: ok("Python %s" % run.host["python"], {"executable": sys.executable}))
    # The driver probe needs no torch: it runs first and is never blocked.
    run.check("driver", 0, lambda: _check_driver(run), gpu=True, standalone=True)
    run.check("torch.import", 0, lambda: _check_torch_import(run))
    run.check("torch.cuda_build", 0, lambda: _check_cuda_build(run), gpu=True)
    run.check("container.gpu_env", 0, lambda: _check_gpu_env(run))
    run.check(
        "cpu",
        0,
        lambda: ok(
            "%s usable of %s CPUs" % (run.host["usable_cpus"], run.host["cpu_count"]),
            {"cpu_count": run.host["cpu_count"], "usable": run.host["usable_cpus"]},
        ),
    )
    if run.options.lock:
        run.check("lock", 0, lambda: _check_lock(run))


def lock_variant(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            lock = json.load(handle)
        return str(lock["stack"]["variant"] or "")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _check_torch_import(run: Run) -> Outcome:
    try:
        import torch
    except Exception as exc:
        run.gpu_block = "torch is not importable"
        return fail(
            "torch is not importable: %s: %s" % (type(exc).__name__, exc),
            hint="install the pinned torch from envbuild.lock into this interpreter (%s)" % sys.executable,
        )
    run.torch = torch
    facts = run.torch_facts
    facts["version"] = str(torch.__version__)
    facts["cuda"] = getattr(torch.version, "cuda", None)
    facts["hip"] = getattr(torch.version, "hip", None)
    facts["cudnn"] = _try(torch.backends.cudnn.version)
    facts["arch_list"] = torch_arch_list(torch)
    facts["file"] = getattr(torch, "__file__", None)
    return ok("torch %s" % facts["version"], {"version": facts["version"], "file": facts["file"]})


def torch_arch_list(torch: Any) -> list[str]:
    """The wheel's arch list, even where no GPU is visible (get_arch_list() is then [])."""
    archs = _try(torch.cuda.get_arch_list) or []
    if not archs:
        flags = _try(getattr(torch._C, "_cuda_getArchFlags", lambda: None))
        if flags:
            archs = str(flags).split()
    return [str(a) for a in archs]


def _check_cuda_build(run: Run) -> Outcome:
    torch = run.torch
    if torch is None:
        return skip("torch is not importable", hint="fix torch.import first")
    cuda, hip = run.torch_facts["cuda"], run.torch_facts["hip"]
    value = {
        "cuda": cuda,
        "cudnn": run.torch_facts["cudnn"],
        "arch_list": run.torch_facts["arch_list"],
    }
    if cuda is None:
        run.gpu_block = "torch is CPU-only"
        what = (
            "torch is a ROCm build (torch.version.hip=%s), not CUDA" % hip
            if hip
            else "torch is CPU-only (torch.version.cuda=None)"
        )
        if run.options.cpu_ok:
            hint = cpu_only_hint(run.torch_facts["version"], run.variant, run.env)
            return skip("%s; accepted by --cpu-ok" % what, value, hint)
        return fail(what, value, cpu_only_hint(run.torch_facts["version"], run.variant, run.env))
    return ok(
        "CUDA %s, cuDNN %s, archs %s" % (cuda, value["cudnn"], " ".join(value["arch_list"]) or "?"),
        value,
    )


def cpu_only_hint(version: str, variant: str, env: Mapping[str, str]) -> str:
    """Name the index that has the CUDA wheel, and where the CPU one likely came from."""
    base = version.split("+")[0]
    if variant and variant != "cpu":
        index = "%s/%s" % (PYTORCH_INDEX, variant)
        hint = "install the CUDA build: pip install torch==%s --index-url %s" % (base, index)
    else:
        hint = (
            "install a CUDA build of torch %s from %s/cuXYZ (envbuild resolve picks cuXYZ for "
            "the host driver)" % (base, PYTORCH_INDEX)
        )
    sources = [k + "=" + env[k] for k in ("PIP_FIND_LINKS", "PIP_INDEX_URL") if env.get(k)]
    if sources:
        hint += "; the +cpu wheel probably came from " + ", ".join(sources)
    return hint


def _check_driver(run: Run) -> Outcome:
    run.driver = probe_driver()
    run.host["driver"] = run.driver
    error = run.driver.get("error")
    if error:
        known = classify_cuda_error(error)
        if known is not None and known.kind == "driver-mismatch":
            return fail(known.message, run.driver, known.hint, known.exit_code)
    if run.driver.get("version") is None:
        text = "no NVIDIA driver found (NVML, nvidia-smi, /proc/driver/nvidia/version)"
        if run.options.cpu_ok:
            return skip(text, run.driver, "a GPU check: it reads the driver on a GPU host")
        return warn(
            text,
            run.driver,
            "on a host: install the driver; in a container: start it with --gpus all and "
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility so nvidia-smi/NVML are mounted",
        )
    message = "driver %s (from %s)" % (run.driver["version"], run.driver["source"])
    if run.driver.get("cuda_version"):
        message += ", supports CUDA <= %s" % run.driver["cuda_version"]
    if (run.driver.get("libcuda") or {}).get("forward_compat"):
        message += "; forward-compat libcuda in use"
    return ok(message, run.driver)


def _check_gpu_env(run: Run) -> Outcome:
    env = run.host["env"]
    value = {
        "env": env,
        "in_container": run.host["in_container"],
        "dev_nodes": run.host["dev_nodes"],
    }
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES")
    if caps is not None and caps.strip() and not {"compute", "all"} & {c.strip() for c in caps.split(",")}:
        return warn(
            "NVIDIA_DRIVER_CAPABILITIES=%s lacks compute: libcuda is not mounted" % caps,
            value,
            "set NVIDIA_DRIVER_CAPABILITIES=compute,utility (or all)",
        )
    shown = ", ".join("%s=%s" % (k, v) for k, v in env.items() if v is not None and k != "LD_LIBRARY_PATH")
    return ok(shown or "no NVIDIA/CUDA variables set", value)


def _check_lock(run: Run) -> Outcome:
    path = run.options.lock or ""
    try:
        with open(path, encoding="utf-8") as handle:
            lock = validate_lock(json.load(handle))
    except (OSError, ValueError) as exc:
        return fail(
            "lock %s unreadable: %s" % (path, exc),
            hint="pass the envbuild.lock the image was built from",
        )
    run.variant = str((lock.get("stack") or {}).get("variant") or "")
    names = list((lock.get("packages") or {}).keys())
    if "torch" not in {canonical_name(n) for n in names}:
        names.append("torch")
    differences = diff_lock(
        lock,
        installed_versions(names),
        torch_cuda=run.torch_facts.get("cuda"),
        python_version=platform.python_version(),
    )
    if differences:
        return fail(
            "stack differs from lock: " + "; ".join(differences),
            {"differences": differences, "lock": path},
            "rebuild from the lock (envbuild build -f %s) or reinstall the pinned versions" % path,
        )
    return ok("stack matches %s (%d packages)" % (path, len(names)), {"lock": path})


# --------------------------------------------------------------------------- T1 correctness


def tier1(run: Run) -> None:
    visible = run.check("gpu.visible", 1, lambda: _check_visible(run), gpu=True)
    if visible.status != "pass" and run.gpu_block is None:
        run.gpu_block = "no GPU visible"
    for index in _indices(run):
        suffix = "" if index is None else "@cuda:%d" % index
        for name, fn, heavy in T1_DEVICE_CHECKS:
            run.check(name + suffix, 1, _bind(fn, run, index), gpu=True, device=index, heavy=heavy)
    run.check("cpu.selfcheck", 1, lambda: _check_cpu_selfcheck(run), heavy=True)


def _indices(run: Run) -> list[int | None]:
    """Each visible device, or one None so the GPU checks still appear (as skips)."""
    return list(run.devices) or [None]


def _bind(fn: Callable[[Run, int], Outcome], run: Run, index: int | None) -> Callable[[], Outcome]:
    def call() -> Outcome:
        if index is None:  # only reached when no GPU is visible; the runner skips it first
            return skip("no GPU", hint="needs a visible GPU")
        return fn(run, index)

    return call


def _matmul_on(dtype: str) -> Callable[[Run, int], Outcome]:
    def check(run: Run, index: int) -> Outcome:
        return check_matmul(run.torch, "cuda:%d" % index, dtype)

    return check


def _optimizer_on(run: Run, index: int) -> Outcome:
    return check_optimizer(run.torch, "cuda:%d" % index)


def _check_visible(run: Run) -> Outcome:
    torch = run.torch
    init_error: str | None = None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count()) if available else 0
        try:
            # Initialises CUDA when a GPU is there; raises the real reason when not.
            torch.cuda.init()
        except Exception as exc:
            init_error = str(exc)
    caught = [str(w.message) for w in seen]
    if init_error is None and not count:
        init_error = next((m for m in caught if "CUDA initialization" in m), None)
    if count and init_error is None:
        run.devices = list(range(count))
        devices = []
        for i in run.devices:
            cap = tuple(torch.cuda.get_device_capability(i))
            props = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "name": torch.cuda.get_device_name(i),
                    "capability": "%d.%d" % cap,
                    "memory_bytes": int(props.total_memory),
                    "multi_processor_count": int(props.multi_processor_count),
                }
            )
        run.torch_facts["devices"] = devices
        run.torch_facts["arch_list"] = torch_arch_list(torch)
        names = ", ".join(
            "cuda:%d %s (sm_%s)" % (d["index"], d["name"], d["capability"].replace(".", "")) for d in devices
        )
        return ok("%d GPU(s): %s" % (count, names), {"devices": devices, "warnings": caught})
    run.gpu_block = "no GPU visible"
    diagnosis = diagnose_no_gpu(
        env=run.env,
        dev_nodes=run.host.get("dev_nodes", []),
        in_container=bool(run.host.get("in_container")),
        init_error=init_error,
        torch_cuda=run.torch_facts.get("cuda"),
        driver_version=(run.driver or {}).get("version"),
        driver_cuda=(run.driver or {}).get("cuda_version"),
    )
    value = {"kind": diagnosis.kind, "init_error": init_error, "warnings": caught}
    if run.options.cpu_ok:
        return skip(diagnosis.message + "; accepted by --cpu-ok", value, diagnosis.hint)
    return fail(diagnosis.message, value, diagnosis.hint, diagnosis.exit_code)


def _check_arch(run: Run, index: int) -> Outcome:
    torch = run.torch
    capability = tuple(int(x) for x in torch.cuda.get_device_capability(index))
    cap = (capability[0], capability[1])
    archs = run.torch_facts.get("arch_list") or []
    if not archs:
        return skip(
            "torch reports no arch list; the kernel checks below decide",
            hint="gpu.kernel and the matmul checks prove the GPU runs",
        )
    coverage = arch_coverage(cap, archs)
    value = {
        "capability": "%d.%d" % cap,
        "arch_list": archs,
        "how": coverage.how,
        "entry": coverage.entry,
    }
    if not coverage.covered:
        run.device_block[index] = "sm_%d%d not in the wheel's arch list" % cap
        return fail(coverage.detail, value, arch_hint(cap, archs, run.variant))
    if coverage.how == "ptx-jit":
        return warn(
            "sm_%d%d covered %s" % (cap[0], cap[1], coverage.detail),
            value,
            "first use compiles every kernel (slow start) and needs a driver that knows this PTX; "
            "a variant with SASS for sm_%d%d avoids both" % cap,
        )
    return ok("sm_%d%d: %s" % (cap[0], cap[1], coverage.detail), value)


def _check_kernel(run: Run, index: int) -> Outcome:
    """A first, trivial kernel with an exact answer: launch failures surface here."""
    torch = run.torch
    device = "cuda:%d" % index
    n = 1 << 20
    x = torch.arange(n, device=device, dtype=torch.int64)
    total = int((x * 2 + 1).sum().item())
    torch.cuda.synchronize(index)
    if total != n * n:  # sum of the first n odd numbers
        return fail(
            "numerical check failed: elementwise kernel sum %d, expected %d" % (total, n * n),
            hint="the GPU returns wrong results for a trivial kernel: check dmesg for Xid errors",
        )
    return ok("elementwise kernel launched and verified on %s" % device)


def _seeded(torch: Any, seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def _no_tf32(torch: Any) -> Iterator[None]:
    """Numerical checks compare real fp32; TF32 would widen the tolerance tenfold."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _dtype(torch: Any, name: str) -> Any:
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def check_matmul(torch: Any, device: str, dtype_name: str, n: int = 512) -> Outcome:
    """A @ B on ``device`` in ``dtype`` vs float64 on the CPU from the same rounded inputs."""
    if device.startswith("cuda") and dtype_name == "bf16":
        index = int(device.split(":")[1])
        if tuple(torch.cuda.get_device_capability(index)) < (8, 0):
            supported = _try(torch.cuda.is_bf16_supported)
            if not supported:
                return skip(
                    "bf16 matmul not supported on this GPU (needs sm_80 or newer)",
                    hint="fp16 and fp32 are checked instead",
                )
    dtype = _dtype(torch, dtype_name)
    gen = _seeded(torch, 1234)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    ref = a.double() @ b.double()
    with _no_tf32(torch):
        got = (a.to(device) @ b.to(device)).float().cpu()
    return compare_result(
        "%s matmul %dx%d on %s" % (dtype_name, n, n, device), got, ref, MATMUL_TOLERANCE[dtype_name]
    )


def check_conv(torch: Any, device: str) -> Outcome:
    """conv2d forward and backward (input and weight gradients) vs float64 on the CPU."""
    functional = torch.nn.functional
    gen = _seeded(torch, 4321)
    x = torch.randn(8, 16, 32, 32, generator=gen)
    w = torch.randn(32, 16, 3, 3, generator=gen) * 0.1
    grad = torch.randn(8, 32, 32, 32, generator=gen)

    def run_on(dev: str, dtype: Any) -> tuple[Any, Any, Any]:
        xi = x.to(dev, dtype).requires_grad_(True)
        wi = w.to(dev, dtype).requires_grad_(True)
        out = functional.conv2d(xi, wi, padding=1)
        out.backward(grad.to(dev, dtype))
        return out.detach().cpu(), xi.grad.cpu(), wi.grad.cpu()

    ref = run_on("cpu", torch.float64)
    with _no_tf32(torch):
        got = run_on(device, torch.float32)
    for label, g, r in zip(("forward", "grad_input", "grad_weight"), got, ref):
        verdict = compare_result("conv2d %s on %s" % (label, device), g, r, CONV_TOLERANCE)
        if verdict.status != "pass":
            return verdict
    return ok("conv2d forward+backward on %s match the CPU reference" % device)


def _check_conv(run: Run, index: int) -> Outcome:
    torch = run.torch
    if not torch.backends.cudnn.is_available():
        return fail(
            "cuDNN is not available to torch",
            hint="the wheel's nvidia-cudnn package is missing or shadowed: run pip check, "
            "and ldd on libtorch_cuda.so",
        )
    saved = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = True
    try:
        verdict = check_conv(torch, "cuda:%d" % index)
    finally:
        torch.backends.cudnn.enabled = saved
    if verdict.status == "pass":
        return ok(verdict.message + " (cuDNN %s)" % run.torch_facts.get("cudnn"), verdict.value)
    return verdict


def check_optimizer(torch: Any, device: str) -> Outcome:
    """One SGD step (momentum, weight decay) of a small MLP; parameters vs the CPU."""
    gen = _seeded(torch, 99)
    layers = [torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)]
    for layer in layers:
        if isinstance(layer, torch.nn.Linear):
            with torch.no_grad():
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.1)
                layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen) * 0.1)
    model = torch.nn.Sequential(*layers)
    x = torch.randn(32, 64, generator=gen)
    y = torch.randint(0, 10, (32,), generator=gen)

    def step(dev: str, dtype: Any) -> list[Any]:
        m = _clone_module(torch, model).to(dev, dtype)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        loss = torch.nn.functional.cross_entropy(m(x.to(dev, dtype)), y.to(dev))
        loss.backward()
        opt.step()
        return [p.detach().cpu() for p in m.parameters()]

    ref = step("cpu", torch.float64)
    with _no_tf32(torch):
        got = step(device, torch.float32)
    for i, (g, r) in enumerate(zip(got, ref)):
        verdict = compare_result("optimizer step parameter %d on %s" % (i, device), g, r, OPTIMIZER_TOLERANCE)
        if verdict.status != "pass":
            return verdict
    return ok("one SGD step on %s matches the CPU reference" % device)


def _clone_module(torch: Any, module: Any) -> Any:
    return copy.deepcopy(module)


def _check_cpu_selfcheck(run: Run) -> Outcome:
    """The same comparisons on the CPU: proves torch's CPU kernels and the checker itself."""
    torch = run.torch
    if torch is None:
        return skip("torch is not importable", hint="fix torch.import first")
    for verdict in (
        check_matmul(torch, "cpu", "fp32"),
        check_conv(torch, "cpu"),
        check_optimizer(torch, "cpu"),
    ):
        if verdict.status != "pass":
            return verdict
    return ok("CPU fp32 matmul, conv2d forward+backward and an SGD step match float64")


# Per-device correctness checks: (name, function, heavy). Order matters: the arch
# check can block the rest for its device.
T1_DEVICE_CHECKS: tuple[tuple[str, Callable[[Run, int], Outcome], bool], ...] = (
    ("gpu.arch", _check_arch, False),
    ("gpu.kernel", _check_kernel, False),
    ("matmul.fp32", _matmul_on("fp32"), True),
    ("matmul.fp16", _matmul_on("fp16"), True),
    ("matmul.bf16", _matmul_on("bf16"), True),
    ("conv2d.cudnn", _check_conv, True),
    ("optimizer.step", _optimizer_on, True),
)


# --------------------------------------------------------------------------- T2 why GPUs idle


def tier2(run: Run) -> None:
    peaks, peaks_path = load_peaks(run.options.peaks)
    for index in _indices(run):
        suffix = "" if index is None else "@cuda:%d" % index
        for dtype in ("bf16", "fp32"):
            run.check(
                "matmul.tflops.%s%s" % (dtype, suffix),
                2,
                _bind(_tflops_on(dtype, peaks, peaks_path), run, index),
                gpu=True,
                device=index,
                heavy=True,
            )
        run.check(
            "h2d_d2h.bandwidth" + suffix,
            2,
            _bind(_check_bandwidth, run, index),
            gpu=True,
            device=index,
            heavy=True,
        )
    first = _indices(run)[0]
    run.check(
        "launch.latency" + ("" if first is None else "@cuda:%d" % first),
        2,
        _bind(_check_latency, run, first),
        gpu=True,
        device=first,
        heavy=True,
    )
    run.check("dataloader.workers", 2, lambda: _check_dataloader(run), heavy=True)
    run.check("shm.size", 2, lambda: check_shm(run.host.get("shm_bytes")))


def load_peaks(path: str | None) -> tuple[dict[str, Any], str | None]:
    """The peaks table: --peaks FILE, else smoke_peaks.json beside this file, else empty."""
    candidate = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "smoke_peaks.json")
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
    dtype = _dtype(torch, dtype_name)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    with _no_tf32(torch):
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
    if not peak:
        value["peak_tflops"] = None
        where = peaks_path or "no peaks table (--peaks FILE or smoke_peaks.json)"
        return ok(
            "%s matmul %.1f TFLOPS (no peak known for %s in %s)" % (dtype_name, tflops, name, where),
            value,
        )
    fraction = tflops / float(peak)
    value.update(
        {
            "peak_tflops": peak,
            "fraction": round(fraction, 3),
            "peak_row": found[0] if found else None,
        }
    )
    text = "%s matmul %.1f TFLOPS = %.0f%% of %s peak %.0f" % (
        dtype_name,
        tflops,
        100 * fraction,
        found[0] if found else "",
        peak,
    )
    if fraction < PEAK_FRACTION_WARN:
        return warn(
            text,
            value,
            "far below peak: power cap, thermal throttling, a MIG slice, another process on the "
            "GPU, or a wrong peaks row (see the health tier: --tier 4)",
        )
    return ok(text, value)


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


class SyntheticImages:
    """A map-style dataset with per-item CPU work like decoding and augmenting an image.

    Module-level and torch-free until __getitem__, so spawn/forkserver workers can load it.
    """

    def __init__(self, items: int, size: int = 64) -> None:
        self.items = items
        self.size = size

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> Any:
        import torch

        gen = torch.Generator().manual_seed(index)
        image = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=gen)
        x = image.float().div_(255.0).unsqueeze(0)
        for _ in range(4):  # stands in for decode + augmentation cost
            x = torch.nn.functional.avg_pool2d(x, 3, stride=1, padding=1)
        return x.squeeze(0).flip(-1)


def measure_dataloader(torch: Any, workers: int, items: int = 384, batch: int = 32) -> float:
    """Items per second through a DataLoader with ``workers`` worker processes."""
    loader = torch.utils.data.DataLoader(
        SyntheticImages(items), batch_size=batch, num_workers=workers, timeout=120 if workers else 0
    )
    start = time.perf_counter()
    seen = 0
    for batch_tensor in loader:
        seen += int(batch_tensor.shape[0])
    return seen / (time.perf_counter() - start)


def _check_dataloader(run: Run) -> Outcome:
    torch = run.torch
    if torch is None:
        return skip("torch is not importable", hint="fix torch.import first")
    workers = max(2, min(4, int(run.host.get("usable_cpus") or 2)))
    try:
        serial = measure_dataloader(torch, 0)
        parallel = measure_dataloader(torch, workers)
    except Exception as exc:
        text = str(exc)
        low = text.lower()
        if any(k in low for k in ("shared memory", "bus error", "exited unexpectedly", "no space left")):
            return fail(
                "DataLoader workers crashed: %s" % _first_line(text),
                {"shm_bytes": run.host.get("shm_bytes")},
                "workers pass batches through /dev/shm: run the container with --shm-size=8g or --ipc=host",
            )
        raise
    value = {
        "workers": workers,
        "items_per_s_0_workers": round(serial, 1),
        "items_per_s_n_workers": round(parallel, 1),
        "speedup": round(parallel / serial, 2) if serial else None,
    }
    return ok(
        "%.0f items/s with 0 workers, %.0f with %d workers (x%.2f)"
        % (serial, parallel, workers, parallel / serial),
        value,
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


# --------------------------------------------------------------------------- T3 several GPUs


def tier3(run: Run) -> None:
    count = len(run.devices)
    few = None if count >= 2 else "needs 2 or more GPUs (found %d)" % count
    for name, fn, heavy in (
        ("p2p.access", lambda: _check_p2p(run), False),
        ("topology", _check_topology, False),
        ("nccl.allreduce", lambda: _check_nccl(run), True),
    ):
        if few is not None and run.gpu_block is None:
            run.check(name, 3, lambda f=few: skip(f), gpu=True)  # type: ignore[misc]
        else:
            run.check(name, 3, fn, gpu=True, heavy=heavy)


def _check_p2p(run: Run) -> Outcome:
    torch = run.torch
    matrix: dict[str, dict[str, bool]] = {}
    missing = []
    for i in run.devices:
        matrix["cuda:%d" % i] = {}
        for j in run.devices:
            if i == j:
                continue
            can = bool(torch.cuda.can_device_access_peer(i, j))
            matrix["cuda:%d" % i]["cuda:%d" % j] = can
            if not can:
                missing.append("%d->%d" % (i, j))
    if missing:
        return warn(
            "no peer access for %s: copies between these GPUs go through host memory" % ", ".join(missing),
            matrix,
            "PCIe P2P can be off across CPU sockets or in VMs; NVLink pairs always allow it",
        )
    return ok("peer access between all %d GPUs" % len(run.devices), matrix)


def _check_topology() -> Outcome:
    rc, out = run_command(["nvidia-smi", "topo", "-m"])
    if rc != 0:
        return skip(
            "nvidia-smi topo -m unavailable (exit %d)" % rc,
            None,
            "set NVIDIA_DRIVER_CAPABILITIES=compute,utility so nvidia-smi is mounted",
        )
    topo = parse_topo(out)
    summary = summarize_topology(topo)
    summary["cpu_affinity"] = topo.cpu_affinity
    text = "links: %s" % ", ".join("%s %s" % (p, k) for p, k in sorted(summary["pairs"].items()))
    if summary["cross_socket_pairs"]:
        return warn(
            text,
            summary,
            "some GPU pairs cross the CPU socket interconnect (SYS): keep "
            "communicating ranks on one NUMA node and pin processes to each GPU's CPU affinity",
        )
    return ok(text, summary)


def _nccl_worker(rank: int, world: int, init_file: str, nbytes: int, queue: Any) -> None:
    """One process per GPU: a checked all-reduce, then a timed one."""
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=world)
        x = torch.full((1 << 20,), float(rank + 1), device="cuda:%d" % rank)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        wrong = int((x != float(world * (world + 1) // 2)).sum().item())
        buf = torch.ones(nbytes // 4, device="cuda:%d" % rank)
        for _ in range(5):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        iters = 20
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        queue.put({"rank": rank, "wrong": wrong, "seconds": seconds})
        dist.destroy_process_group()
    except Exception as exc:
        queue.put({"rank": rank, "error": "%s: %s" % (type(exc).__name__, exc)})


def _check_nccl(run: Run) -> Outcome:
    import multiprocessing

    torch = run.torch
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return fail("torch was built without NCCL", hint="install the CUDA wheel from the PyTorch index")
    world = len(run.devices)
    nbytes = 256 << 20
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    limit = run.options.timeout or 180.0
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            context.Process(target=_nccl_worker, args=(r, world, init_file, nbytes, queue))
            for r in range(world)
        ]
        for proc in procs:
            proc.start()
        results: list[dict[str, Any]] = []
        end = time.monotonic() + limit
        try:
            while len(results) < world and time.monotonic() < end:
                with contextlib.suppress(Exception):
                    results.append(queue.get(timeout=1.0))
        finally:
            for proc in procs:
                proc.join(timeout=max(0.0, end - time.monotonic()) if len(results) == world else 1.0)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)
    if len(results) < world:
        return fail(
            "NCCL all-reduce timed out after %.0f s (%d of %d ranks reported)" % (limit, len(results), world),
            hint="rerun with NCCL_DEBUG=INFO; try NCCL_P2P_DISABLE=1 to test the P2P path",
        )
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        known = classify_cuda_error(errors[0])
        return fail(
            "NCCL all-reduce failed: %s" % errors[0],
            {"errors": errors},
            known.hint if known else "rerun with NCCL_DEBUG=INFO",
        )
    wrong = sum(int(r["wrong"]) for r in results)
    seconds = max(float(r["seconds"]) for r in results)
    busbw = bus_bandwidth_gbs(nbytes, seconds, world)
    value = {
        "ranks": world,
        "bytes": nbytes,
        "seconds": seconds,
        "busbw_gbs": round(busbw, 2),
        "wrong": wrong,
    }
    if wrong:
        return fail(
            "numerical check failed: NCCL all-reduce gave %d wrong elements" % wrong,
            value,
            "a broken link or GPU: run nccl-tests and check dmesg for Xid errors",
        )
    return ok(
        "NCCL all-reduce %d MiB over %d GPUs: bus bandwidth %.1f GB/s" % (nbytes >> 20, world, busbw),
        value,
    )


# --------------------------------------------------------------------------- T4 health

HEALTH_FIELDS = (
    "index",
    "name",
    "uuid",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "power.default_limit",
    "clocks.sm",
    "clocks.max.sm",
    "clocks_throttle_reasons.active",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "mig.mode.current",
    "mig.mode.pending",
)


def health_from_smi_rows(
    rows: Sequence[Mapping[str, str | None]], listing: Sequence[Mapping[str, Any]] = ()
) -> list[HealthReading]:
    """nvidia-smi CSV rows (plus ``nvidia-smi -L`` for MIG devices) -> readings."""
    migs = {int(g["index"]): tuple(m["profile"] + " " + m["uuid"] for m in g["mig"]) for g in listing}
    readings = []
    for row in rows:
        index = parse_int(row.get("index")) or 0
        readings.append(
            HealthReading(
                index=index,
                name=row.get("name") or "",
                uuid=row.get("uuid") or "",
                temperature_c=parse_float(row.get("temperature.gpu")),
                power_w=parse_float(row.get("power.draw")),
                power_limit_w=parse_float(row.get("power.limit")),
                power_default_limit_w=parse_float(row.get("power.default_limit")),
                sm_clock_mhz=parse_float(row.get("clocks.sm")),
                sm_clock_max_mhz=parse_float(row.get("clocks.max.sm")),
                throttle_mask=parse_int(
                    row.get("clocks_throttle_reasons.active") or row.get("clocks_event_reasons.active")
                ),
                ecc_mode=row.get("ecc.mode.current"),
                ecc_volatile_uncorrected=parse_int(row.get("ecc.errors.uncorrected.volatile.total")),
                ecc_aggregate_uncorrected=parse_int(row.get("ecc.errors.uncorrected.aggregate.total")),
                mig_current=row.get("mig.mode.current"),
                mig_pending=row.get("mig.mode.pending"),
                mig_instances=migs.get(index, ()),
            )
        )
    return readings


_INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')


def query_smi(fields: Sequence[str]) -> tuple[list[str], str] | None:
    """Run ``nvidia-smi --query-gpu``, dropping fields this driver does not know."""
    fields = list(fields)
    for _ in range(len(fields)):
        rc, out = run_command(
            ["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]
        )
        if rc == 0:
            return fields, out
        bad = _INVALID_FIELD_RE.search(out)
        if bad is None or bad.group(1) not in fields:
            return None
        if bad.group(1) == "clocks_throttle_reasons.active":
            # Newer drivers name it clocks_event_reasons.active.
            fields[fields.index(bad.group(1))] = "clocks_event_reasons.active"
        else:
            fields.remove(bad.group(1))
    return None


def health_from_smi() -> list[HealthReading] | None:
    result = query_smi(HEALTH_FIELDS)
    if result is None:
        return None
    fields, out = result
    _, listing = run_command(["nvidia-smi", "-L"])
    return health_from_smi_rows(parse_smi_csv(out, fields), parse_smi_list(listing))


def health_from_nvml(nvml: Any) -> list[HealthReading]:
    nvml.nvmlInit()
    try:
        return [_nvml_reading(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount()))]
    finally:
        _try(nvml.nvmlShutdown)


def _nvml_reading(nvml: Any, index: int) -> HealthReading:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    mig = _try(nvml.nvmlDeviceGetMigMode, h)
    ecc = _try(nvml.nvmlDeviceGetEccMode, h)
    return HealthReading(
        index=index,
        name=_text(_try(nvml.nvmlDeviceGetName, h) or ""),
        uuid=_text(_try(nvml.nvmlDeviceGetUUID, h) or ""),
        temperature_c=_try(nvml.nvmlDeviceGetTemperature, h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
        power_w=_milli(_try(nvml.nvmlDeviceGetPowerUsage, h)),
        power_limit_w=_milli(_try(nvml.nvmlDeviceGetEnforcedPowerLimit, h)),
        power_default_limit_w=_milli(_try(nvml.nvmlDeviceGetPowerManagementDefaultLimit, h)),
        sm_clock_mhz=_try(nvml.nvmlDeviceGetClockInfo, h, getattr(nvml, "NVML_CLOCK_SM", 1)),
        sm_clock_max_mhz=_try(nvml.nvmlDeviceGetMaxClockInfo, h, getattr(nvml, "NVML_CLOCK_SM", 1)),
        throttle_mask=_try(reasons, h) if reasons else None,
        ecc_mode=None if not ecc else ("Enabled" if ecc[0] else "Disabled"),
        ecc_volatile_uncorrected=_try(
            nvml.nvmlDeviceGetTotalEccErrors, h, uncorrected, getattr(nvml, "NVML_VOLATILE_ECC", 0)
        ),
        ecc_aggregate_uncorrected=_try(
            nvml.nvmlDeviceGetTotalEccErrors, h, uncorrected, getattr(nvml, "NVML_AGGREGATE_ECC", 1)
        ),
        mig_current=None if mig is None else ("Enabled" if mig[0] else "Disabled"),
        mig_pending=None if mig is None else ("Enabled" if mig[1] else "Disabled"),
        mig_instances=_nvml_mig_instances(nvml, h) if mig and mig[0] else (),
    )


def _milli(value: Any) -> float | None:
    return None if value is None else float(value) / 1000.0


def _nvml_mig_instances(nvml: Any, handle: Any) -> tuple[str, ...]:
    found = []
    for slot in range(int(_try(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0)):
        mig = _try(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is not None:
            found.append(_text(_try(nvml.nvmlDeviceGetUUID, mig) or "slot %d" % slot))
    return tuple(found)


def tier4(run: Run) -> None:
    """Health readings come from the driver (NVML or nvidia-smi), not torch."""
    readings: list[HealthReading] | None = None
    source = ""
    error = ""
    nvml = _import_pynvml()
    if nvml is not None:
        try:
            readings, source = health_from_nvml(nvml), "nvml"
        except Exception as exc:
            error = "NVML: %s" % exc
    if readings is None:
        readings = health_from_smi()
        source = "nvidia-smi" if readings is not None else ""
    if not readings:
        reason = error or "neither NVML (pynvml) nor nvidia-smi is available"
        if run.gpu_block is not None:
            run.check("health", 4, lambda: skip(reason, hint="needs a GPU and its driver"), gpu=True)
        else:
            run.check("health", 4, lambda: _no_health(reason), gpu=True)
        return
    run.host["health_source"] = source
    for reading in readings:
        for suffix, outcome in evaluate_health(reading):
            run.check(
                "health.%s@gpu%d" % (suffix, reading.index),
                4,
                _with_gpu(outcome, reading),
                gpu=True,
                standalone=True,
            )


def _no_health(reason: str) -> Outcome:
    return warn(
        "no health data: %s" % reason,
        None,
        "set NVIDIA_DRIVER_CAPABILITIES=compute,utility so nvidia-smi and NVML are mounted, "
        "or pip install nvidia-ml-py",
    )


def _with_gpu(outcome: Outcome, reading: HealthReading) -> Callable[[], Outcome]:
    value = outcome.value if isinstance(outcome.value, dict) else {"value": outcome.value}
    value = dict(value, gpu=reading.name, uuid=reading.uuid)
    return lambda: dataclasses.replace(outcome, value=value)


# --------------------------------------------------------------------------- CLI

TIERS = (tier0, tier1, tier2, tier3, tier4)


def run_smoke(options: Options, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run tiers 0..options.tier and return the report (a JSON-ready dict)."""
    run = Run(options, os.environ if env is None else env)
    tier_seconds: dict[int, float] = {}
    for tier in range(options.tier + 1):
        start = time.perf_counter()
        if tier >= 1 and run.torch is None:
            run.gpu_block = run.gpu_block or "torch is not importable"
        TIERS[tier](run)
        tier_seconds[tier] = time.perf_counter() - start
    return run.report(tier_seconds)


def render_text(report: Mapping[str, Any]) -> str:
    """The readable summary: one line per check, a hint under each non-pass."""
    torch = report.get("torch") or {}
    host = report.get("host") or {}
    lines = [
        "envbuild smoke (%s) tiers 0-%d: torch %s (CUDA %s), Python %s, %s usable CPUs"
        % (
            report["schema"],
            max(report["tiers"]),
            torch.get("version", "-"),
            torch.get("cuda"),
            host.get("python"),
            host.get("usable_cpus"),
        )
    ]
    width = max([len(c["name"]) for c in report["checks"]] + [10])
    for c in report["checks"]:
        lines.append("T%d  %-4s  %-*s  %s" % (c["tier"], c["status"].upper(), width, c["name"], c["message"]))
        if c["status"] != "pass":
            lines.append("          %*s  hint: %s" % (width, "", c["hint"] or "-"))
    s = report["summary"]
    meaning = {0: "pass", 7: "a check failed", 8: "GPU runtime or driver missing"}.get(
        report["exit_code"], ""
    )
    lines.append(
        "%d pass, %d warn, %d fail, %d skip; exit %d (%s); tier seconds %s"
        % (
            s["pass"],
            s["warn"],
            s["fail"],
            s["skip"],
            report["exit_code"],
            meaning,
            " ".join("T%s=%.1f" % kv for kv in sorted(report["tier_seconds"].items())),
        )
    )
    return "\n".join(lines)


def write_atomic(path: str, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename: complete or untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".smoke-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="envbuild smoke",
        description="Verify that torch really computes on the GPU, and report why GPUs idle.",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON report only")
    parser.add_argument(
        "--tier",
        type=int,
        default=2,
        choices=range(MAX_TIER + 1),
        metavar="N",
        help="run tiers 0..N (0 env, 1 correctness, 2 speed, 3 multi-GPU, 4 health); default 2",
    )
    parser.add_argument("--lock", metavar="FILE", help="envbuild.lock to compare the installed stack with")
    parser.add_argument(
        "--cpu-ok",
        action="store_true",
        help="a CPU-only run is acceptable: GPU checks are reported as skip, never pass",
    )
    parser.add_argument(
        "--peaks",
        metavar="FILE",
        help="JSON GPU peak table (default: smoke_peaks.json beside this file)",
    )
    parser.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE (atomically)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="limit for each heavy check")
    ns = parser.parse_args(argv)
    return Options(
        json=ns.json,
        tier=ns.tier,
        lock=ns.lock,
        cpu_ok=ns.cpu_ok,
        peaks=ns.peaks,
        report=ns.report,
        timeout=ns.timeout,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, usage errors 2
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    try:
        report = run_smoke(options)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    text = json.dumps(report, indent=2, sort_keys=False, default=str)
    if options.report:
        write_atomic(options.report, text + "\n")
    if options.json:
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write(render_text(report) + "\n")
    sys.stdout.flush()
    return int(report["exit_code"])


__all__ = [
    "Check",
    "Coverage",
    "Diagnosis",
    "HealthReading",
    "Options",
    "Outcome",
    "Topology",
    "arch_coverage",
    "classify_cuda_error",
    "diagnose_no_gpu",
    "diff_lock",
    "evaluate_health",
    "exit_code_for",
    "main",
    "match_peak",
    "parse_arch",
    "parse_smi_csv",
    "parse_topo",
    "run_smoke",
    "summarize",
]

if __name__ == "__main__":
    sys.exit(main())
