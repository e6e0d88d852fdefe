"""The lock file as a set of targets (schema 2), and the pylock files beside it.

A project names one or more targets (node types); ``envbuild lock`` writes one lock object per
target (``render.lock.Lock``) into one ``envbuild.lock``, and each target's whole closure into a
PEP 751 file beside it (``pylock.toml`` for a single target named ``default``, else
``pylock.NAME.toml``) whose sha256 the lock records.

Format (schema 2, JSON object, keys sorted):
  schema    2
  project   {"file": the project file's name, "inputs_sha256": digest of the project file and
            every requirements file it reads} or null (a lock made from flags alone)
  targets   {NAME: a per-target lock object (render/lock.py's format without "schema")}
  flags     the flags given to ``lock`` that change the result, as ``--opt=value`` items
            (commands/lockflags.py), which ``lock --check`` uses; only when there are any

A schema-1 file (one stack-only lock at the top level) reads as one target named ``default``.
An image carries a lock set holding only its own target.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envbuild.confine import read_confined, read_regular
from envbuild.errors import UsageError
from envbuild.render import lock as lockmod
from envbuild.render import values as valuesmod
from envbuild.render.lock import Lock

SCHEMA = 2
DEFAULT_TARGET = "default"
TARGET_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}", re.ASCII)
_PROJECT_FILE_RE = re.compile(r"[A-Za-z0-9._-]{1,255}", re.ASCII)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProjectRef:
    """The project file a lock set was made from, and the digest of everything it reads."""

    file: str
    inputs_sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LockSet:
    targets: Mapping[str, Lock]
    project: ProjectRef | None = None
    flags: tuple[str, ...] = ()

    def to_json(self) -> str:
        targets: dict[str, dict[str, Any]] = {}
        for name in sorted(self.targets):
            targets[name] = self.targets[name].to_mapping()
            del targets[name]["schema"]  # the set's schema covers its targets
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "project": None if self.project is None else {
                "file": self.project.file, "inputs_sha256": self.project.inputs_sha256},
            "targets": targets,
        }
        if self.flags:  # only when given: a lock made without flags keeps its bytes
            data["flags"] = list(self.flags)
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n"

    def select(self, name: str | None) -> tuple[str, Lock]:
        """The target ``name``; None picks the only one (several → exit 2 listing them)."""
        if name is None:
            if len(self.targets) == 1:
                only = next(iter(self.targets))
                return only, self.targets[only]
            raise UsageError(f"the lock holds {len(self.targets)} targets "
                             f"({', '.join(sorted(self.targets))})", hint="choose one with --target NAME")
        if name not in self.targets:
            raise UsageError(f"no target {name!r} in the lock (it has {', '.join(sorted(self.targets))})")
        return name, self.targets[name]

    def only(self, name: str) -> LockSet:
        """The lock set of one target: what an image built for it carries."""
        return replace(self, targets={name: self.targets[name]})

    def files(self) -> dict[str, bytes]:
        """envbuild.lock and every target's pylock file, as written beside each other."""
        out = {"envbuild.lock": self.to_json().encode("utf-8")}
        for lock in self.targets.values():
            if lock.pylock is not None:
                out[lock.pylock.file] = lock.pylock.text.encode("utf-8")
        return out


def pylock_name(target: str, targets: int) -> str:
    """PEP 751's names: ``pylock.toml`` for a lone default target, else ``pylock.NAME.toml``."""
    return "pylock.toml" if target == DEFAULT_TARGET and targets == 1 else f"pylock.{target}.toml"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_target_name(name: str, field: str = "target") -> str:
    if not isinstance(name, str) or not TARGET_RE.fullmatch(name):
        raise UsageError(f"invalid {field} name {name!r}",
                         hint="lowercase letters, digits, '-' and '_', at most 32, starting "
                              "with a letter or digit")
    return name


def kubernetes_name(target: str) -> str:
    """A target's name as Kubernetes names its Job (a DNS-1123 label: lowercase letters, digits
    and '-', starting and ending with a letter or digit): '_' becomes '-', a trailing '-' goes.
    Two target names can become one (``gpu-a``, ``gpu_a``): ``check_distinct_names`` refuses that."""
    return target.replace("_", "-").rstrip("-")


def check_distinct_names(names: Iterable[str], where: str = "the lock") -> None:
    """UsageError when two target names become one identifier elsewhere (a Kubernetes Job: the
    second submit would delete the first target's Job and both be judged on its pods)."""
    seen: dict[str, str] = {}
    for name in names:
        derived = kubernetes_name(name)
        if derived in seen:
            raise UsageError(f"targets {seen[derived]!r} and {name!r} of {where} would share the "
                             f"Kubernetes Job name 'envbuild-fleet-{derived}'",
                             hint="rename one: names that differ only in '_' against '-' or a "
                                  "trailing '-' become one name in Kubernetes")
        seen[derived] = name


