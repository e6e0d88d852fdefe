"""A lock of several targets with fleet placements, for the fleet's tests: the golden CPU
lock's target, its stack made to match this interpreter's torch (so that a real smoke run
against it compares equal), each target with the placement a test gives."""

from __future__ import annotations

import json
import platform
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from envbuild.fleet.placement import Placement
from envbuild.render import lock as lockmod
from envbuild.render.lockset import LockSet

GOLDEN = Path(__file__).parent / "golden" / "cpu" / "envbuild.lock"
DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.test/acme/app@{DIGEST}"


def matching_lock() -> lockmod.Lock:
    """The golden CPU lock with torch and Python as installed here (or as the golden says)."""
    data = json.loads(GOLDEN.read_text())
    try:  # the installed distribution's version, without importing torch (seconds)
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return lockmod.from_json(json.dumps(data))
    data["packages"] = {"torch": version}
    data["companions"] = False
    data["stack"]["torch"] = version.split("+")[0]
    data["stack"]["python"] = ".".join(platform.python_version_tuple()[:2])
    return lockmod.from_json(json.dumps(data))


def write_lock(directory: Path, placements: dict[str, Placement],
               platforms: dict[str, str] | None = None) -> Path:
    """``platforms``: a target's stack platform (linux/arm64), else the golden's (linux/amd64)."""
    base = matching_lock()
    lockset = LockSet(targets={name: replace(base, fleet=p, stack=base.stack.replace(
        platform=(platforms or {}).get(name, base.stack.platform))) for name, p in placements.items()})
    path = directory / "envbuild.lock"
    path.write_text(lockset.to_json())
    return path
