"""Reading nvidia-smi: query CSV rows, ``topo -m`` and throttle reasons (pure functions)."""

# Runs on Python 3.8: zip(strict=...) is 3.10+.
# ruff: noqa: B905
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from .rules import parse_topo_rows, smi_value

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


@dataclasses.dataclass(frozen=True)
class Topology:
    gpus: tuple[str, ...]
    links: dict[str, dict[str, str]]
    cpu_affinity: dict[str, str]


def parse_smi_csv(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``."""
    rows: list[dict[str, str | None]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ValueError("expected %d fields, got %d: %r" % (len(fields), len(cells), line))
        rows.append({f: smi_value(c) for f, c in zip(fields, cells)})
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


_GPU_LABEL_RE = re.compile(r"^GPU\d+$")


def parse_topo(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m``: the GPU x GPU link matrix and each GPU's CPU affinity."""
    columns, rows = parse_topo_rows(text)
    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, str] = {}
    for label, cells in rows:
        if not _GPU_LABEL_RE.match(label):
            continue  # a NIC's row
        links[label] = {col: cell for col, cell in zip(columns, cells) if _GPU_LABEL_RE.match(col)}
        rest = cells[len(columns) :]
        if rest:
            affinity[label] = rest[0]
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


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name, _ in THROTTLE_REASONS if mask & bit]


def bad_throttle(mask: int) -> list[str]:
    return [name for bit, name, bad in THROTTLE_REASONS if bad and mask & bit]
