"""Parsers for ``nvidia-smi``'s plain outputs: the table, ``-L``, the CSV query, ``topo -m``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from envbuild.host.facts import GpuFacts, HostFacts, leading_int, mig_mode_of
from envbuild.smoke.health import HEALTH_FIELDS
from envbuild.smoke.rules import parse_smi_list, parse_topo_rows, smi_value

# compute_cap is missing from older nvidia-smi; the fallback query drops it.
QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "compute_cap",
    "memory.total",
    "mig.mode.current",
    "driver_version",
)
FALLBACK_FIELDS = tuple(f for f in QUERY_FIELDS if f != "compute_cap")
# Header-less rows by their width: detect's own queries, and the smoke test's health query
# (what `envbuild smoke` and the fleet reports save; its fixtures are such files).
HEADERLESS = {len(QUERY_FIELDS): QUERY_FIELDS, len(FALLBACK_FIELDS): FALLBACK_FIELDS,
              len(HEALTH_FIELDS): HEALTH_FIELDS}


_SMI_HEADER = re.compile(
    r"NVIDIA-SMI\s+\S+\s+Driver Version:\s*(?P<driver>\S+)(?:\s+CUDA Version:\s*(?P<cuda>\S+))?"
)
# First line of a GPU block: "|   0  NVIDIA GeForce RTX 4090   Off |" (index, name, persistence).
_TABLE_GPU = re.compile(r"^\|\s*(?P<index>\d+)\s+(?P<name>[^|]*?)\s+(?:On|Off)\s*\|")
_TABLE_MEMORY = re.compile(r"(?P<used>\d+)\s*MiB\s*/\s*(?P<total>\d+)\s*MiB")
_TABLE_MIG_ROW = re.compile(r"^\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<dev>\d+)\s*\|")


def parse_table(text: str) -> HostFacts:
    """The plain ``nvidia-smi`` table (the 470, 535 and 550+ layouts)."""
    header = _SMI_HEADER.search(text)
    if header is None:
        return HostFacts()
    lines = text.splitlines()
    gpus = [_table_gpu(lines, i) for i, line in enumerate(lines) if _TABLE_GPU.match(line)]
    mig = _table_mig_devices(lines)
    gpus = [replace(g, mig_devices=tuple(mig.get(g.index, ()))) for g in gpus]
    return HostFacts(
        driver_version=smi_value(header.group("driver")),
        cuda_driver_version=smi_value(header.group("cuda")),
        gpus=tuple(gpus),
    )


def _table_gpu(lines: Sequence[str], start: int) -> GpuFacts:
    first = _TABLE_GPU.match(lines[start])
    assert first is not None  # the caller matched this line
    block = [*lines[start + 1 : start + 3], "", ""]
    memory = _TABLE_MEMORY.search(block[0])
    # The third line's last cell is "MIG M." (absent in layouts before MIG existed).
    mig_cell = block[1].rstrip().rstrip("|").rsplit("|", 1)[-1] if block[1].startswith("|") else ""
    return GpuFacts(
        index=int(first.group("index")),
        name=first.group("name").strip(),
        memory_mib=int(memory.group("total")) if memory else None,
        mig_mode=mig_mode_of(mig_cell),
    )


def _table_mig_devices(lines: Sequence[str]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    in_mig = False
    for line in lines:
        if "MIG devices:" in line:
            in_mig = True
        elif "Processes:" in line:
            in_mig = False
        elif in_mig and (row := _TABLE_MIG_ROW.match(line)):
            label = f"MIG device {row['dev']} (GI {row['gi']}, CI {row['ci']})"
            found.setdefault(int(row["gpu"]), []).append(label)
    return found


def parse_list(text: str) -> HostFacts:
    """``nvidia-smi -L``: GPU names and UUIDs, and the MIG devices under each."""
    gpus: list[GpuFacts] = []
    for gpu in parse_smi_list(text):
        facts = GpuFacts(index=gpu["index"], name=gpu["name"], uuid=gpu["uuid"])
        if gpu["mig"]:
            # Listed MIG devices mean MIG is on, whatever else the file says.
            labels = tuple(f"MIG {m['profile']} device {m['device']} ({m['uuid']})" for m in gpu["mig"])
            facts = replace(facts, mig_mode="Enabled", mig_devices=labels)
        gpus.append(facts)
    return HostFacts(gpus=tuple(gpus))


def parse_query_csv(text: str) -> HostFacts:
    """``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    With a header, columns are named by it; without, they are ``QUERY_FIELDS``
    (7 columns) or ``FALLBACK_FIELDS`` (6), the queries ``probe_host`` runs, or the smoke
    test's ``HEALTH_FIELDS`` (15).
    """
    columns: tuple[str, ...] | None = None
    rows: list[dict[str, str]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if _is_csv_header(cells):
            columns = tuple(re.sub(r"\s*\[.*\]$", "", c) for c in cells)
            continue
        names = columns or HEADERLESS.get(len(cells))
        if names and len(names) == len(cells) and _csv_row_ok(dict(zip(names, cells, strict=True))):
            rows.append(dict(zip(names, cells, strict=True)))
    drivers = [d for r in rows if (d := smi_value(r.get("driver_version")))]
    return HostFacts(
        driver_version=drivers[0] if drivers else None,
        gpus=tuple(_csv_gpu(row, position) for position, row in enumerate(rows)),
    )


def _is_csv_header(cells: Sequence[str]) -> bool:
    return len(cells) > 1 and ("name" in cells or "index" in cells)


def _csv_row_ok(row: Mapping[str, str]) -> bool:
    """A GPU row has a numeric index (when queried) and a name."""
    index_ok = "index" not in row or row["index"].isdigit()
    return index_ok and bool(smi_value(row.get("name")))


def _csv_gpu(row: Mapping[str, str], position: int) -> GpuFacts:
    index = row.get("index", "")
    return GpuFacts(
        index=int(index) if index.isdigit() else position,
        name=row.get("name", "").strip(),
        uuid=smi_value(row.get("uuid")),
        compute_capability=smi_value(row.get("compute_cap")),
        memory_mib=leading_int(row.get("memory.total")),
        mig_mode=mig_mode_of(row.get("mig.mode.current")),
    )


def parse_topology(text: str) -> dict[str, dict[str, str]] | None:
    """``nvidia-smi topo -m``: {"GPU0": {"GPU1": "NV18", "NIC0": "PIX"}, ...}, self omitted."""
    columns, rows = parse_topo_rows(text)
    matrix = {label: {c: v for c, v in zip(columns, cells[: len(columns)], strict=True) if c != label}
              for label, cells in rows if len(cells) >= len(columns)}
    return matrix or None
