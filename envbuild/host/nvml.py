"""Driver, CUDA version and GPUs through NVML (``pynvml``, only when importable)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from envbuild.host.facts import GpuFacts, HostFacts, as_text
from envbuild.host.problems import HINT_MISMATCH, HINT_NOT_LOADED
from envbuild.smoke.rules import cuda_version_from_int


def load_nvml() -> Any:
    """The ``pynvml`` module (from nvidia-ml-py) if importable, else None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the old "pynvml" package warns on import
            import pynvml
    except Exception:  # an installed but broken binding is the same as none
        return None
    return pynvml


def _nvml_try(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # NVMLError_NotSupported and friends: the value is unknown
        return None


# NVML return codes (nvml.h, nvmlReturn_t); the module's constants win when present.
_NVML_DRIVER_NOT_LOADED = 9
_NVML_LIBRARY_NOT_FOUND = 12
_NVML_LIB_RM_VERSION_MISMATCH = 18


def probe_nvml(nvml: Any) -> HostFacts | None:
    """Driver, CUDA version and GPUs through NVML; None when NVML gives no answer."""
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses
        return _nvml_init_failure(nvml, exc)
    try:
        return _nvml_read(nvml)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _nvml_init_failure(nvml: Any, exc: Exception) -> HostFacts | None:
    code = getattr(exc, "value", None)
    if code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", _NVML_LIBRARY_NOT_FOUND):
        return None  # no libnvidia-ml: no driver here, which is not a problem
    if code == getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", _NVML_LIB_RM_VERSION_MISMATCH):
        return HostFacts(problems=(f"nvml: Driver/library version mismatch — {HINT_MISMATCH}",))
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", _NVML_DRIVER_NOT_LOADED):
        return HostFacts(problems=(f"nvml: Driver Not Loaded — {HINT_NOT_LOADED}",))
    return HostFacts(problems=(f"nvml: initialisation failed: {exc}",))


def _nvml_read(nvml: Any) -> HostFacts:
    count = _nvml_try(nvml.nvmlDeviceGetCount)
    cuda = _nvml_try(nvml.nvmlSystemGetCudaDriverVersion)
    return HostFacts(
        driver_version=as_text(_nvml_try(nvml.nvmlSystemGetDriverVersion)),
        driver_source="nvml",
        cuda_driver_version=_nvml_cuda(cuda),
        gpus=tuple(_nvml_gpu(nvml, i) for i in range(count if isinstance(count, int) else 0)),
    )


def _nvml_cuda(value: object) -> str | None:
    """NVML encodes CUDA 12.4 as 12040."""
    if not isinstance(value, int) or value <= 0:
        return None
    return cuda_version_from_int(value)


def _nvml_gpu(nvml: Any, index: int) -> GpuFacts:
    handle = _nvml_try(nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return GpuFacts(index=index, name="")
    cc = _nvml_try(nvml.nvmlDeviceGetCudaComputeCapability, handle)
    memory = _nvml_try(nvml.nvmlDeviceGetMemoryInfo, handle)
    modes = _nvml_try(nvml.nvmlDeviceGetMigMode, handle)  # (current, pending); raises if no MIG
    enabled = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
    mig = None if not modes else ("Enabled" if modes[0] == enabled else "Disabled")
    return GpuFacts(
        index=index,
        name=as_text(_nvml_try(nvml.nvmlDeviceGetName, handle)) or "",
        uuid=as_text(_nvml_try(nvml.nvmlDeviceGetUUID, handle)),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        memory_mib=int(memory.total) // 2**20 if memory is not None else None,
        mig_mode=mig,
        mig_devices=tuple(_nvml_mig_devices(nvml, handle)) if mig == "Enabled" else (),
    )


def _nvml_mig_devices(nvml: Any, handle: Any) -> Iterator[str]:
    slots = _nvml_try(nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
    for slot in range(slots if isinstance(slots, int) else 0):
        mig = _nvml_try(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:
            continue  # an empty slot
        name = as_text(_nvml_try(nvml.nvmlDeviceGetName, mig)) or "MIG device"
        uuid = as_text(_nvml_try(nvml.nvmlDeviceGetUUID, mig))
        yield f"{name} device {slot} ({uuid})" if uuid else f"{name} device {slot}"
