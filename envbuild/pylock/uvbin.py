"""The uv binary that resolves closures, and its version: a module of its own, light enough
(``re`` and ``subprocess``) for ``lock`` to ask ``uv --version`` on a thread from its start
while the main thread imports the rest (envbuild/commands/lock.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from envbuild.errors import UsageError

__all__ = ["find_uv", "uv_version"]


def uv_version(uv: str) -> str:
    """The version of the uv binary ``uv`` ("0.13.9"), from ``uv --version``."""
    try:
        done = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot run uv ({uv}): {exc}", hint="pip install uv") from exc
    words = done.stdout.split()
    if done.returncode != 0 or len(words) < 2 or words[0] != "uv" \
            or not re.fullmatch(r"[0-9]+(?:\.[0-9]+)*", words[1], re.ASCII):
        raise UsageError(f"{uv} --version did not name a uv version ({done.stdout.strip()[:80]!r})",
                         hint="pip install uv")
    return words[1]


def find_uv(explicit: str | None) -> str:
    """The uv binary: ``explicit`` if given (it must exist), else the ``uv`` package's."""
    hint = "pip install uv (envbuild resolves the closure with it)"
    if explicit is not None:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise UsageError(f"uv not found at {explicit}", hint=hint)
        return explicit
    # In a virtual environment on POSIX the uv package's binary is where its own finder looks
    # first (sysconfig's scripts path, <prefix>/bin), found here without importing sysconfig.
    if os.name == "posix" and sys.prefix != sys.base_prefix:
        here = os.path.join(sys.prefix, "bin", "uv")
        if os.path.isfile(here) and os.access(here, os.X_OK):
            return here
    try:
        from uv import find_uv_bin
    except ModuleNotFoundError as exc:
        raise UsageError("uv is not installed", hint=hint) from exc
    try:
        return str(find_uv_bin())
    except FileNotFoundError as exc:
        raise UsageError("the uv package is installed but its binary is missing", hint=hint) from exc
