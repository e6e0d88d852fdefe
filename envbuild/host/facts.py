"""What ``envbuild detect`` knows about a host, and how partial answers combine.

Each probe and each parser returns a partial :class:`HostFacts`; ``merge`` combines
them, the earlier (better) source winning field by field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from envbuild.smoke.rules import smi_value


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFacts:
    index: int
    name: str
    uuid: str | None = None
    compute_capability: str | None = None  # "8.9"
    compute_capability_source: str | None = None  # "catalogue": looked up by name, not reported
    memory_mib: int | None = None
    mig_mode: str | None = None  # "Enabled" / "Disabled" / None (not MIG-capable or unknown)
    mig_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFacts:
    driver_version: str | None = None
    driver_source: str | None = None  # "nvml" | "nvidia-smi" | "proc" | "file"
    cuda_driver_version: str | None = None  # nvidia-smi's "CUDA Version": newest CUDA supported
    gpus: tuple[GpuFacts, ...] = ()
    topology: dict[str, dict[str, str]] | None = None  # from `nvidia-smi topo -m`
    os_release: dict[str, str] = field(default_factory=dict)
    cpu_count: int | None = None
    shm_bytes: int | None = None
    platform: str | None = None  # linux/amd64 or linux/arm64, from the kernel's machine name
    problems: tuple[str, ...] = ()


def leading_int(value: str | None) -> int | None:
    """'24564', '24564 MiB' and '24564MiB' are all 24564."""
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


def mig_mode_of(value: str | None) -> str | None:
    text = (smi_value(value) or "").rstrip("*").strip().lower()
    return {"enabled": "Enabled", "disabled": "Disabled"}.get(text)


def as_text(value: object) -> str | None:
    """NVML bindings return bytes in old releases and str in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _merge_gpu(a: GpuFacts, b: GpuFacts) -> GpuFacts:
    """``a`` wins; ``b`` fills what ``a`` lacks. MIG lists with UUIDs beat those without."""
    mig = a.mig_devices
    if not mig or (b.mig_devices and _has_uuid(b.mig_devices) and not _has_uuid(mig)):
        mig = b.mig_devices
    return replace(
        a,
        name=a.name or b.name,
        uuid=a.uuid or b.uuid,
        compute_capability=a.compute_capability or b.compute_capability,
        memory_mib=a.memory_mib if a.memory_mib is not None else b.memory_mib,
        mig_mode=a.mig_mode or b.mig_mode,
        mig_devices=mig,
    )


def _has_uuid(labels: Iterable[str]) -> bool:
    return any("MIG-" in label for label in labels)


def _merge_gpus(a: Sequence[GpuFacts], b: Sequence[GpuFacts]) -> tuple[GpuFacts, ...]:
    if not a:
        return tuple(b)
    others = {g.index: g for g in b}
    return tuple(_merge_gpu(g, others[g.index]) if g.index in others else g for g in a)


def merge(a: HostFacts, b: HostFacts) -> HostFacts:
    """``a`` is the better source; ``b`` fills its gaps. Problems accumulate."""
    driver_from_a = a.driver_version is not None
    return HostFacts(
        driver_version=a.driver_version if driver_from_a else b.driver_version,
        driver_source=a.driver_source if driver_from_a else b.driver_source,
        cuda_driver_version=a.cuda_driver_version or b.cuda_driver_version,
        gpus=_merge_gpus(a.gpus, b.gpus),
        topology=a.topology if a.topology is not None else b.topology,
        os_release=a.os_release or b.os_release,
        cpu_count=a.cpu_count if a.cpu_count is not None else b.cpu_count,
        shm_bytes=a.shm_bytes if a.shm_bytes is not None else b.shm_bytes,
        platform=a.platform or b.platform,
        problems=tuple(dict.fromkeys(a.problems + b.problems)),
    )


def merge_all(parts: Iterable[HostFacts]) -> HostFacts:
    result = HostFacts()
    for part in parts:
        result = merge(result, part)
    return result


def with_catalogue(facts: HostFacts, lookup: Callable[[str], str | None]) -> HostFacts:
    """Each GPU without a reported compute capability gets the one ``lookup`` finds for its
    name (the GPU catalogue), marked as looked up."""
    gpus = tuple(
        replace(g, compute_capability=cc, compute_capability_source="catalogue")
        if g.compute_capability is None and g.name and (cc := lookup(g.name)) else g
        for g in facts.gpus)
    return replace(facts, gpus=gpus)


def with_source(facts: HostFacts, source: str) -> HostFacts:
    return replace(facts, driver_source=source if facts.driver_version else None)
