"""``envbuild detect``'s output: the JSON contract and the readable report.

JSON (``to_json``), a stable contract; keys are the HostFacts field names::

    {"schema_version": 1,
     "driver_version": "550.54.15" | null,    # kernel driver version
     "driver_source": "nvml"|"nvidia-smi"|"proc"|"file" | null,
     "cuda_driver_version": "12.4" | null,    # newest CUDA the driver supports
     "gpus": [{"index": 0, "name": "...", "uuid": "GPU-..." | null,
               "compute_capability": "8.9" | null,
               "compute_capability_source": "reported"|"catalogue" | null,
               "memory_mib": 24564 | null,
               "mig_mode": "Enabled"|"Disabled" | null, "mig_devices": ["..."]}],
     "topology": {"GPU0": {"GPU1": "NV18", "NIC0": "PIX"}, ...} | null,
     "os_release": {"ID": "ubuntu", "VERSION_ID": "22.04", ...},
     "cpu_count": 32 | null, "shm_bytes": 67108864 | null,
     "platform": "linux/amd64"|"linux/arm64" | null,   # the kernel's machine, Docker's spelling
     "problems": ["nvidia-smi: Failed to initialize NVML: ... — <hint>"],
     "advice": ["MIG is on ...", ...]}          # envbuild.host.advice

``mig_devices`` entries are readable labels; they carry the MIG UUID when the
source lists it (``nvidia-smi -L``, NVML).
"""

from __future__ import annotations

from envbuild.host.advice import advice, gpu_links, topology_gpus
from envbuild.host.facts import GpuFacts, HostFacts

SCHEMA_VERSION = 1


def to_json(h: HostFacts) -> dict[str, object]:
    """The documented ``detect --json`` object (see the module docstring)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "driver_version": h.driver_version,
        "driver_source": h.driver_source,
        "cuda_driver_version": h.cuda_driver_version,
        "gpus": [_gpu_json(g) for g in h.gpus],
        # nvidia-smi's own device order (GPU2 before GPU10), not a string sort.
        "topology": {k: dict(v) for k, v in h.topology.items()} if h.topology is not None else None,
        "os_release": dict(sorted(h.os_release.items())),
        "cpu_count": h.cpu_count,
        "shm_bytes": h.shm_bytes,
        "platform": h.platform,
        "problems": list(h.problems),
        "advice": advice(h),
    }


def _gpu_json(g: GpuFacts) -> dict[str, object]:
    return {
        "index": g.index,
        "name": g.name,
        "uuid": g.uuid,
        "compute_capability": g.compute_capability,
        "compute_capability_source": g.compute_capability_source or (
            "reported" if g.compute_capability else None),
        "memory_mib": g.memory_mib,
        "mig_mode": g.mig_mode,
        "mig_devices": list(g.mig_devices),
    }


# What each `topo -m` link means (nvidia-smi's own legend), fastest first.
_LINK_WORDS = {
    "NV": "NVLink",
    "PIX": "PCIe, at most one bridge",
    "PXB": "PCIe, several bridges",
    "PHB": "PCIe through the host bridge (CPU)",
    "NODE": "PCIe across host bridges within a NUMA node",
    "SYS": "PCIe across NUMA nodes (slowest)",
}
_SHM_SMALL = 1 << 30  # below this, DataLoader workers passing batches through /dev/shm suffer


def format_human(h: HostFacts) -> str:
    """A readable report; says plainly when there is no NVIDIA GPU or driver."""
    lines = [*_driver_lines(h), *_gpu_lines(h), *_topology_lines(h), *_system_lines(h)]
    if h.problems:
        lines.append("Problems:")
        lines.extend(f"  ! {p}" for p in h.problems)
    advised = advice(h)
    if advised:
        lines.append("Advice:")
        lines.extend(f"  - {line}" for line in advised)
    return "\n".join(lines) + "\n"


_SOURCE_WORDS = {
    "nvml": "NVML",
    "nvidia-smi": "nvidia-smi",
    "proc": "the loaded kernel module, /proc/driver/nvidia/version",
    "file": "saved output",
}


def _driver_lines(h: HostFacts) -> list[str]:
    if h.driver_version is None and not h.gpus and topology_gpus(h):
        # A saved `topo -m` alone names GPUs but no driver: not a host without GPUs.
        return ["Driver      unknown (the saved output has no driver version)"]
    if h.driver_version is None and not h.gpus:
        if h.problems:
            return ["No working NVIDIA driver answered (see the problems below)."]
        return [
            "No NVIDIA GPU/driver found (no NVML, no nvidia-smi, no /proc/driver/nvidia/version)."
            " CPU-only stacks still apply."
        ]
    version = h.driver_version or "unknown"
    source = f" (from {_SOURCE_WORDS.get(h.driver_source or '', h.driver_source)})"
    cuda = f"; supports CUDA up to {h.cuda_driver_version}" if h.cuda_driver_version else ""
    return [f"Driver      {version}{source if h.driver_source else ''}{cuda}"]


def _gpu_lines(h: HostFacts) -> list[str]:
    if not h.gpus and topology_gpus(h):
        return [f"GPUs        {len(topology_gpus(h))} in the topology ({', '.join(topology_gpus(h))}); "
                "names unknown: save `nvidia-smi -L` or `nvidia-smi` with it"]
    if not h.gpus:
        if h.driver_version is None:
            return []
        return [f"GPUs        none {'listed' if h.driver_source == 'file' else 'visible'}"]
    lines = [f"GPUs        {len(h.gpus)}"]
    for g in h.gpus:
        cc = f"compute capability {g.compute_capability}" if g.compute_capability else "cc unknown"
        if g.compute_capability_source == "catalogue":
            cc += " (GPU catalogue)"
        memory = f"{g.memory_mib} MiB" if g.memory_mib is not None else "memory unknown"
        mig = f", MIG {g.mig_mode}" if g.mig_mode else ""
        lines.append(f"  [{g.index}] {g.name or 'unknown GPU'}: {cc}, {memory}{mig}")
        lines.extend(f"        {label}" for label in g.mig_devices)
    return lines


def _topology_lines(h: HostFacts) -> list[str]:
    links = gpu_links(h)
    if not links:
        return []
    described = [f"{link} ×{n} ({_link_words(link)})" for link, n in sorted(links.items())]
    return [f"GPU links   {', '.join(described)}"]


def _link_words(link: str) -> str:
    if link.startswith("NV") and link[2:].isdigit():
        return f"NVLink, {link[2:]} links"
    return _LINK_WORDS.get(link, "see `nvidia-smi topo -m`")


def _system_lines(h: HostFacts) -> list[str]:
    os_name = h.os_release.get("PRETTY_NAME") or " ".join(
        v for v in (h.os_release.get("NAME"), h.os_release.get("VERSION_ID")) if v
    )
    if not (h.os_release or h.cpu_count or h.shm_bytes is not None):
        return []  # saved nvidia-smi output says nothing about the rest of the host
    lines = [f"OS          {os_name or 'unknown'}", f"CPUs        {h.cpu_count or 'unknown'}"]
    if h.platform:
        lines.append(f"Platform    {h.platform}")
    if h.shm_bytes is None:
        lines.append("/dev/shm    unknown")
    else:
        note = ""
        if h.shm_bytes < _SHM_SMALL:
            note = " (small: DataLoader workers need more; docker run --shm-size=8g or --ipc=host)"
        lines.append(f"/dev/shm    {h.shm_bytes / 2**30:.1f} GiB{note}")
    return lines
