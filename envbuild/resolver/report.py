"""Human and JSON views of a resolution. Pure: strings and dicts out, nothing printed."""

from __future__ import annotations

from envbuild.resolver.model import group_rejections

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from envbuild.errors import NoCompatibleStack
    from envbuild.resolver.model import Request, Resolution, Stack

JSON_SCHEMA = "envbuild.resolve/1"
COMPAT_SHORT = {"native": "native", "minor-version": "minor", "forward": "forward", None: "-"}


def resolution_json(request: Request, resolution: Resolution, *, top: int) -> dict[str, Any]:
    return {
        "schema": JSON_SCHEMA,
        "driver": resolution.driver.to_json() if resolution.driver else None,
        "gpus": [_gpu_json(g) for g in request.gpus],
        "stacks": [s.to_json() for s in resolution.stacks[:top]],
        "total_stacks": len(resolution.stacks),
        "rejected": [r.to_json() for r in resolution.rejected],
    }


def failure_json(failure: NoCompatibleStack, resolution: Resolution) -> dict[str, Any]:
    return {
        "schema": JSON_SCHEMA,
        "error": failure.message,
        "conflicts": list(failure.conflicts),
        "fixes": list(failure.fixes),
        "driver": resolution.driver.to_json() if resolution.driver else None,
        "rejected": [r.to_json() for r in resolution.rejected],
    }


def _gpu_json(gpu: Any) -> dict[str, Any]:
    return {"name": gpu.label, "compute_capability": gpu.compute_capability, "sm": gpu.sm,
            "datacenter": gpu.datacenter}


def resolution_text(request: Request, resolution: Resolution, *, top: int, explain: bool) -> str:
    lines = list(header_lines(request, resolution))
    lines.append("")
    lines.extend(stack_table(resolution.stacks[:top]))
    shown = min(top, len(resolution.stacks))
    lines.append("")
    lines.append(f"{shown} of {len(resolution.stacks)} stacks shown (--top N for more); "
                 f"{len(resolution.rejected)} families rejected"
                 + ("." if explain else " (--explain says why)."))
    for stack in resolution.stacks[:1]:
        for note in stack.notes:
            lines.append(f"note: {note}")
    if explain:
        lines.append("")
        lines.extend(rejection_lines(resolution))
    return "\n".join(lines)


def header_lines(request: Request, resolution: Resolution) -> Iterable[str]:
    summary = resolution.driver
    if summary is None and request.cpu_host:
        yield ("No NVIDIA driver or GPU found on this host (--host): CPU stacks first; a CUDA "
               "stack's min_driver says the driver it needs.")
    elif summary is None:
        yield ("No driver given (--driver or --host): no driver constraint; each stack's "
               "min_driver says what it needs.")
    else:
        native = _natively(summary.max_cuda, summary.max_cuda_release)
        if summary.partial:
            yield (f"Driver {summary.version}: read as the newest {summary.version} build, "
                   f"which runs {native}.")
            yield _older_line(summary.version, summary.older, summary.minor_compat)
        else:
            yield f"Driver {summary.version} runs {native}."
        if summary.minor_compat:
            yield (f"  CUDA {summary.minor_compat} also through minor-version compatibility "
                   "(caveat: PTX newer than the driver cannot be JIT-compiled; features that "
                   "need a newer driver fail).")
        for family, driver in _needs_newer(summary.needs_newer, summary.minor_compat):
            yield f"  CUDA {family} needs driver >= {driver}."
        ended = end_of_life_line(summary.version, summary.lifecycle)
        if ended:
            yield ended
    for gpu in request.gpus:
        kind = {True: "datacenter", False: "consumer/workstation", None: "kind unknown"}
        yield f"GPU: {gpu.label} ({gpu.sm}, {kind[gpu.datacenter]})"
    if request.platform != "linux/amd64" or request.platform_given:
        why = "" if request.platform_given else " (a GPU built into an Arm system)"
        yield f"Platform: {request.platform}{why}"


def end_of_life_line(version: str, lifecycle: tuple[str, str | None, str] | None,
                     today: str | None = None) -> str | None:
    """"  Branch 535 reached its end of life in 2026-06 ..." once the month has passed
    (``today``: "YYYY-MM", the current month when None)."""
    if lifecycle is None or lifecycle[1] is None:
        return None
    if today is None:
        import time

        today = time.strftime("%Y-%m", time.gmtime())
    if lifecycle[1] >= today:
        return None
    branch = version.split(".")[0]
    return (f"  Branch {branch} ({lifecycle[0]}) reached its end of life in {lifecycle[1]} "
            f"(NVIDIA's driver lifecycle, {lifecycle[2]}): it gets no more fixes or security "
            "updates; move the host to a supported production or LTS branch.")


