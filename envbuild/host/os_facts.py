"""The rest of the host: the loaded kernel module, OS release, CPUs, /dev/shm."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from envbuild.smoke.rules import parse_proc_driver_version


def parse_os_release(text: str) -> dict[str, str]:
    """``/etc/os-release``: shell-style KEY=value lines, values possibly quoted."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.strip().partition("=")
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            continue
        try:
            result[key] = " ".join(shlex.split(raw))
        except ValueError:  # unbalanced quotes: keep what is there
            result[key] = raw.strip().strip("\"'")
    return result


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def probe_proc_driver(root: Path) -> str | None:
    text = _read_text(root / "proc" / "driver" / "nvidia" / "version")
    return parse_proc_driver_version(text) if text else None


def probe_os_release(root: Path) -> dict[str, str]:
    for candidate in ("etc/os-release", "usr/lib/os-release"):
        text = _read_text(root / candidate)
        if text is not None:
            return parse_os_release(text)
    return {}


def probe_shm_bytes(root: Path) -> int | None:
    """Size of /dev/shm: Docker's default is 64 MB, too small for DataLoader workers."""
    try:
        stats = os.statvfs(root / "dev" / "shm")
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def probe_cpu_count() -> int | None:
    """CPUs this process may run on (a container's cpuset), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
