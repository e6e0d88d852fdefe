"""Domain rules the smoke payload shares with the host side of envbuild.

Which compiled architectures run on which GPU, what a driver's version files and
``nvidia-smi`` print, and the grammar of wheel variants, Python versions and arch
entries. The smoke payload runs standalone (stdlib, Python 3.8) and the resolver,
the lock validators and the host probe import these same functions, so each rule is
written once.

Cheap to import on purpose: ``envbuild resolve``'s start-up path reaches this module,
so it imports no ``re``, ``dataclasses`` or ``typing`` at module level (the few regexes
compile on first use) and its values are plain tuples, which the resolver's on-disk
index can ``marshal``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Any, Iterable, Sequence, Tuple

    # An arch-list entry, parsed: (kind "sm" or "compute", (major, minor),
    # suffix "" / "a" (arch-specific) / "f" (family-specific), "+PTX" appended).
    ArchEntry = Tuple[str, Tuple[int, int], str, bool]

# Integrated (Tegra/Jetson) GPUs do not run SASS built for the discrete GPUs of the
# same major, nor the reverse; sm_101 code also runs on 11.0 (the renamed Thor).
MAX_TIER = 4  # the smoke test's tiers run 0..4 (health last); here for its --help, which reads no report

# source: https://github.com/pytorch/pytorch/blob/main/torch/cuda/__init__.py
# (DEVICE_REQUIREMENT, read in the torch 2.13.0 wheel), retrieved: 2026-11-21
INTEGRATED_CCS = frozenset({(5, 3), (6, 2), (7, 2), (8, 7), (10, 1)})
RENAMED_CCS = {(10, 1): (11, 0)}

# How an arch list runs on a GPU, best first; "none" is "no kernel image is available".
SASS_EXACT = "sass-exact"
SASS_COMPATIBLE = "sass-compatible"
PTX_JIT = "ptx-jit"
NO_COVERAGE = "none"

_DIGITS = frozenset("0123456789")

# Set to "0" in an image (ENV) or a host's smoke environment built without what torch.compile
# needs at run time (compile_toolchain false in the lock): the smoke test then reports a failed
# compile as a warning, not a failure. Written by render/docker (the Dockerfile) and render/script.
COMPILE_TOOLCHAIN_ENV = "ENVBUILD_COMPILE_TOOLCHAIN"


def _ascii_digits(text: str, low: int, high: int) -> bool:
    """``low`` to ``high`` ASCII digits (``str.isdigit`` also takes other scripts' digits)."""
    return low <= len(text) <= high and all(c in _DIGITS for c in text)


# --------------------------------------------------------------------------- value grammars


def is_wheel_variant(text: str) -> bool:
    """A wheel's CUDA variant as the index names it: ``cpu`` or ``cu`` + 3-4 digits."""
    if not isinstance(text, str):
        return False
    return text == "cpu" or (text.startswith("cu") and _ascii_digits(text[2:], 3, 4))


def is_variant_selector(text: str) -> bool:
    """A variant a user may ask for: a wheel's variant, or ``default`` (PyPI's own wheel)."""
    return text == "default" or is_wheel_variant(text)


def is_python_version(text: str) -> bool:
    """A CPython minor version: ``3.11``, or ``3.13t`` for a free-threaded build."""
    if not isinstance(text, str) or not text.startswith("3."):
        return False
    digits = text[2:-1] if text.endswith("t") else text[2:]
    return _ascii_digits(digits, 1, 2)


def is_arch(text: str) -> bool:
    """An arch-list entry: ``sm_90``, ``sm_100a``, ``sm_120f``, ``sm_90+PTX`` or ``compute_90``."""
    return isinstance(text, str) and parse_arch_entry(text) is not None


# --------------------------------------------------------------------------- arch coverage


def parse_arch_entry(text: str) -> ArchEntry | None:
    """``sm_86`` -> SASS 8.6; ``compute_90`` -> PTX 9.0; ``sm_100a`` -> 10.0 arch-specific;
    ``sm_120+PTX`` -> SASS and PTX 12.0. None when ``text`` is none of these."""
    body, plus_ptx = (text[:-4], True) if text.endswith("+PTX") else (text, False)
    kind, _, code = body.partition("_")
    if kind not in ("sm", "compute") or (plus_ptx and kind == "compute"):
        return None
    suffix = code[-1:] if code[-1:] in ("a", "f") else ""
    digits = code[: len(code) - len(suffix)]
    if not _ascii_digits(digits, 2, 3):
        return None
    return (kind, (int(digits[:-1]), int(digits[-1])), suffix, plus_ptx)


def parse_arch_list(arch_list: Iterable[str]) -> list[ArchEntry]:
    """The entries ``arch_runs_on`` understands, parsed once (the resolver's index stores them)."""
    return [e for e in (parse_arch_entry(a.strip()) for a in arch_list) if e is not None]


def _sass_runs_on(entry: ArchEntry, device: tuple[int, int]) -> str:
    """SASS_EXACT, SASS_COMPATIBLE or "" for an entry's SASS on a device."""
    _, code, suffix, _ = entry
    if code == device or RENAMED_CCS.get(code) == device:
        return SASS_EXACT
    if suffix == "a" or device in INTEGRATED_CCS or code in INTEGRATED_CCS:
        return ""
    # A cubin for X.y runs on X.z with z >= y (same major only); a family-specific
    # ("f") cubin runs across its family, which is the same major.
    if code[0] == device[0] and code[1] <= device[1]:
        return SASS_COMPATIBLE
    return ""


def _ptx_runs_on(entry: ArchEntry, device: tuple[int, int]) -> bool:
    _, code, suffix, _ = entry
    if suffix == "a":
        return code == device
    if suffix == "f":
        return code[0] == device[0] and code[1] <= device[1]
    # PTX is JIT-compiled by the driver for any device of equal or newer capability.
    return code <= device


def arch_runs_on(entries: Sequence[ArchEntry], device: tuple[int, int]) -> tuple[str, ArchEntry | None]:
    """How a wheel built for ``entries`` runs on a device of capability ``device``, and
    the entry that makes it run: exact SASS, else compatible SASS, else the newest usable
    PTX; (NO_COVERAGE, None) when nothing runs."""
    for wanted in (SASS_EXACT, SASS_COMPATIBLE):
        for entry in entries:
            if entry[0] == "sm" and _sass_runs_on(entry, device) == wanted:
                return wanted, entry
    ptx = [e for e in entries if (e[0] == "compute" or e[3]) and _ptx_runs_on(e, device)]
    if ptx:
        return PTX_JIT, max(ptx, key=lambda e: e[1])
    return NO_COVERAGE, None


def arch_text(entry: ArchEntry) -> str:
    """An entry as an arch list spells it (``compute_90``, ``sm_100a``, ``sm_120+PTX``)."""
    kind, (major, minor), suffix, plus_ptx = entry
    return "%s_%d%d%s%s" % (kind, major, minor, suffix, "+PTX" if plus_ptx else "")


# --------------------------------------------------------------------------- driver texts


def cuda_version_from_int(value: int) -> str:
    """12040 -> '12.4' (the CUDA driver API encoding: 1000*major + 10*minor)."""
    return "%d.%d" % (value // 1000, (value % 1000) // 10)


def _compiled(pattern: str) -> re.Pattern[str]:
    """Regexes compile on first use: ``re`` costs ``envbuild resolve`` start-up time
    (``re`` keeps its own cache of compiled patterns, so nothing is kept here)."""
    import re

    return re.compile(pattern)


def parse_proc_driver_version(text: str) -> str | None:
    """The kernel module's version from ``/proc/driver/nvidia/version`` ('550.54.15').

    Both banners: "NVIDIA UNIX x86_64 Kernel Module  550.54.15 ..." (proprietary) and
    "NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ..." (open).
    """
    match = _compiled(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)").search(text)
    return match.group(1) if match else None


# What nvidia-smi prints where a value does not exist or is not readable.
SMI_MISSING = frozenset({"", "n/a", "[n/a]", "na", "none", "not supported", "[not supported]",
                         "unknown error", "[unknown error]", "insufficient permissions",
                         "[insufficient permissions]"})


def smi_value(text: str | None) -> str | None:
    """One nvidia-smi cell, stripped; None where it says the value is missing."""
    if text is None:
        return None
    text = text.strip()
    return None if text.lower() in SMI_MISSING else text


def parse_smi_list(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -L``: each GPU (index, name, uuid) with its MIG devices (profile,
    device, uuid)."""
    gpu_re = _compiled(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)")
    mig_re = _compiled(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)")
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        gpu = gpu_re.match(line)
        if gpu:
            gpus.append({"index": int(gpu.group(1)), "name": gpu.group(2), "uuid": gpu.group(3), "mig": []})
            continue
        mig = mig_re.match(line)
        if mig and gpus:
            gpus[-1]["mig"].append({"profile": mig.group(1), "device": int(mig.group(2)),
                                    "uuid": mig.group(3)})
    return gpus


def parse_topo_rows(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``nvidia-smi topo -m``: the device columns (GPUs, then NICs) and each device's row,
    its label and cells: the link to every column ("X" to itself), then its CPU affinity,
    NUMA affinity and so on. ([], []) when ``text`` holds no matrix."""
    ansi = _compiled(r"\x1b\[[0-9;]*m")  # some drivers underline the header
    gpu = _compiled(r"GPU\d+")
    lines = [ansi.sub("", line) for line in text.splitlines()]
    for i, line in enumerate(lines):
        tokens = line.split()
        # The header names the devices; a row starts with one and holds its own "X".
        if not tokens or gpu.fullmatch(tokens[0]) is None or "X" in tokens:
            continue
        columns: list[str] = []
        for token in tokens:
            if token in ("CPU", "NUMA"):  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
                break
            columns.append(token)
        rows: list[tuple[str, list[str]]] = []
        for row in lines[i + 1 :]:
            cells = row.split()
            if not cells or cells[0] not in columns:
                if rows:
                    break  # the matrix ended (a blank line, then the legend)
                continue
            rows.append((cells[0], cells[1:]))
        return columns, rows
    return [], []
