"""The diagnosis as JSON (schema ``envbuild.diagnose/1``), a text summary, and a
self-contained HTML page: GPU utilisation against data wait and step time, inline SVG."""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict
from typing import Any

from envbuild.diagnose.evidence import Evidence, Recording, summarise
from envbuild.diagnose.verdict import Finding, findings, headroom, verdict

SCHEMA = "envbuild.diagnose/1"


def diagnose(rec: Recording, *, command: list[str] | None = None, pid: int | None = None,
             exit_code: int | None = None, stopped: bool = False) -> dict[str, Any]:
    """The report: the verdict, the findings with their evidence and fixes, the headroom."""
    ev = summarise(rec)
    found = findings(ev)
    return {
        "schema": SCHEMA, "command": command, "pid": pid, "seconds": round(rec.seconds, 2),
        "exit_code": exit_code, "stopped": stopped, "verdict": verdict(found),
        "findings": [_finding(f) for f in found], "headroom": headroom(ev, rec.mig_profiles),
        "gpu_source": ev.gpu_source, "gpu": _plain(ev.gpu), "cpu": _plain(ev.cpu),
        "probe": _plain(ev.probe), "timeline": timeline(rec, ev),
    }


def _finding(f: Finding) -> dict[str, Any]:
    return {"kind": f.kind, "summary": f.summary, "evidence": f.evidence, "fixes": list(f.fixes)}


def _plain(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return {k: (round(v, 3) if isinstance(v, float) else list(v) if isinstance(v, tuple) else v)
            for k, v in asdict(value).items()}


def timeline(rec: Recording, ev: Evidence) -> dict[str, list[list[float]]]:
    """Series of [seconds since start, value]: GPU %, data wait % and step ms per window."""
    starts = [s.t for s in rec.cpu[:1]] + [s.t for s in rec.gpu[:1]] + \
        [float(w["t0"]) for w in ev.windows[:1] if isinstance(w.get("t0"), (int, float))]
    t0 = min(starts) if starts else 0.0
    index = ev.gpu.index if ev.gpu else None
    gpu = [[round(s.t - t0, 2), s.util_pct] for s in rec.gpu if s.index == index and s.util_pct is not None]
    wait, step = [], []
    for w in ev.windows:
        try:
            a, b = float(w["t0"]), float(w["t1"])
            span, periods = b - a, float(w.get("periods") or 0)
            if span > 0:
                waited = float(w["data_wait_s"]) + float(w.get("first_wait_s") or 0)
                wait.append([round((a + b) / 2 - t0, 2), round(100 * waited / span, 1)])
            if periods:
                step.append([round((a + b) / 2 - t0, 2), round(1000 * float(w["period_s"]) / periods, 2)])
        except (KeyError, TypeError, ValueError):
            continue  # a window line the probe did not write whole
    return {"gpu_util_pct": gpu, "data_wait_pct": wait, "step_ms": step}


def text(report: dict[str, Any]) -> str:
    lines = [f"verdict: {report['verdict']}"]
    for f in report["findings"]:
        numbers = ", ".join(f"{k}={v}" for k, v in f["evidence"].items() if v not in (None, [], ""))
        lines += [f"- {f['kind']}: {f['summary']}", f"    evidence: {numbers}"]
        lines += [f"    fix: {fix}" for fix in f["fixes"]]
    room = report["headroom"]
    if room:
        lines.append(f"headroom: {room['jobs']} such job(s) per GPU (memory: {room['by_memory']}, "
                     f"utilisation: {room['by_util']}); {room['note']}")
    lines.append(_sources(report))
    return "\n".join(lines)


def _sources(report: dict[str, Any]) -> str:
    gpu = report["gpu"]
    seen = (f"GPU {gpu['index']} {gpu['name']} via {report['gpu_source']}" if gpu
            else "no GPU seen (neither NVML nor nvidia-smi answered)")
    probe = report["probe"]
    inside = (f"probe: {probe['batches']} batches, {probe['steps']} steps" if probe
              else "probe: none (not a Python job, --pid, or torch never imported)")
    cpu = report["cpu"]
    used = (f"; job CPU {cpu['process_pct']:.0f}% of a core (user {cpu['user_pct']:.0f}, kernel "
            f"{cpu['system_pct']:.0f}), busiest thread {cpu['busiest_thread_pct']:.0f}%" if cpu else "")
    return f"sampled {report['seconds']} s; {seen}; {inside}{used}"


# --- HTML -------------------------------------------------------------------------------

W, H, PAD = 760, 220, 40
COLOURS = {"gpu_util_pct": "#2a9d8f", "data_wait_pct": "#e76f51", "step_ms": "#264653"}
LABELS = {"gpu_util_pct": "GPU utilisation %", "data_wait_pct": "data wait % of the loop",
          "step_ms": "step time ms (right scale)"}


def _polyline(points: list[list[float]], t_max: float, y_max: float, colour: str) -> str:
    if not points:
        return ""
    xy = " ".join(f"{PAD + (W - 2 * PAD) * t / t_max:.1f},"
                  f"{H - PAD - (H - 2 * PAD) * min(v, y_max) / y_max:.1f}" for t, v in points)
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{xy}"/>'


def svg(series: dict[str, list[list[float]]]) -> str:
    t_max = max([p[0] for s in series.values() for p in s] + [1.0])
    step_max = max([p[1] for p in series["step_ms"]] + [1.0]) * 1.1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img">',
             f'<rect x="{PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" fill="#fafafa" '
             'stroke="#ccc"/>',
             f'<text x="4" y="{PAD + 4}" font-size="11">100%</text><text x="4" y="{H - PAD}" '
             f'font-size="11">0</text><text x="{W - PAD + 4}" y="{PAD + 4}" font-size="11">'
             f'{step_max:.0f} ms</text>', *_ticks(t_max)]
    for key in ("gpu_util_pct", "data_wait_pct"):
        parts.append(_polyline(series[key], t_max, 100.0, COLOURS[key]))
    parts.append(_polyline(series["step_ms"], t_max, step_max, COLOURS["step_ms"]))
    parts.append("</svg>")
    return "".join(parts)


