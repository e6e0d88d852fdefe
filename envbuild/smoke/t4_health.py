"""T4 health: temperature, power, clocks, throttle reasons, ECC, MIG (from the driver)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .health import HealthReading, evaluate_health, health_from_nvml, health_from_smi
from .probes import import_pynvml
from .report import Outcome, skip, warn
from .runner import Run


def tier4(run: Run) -> None:
    """Health readings come from the driver (NVML or nvidia-smi), not torch."""
    readings: list[HealthReading] | None = None
    source = ""
    error = ""
    nvml = import_pynvml()
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
