"""The envbuild.lock read back inside the image: its shape and how the stack differs."""

from __future__ import annotations

import re
from typing import Any, Mapping


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


def validate_lock(lock: Any) -> dict[str, Any]:
    if not isinstance(lock, dict):
        raise LockError("lock is not a JSON object")
    if lock.get("schema") != 1:
        raise LockError("unknown lock schema %r (expected 1)" % (lock.get("schema"),))
    if not isinstance(lock.get("packages", {}), dict) or not isinstance(lock.get("stack", {}), dict):
        raise LockError("lock 'packages' and 'stack' must be objects")
    return lock


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
    if "cuda" in stack:
        want_cuda = _major_minor(stack["cuda"]) if stack["cuda"] else None
        if want_cuda != _major_minor(torch_cuda):
            differences.append("cuda: lock %s, torch.version.cuda=%s" % (stack["cuda"], torch_cuda))
    if stack.get("python") and _major_minor(str(stack["python"])) != _major_minor(python_version):
        differences.append("python: lock %s, running %s" % (stack["python"], python_version))
    if stack.get("torch") and "torch" not in {canonical_name(n) for n in packages}:
        have = installed.get("torch")
        if have is None or canonical_version(have.split("+")[0]) != canonical_version(
            str(stack["torch"]).split("+")[0]
        ):
            differences.append("torch: lock %s, installed %s" % (stack["torch"], have))
    return differences
