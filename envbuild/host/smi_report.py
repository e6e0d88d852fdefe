"""Parsers for ``nvidia-smi -q`` (the indented report) and ``nvidia-smi -q -x`` (XML)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from envbuild.host.facts import GpuFacts, HostFacts, leading_int, mig_mode_of
from envbuild.smoke.rules import smi_value


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
        return smi_value(node.value) if node else None


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
        memory_mib=leading_int(node.value_at("FB Memory Usage", "Total")),
        mig_mode=mig_mode_of(node.value_at("MIG Mode", "Current")),
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


def split_xml(text: str) -> tuple[str | None, str]:
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
        driver_version=smi_value(root.findtext("driver_version")),
        cuda_driver_version=smi_value(root.findtext("cuda_version")),
        gpus=tuple(_xml_gpu(gpu, i) for i, gpu in enumerate(root.findall("gpu"))),
    )


def _xml_gpu(gpu: ET.Element, index: int) -> GpuFacts:
    return GpuFacts(
        index=index,
        name=(gpu.findtext("product_name") or "").strip(),
        uuid=smi_value(gpu.findtext("uuid")),
        memory_mib=leading_int(gpu.findtext("fb_memory_usage/total")),
        mig_mode=mig_mode_of(gpu.findtext("mig_mode/current_mig")),
        mig_devices=tuple(_xml_mig_label(m) for m in gpu.findall("mig_devices/mig_device")),
    )


def _xml_mig_label(mig: ET.Element) -> str:
    parts = [
        f"GI {mig.findtext('gpu_instance_id', '?').strip()}",
        f"CI {mig.findtext('compute_instance_id', '?').strip()}",
    ]
    if uuid := smi_value(mig.findtext("uuid")):
        parts.append(uuid)
    return f"MIG device {mig.findtext('index', '?').strip()} ({', '.join(parts)})"
