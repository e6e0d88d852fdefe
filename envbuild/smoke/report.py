"""The smoke report: check values, verdict helpers, exit codes and the readable summary."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from .rules import MAX_TIER as MAX_TIER  # re-exported: the tiers run 0..MAX_TIER

SCHEMA = "envbuild.smoke/1"
EXIT_PASS = 0
EXIT_FAILED = 7
EXIT_GPU_MISSING = 8
EXIT_INTERRUPTED = 130
STATUSES = ("pass", "warn", "fail", "skip")


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    tier: int
    status: str
    message: str = ""
    value: Any = None
    hint: str = ""
    seconds: float = 0.0
    exit_code: int = 0
    gpu: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tier": self.tier,
            "status": self.status,
            "message": self.message,
            "value": self.value,
            "hint": self.hint,
            "seconds": round(self.seconds, 4),
            "exit_code": self.exit_code,
            "gpu": self.gpu,
        }


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a check function returns; the runner adds name, tier and timing."""

    status: str
    message: str = ""
    value: Any = None
    hint: str = ""
    exit_code: int = 0


def ok(message: str = "", value: Any = None) -> Outcome:
    return Outcome("pass", message, value)


def warn(message: str, value: Any = None, hint: str = "") -> Outcome:
    return Outcome("warn", message, value, hint)


def fail(message: str, value: Any = None, hint: str = "", exit_code: int = EXIT_FAILED) -> Outcome:
    return Outcome("fail", message, value, hint, exit_code)


def skip(message: str, value: Any = None, hint: str = "") -> Outcome:
    return Outcome("skip", message, value, hint)


def first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


def summarize(checks: Sequence[Check]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for check in checks:
        counts[check.status] += 1
    return counts


def exit_code_for(checks: Sequence[Check]) -> int:
    """8 when the GPU runtime/driver is missing, else 7 when anything failed, else 0."""
    codes = {c.exit_code or EXIT_FAILED for c in checks if c.status == "fail"}
    if EXIT_GPU_MISSING in codes:
        return EXIT_GPU_MISSING
    return EXIT_FAILED if codes else EXIT_PASS


def render_text(report: Mapping[str, Any]) -> str:
    """The readable summary: one line per check, a hint under each non-pass."""
    torch = report.get("torch") or {}
    host = report.get("host") or {}
    lines = [
        "envbuild smoke (%s) tiers 0-%d: torch %s (CUDA %s), Python %s, %s usable CPUs"
        % (
            report["schema"],
            max(report["tiers"]),
            torch.get("version", "-"),
            torch.get("cuda"),
            host.get("python"),
            host.get("usable_cpus"),
        )
    ]
    width = max([len(c["name"]) for c in report["checks"]] + [10])
    for c in report["checks"]:
        lines.append("T%d  %-4s  %-*s  %s" % (c["tier"], c["status"].upper(), width, c["name"], c["message"]))
        if c["status"] != "pass":
            lines.append("          %*s  hint: %s" % (width, "", c["hint"] or "-"))
    s = report["summary"]
    meaning = {0: "pass", 7: "a check failed", 8: "GPU runtime or driver missing"}.get(
        report["exit_code"], ""
    )
    lines.append(
        "%d pass, %d warn, %d fail, %d skip; exit %d (%s); tier seconds %s"
        % (
            s["pass"],
            s["warn"],
            s["fail"],
            s["skip"],
            report["exit_code"],
            meaning,
            " ".join("T%s=%.1f" % kv for kv in sorted(report["tier_seconds"].items())),
        )
    )
    return "\n".join(lines)