def from_json(text: str) -> LockSet:
    """Parse and validate a lock file of schema 1 or 2; any problem is a UsageError (exit 2)."""
    try:
        data = lockmod.load_json(text)
    except ValueError as exc:
        raise UsageError(f"invalid lock: {exc}", hint="re-create it with 'envbuild lock'") from None
    except RecursionError:
        raise UsageError("invalid lock: nested too deeply",
                         hint="re-create it with 'envbuild lock'") from None
    if isinstance(data, dict) and type(data.get("schema")) is int and data["schema"] == lockmod.SCHEMA:
        return LockSet(targets={DEFAULT_TARGET: lockmod.from_json(text)})
    if not isinstance(data, dict) or type(data.get("schema")) is not int or data["schema"] != SCHEMA:
        raise UsageError(f"not an envbuild lock of schema {lockmod.SCHEMA} or {SCHEMA}")
    if not {"schema", "project", "targets"} <= set(data) <= {"schema", "project", "targets", "flags"}:
        raise UsageError("lock has missing or unknown fields", hint="re-create the lock")
    targets = data["targets"]
    if not isinstance(targets, dict) or not targets:
        raise UsageError("lock 'targets' must be a non-empty mapping", hint="re-create the lock")
    locks: dict[str, Lock] = {}
    pylocks: set[str] = set()
    for name, raw in targets.items():
        check_target_name(name)
        if not isinstance(raw, dict):
            raise UsageError(f"lock target {name!r} must be an object")
        lock = lockmod.from_json(json.dumps({**raw, "schema": lockmod.SCHEMA}))
        if lock.pylock is not None:
            if lock.pylock.file in pylocks:
                raise UsageError(f"two targets of the lock share {lock.pylock.file}")
            pylocks.add(lock.pylock.file)
        locks[name] = lock
    check_distinct_names(locks)
    return LockSet(targets=locks, project=_project(data["project"]), flags=_flags(data.get("flags", [])))


def _flags(raw: Any) -> tuple[str, ...]:
    """The recorded flags' shape: a list of ``--``-options, each one printable line (which
    options and values are allowed, the command that applies them checks)."""
    if not isinstance(raw, list) or len(raw) > 200 or not all(
            isinstance(f, str) and f.startswith("--") and len(f) <= 2048 and f.isprintable() for f in raw):
        raise UsageError("lock 'flags' must be a list of --options, each one printable line",
                         hint="re-create the lock with 'envbuild lock'")
    return tuple(raw)


def _project(raw: Any) -> ProjectRef | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"file", "inputs_sha256"} \
            or not isinstance(raw["file"], str) or not _PROJECT_FILE_RE.fullmatch(raw["file"]) \
            or raw["file"] in (".", ".."):
        raise UsageError("lock 'project' must be null or {file, inputs_sha256} with a plain file name")
    return ProjectRef(file=raw["file"], inputs_sha256=valuesmod.check_sha256(
        lockmod._str(raw["inputs_sha256"], "project inputs_sha256"), "project inputs_sha256"))


def read_lockset(path: Path) -> LockSet:
    """A lock file and the pylock files beside it, each checked against its recorded sha256."""
    try:  # a regular file of bounded size: --lock FIFO or /dev/zero must not hang or fill memory
        text = read_regular(path, f"lock {path}").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read lock {path}: {exc}") from None
    lockset = from_json(text)
    targets: dict[str, Lock] = {}
    for name, lock in lockset.targets.items():
        if lock.pylock is not None:
            beside = path.parent / lock.pylock.file
            try:  # beside the lock, links resolved: a pylock linked to /proc/self/environ is refused
                pylock_text = read_confined(beside, [path.parent], str(beside)).decode("utf-8")
            except UsageError as exc:
                problem = exc.message.removeprefix(str(beside)).strip()
                raise UsageError(f"cannot read {beside} (target {name!r} of {path}): {problem}",
                                 hint="keep the pylock files beside envbuild.lock, "
                                      "or run 'envbuild lock'") from None
            except UnicodeDecodeError as exc:
                raise UsageError(f"cannot read {beside} (target {name!r} of {path}): "
                                 f"{getattr(exc, 'strerror', None) or exc}",
                                 hint="keep the pylock files beside envbuild.lock, "
                                      "or run 'envbuild lock'") from None
            if sha256_text(pylock_text) != lock.pylock.sha256:
                raise UsageError(f"{beside} changed since {path} was written (sha256 differs)",
                                 hint="run 'envbuild lock' again; never edit a pylock by hand")
            lock = replace(lock, pylock=replace(lock.pylock, text=pylock_text))
        targets[name] = lock
    return replace(lockset, targets=targets)


def read_target(path: Path, target: str | None) -> tuple[str, Lock]:
    """One target of the lock at ``path`` (the only one when ``target`` is None)."""
    return read_lockset(path).select(target)
