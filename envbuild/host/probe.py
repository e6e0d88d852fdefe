"""Host probing for ``envbuild detect``: driver, GPUs, topology, OS, CPUs, /dev/shm.

Sources, best first: NVML through ``pynvml`` (only when importable; never a
dependency), ``nvidia-smi`` (a CSV query, the plain table for the "CUDA Version",
``-L`` for MIG devices, ``topo -m``), then ``/proc/driver/nvidia/version``.
Every probe is a small function that returns ``None`` (or an empty fragment)
instead of raising: a host without a GPU is a normal answer, not an error.

Each probe and each parser returns a partial :class:`HostFacts`; ``_merge``
combines them, the earlier (better) source winning field by field.

``parse_saved`` reads what a user saved from ``nvidia-smi`` (plain table, ``-q``,
``-q -x``, the CSV query, ``-L``, ``topo -m``, ``/proc/driver/nvidia/version``),
in any combination within one file; it detects each part by its own markers.

JSON (``to_json``), a stable contract; keys are the HostFacts field names::

    {"schema_version": 1,
     "driver_version": "550.54.15" | null,    # kernel driver version
     "driver_source": "nvml"|"nvidia-smi"|"proc"|"file" | null,
     "cuda_driver_version": "12.4" | null,    # newest CUDA the driver supports
     "gpus": [{"index": 0, "name": "...", "uuid": "GPU-..." | null,
               "compute_capability": "8.9" | null, "memory_mib": 24564 | null,
               "mig_mode": "Enabled"|"Disabled" | null, "mig_devices": ["..."]}],
     "topology": {"GPU0": {"GPU1": "NV18", "NIC0": "PIX"}, ...} | null,
     "os_release": {"ID": "ubuntu", "VERSION_ID": "22.04", ...},
     "cpu_count": 32 | null, "shm_bytes": 67108864 | null,
     "problems": ["nvidia-smi: Failed to initialize NVML: ... — <hint>"]}

``mig_devices`` entries are readable labels; they carry the MIG UUID when the
source lists it (``nvidia-smi -L``, NVML).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envbuild.errors import UsageError

Runner = Callable[[Sequence[str]], str | None]

SCHEMA_VERSION = 1
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
RUN_TIMEOUT_S = 15.0  # nvidia-smi can hang on a GPU in a bad state


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFacts:
    index: int
    name: str
    uuid: str | None = None
    compute_capability: str | None = None  # "8.9"
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
    problems: tuple[str, ...] = ()


# --------------------------------------------------------------------------- values


_MISSING = frozenset(
    {
        "",
        "n/a",
        "[n/a]",
        "na",
        "none",
        "not supported",
        "[not supported]",
        "unknown error",
        "[unknown error]",
        "insufficient permissions",
        "[insufficient permissions]",
    }
)


def _clean(value: str | None) -> str | None:
    """nvidia-smi's placeholders ("[N/A]", "[Not Supported]") become None."""
    if value is None:
        return None
    text = value.strip()
    return None if text.lower() in _MISSING else text


def _leading_int(value: str | None) -> int | None:
    """'24564', '24564 MiB' and '24564MiB' are all 24564."""
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


def _mig_mode(value: str | None) -> str | None:
    text = (_clean(value) or "").rstrip("*").strip().lower()
    return {"enabled": "Enabled", "disabled": "Disabled"}.get(text)


def _as_text(value: object) -> str | None:
    """NVML bindings return bytes in old releases and str in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------------- problems

_HINT_MISMATCH = (
    "the loaded kernel module and the user-space driver libraries differ, usually after a "
    "driver upgrade without a reboot; reboot the host (or unload and reload the nvidia modules)"
)
_HINT_NOT_LOADED = (
    "the NVIDIA kernel module is not loaded: the driver is not installed, Secure Boot refused "
    "the module, or the kernel was updated without rebuilding it; install the driver or reboot"
)
_KNOWN_PROBLEMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Driver/library version mismatch", re.I), _HINT_MISMATCH),
    (
        re.compile(
            r"couldn't communicate with the NVIDIA driver|could not communicate with the "
            r"NVIDIA driver",
            re.I,
        ),
        _HINT_NOT_LOADED,
    ),
    (
        re.compile(r"No devices were found", re.I),
        "the driver is loaded but lists no GPU: check the device (lspci), the container's GPU "
        "request, and dmesg for Xid errors",
    ),
    (
        re.compile(r"GPU is lost", re.I),
        "a GPU fell off the bus (see dmesg for Xid errors); reboot, and check power and cooling",
    ),
)
_NVML_LIBRARY_VERSION = re.compile(r"NVML library version:\s*(\S+)")


def find_problems(text: str, source: str) -> tuple[str, ...]:
    """Known failure texts in a tool's output, each as 'source: line — hint'."""
    found: list[str] = []
    for line in text.splitlines():
        for pattern, hint in _KNOWN_PROBLEMS:
            if pattern.search(line):
                found.append(f"{source}: {_problem_line(line, text)} — {hint}")
    return tuple(dict.fromkeys(found))


