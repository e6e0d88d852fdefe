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


# PyTorch's Linux aarch64 wheels drop 5.0-7.5 and 8.6 from every arch list (filter_aarch64_archs in
# .ci/manywheel/build_cuda.sh; RELEASE.md's aarch64 table: 8.0, 9.0, then 10.0, 11.0, 12.0 from CUDA 13),
# read 2026-11-28: an older GPU on an Arm host has no variant to move to.
AARCH64_FIRST = (8, 0)


def arch_hint(capability: tuple[int, int], arch_list: Sequence[str], variant: str = "",
              machine: str = "") -> str:
    """Which way to move: the GPU is newer or older than everything in the wheel. ``machine``:
    the host's CPU (platform.machine()); on aarch64 older GPUs have no wheel at all."""
    sm = "sm_%d%d" % capability
    entries = parse_arch_list(arch_list)
    current = " (this is %s)" % variant if variant else ""
    pick = "`envbuild resolve --arch %s` names the variants that include it" % sm
    if machine == "aarch64" and capability < AARCH64_FIRST:
        return ("no aarch64 torch wheel runs on %s: PyTorch's aarch64 arch lists start at sm_80; an "
                "x86_64 host runs this GPU (`envbuild resolve --arch %s --platform linux/amd64`)" % (sm, sm))
    if machine == "aarch64" and capability == (8, 7):
        return "sm_87 is a Jetson (Orin) GPU: its torch comes with JetPack, not PyTorch's aarch64 wheels"
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
