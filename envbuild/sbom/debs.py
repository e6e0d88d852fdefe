"""The Debian packages an image holds, recorded beside the lock (``envbuild.debs.json``).

A lock pins the Python layer by URL and sha256 and the base by digest, but the ``apt-get install``
steps take whatever the archive holds on the day of the build. ``build --lock`` therefore reads the
image's dpkg database (``/var/lib/dpkg/status``, copied out of a container that is created and never
started: :mod:`envbuild.engine.imagefile`) and records, per target, every installed package with its
version and architecture. The first build of a lock writes the record; a later build of the same lock
compares and names every package that differs (a warning; ``build --strict`` makes it exit 6 and
keeps the record; ``build --accept-rebuilt`` records the new set). A record made for another lock (the
target's lock changed: another apt package, another base) is replaced, saying so.

Format (JSON, keys sorted)::

    {"schema": "envbuild.debs/1",
     "targets": {NAME: {"lock_sha256": sha256 of the target's lock object,
                        "os": "debian" | "ubuntu" | null (os-release ID),
                        "packages": {"NAME:ARCH": VERSION}}}}

The file may come from a pull request: it is read confined and size-capped, every name, version and
architecture checked against Debian's grammar, and no error quotes its content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.errors import UsageError

FILE = "envbuild.debs.json"
SCHEMA = "envbuild.debs/1"
LIMIT = 8 * 1024 * 1024
STATUS = "/var/lib/dpkg/status"
OS_RELEASE = "/etc/os-release"
STATUS_LIMIT = 64 * 1024 * 1024  # a CUDA devel image's status file is a few MB
# Debian Policy 5.6.1 (Package), 5.6.12 (Version), dpkg-architecture's names.
_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{0,127}", re.ASCII)
_VERSION = re.compile(r"(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~-]{0,127}", re.ASCII)
_ARCH = re.compile(r"[a-z0-9][a-z0-9-]{0,31}", re.ASCII)
_KEY = re.compile(rf"(?P<name>{_NAME.pattern}):(?P<arch>{_ARCH.pattern})", re.ASCII)
_SHA = re.compile(r"[0-9a-f]{64}", re.ASCII)
OS_IDS = ("debian", "ubuntu")
_AGAIN = f"remove {FILE} (build --lock writes it again)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Debs:
    """One image's installed Debian packages: {"name:arch": version}, and its os-release ID."""

    packages: Mapping[str, str] = field(default_factory=dict)
    os: str | None = None
    lock_sha256: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"lock_sha256": self.lock_sha256, "os": self.os,
                "packages": dict(sorted(self.packages.items()))}


def parse_status(text: str) -> dict[str, str]:
    """{"name:arch": version} of every package dpkg's status file says is installed
    (``Status: install ok installed``); a stanza of another form is skipped, never quoted."""
    found: dict[str, str] = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue  # a continuation line (Description, Conffiles)
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if not fields.get("Status", "").endswith(" installed"):
            continue
        name, version = fields.get("Package", ""), fields.get("Version", "")
        arch = fields.get("Architecture", "")
        if _NAME.fullmatch(name) and _VERSION.fullmatch(version) and _ARCH.fullmatch(arch):
            found[f"{name}:{arch}"] = version
    return dict(sorted(found.items()))


def os_id(text: str) -> str | None:
    """os-release's ID when it is one envbuild knows (debian, ubuntu), else None."""
    for line in text.splitlines():
        if line.startswith("ID="):
            value = line[3:].strip().strip('"').strip("'")
            return value if value in OS_IDS else None
    return None


def differences(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """Every package that differs: ``name:arch old → new``, ``name:arch version added``,
    ``name:arch version removed``, sorted by name."""
    lines = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if before is None:
            lines.append(f"{key} {after} added")
        elif after is None:
            lines.append(f"{key} {before} removed")
        else:
            lines.append(f"{key} {before} → {after}")
    return lines


def record_path(lock_dir: Path) -> Path:
    return lock_dir / FILE


def _bad(where: str) -> UsageError:
    return UsageError(f"{FILE}: {where}: missing or not of its form",
                      hint=f"remove {FILE} (build --lock writes it again) or restore it from version control")


def parse_record(text: str) -> dict[str, Debs]:
    """The record's targets; UsageError (exit 2) naming the first bad field."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise UsageError(f"{FILE}: not valid JSON", hint=_AGAIN) from None
    if not isinstance(data, dict) or set(data) != {"schema", "targets"} or data["schema"] != SCHEMA \
            or not isinstance(data["targets"], dict):
        raise UsageError(f"{FILE}: not a record of schema {SCHEMA}", hint=_AGAIN)
    from envbuild.render.lockset import TARGET_RE

    targets: dict[str, Debs] = {}
    for name, raw in data["targets"].items():
        if not isinstance(name, str) or not TARGET_RE.fullmatch(name):
            raise _bad("targets")
        if not isinstance(raw, dict) or set(raw) != {"lock_sha256", "os", "packages"}:
            raise _bad(f"targets.{name}")
        if not isinstance(raw["lock_sha256"], str) or not _SHA.fullmatch(raw["lock_sha256"]):
            raise _bad(f"targets.{name}.lock_sha256")
        if raw["os"] is not None and raw["os"] not in OS_IDS:
            raise _bad(f"targets.{name}.os")
        packages = raw["packages"]
        if not isinstance(packages, dict) or not all(
                isinstance(k, str) and _KEY.fullmatch(k) and isinstance(v, str) and _VERSION.fullmatch(v)
                for k, v in packages.items()):
            raise _bad(f"targets.{name}.packages")
        targets[name] = Debs(packages=dict(sorted(packages.items())), os=raw["os"],
                             lock_sha256=raw["lock_sha256"])
    return targets


def read_record(lock_dir: Path) -> dict[str, Debs]:
    """The record beside the lock in ``lock_dir``; empty when there is none."""
    from envbuild.extensions.record import read_beside

    text = read_beside(lock_dir, FILE, LIMIT, hint=_AGAIN)
    return {} if text is None else parse_record(text)


def record_text(record: Mapping[str, Debs]) -> str:
    targets = {name: record[name].to_json() for name in sorted(record)}
    return json.dumps({"schema": SCHEMA, "targets": targets}, indent=2, sort_keys=True,
                      ensure_ascii=True) + "\n"
