"""GPU targets: what a stack must run on, from a name, an ``sm_XY`` or the host."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from envbuild.errors import UsageError

Coverage = Literal["sass", "sass-compatible", "ptx"]

_ARCH_RE = re.compile(r"sm_(\d{1,2})(\d)")
_ENTRY_RE = re.compile(r"(sm|compute)_(\d{1,2})(\d)([af]?)(\+PTX)?")
_NAME_RE = re.compile(r"[A-Za-z0-9 ._()/\-]{1,80}")
_NOISE_RE = re.compile(r"\b(nvidia|geforce|tesla|quadro)\b|[\s_\-]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuTarget:
    """One GPU a stack must run on, with what the data knows about its driver support."""

    label: str
    compute_capability: str
    datacenter: bool | None = None
    min_driver_branch: int | None = None
    last_driver_branch: int | None = None
    source: str | None = None

    @property
    def sm(self) -> str:
        return "sm_" + self.compute_capability.replace(".", "")


def _fold(name: str) -> str:
    return _NOISE_RE.sub("", name.casefold())


def find_gpu(rows: Iterable[Mapping[str, Any]], name: str) -> GpuTarget:
    """Look a GPU up by name or alias, forgiving case, spaces and vendor words."""
    if _NAME_RE.fullmatch(name) is None:
        raise UsageError(f"invalid GPU name {name!r}",
                         hint="letters, digits, spaces and . _ - ( ) / only")
    by_key: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        for alias in (row["name"], *row.get("aliases", ())):
            by_key.setdefault(_fold(alias), row)
    found = by_key.get(_fold(name))
    if found is None:
        close = difflib.get_close_matches(_fold(name), list(by_key), n=3, cutoff=0.6)
        names = list(dict.fromkeys(by_key[c]["name"] for c in close))  # closest first
        hint = f"Perhaps you meant {' or '.join(names)}?" if names else (
            "give --arch sm_XY instead, or see 'envbuild matrix show gpus'"
        )
        raise UsageError(f"unknown GPU {name!r}", hint=hint)
    return target_from_row(found, label=found["name"])


def target_from_row(row: Mapping[str, Any], *, label: str) -> GpuTarget:
    return GpuTarget(
        label=label,
        compute_capability=row["compute_capability"],
        datacenter=row["datacenter"],
        min_driver_branch=row.get("min_driver_branch"),
        last_driver_branch=row.get("last_driver_branch"),
        source=row["source"],
    )


def target_from_arch(arch: str, *, datacenter: bool | None) -> GpuTarget:
    match = _ARCH_RE.fullmatch(arch)
    if match is None:
        raise UsageError(f"invalid GPU architecture {arch!r}", hint="write it as sm_89, sm_90 or sm_120")
    return GpuTarget(label=arch, compute_capability=f"{int(match[1])}.{match[2]}", datacenter=datacenter)


def coverage(compute_capability: str, arch_list: Iterable[str]) -> Coverage | None:
    """How a wheel compiled for ``arch_list`` can run on a GPU, best way first.

    Exact SASS; SASS of the same major and a lower minor (binary compatible, except
    the arch-specific ``a``/``f`` targets); or PTX of an equal or lower capability that
    the driver JIT-compiles. None: "no kernel image is available" at the first kernel.
    """
    major, minor = (int(p) for p in compute_capability.split("."))
    found: list[Coverage] = []
    for entry in arch_list:
        match = _ENTRY_RE.fullmatch(entry)
        if match is None:
            continue
        kind, e_major, e_minor, specific, ptx = match.groups()
        e_cc = (int(e_major), int(e_minor))
        if kind == "sm" and e_cc == (major, minor):
            found.append("sass")
        elif kind == "sm" and not specific and e_cc[0] == major and e_cc[1] < minor:
            found.append("sass-compatible")
        if (ptx or kind == "compute") and not specific and e_cc <= (major, minor):
            found.append("ptx")
    best: Coverage
    for best in ("sass", "sass-compatible", "ptx"):
        if best in found:
            return best
    return None