def _problem_line(line: str, text: str) -> str:
    # Newer nvidia-smi names its user-space NVML after the mismatch line.
    library = _NVML_LIBRARY_VERSION.search(text)
    if library and "mismatch" in line.lower():
        return f"{line.strip()} (NVML library version {library.group(1)})"
    return line.strip()


# ------------------------------------------------------------------------- merging


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


def _merge(a: HostFacts, b: HostFacts) -> HostFacts:
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
        problems=tuple(dict.fromkeys(a.problems + b.problems)),
    )


def _merge_all(parts: Iterable[HostFacts]) -> HostFacts:
    result = HostFacts()
    for part in parts:
        result = _merge(result, part)
    return result


def _with_source(facts: HostFacts, source: str) -> HostFacts:
    return replace(facts, driver_source=source if facts.driver_version else None)


# ---------------------------------------------------------- parsers: nvidia-smi texts

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
        driver_version=_clean(header.group("driver")),
        cuda_driver_version=_clean(header.group("cuda")),
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
        mig_mode=_mig_mode(mig_cell),
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


_LIST_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>[^)]+)\)\s*$")
_LIST_MIG = re.compile(
    r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<dev>\d+): \(UUID: (?P<uuid>[^)]+)\)\s*$"
)


def parse_list(text: str) -> HostFacts:
    """``nvidia-smi -L``: GPU names and UUIDs, and the MIG devices under each."""
    gpus: list[GpuFacts] = []
    for line in text.splitlines():
        if gpu := _LIST_GPU.match(line):
            gpus.append(GpuFacts(index=int(gpu["index"]), name=gpu["name"], uuid=gpu["uuid"]))
        elif (mig := _LIST_MIG.match(line)) and gpus:
            label = f"MIG {mig['profile']} device {mig['dev']} ({mig['uuid']})"
            last = gpus[-1]
            # Listed MIG devices mean MIG is on, whatever else the file says.
            gpus[-1] = replace(last, mig_mode="Enabled", mig_devices=(*last.mig_devices, label))
    return HostFacts(gpus=tuple(gpus))


