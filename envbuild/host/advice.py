"""What ``envbuild detect`` advises from the host's facts: MIG instances and PCIe paths.

Each line says what the fact means for a training job and names where that is documented:

- MIG: a CUDA process enumerates one MIG device, the first one ``CUDA_VISIBLE_DEVICES``
  names (NVIDIA's MIG user guide, "CUDA Device Enumeration"); MIG devices have no
  peer-to-peer path (the same guide's limitations), so one process runs per MIG device and
  data-parallel training across them is not possible.
- PIX/PXB (paths through PCIe switches): peer-to-peer transfers between the GPUs go through
  the switches, and with PCI Access Control Services (ACS) enabled they are redirected to the
  root complex, which makes NCCL slow or hang (NCCL's troubleshooting guide, "PCI Access
  Control Services (ACS)": disable ACS in the BIOS or on the bridges).
- PHB/NODE/SYS (through the CPU): no direct peer-to-peer path, so all-reduce crosses the
  host bridge (and the inter-socket link for SYS): keep a job's GPUs within NVLink or PIX
  groups where it matters.
"""

from __future__ import annotations

from envbuild.host.facts import HostFacts

MIG_GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html#cuda-device-enumeration"
NCCL_ACS = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"
            "#pci-access-control-services-acs")


def gpu_links(h: HostFacts) -> dict[str, int]:
    """Link type → how many GPU pairs it joins (each pair once)."""
    links: dict[str, int] = {}
    for a, row in (h.topology or {}).items():
        for b, link in row.items():
            if is_gpu(a) and is_gpu(b) and int(a[3:]) < int(b[3:]):
                links[link] = links.get(link, 0) + 1
    return links


def is_gpu(label: str) -> bool:
    return label.startswith("GPU") and label[3:].isdigit()


def topology_gpus(h: HostFacts) -> list[str]:
    """The GPUs ``nvidia-smi topo -m`` lists (its rows), in its order."""
    return [label for label in (h.topology or {}) if is_gpu(label)]


def advice(h: HostFacts) -> list[str]:
    """Advice lines, MIG first, then the PCIe paths (empty when nothing applies)."""
    lines: list[str] = []
    mig = [g for g in h.gpus if g.mig_mode == "Enabled"]
    if mig:
        count = sum(len(g.mig_devices) for g in mig)
        listed = f"{count} MIG devices listed" if count else "no MIG device listed yet"
        lines.append(
            f"MIG is on ({listed}): a CUDA process sees one MIG device, the first that "
            "CUDA_VISIBLE_DEVICES names (MIG-<uuid> from `nvidia-smi -L`); run one process per MIG "
            "device (no DDP/NCCL across them: MIG devices have no peer-to-peer path), and verify "
            f"each one. Source: {MIG_GUIDE}")
    links = gpu_links(h)
    switched = sorted(link for link in links if link in ("PIX", "PXB"))
    if switched:
        lines.append(
            f"GPU pairs joined through PCIe switches ({', '.join(switched)}): peer-to-peer "
            "transfers can hang or crawl when PCI ACS is enabled on the switches (it redirects them "
            "to the CPU); if NCCL stalls, disable ACS in the BIOS (or with setpci) or try "
            f"NCCL_P2P_DISABLE=1 to confirm. Source: {NCCL_ACS}")
    through_cpu = sorted(link for link in links if link in ("PHB", "NODE", "SYS"))
    if through_cpu:
        lines.append(
            f"GPU pairs joined only through the CPU ({', '.join(through_cpu)}): no direct "
            "peer-to-peer path, so all-reduce goes through host memory"
            f"{' and across sockets' if 'SYS' in through_cpu else ''}; place a job's GPUs on "
            "NVLink or one PCIe switch where the topology allows.")
    return lines
