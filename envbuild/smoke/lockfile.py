"""The envbuild.lock read back inside the image: its shape and how the stack differs.

A lock of schema 1 pins the stack's own packages (torch and its companions). A lock with a
``pylock`` (schema 2, one target per image) pins the whole environment: its ``packages`` are
every distribution, and ``diff_installed`` compares them with everything installed."""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, Iterable, Mapping

LOCK_LIMIT = 16 * 1024 * 1024  # as envbuild reads a lock (confine.TEXT_LIMIT)


def load_lock(path: str) -> Any:
    """The JSON of the lock file at ``path``, read by envbuild's rule for an input file
    (envbuild/confine.py, which this payload cannot import): opened without blocking, a
    regular file of at most LOCK_LIMIT bytes, never a FIFO that hangs the read or a device
    that never ends it. OSError or ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file (a FIFO, socket, device or directory is never read)")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > LOCK_LIMIT:
                raise ValueError("larger than %d MiB" % (LOCK_LIMIT >> 20))
            chunks.append(chunk)
    finally:
        os.close(fd)
    return json.loads(b"".join(chunks).decode("utf-8"))


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def canonical_version(version: str) -> str:
    """Equal PEP 440 release spellings compare equal: '2.4' == '2.4.0', case-insensitive."""
    version = version.strip().lower().lstrip("v")
    public, _, local = version.partition("+")
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", public)
    if match:
        release = match.group(1).split(".")
        while len(release) > 1 and release[-1] == "0":
            release.pop()
        public = ".".join(str(int(p)) for p in release) + match.group(2)
    return public + ("+" + local if local else "")


def _major_minor(version: str | None) -> str | None:
    if version is None:
        return None
    match = re.match(r"^(\d+)\.(\d+)", str(version).strip())
    return "%s.%s" % (match.group(1), match.group(2)) if match else str(version).strip()


class LockError(ValueError):
    """The lock file is unreadable or has an unknown shape."""


def validate_lock(lock: Any, target: str | None = None) -> dict[str, Any]:
    """The lock of the environment being checked, in the schema-1 shape.

    Schema 1 is that lock itself. Schema 2 holds ``{"targets": {NAME: <per-target lock>}}``:
    the per-target object (schema 1's fields plus ``pylock``) is returned, the only one, or
    the one named ``target``. An image carries a lock of exactly one target; more than one
    without ``target`` is refused, naming them."""
    if not isinstance(lock, dict):
        raise LockError("lock is not a JSON object")
    schema = lock.get("schema")
    chosen: dict[str, Any] = lock
    if schema == 2 and type(schema) is int:
        chosen = _one_target(lock, target)
    elif schema != 1 or type(schema) is not int:
        raise LockError("unknown lock schema %r (expected 1 or 2)" % (schema,))
    elif target is not None:
        raise LockError("--target %s: a schema 1 lock has no targets" % target)
    if not isinstance(chosen.get("packages", {}), dict) or not isinstance(chosen.get("stack", {}), dict):
        raise LockError("lock 'packages' and 'stack' must be objects")
    if "pylock" in chosen and not isinstance(chosen["pylock"], dict):
        raise LockError("lock 'pylock' must be an object")
    return chosen


def _one_target(lock: Mapping[str, Any], target: str | None) -> dict[str, Any]:
    targets = lock.get("targets")
    if not isinstance(targets, dict) or not targets:
        raise LockError("schema 2 lock without targets (expected a non-empty 'targets' object)")
    names = sorted(str(name) for name in targets)
    if target is None:
        if len(names) > 1:
            raise LockError("the lock has %d targets (%s): name one with --target NAME"
                            % (len(names), ", ".join(names)))
        target = names[0]
    if target not in targets:
        raise LockError("the lock has no target %r (it has: %s)" % (target, ", ".join(names)))
    chosen = targets[target]
    if not isinstance(chosen, dict):
        raise LockError("lock target %r is not an object" % target)
    return chosen


# The distributions a virtual environment holds before anything is installed into it. They
# are not part of a lock's closure, so the full comparison passes them over, but only when
# the lock does not pin them (a pin is compared like any other). pip always: ``python -m venv``
# and virtualenv seed it. setuptools and wheel only when the interpreter that made the venv
# carries them for seeding (``bootstrap_distributions`` in probes.py looks at ensurepip's
# bundled wheels and Debian's /usr/share/python-wheels; without either, setuptools before
# Python 3.12, whose venv stopped seeding it).
BOOTSTRAP = ("pip", "setuptools", "wheel")


def diff_installed(
    packages: Mapping[str, Any],
    installed: Mapping[str, str],
    *,
    bootstrap: Iterable[str] = ("pip",),
) -> list[str]:
    """Every way the environment's distributions differ from a full lock, one line each,
    sorted by name: missing, a different version, or installed but not in the lock.

    ``packages``: the lock's {name: version}, every distribution of the environment.
    ``installed``: {canonical name: version} of everything installed. ``bootstrap``: the
    venv's seed distributions, passed over when the lock does not name them."""
    want = {canonical_name(str(name)): str(version) for name, version in packages.items()}
    have = {canonical_name(name): version for name, version in installed.items()}
    ignored = {canonical_name(name) for name in bootstrap} - set(want)
    differences = []
    for name in sorted(set(want) | set(have)):
        if name in want and name not in have:
            differences.append("%s: lock %s, not installed" % (name, want[name]))
        elif name in want and canonical_version(have[name]) != canonical_version(want[name]):
            differences.append("%s: lock %s, installed %s" % (name, want[name], have[name]))
        elif name not in want and name not in ignored:
            differences.append("%s: installed %s, not in the lock" % (name, have[name]))
    return differences


def diff_lock(
    lock: Mapping[str, Any],
    installed: Mapping[str, str | None],
    *,
    torch_cuda: str | None,
    python_version: str,
) -> list[str]:
    """Each way the running stack differs from the lock, as one readable line."""
    differences: list[str] = []
    packages = lock.get("packages") or {}
    for name in sorted(packages):
        want = str(packages[name])
        have = installed.get(canonical_name(name))
        if have is None:
            differences.append("%s: lock %s, not installed" % (name, want))
        elif canonical_version(have) != canonical_version(want):
            differences.append("%s: lock %s, installed %s" % (name, want, have))
    stack = lock.get("stack") or {}
    differences.extend(diff_stack(stack, torch_cuda=torch_cuda, python_version=python_version))
    if stack.get("torch") and "torch" not in {canonical_name(n) for n in packages}:
        have = installed.get("torch")
        if have is None or canonical_version(have.split("+")[0]) != canonical_version(
            str(stack["torch"]).split("+")[0]
        ):
            differences.append("torch: lock %s, installed %s" % (stack["torch"], have))
    return differences


def diff_stack(stack: Mapping[str, Any], *, torch_cuda: str | None, python_version: str) -> list[str]:
    """How the running CUDA build and Python differ from the lock's stack."""
    differences = []
    if "cuda" in stack:
        want_cuda = _major_minor(stack["cuda"]) if stack["cuda"] else None
        if want_cuda != _major_minor(torch_cuda):
            differences.append("cuda: lock %s, torch.version.cuda=%s" % (stack["cuda"], torch_cuda))
    if stack.get("python") and _major_minor(str(stack["python"])) != _major_minor(python_version):
        differences.append("python: lock %s, running %s" % (stack["python"], python_version))
    return differences
