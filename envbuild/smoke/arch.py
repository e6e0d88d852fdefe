"""Arch coverage as the smoke report shows it: which entry runs on the GPU, in words.

The rule itself (exact SASS, compatible SASS, PTX JIT) is ``rules.arch_runs_on``, the
one the resolver uses too.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .rules import (
    NO_COVERAGE,
    SASS_COMPATIBLE,
    SASS_EXACT,
    arch_runs_on,
    arch_text,
    parse_arch_entry,
    parse_arch_list,
)


@dataclasses.dataclass(frozen=True)
class ArchEntry:
    """One entry of torch.cuda.get_arch_list(): sm_XY (SASS) or compute_XY (PTX)."""

    text: str
    ptx: bool
    major: int
    minor: int
    suffix: str  # "", "a" (arch-specific) or "f" (family-specific)
    with_ptx: bool = False  # "sm_XY+PTX": SASS and PTX


@dataclasses.dataclass(frozen=True)
class Coverage:
    covered: bool
    how: str  # "sass-exact", "sass-compatible", "ptx-jit" or "none"
    entry: str
    detail: str


def parse_arch(text: str) -> ArchEntry | None:
    """``sm_86`` -> SASS 8.6; ``compute_90`` -> PTX 9.0; ``sm_100a`` -> 10.0 arch-specific."""
    parsed = parse_arch_entry(text.strip())
    if parsed is None:
        return None
    kind, (major, minor), suffix, with_ptx = parsed
    return ArchEntry(text.strip(), kind == "compute", major, minor, suffix, with_ptx)


def arch_coverage(capability: tuple[int, int], arch_list: Sequence[str]) -> Coverage:
    """Does a wheel built for ``arch_list`` run on a device of ``capability``?"""
    sm = "sm_%d%d" % capability
    how, entry = arch_runs_on(parse_arch_list(arch_list), capability)
    if how == NO_COVERAGE or entry is None:
        return Coverage(False, NO_COVERAGE, "", "%s not in torch arch list [%s]" % (sm, " ".join(arch_list)))
    text = arch_text(entry)
    if how == SASS_EXACT:
        detail = "SASS %s built for this GPU" % text
    elif how == SASS_COMPATIBLE:
        detail = "SASS %s is binary-compatible with %s (same major)" % (text, sm)
    else:
        detail = "only PTX %s, JIT-compiled by the driver at first use" % text
    return Coverage(True, how, text, detail)


def arch_hint(capability: tuple[int, int], arch_list: Sequence[str], variant: str = "") -> str:
    """Which way to move: the GPU is newer or older than everything in the wheel."""
    sm = "sm_%d%d" % capability
    entries = parse_arch_list(arch_list)
    current = " (this is %s)" % variant if variant else ""
    pick = "`envbuild resolve --arch %s` names the variants that include it" % sm
    if entries and all(e[1] < capability for e in entries):
        return "this GPU is newer than every architecture in the wheel%s: use a newer CUDA variant; %s" % (
            current,
            pick,
        )
    if entries and all(e[1] > capability for e in entries):
        return "the wheel dropped this older architecture%s: use an older CUDA variant; %s" % (
            current,
            pick,
        )
    return "use a torch variant whose arch list includes %s%s; %s" % (sm, current, pick)