def _natively(max_cuda: str | None, release: str | None) -> str:
    return (f"CUDA <= {max_cuda} natively (newest release {release})" if max_cuda
            else "no CUDA release natively")


def _older_line(version: str, older: tuple[str, str | None, str | None, str | None] | None,
                minor: str | None) -> str:
    """What the oldest builds of a partial version run, from the data's toolkit drivers."""
    if older is None:
        return (f"  Every {version} build runs the same: no toolkit driver or compatibility "
                "floor in the data falls among them.")
    below, max_cuda, release, older_minor = older
    line = (f"  The data records no oldest {version} build: {version} builds older than "
            f"{below} run {_natively(max_cuda, release)}")
    if older_minor != minor:
        line += (f", CUDA {older_minor} through minor-version compatibility" if older_minor
                 else ", none through minor-version compatibility")
    return line + "; give the full version (nvidia-smi) for an exact answer."


def _needs_newer(needs: Sequence[tuple[str, str]], minor: str | None) -> Iterable[tuple[str, str]]:
    """One line per CUDA major the driver cannot run at all (the first release of it)."""
    covered = minor.split(".")[0] if minor else None
    seen: set[str] = set()
    for family, driver in needs:
        major = family.split(".")[0]
        if major != covered and major not in seen:
            seen.add(major)
            yield f"{major}.x", driver


COLUMNS = ("#", "torch", "variant", "cuda", "cudnn", "python", "ubuntu", "compat", "min driver",
           "base image")


def stack_table(stacks: Sequence[Stack]) -> list[str]:
    rows = [COLUMNS] + [
        (str(i), s.torch, s.variant, s.cuda or "-", s.cudnn or "-", s.python, s.ubuntu,
         COMPAT_SHORT[s.compat], s.min_driver or "-", s.base_image)
        for i, s in enumerate(stacks, start=1)
    ]
    return format_table(rows)


def format_table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def rejection_lines(resolution: Resolution) -> Iterable[str]:
    yield "Rejected families, by the constraint that failed:"
    for constraint, items in group_rejections(resolution.rejected).items():
        yield f"[{constraint}] {len(items)} families"
        for item in items:
            yield f"  {item.family}: {item.reason}"
            if item.source:
                yield f"      source: {item.source}"


def table_of_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    keys = [k for k in rows[0] if k not in ("source", "retrieved", "note")]
    body = [tuple(keys)] + [tuple(_cell(r.get(k)) for k in keys) for r in rows]
    return "\n".join(format_table(body))


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "-" if value is None else str(value)


# --- JSON text without the json module ------------------------------------------------
# ``import json`` imports ``re`` (its decoder's patterns): a third of the time a resolve
# may take (twice a bare interpreter's start-up). This writes what
# ``json.dumps(body, indent=2)`` writes, for the types a report holds, and hands anything
# else to json itself.


def json_text(body: Any) -> str:
    """``json.dumps(body, indent=2)``, byte for byte."""
    try:
        from _json import encode_basestring_ascii as quote
    except ImportError:  # an interpreter without the C accelerator
        from json.encoder import py_encode_basestring_ascii as quote
    out: list[str] = []
    try:
        _json_into(body, quote, "\n", out)
    except _NotPlain:
        import json

        return json.dumps(body, indent=2)
    return "".join(out)


class _NotPlain(Exception):
    pass


def _json_into(value: Any, quote: Callable[[str], str], newline: str, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(quote(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif type(value) is int:
        out.append(int.__repr__(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = newline + "  "
        out.append("[" + inner)
        for i, item in enumerate(value):
            if i:
                out.append("," + inner)
            _json_into(item, quote, inner, out)
        out.append(newline + "]")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = newline + "  "
        out.append("{" + inner)
        for i, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise _NotPlain
            out.append(("," + inner if i else "") + quote(key) + ": ")
            _json_into(item, quote, inner, out)
        out.append(newline + "}")
    else:  # floats, subclasses, anything json might treat specially
        raise _NotPlain
