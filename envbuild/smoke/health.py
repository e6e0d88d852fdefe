"""GPU health readings (NVML or nvidia-smi) and what each reading means."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from .nvsmi import bad_throttle, decode_throttle, parse_float, parse_int, parse_smi_csv
from .probes import as_text, run_command, try_call
from .report import Outcome, fail, ok, skip, warn
from .rules import parse_smi_list

# Heuristic threshold (not a vendor fact): where a reading stops being "fine".
TEMPERATURE_WARN_C = 85.0  # the brief: throttling starts around 84-90 C


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
        try_call(nvml.nvmlShutdown)


def _nvml_reading(nvml: Any, index: int) -> HealthReading:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    mig = try_call(nvml.nvmlDeviceGetMigMode, h)
    ecc = try_call(nvml.nvmlDeviceGetEccMode, h)
    return HealthReading(
        index=index,
        name=as_text(try_call(nvml.nvmlDeviceGetName, h) or ""),
        uuid=as_text(try_call(nvml.nvmlDeviceGetUUID, h) or ""),
        temperature_c=try_call(nvml.nvmlDeviceGetTemperature, h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
        power_w=_milli(try_call(nvml.nvmlDeviceGetPowerUsage, h)),
        power_limit_w=_milli(try_call(nvml.nvmlDeviceGetEnforcedPowerLimit, h)),
        power_default_limit_w=_milli(try_call(nvml.nvmlDeviceGetPowerManagementDefaultLimit, h)),
        sm_clock_mhz=try_call(nvml.nvmlDeviceGetClockInfo, h, getattr(nvml, "NVML_CLOCK_SM", 1)),
        sm_clock_max_mhz=try_call(nvml.nvmlDeviceGetMaxClockInfo, h, getattr(nvml, "NVML_CLOCK_SM", 1)),
        throttle_mask=try_call(reasons, h) if reasons else None,
        ecc_mode=None if not ecc else ("Enabled" if ecc[0] else "Disabled"),
        ecc_volatile_uncorrected=try_call(
            nvml.nvmlDeviceGetTotalEccErrors, h, uncorrected, getattr(nvml, "NVML_VOLATILE_ECC", 0)
        ),
        ecc_aggregate_uncorrected=try_call(
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
    for slot in range(int(try_call(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0)):
        mig = try_call(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is not None:
            found.append(as_text(try_call(nvml.nvmlDeviceGetUUID, mig) or "slot %d" % slot))
    return tuple(found)
