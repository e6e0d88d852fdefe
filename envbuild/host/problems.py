"""Known failure texts in the driver tools' output, each with what to do about it."""

from __future__ import annotations

import re

HINT_MISMATCH = (
    "the loaded kernel module and the user-space driver libraries differ, usually after a "
    "driver upgrade without a reboot; reboot the host (or unload and reload the nvidia modules)"
)
HINT_NOT_LOADED = (
    "the NVIDIA kernel module is not loaded: the driver is not installed, Secure Boot refused "
    "the module, or the kernel was updated without rebuilding it; install the driver or reboot"
)
_KNOWN_PROBLEMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Driver/library version mismatch", re.I), HINT_MISMATCH),
    (
        re.compile(
            r"couldn't communicate with the NVIDIA driver|could not communicate with the "
            r"NVIDIA driver",
            re.I,
        ),
        HINT_NOT_LOADED,
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