def _ticks(t_max: float) -> list[str]:
    """Five time marks under the plot, and a faint line at 50%."""
    mid = H / 2
    marks = [f'<line x1="{PAD}" x2="{W - PAD}" y1="{mid}" y2="{mid}" stroke="#e4e4e4"/>']
    for i in range(5):
        x = PAD + (W - 2 * PAD) * i / 4
        marks.append(f'<text x="{x:.0f}" y="{H - PAD + 16}" font-size="11" text-anchor="middle">'
                     f'{t_max * i / 4:.1f} s</text>')
    return marks


def json_text(report: dict[str, Any]) -> str:
    """The report as strict JSON (RFC 8259 has no NaN or Infinity: a value that is not a finite
    number, should one arise, is null), indented, one trailing newline."""
    return json.dumps(_finite(report), indent=2, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def page(report: dict[str, Any]) -> str:
    """One HTML file, nothing fetched: the timeline and the text summary."""
    series = report["timeline"]
    legend = "".join(f'<li><span style="color:{COLOURS[k]}">&#9632;</span> {LABELS[k]}'
                     f'{"" if series[k] else " (no samples)"}</li>' for k in COLOURS)
    title = html.escape(" ".join(report["command"] or [f"pid {report['pid']}"]))
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>envbuild diagnose: "
            f"{title}</title><style>body{{font-family:sans-serif;margin:2em}}pre{{background:#f4f4f4;"
            f"padding:1em;white-space:pre-wrap}}</style></head><body><h1>{html.escape(report['verdict'])}"
            f"</h1><p>{title}</p>{svg(series)}<ul>{legend}</ul><pre>{html.escape(text(report))}</pre>"
            "</body></html>\n")
