"""GPU samples for ``envbuild diagnose``: NVML through ``pynvml`` (the optional extra
``envbuild[nvml]``, which installs nvidia-ml-py), else ``nvidia-smi`` CSV queries (one looping
process, ``smi.SmiStream``; the parsing is here).

Both readers return the same ``GpuSample`` values, so the verdict rules never know which
one answered, and a recorded CSV (or a fake ``pynvml``) tests them without a GPU.
PCIe throughput comes from NVML only (``nvidia-smi --query-gpu`` has no field for it).
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Clock throttle / event reasons, the bits of nvmlClocksThrottleReasons (nvml.h): what
# ``clocks_throttle_reasons.active`` reports as a hex mask.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

SMI_FIELDS = ("index", "uuid", "name", "utilization.gpu", "utilization.memory", "memory.used",
              "memory.total", "power.draw", "power.limit", "clocks.sm", "clocks.max.sm",
              "clocks_throttle_reasons.active", "mig.mode.current")
# Newer drivers name the mask "clocks_event_reasons"; either spelling may be the one refused.
SMI_FIELDS_EVENT = tuple(f.replace("clocks_throttle_reasons", "clocks_event_reasons") for f in SMI_FIELDS)
SMI_APPS = ("pid", "gpu_uuid", "used_memory")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    t: float
    index: int
    name: str
    util_pct: float | None
    mem_util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    throttle: tuple[str, ...] = ()
    pcie_rx_mbs: float | None = None  # host→device, MB/s
    pcie_tx_mbs: float | None = None
    mig: bool | None = None
    processes: tuple[tuple[int, float], ...] = ()  # (pid, MiB) of compute processes


def throttle_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit)


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", empty


def _mask(text: str) -> tuple[str, ...]:
    try:
        return throttle_names(int(text.strip(), 16))
    except ValueError:
        return ()


def parse_smi_apps(text: str) -> dict[str, tuple[tuple[int, float], ...]]:
    """``--query-compute-apps=pid,gpu_uuid,used_memory`` (noheader, nounits) by GPU uuid."""
    found: dict[str, list[tuple[int, float]]] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) != len(SMI_APPS) or not row[0].strip().isdigit():
            continue
        found.setdefault(row[1].strip(), []).append((int(row[0]), _number(row[2]) or 0.0))
    return {uuid: tuple(rows) for uuid, rows in found.items()}


def parse_smi_csv(text: str, t: float, apps: str = "") -> list[GpuSample]:
    """One sample per GPU from ``--query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``."""
    processes = parse_smi_apps(apps)
    samples = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) != len(SMI_FIELDS) or not row[0].strip().isdigit():
            continue
        v = [c.strip() for c in row]
        samples.append(GpuSample(
            t=t, index=int(v[0]), name=v[2], util_pct=_number(v[3]), mem_util_pct=_number(v[4]),
            mem_used_mib=_number(v[5]), mem_total_mib=_number(v[6]), power_w=_number(v[7]),
            power_limit_w=_number(v[8]), sm_clock_mhz=_number(v[9]), sm_clock_max_mhz=_number(v[10]),
            throttle=_mask(v[11]), mig=v[12] == "Enabled" if v[12] in ("Enabled", "Disabled") else None,
            processes=processes.get(v[1], ())))
    return samples


Runner = Callable[[Sequence[str]], "str | None"]


def query_fields(run: Runner) -> tuple[tuple[str, ...], str] | None:
    """The field list this nvidia-smi accepts and its answer; None when it does not answer."""
    for fields in (SMI_FIELDS, SMI_FIELDS_EVENT):
        text = run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
        if text is not None:
            return fields, text
    return None


def read_smi(run: Runner, t: float) -> list[GpuSample] | None:
    """Sample every GPU through nvidia-smi; None when it does not answer."""
    answered = query_fields(run)
    if answered is None:
        return None
    apps = run(["nvidia-smi", f"--query-compute-apps={','.join(SMI_APPS)}",
                "--format=csv,noheader,nounits"])
    return parse_smi_csv(answered[1], t, apps or "")


def _try(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # NVMLError_NotSupported and friends: unknown
        return None


class Nvml:
    """An initialised NVML (``pynvml``), sampled once per call of ``read``."""

    def __init__(self, nvml: Any) -> None:
        nvml.nvmlInit()
        self.nvml = nvml
        count = _try(nvml.nvmlDeviceGetCount)
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count or 0)]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()

    def read(self, t: float) -> list[GpuSample]:
        return [self.sample(i, h, t) for i, h in enumerate(self.handles)]

    def sample(self, index: int, h: Any, t: float) -> GpuSample:
        n = self.nvml
        util, memory = _try(n.nvmlDeviceGetUtilizationRates, h), _try(n.nvmlDeviceGetMemoryInfo, h)
        power, limit = _try(n.nvmlDeviceGetPowerUsage, h), _try(n.nvmlDeviceGetEnforcedPowerLimit, h)
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)  # the newer name
        mask = _try(reasons or n.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        mig = _try(n.nvmlDeviceGetMigMode, h)
        name = _try(n.nvmlDeviceGetName, h)
        return GpuSample(
            t=t, index=index, name=name.decode() if isinstance(name, bytes) else str(name or ""),
            util_pct=_scaled(getattr(util, "gpu", None), 1),
            mem_util_pct=_scaled(getattr(util, "memory", None), 1),
            mem_used_mib=_scaled(getattr(memory, "used", None), 1 / 2**20),
            mem_total_mib=_scaled(getattr(memory, "total", None), 1 / 2**20),
            power_w=_scaled(power, 1e-3), power_limit_w=_scaled(limit, 1e-3),
            sm_clock_mhz=_scaled(_try(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM), 1),
            sm_clock_max_mhz=_scaled(_try(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM), 1),
            throttle=throttle_names(mask) if isinstance(mask, int) else (),
            pcie_rx_mbs=_scaled(_try(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES), 1e-3),
            pcie_tx_mbs=_scaled(_try(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES), 1e-3),
            mig=bool(mig[0]) if isinstance(mig, (list, tuple)) and mig else None,
            processes=self.processes(h))

    def processes(self, h: Any) -> tuple[tuple[int, float], ...]:
        found = _try(self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        return tuple((int(p.pid), (getattr(p, "usedGpuMemory", None) or 0) / 2**20) for p in found)

    def mig_profiles(self, index: int) -> list[tuple[str, float]]:
        """(name, memory MiB) of each GPU-instance profile this GPU offers (MIG only)."""
        n, h = self.nvml, self.handles[index]
        found = []
        count = int(getattr(n, "NVML_GPU_INSTANCE_PROFILE_COUNT", None) or 0)
        for profile in range(count):
            info = _try(n.nvmlDeviceGetGpuInstanceProfileInfo, h, profile)
            if info is not None and getattr(info, "memorySizeMB", None):
                slices = getattr(info, "sliceCount", 0)
                gib = round(info.memorySizeMB / 1024)
                found.append((f"{slices}g.{gib}gb", float(info.memorySizeMB)))
        return found


def _scaled(value: object, factor: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) * factor
