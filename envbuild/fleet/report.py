"""The fleet report: target × node → pass / warn / fail, as JSON (``envbuild.fleet/1``), a
table and one self-contained HTML page (no external assets: it is opened from a CI artifact
or a shared directory, offline).

Each node's verdict is read from its smoke report (``envbuild.smoke/1``): exit code 0 is pass
(warn when a check warned), anything else is fail with the first failing check and its hint.
A node that answered with no usable report fails too; a target with fewer nodes answering
than it declares fails, naming the target.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from envbuild.redact import server_text

SCHEMA = "envbuild.fleet/1"
Status = Literal["pass", "warn", "fail"]
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_TEXT_CAP = 300


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeResult:
    node: str
    status: Status
    check: str = ""  # the first failing (or warning) check
    message: str = ""
    hint: str = ""
    exit_code: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "status": self.status, "check": self.check, "message": self.message,
                "hint": self.hint, "exit_code": self.exit_code}


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetResult:
    target: str
    expected: int
    nodes: tuple[NodeResult, ...] = ()
    problem: str = ""  # why the target failed as a whole (submission, too few nodes, deadline)

    @property
    def status(self) -> Status:
        if self.problem or len(self.nodes) < self.expected or any(n.status == "fail" for n in self.nodes):
            return "fail"
        return "warn" if any(n.status == "warn" for n in self.nodes) else "pass"

    def why(self) -> str:
        if self.problem:  # may quote the engine's own stderr: through the one sanitiser
            return server_text(self.problem, 2 * _TEXT_CAP)
        if len(self.nodes) < self.expected:
            return f"target {self.target}: {len(self.nodes)} of {self.expected} nodes answered"
        failed = [n.node for n in self.nodes if n.status == "fail"]
        return f"target {self.target}: failed on {', '.join(failed)}" if failed else ""

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "status": self.status, "expected_nodes": self.expected,
                "answered_nodes": len(self.nodes), "problem": self.why(),
                "nodes": [n.to_json() for n in self.nodes]}


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetReport:
    engine: str
    targets: tuple[TargetResult, ...] = field(default=())
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(t.status != "fail" for t in self.targets)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "engine": self.engine, "passed": self.passed,
                "seconds": round(self.seconds, 3), "targets": [t.to_json() for t in self.targets]}


def _clip(value: Any) -> str:
    """What a node wrote, as the table, the JSON and the page show it: through the one
    sanitiser (no terminal escape or control character reaches the terminal), cut."""
    return server_text(str(value or ""), _TEXT_CAP)


@dataclass(frozen=True, slots=True, kw_only=True)
class Required:
    """What a node's report must hold to pass: the tiers it was asked to run (0..tier) and the
    checks those ask for, each passed or warned (a report of exit 0 with no checks is no pass)."""

    tier: int = 2
    checks: tuple[str, ...] = ("torch.import",)


def _missing(report: Mapping[str, Any], checks: Sequence[Mapping[str, Any]], required: Required) -> str:
    """Why a report of exit 0 is still no pass, or ''."""
    tiers = report.get("tiers")
    ran = max((t for t in tiers if type(t) is int), default=-1) if isinstance(tiers, list) else -1
    if ran < required.tier:
        return f"the report covers tiers up to {ran}, the run asked for 0-{required.tier}"
    statuses = {str(c.get("name")): c.get("status") for c in checks}
    for name in required.checks:
        if statuses.get(name) not in ("pass", "warn"):
            shown = "missing" if name not in statuses else _clip(statuses[name])
            return f"the required check {name} did not pass ({shown})"
    return ""


def node_result(node: str, report: Any, stderr_tail: str = "",
                required: Required | None = None) -> NodeResult:
    """One node's verdict from what it wrote (a parsed JSON value, any shape)."""
    required = required or Required()
    if not isinstance(report, Mapping) or report.get("schema") != "envbuild.smoke/1":
        code = report.get("exit_code") if isinstance(report, Mapping) else None
        code = code if isinstance(code, int) and not isinstance(code, bool) else 1
        return NodeResult(node=node, status="fail", check="launcher", exit_code=code or 1,
                          message=_clip(f"the smoke test did not run (exit {code}): {stderr_tail}"),
                          hint="see the node's log beside its report; check the launcher, image "
                               "and interpreter")
    checks = [c for c in report.get("checks") or [] if isinstance(c, Mapping)]
    code = report.get("exit_code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else 1
    for wanted, status in (("fail", "fail"), ("warn", "warn")):
        first = next((c for c in checks if c.get("status") == wanted), None)
        if first is not None and (status == "warn" or code != 0):
            return NodeResult(node=node, status="fail" if status == "fail" else "warn",
                              check=_clip(first.get("name")), message=_clip(first.get("message")),
                              hint=_clip(first.get("hint")), exit_code=code)
    if code != 0:
        return NodeResult(node=node, status="fail", check="exit", exit_code=code,
                          message=f"the smoke test exited {code}", hint="see the node's report")
    missing = _missing(report, checks, required)
    if missing:
        return NodeResult(node=node, status="fail", check="required", exit_code=1, message=missing,
                          hint="the node ran less than the fleet asked for: check its image's smoke "
                               "test and the node's log")
    plural = "s" if len(checks) != 1 else ""
    return NodeResult(node=node, status="pass", message=f"{len(checks)} check{plural}")


def parse_node_report(node: str, data: bytes, stderr_tail: str = "",
                      required: Required | None = None) -> NodeResult:
    try:
        value: Any = json.loads(data)
    except (ValueError, RecursionError):
        value = None
    return node_result(node, value, stderr_tail, required)


# --- the readable forms -----------------------------------------------------------------


def render_table(report: FleetReport) -> str:
    """target × node, one line per node; every non-pass with its check and hint."""
    lines = [f"fleet ({report.engine}): {'PASS' if report.passed else 'FAIL'}"]
    for target in report.targets:
        lines.append(f"{target.target}: {target.status.upper()} ({len(target.nodes)} of "
                     f"{target.expected} nodes answered)")
        if target.why():
            lines.append(f"  ! {target.why()}")
        for node in target.nodes:
            line = f"  {node.node:<24} {node.status.upper():<5}"
            line += f" {node.message}" if node.status == "pass" else \
                f" {node.check}: {node.message} — {node.hint}"
            lines.append(line)
    return "\n".join(lines)


_CSS = """body{font:14px system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.3em}table{border-collapse:collapse;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:.4em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}.pass{background:#d9f2d9}.warn{background:#fff1c2}.fail{background:#f8d0d0}
.missing{background:#eee;color:#777}.cell{min-width:9em}small{color:#555;display:block;max-width:28em}"""


def render_html(report: FleetReport) -> str:
    """One page: a row per target, a cell per node (colour = verdict, hover = the hint)."""
    width = max([t.expected for t in report.targets] + [len(t.nodes) for t in report.targets] + [1])
    esc = html.escape
    rows = []
    for target in report.targets:
        cells = [f'<th class="{target.status}">{esc(target.target)}<small>{esc(target.why())}</small></th>']
        for node in target.nodes:
            detail = "" if node.status == "pass" else (
                f"<small>{esc(node.check)}: {esc(node.message)}</small>"
                f"<small><i>{esc(node.hint)}</i></small>")
            cells.append(f'<td class="cell {node.status}" title="{esc(node.hint)}"><b>{esc(node.node)}</b> '
                         f"{node.status.upper()}{detail}</td>")
        cells += ['<td class="cell missing">no answer</td>'] * max(0, target.expected - len(target.nodes))
        cells += ["<td></td>"] * (width - max(target.expected, len(target.nodes)))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    verdict = "PASS" if report.passed else "FAIL"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>envbuild fleet: {verdict}</title><style>{_CSS}</style></head><body>"
            f"<h1>envbuild fleet ({esc(report.engine)}): {verdict}</h1>"
            f"<table><tr><th>node type</th><th colspan=\"{width}\">nodes</th></tr>{''.join(rows)}</table>"
            f"<p>schema {SCHEMA}, {report.seconds:.1f} s</p></body></html>\n")


def sorted_nodes(results: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
    return tuple(sorted(results, key=lambda n: n.node))