def parse_query_csv(text: str) -> HostFacts:
    """``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    With a header, columns are named by it; without, they are ``QUERY_FIELDS``
    (7 columns) or ``FALLBACK_FIELDS`` (6), the queries ``probe_host`` runs.
    """
    columns: tuple[str, ...] | None = None
    rows: list[dict[str, str]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if _is_csv_header(cells):
            columns = tuple(re.sub(r"\s*\[.*\]$", "", c) for c in cells)
            continue
        names = columns or {7: QUERY_FIELDS, 6: FALLBACK_FIELDS}.get(len(cells))
        if names and len(names) == len(cells) and _csv_row_ok(dict(zip(names, cells, strict=True))):
            rows.append(dict(zip(names, cells, strict=True)))
    drivers = [d for r in rows if (d := _clean(r.get("driver_version")))]
    return HostFacts(
        driver_version=drivers[0] if drivers else None,
        gpus=tuple(_csv_gpu(row, position) for position, row in enumerate(rows)),
    )


def _is_csv_header(cells: Sequence[str]) -> bool:
    return len(cells) > 1 and ("name" in cells or "index" in cells)


def _csv_row_ok(row: Mapping[str, str]) -> bool:
    """A GPU row has a numeric index (when queried) and a name."""
    index_ok = "index" not in row or row["index"].isdigit()
    return index_ok and bool(_clean(row.get("name")))


def _csv_gpu(row: Mapping[str, str], position: int) -> GpuFacts:
    index = row.get("index", "")
    return GpuFacts(
        index=int(index) if index.isdigit() else position,
        name=row.get("name", "").strip(),
        uuid=_clean(row.get("uuid")),
        compute_capability=_clean(row.get("compute_cap")),
        memory_mib=_leading_int(row.get("memory.total")),
        mig_mode=_mig_mode(row.get("mig.mode.current")),
    )


# ------------------------------------------------------------- parser: nvidia-smi -q


@dataclass(frozen=True, slots=True, kw_only=True)
class _Node:
    """One line of ``nvidia-smi -q``: 'Key : value', or a section 'Key' with children."""

    key: str
    value: str | None
    children: tuple[_Node, ...] = ()

    def child(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for key in path:
            node = next((c for c in node.children if c.key == key), None) if node else None
        return node

    def value_at(self, *path: str) -> str | None:
        node = self.child(*path)
        return _clean(node.value) if node else None


# "    Key      : value" or a section "    Key"; the key ends at the first " :" (a PCI
# address such as "GPU 00000000:07:00.0" has no space before its colons).
_Q_LINE = re.compile(r"^(?P<indent> *)(?P<key>\S.*?)(?:\s+:\s?(?P<value>.*?))?\s*$")
_Q_GPU = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_Q_TOP = re.compile(r"^(?:=+NVSMI LOG=+|GPU [0-9A-Fa-f]{4,8}:\S+|\S[^:]*?\s+:.*)$")


def _q_lines(text: str) -> list[str]:
    """The lines of the ``-q`` report: from its banner to the first foreign top-level line."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "NVSMI LOG" in line), None)
    if start is None:
        return []
    kept: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip() and not line.startswith(" ") and not _Q_TOP.match(line):
            break
        kept.append(line)
    return kept


def _q_tree(lines: Iterable[str]) -> tuple[_Node, ...]:
    parsed = [
        (len(m["indent"]), m["key"], m["value"])
        for line in lines
        if line.strip() and (m := _Q_LINE.match(line))
    ]
    nodes, _ = _q_build(parsed, 0, 0)
    return nodes


def _q_build(
    parsed: Sequence[tuple[int, str, str | None]], start: int, indent: int
) -> tuple[tuple[_Node, ...], int]:
    """Nodes at ``indent`` from ``start``; deeper lines become their children."""
    nodes: list[_Node] = []
    i = start
    while i < len(parsed) and parsed[i][0] >= indent:
        own_indent, key, value = parsed[i]
        children, i = _q_build(parsed, i + 1, own_indent + 1)
        nodes.append(_Node(key=key, value=value, children=children))
    return tuple(nodes), i


def parse_query_report(text: str) -> HostFacts:
    """``nvidia-smi -q``: driver, CUDA version and per-GPU name, UUID, memory and MIG."""
    top = _Node(key="", value=None, children=_q_tree(_q_lines(text)))
    if not top.children:
        return HostFacts()
    gpu_nodes = [n for n in top.children if _Q_GPU.match(n.key)]
    return HostFacts(
        driver_version=top.value_at("Driver Version"),
        cuda_driver_version=top.value_at("CUDA Version"),
        # -q lists GPUs in nvidia-smi index order and prints no index itself.
        gpus=tuple(_q_gpu(node, i) for i, node in enumerate(gpu_nodes)),
    )


def _q_gpu(node: _Node, index: int) -> GpuFacts:
    mig_root = node.child("MIG Devices")
    mig_nodes = mig_root.children if mig_root else ()
    return GpuFacts(
        index=index,
        name=node.value_at("Product Name") or "",
        uuid=node.value_at("GPU UUID"),
        memory_mib=_leading_int(node.value_at("FB Memory Usage", "Total")),
        mig_mode=_mig_mode(node.value_at("MIG Mode", "Current")),
        mig_devices=tuple(_q_mig_label(m) for m in mig_nodes if m.key.startswith("MIG ")),
    )


def _q_mig_label(node: _Node) -> str:
    number = node.key.removeprefix("MIG ").strip()
    gi, ci = node.value_at("GPU Instance ID"), node.value_at("Compute Instance ID")
    return f"MIG device {number} (GI {gi}, CI {ci})"


# ---------------------------------------------------------- parser: nvidia-smi -q -x

_XML_SPAN = re.compile(
    r"(?:<\?xml[^>]*>\s*)?(?:<!DOCTYPE[^>]*>\s*)?<nvidia_smi_log\b.*?"
    r"</nvidia_smi_log>",
    re.S,
)


def _split_xml(text: str) -> tuple[str | None, str]:
    """The ``-q -x`` document (if any) and the rest of the text, for the other parsers."""
    match = _XML_SPAN.search(text)
    if match is None:
        return None, text
    return match.group(0), text[: match.start()] + "\n" + text[match.end() :]


def parse_query_xml(document: str) -> HostFacts:
    """``nvidia-smi -q -x``. Returns an empty fragment for a document that will not parse."""
    # The DOCTYPE names an external DTD; expat never fetches it, and it is not needed.
    try:
        root = ET.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", document))
    except ET.ParseError:
        return HostFacts(problems=("file: the nvidia-smi XML could not be parsed",))
    return HostFacts(
        driver_version=_clean(root.findtext("driver_version")),
        cuda_driver_version=_clean(root.findtext("cuda_version")),
        gpus=tuple(_xml_gpu(gpu, i) for i, gpu in enumerate(root.findall("gpu"))),
    )


def _xml_gpu(gpu: ET.Element, index: int) -> GpuFacts:
    return GpuFacts(
        index=index,
        name=(gpu.findtext("product_name") or "").strip(),
        uuid=_clean(gpu.findtext("uuid")),
        memory_mib=_leading_int(gpu.findtext("fb_memory_usage/total")),
        mig_mode=_mig_mode(gpu.findtext("mig_mode/current_mig")),
        mig_devices=tuple(_xml_mig_label(m) for m in gpu.findall("mig_devices/mig_device")),
    )


def _xml_mig_label(mig: ET.Element) -> str:
    parts = [
        f"GI {mig.findtext('gpu_instance_id', '?').strip()}",
        f"CI {mig.findtext('compute_instance_id', '?').strip()}",
    ]
    if uuid := _clean(mig.findtext("uuid")):
        parts.append(uuid)
    return f"MIG device {mig.findtext('index', '?').strip()} ({', '.join(parts)})"


# ------------------------------------------------------------------ parser: topo -m

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topology(text: str) -> dict[str, dict[str, str]] | None:
    """``nvidia-smi topo -m``: {"GPU0": {"GPU1": "NV18", "NIC0": "PIX"}, ...}, self omitted."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    for i, line in enumerate(lines):
        tokens = line.split()
        # The header names the devices; a row starts with one and holds its own "X".
        if tokens[:1] == ["GPU0"] and "X" not in tokens:
            columns = _topology_columns(tokens)
            return _topology_rows(lines[i + 1 :], columns) or None
    return None


def _topology_columns(tokens: Sequence[str]) -> list[str]:
    columns: list[str] = []
    for token in tokens:
        if token in ("CPU", "NUMA"):  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
            break
        columns.append(token)
    return columns


def _topology_rows(lines: Iterable[str], columns: Sequence[str]) -> dict[str, dict[str, str]]:
    matrix: dict[str, dict[str, str]] = {}
    for line in lines:
        tokens = line.split()
        if not tokens or tokens[0] not in columns:
            if matrix:
                break  # the matrix ended (a blank line, then the legend)
            continue
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) == len(columns):
            matrix[tokens[0]] = {
                c: v for c, v in zip(columns, cells, strict=True) if c != tokens[0]
            }
    return matrix


# ------------------------------------------------------- parser: /proc, os-release

_PROC_VERSION = re.compile(
    r"NVRM version:.*?Kernel Module(?:\s+for\s+\S+)?\s+(?P<version>\d+\.\d+(?:\.\d+)?)"
)


def parse_proc_version(text: str) -> str | None:
    """The kernel module's version from ``/proc/driver/nvidia/version``.

    Both banners: "NVIDIA UNIX x86_64 Kernel Module  550.54.15 ..." and
    "NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ...".
    """
    match = _PROC_VERSION.search(text)
    return match.group("version") if match else None


def parse_os_release(text: str) -> dict[str, str]:
    """``/etc/os-release``: shell-style KEY=value lines, values possibly quoted."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.strip().partition("=")
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            continue
        try:
            result[key] = " ".join(shlex.split(raw))
        except ValueError:  # unbalanced quotes: keep what is there
            result[key] = raw.strip().strip("\"'")
    return result


# ------------------------------------------------------------------ saved outputs


def parse_saved(text: str) -> HostFacts:
    """Host facts from saved tool output (``envbuild detect --from FILE``).

    Raises :class:`UsageError` when nothing in ``text`` is recognised.
    """
    document, rest = _split_xml(text)
    parts = [
        parse_query_xml(document) if document else HostFacts(),
        parse_query_report(rest),
        parse_query_csv(rest),
        parse_table(rest),
        parse_list(rest),
        HostFacts(driver_version=parse_proc_version(rest)),
        HostFacts(topology=parse_topology(rest), problems=find_problems(rest, "nvidia-smi")),
    ]
    facts = _with_source(_merge_all(parts), "file")
    if facts == HostFacts():
        raise UsageError(
            "no nvidia-smi output recognised",
            hint="save the output of `nvidia-smi`, `nvidia-smi -q`, `nvidia-smi -q -x`, "
            "`nvidia-smi --query-gpu=... --format=csv`, `nvidia-smi -L` or "
            "`nvidia-smi topo -m` (or /proc/driver/nvidia/version)",
        )
    return facts


# ------------------------------------------------------------------- live probes


def make_runner(env: Mapping[str, str], *, timeout: float = RUN_TIMEOUT_S) -> Runner:
    """Run a tool found on ``env``'s PATH.

    Returns stdout on success; on failure the combined output if there is any
    (so known failure texts can be recognised), else None. A missing binary or
    a timeout gives None.
    """

    def run(argv: Sequence[str]) -> str | None:
        exe = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if exe is None:
            return None
        try:
            done = subprocess.run(
                [exe, *argv[1:]],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
                env={**env, "LC_ALL": "C"},
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0:
            return done.stdout
        output = done.stdout + done.stderr
        return output if output.strip() else None

    return run


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
        return HostFacts(problems=(f"nvml: Driver/library version mismatch — {_HINT_MISMATCH}",))
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", _NVML_DRIVER_NOT_LOADED):
        return HostFacts(problems=(f"nvml: Driver Not Loaded — {_HINT_NOT_LOADED}",))
    return HostFacts(problems=(f"nvml: initialisation failed: {exc}",))


def _nvml_read(nvml: Any) -> HostFacts:
    count = _nvml_try(nvml.nvmlDeviceGetCount)
    cuda = _nvml_try(nvml.nvmlSystemGetCudaDriverVersion)
    return HostFacts(
        driver_version=_as_text(_nvml_try(nvml.nvmlSystemGetDriverVersion)),
        driver_source="nvml",
        cuda_driver_version=_nvml_cuda(cuda),
        gpus=tuple(_nvml_gpu(nvml, i) for i in range(count if isinstance(count, int) else 0)),
    )


def _nvml_cuda(value: object) -> str | None:
    """NVML encodes CUDA 12.4 as 12040."""
    if not isinstance(value, int) or value <= 0:
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


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
        name=_as_text(_nvml_try(nvml.nvmlDeviceGetName, handle)) or "",
        uuid=_as_text(_nvml_try(nvml.nvmlDeviceGetUUID, handle)),
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
        name = _as_text(_nvml_try(nvml.nvmlDeviceGetName, mig)) or "MIG device"
        uuid = _as_text(_nvml_try(nvml.nvmlDeviceGetUUID, mig))
        yield f"{name} device {slot} ({uuid})" if uuid else f"{name} device {slot}"


def probe_nvidia_smi(run: Runner) -> HostFacts | None:
    """GPUs and driver from the CSV query, then the table's CUDA version and MIG devices."""
    answered, facts = False, HostFacts()
    # Older nvidia-smi rejects the compute_cap field: then ask again without it.
    for fields in (QUERY_FIELDS, FALLBACK_FIELDS):
        output = run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        )
        if output is None:
            continue
        answered = True
        if problems := find_problems(output, "nvidia-smi"):
            return HostFacts(problems=problems)
        facts = parse_query_csv(output)
        if facts.gpus:
            break
    if not answered:
        return None
    parts = [facts, parse_table(run(["nvidia-smi"]) or "")]
    if any(g.mig_mode == "Enabled" for g in facts.gpus):
        parts.append(parse_list(run(["nvidia-smi", "-L"]) or ""))
    return _with_source(_merge_all(parts), "nvidia-smi")


def probe_topology(run: Runner, gpu_count: int) -> dict[str, dict[str, str]] | None:
    if gpu_count < 2:
        return None  # one GPU has no interconnect worth a subprocess
    return parse_topology(run(["nvidia-smi", "topo", "-m"]) or "")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def probe_proc_driver(root: Path) -> str | None:
    text = _read_text(root / "proc" / "driver" / "nvidia" / "version")
    return parse_proc_version(text) if text else None


def probe_os_release(root: Path) -> dict[str, str]:
    for candidate in ("etc/os-release", "usr/lib/os-release"):
        text = _read_text(root / candidate)
        if text is not None:
            return parse_os_release(text)
    return {}


def probe_shm_bytes(root: Path) -> int | None:
    """Size of /dev/shm: Docker's default is 64 MB, too small for DataLoader workers."""
    try:
        stats = os.statvfs(root / "dev" / "shm")
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def probe_cpu_count() -> int | None:
    """CPUs this process may run on (a container's cpuset), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _consistency_problems(
    facts: HostFacts, kernel: str | None, env: Mapping[str, str]
) -> tuple[str, ...]:
    found: list[str] = []
    if kernel and facts.driver_version and facts.driver_version != kernel:
        found.append(
            f"driver: user-space {facts.driver_version} but kernel module {kernel} is loaded"
            f" — {_HINT_MISMATCH}"
        )
    hidden = env.get("CUDA_VISIBLE_DEVICES")
    if facts.gpus and hidden is not None and hidden.strip() in ("", "-1"):
        found.append(
            f"env: CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU from CUDA programs"
            " — unset it, or list the GPU indexes to use"
        )
    return tuple(found)


_AUTO: Any = object()


def probe_host(
    env: Mapping[str, str],
    *,
    run: Runner | None = None,
    root: Path = Path("/"),
    nvml: Any = _AUTO,
) -> HostFacts:
    """Everything ``envbuild detect`` reports; never raises for a missing GPU or tool.

    ``run`` defaults to :func:`make_runner` over ``env``; ``nvml`` to the
    ``pynvml`` module when importable (pass None to skip NVML, as tests do);
    ``root`` relocates /proc, /etc/os-release and /dev/shm for tests.
    """
    runner = run if run is not None else make_runner(env)
    from_nvml = probe_nvml(load_nvml() if nvml is _AUTO else nvml)
    facts = from_nvml or HostFacts()
    # A recognised NVML failure (mismatch, module not loaded) would fail nvidia-smi too.
    if not facts.gpus and not facts.problems:
        facts = _merge(facts, probe_nvidia_smi(runner) or HostFacts())
    kernel = probe_proc_driver(root)
    host = HostFacts(
        driver_version=kernel,
        driver_source="proc" if kernel else None,
        topology=probe_topology(runner, len(facts.gpus)),
        os_release=probe_os_release(root),
        cpu_count=probe_cpu_count(),
        shm_bytes=probe_shm_bytes(root),
        problems=_consistency_problems(facts, kernel, env),
    )
    return _merge(facts, host)


# ------------------------------------------------------------------------ output


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
        "problems": list(h.problems),
    }


def _gpu_json(g: GpuFacts) -> dict[str, object]:
    return {
        "index": g.index,
        "name": g.name,
        "uuid": g.uuid,
        "compute_capability": g.compute_capability,
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
    return "\n".join(lines) + "\n"


_SOURCE_WORDS = {
    "nvml": "NVML",
    "nvidia-smi": "nvidia-smi",
    "proc": "the loaded kernel module, /proc/driver/nvidia/version",
    "file": "saved output",
}


def _driver_lines(h: HostFacts) -> list[str]:
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
    if not h.gpus:
        if h.driver_version is None:
            return []
        return [f"GPUs        none {'listed' if h.driver_source == 'file' else 'visible'}"]
    lines = [f"GPUs        {len(h.gpus)}"]
    for g in h.gpus:
        cc = f"compute capability {g.compute_capability}" if g.compute_capability else "cc unknown"
        memory = f"{g.memory_mib} MiB" if g.memory_mib is not None else "memory unknown"
        mig = f", MIG {g.mig_mode}" if g.mig_mode else ""
        lines.append(f"  [{g.index}] {g.name or 'unknown GPU'}: {cc}, {memory}{mig}")
        lines.extend(f"        {label}" for label in g.mig_devices)
    return lines


def _topology_lines(h: HostFacts) -> list[str]:
    links: dict[str, int] = {}
    for a, row in sorted((h.topology or {}).items()):
        for b, link in row.items():
            if a.startswith("GPU") and b.startswith("GPU") and a < b:
                links[link] = links.get(link, 0) + 1
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
    if h.shm_bytes is None:
        lines.append("/dev/shm    unknown")
    else:
        note = ""
        if h.shm_bytes < _SHM_SMALL:
            note = " (small: DataLoader workers need more; docker run --shm-size=8g or --ipc=host)"
        lines.append(f"/dev/shm    {h.shm_bytes / 2**30:.1f} GiB{note}")
    return lines
