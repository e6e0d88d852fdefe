"""How ``envbuild lock`` shows itself: its progress lines on standard error and its --json
document (docs/schemas/lock.schema.json). commands/lock.py calls ``Steps`` at each step of a
target and ``lock_json`` once the files are written; nothing here resolves or writes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from envbuild.commands.options import VERBOSITY, progress, warn

if TYPE_CHECKING:
    from envbuild.pylock.sourceonly import HeldBack
    from envbuild.render.lock import Lock
    from envbuild.render.lockset import LockSet

SCHEMA = "envbuild.lock/1"


@dataclass(slots=True, kw_only=True)
class Steps:
    """One target's steps. On a terminal each step overwrites the last in place and the
    target's closing line stays; elsewhere (a CI log, a pipe) every step is a plain line.
    -q silences both (``options.progress``)."""

    target: str
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    _open: bool = False

    def step(self, text: str) -> None:
        line = f"lock {self.target}: {text}"
        if not self._live():
            progress(line)
            return
        self.stream.write(f"\r\x1b[K{line}")
        self.stream.flush()
        self._open = True

    def done(self, text: str) -> None:
        """The target's last line, kept on a terminal too."""
        self.step(text)
        self._close()

    def warn(self, messages: Iterable[str]) -> None:
        """Warnings on lines of their own, after the step they came from."""
        for message in messages:
            self._close()
            warn(message)

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()  # an error's line starts on a line of its own

    def _close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def _live(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return VERBOSITY.get() >= 0 and isatty is not None and bool(isatty())


def base_text(lock: Lock) -> str:
    return lock.base_image if lock.base_digest else f"{lock.base_image} (a tag: unpinned)"


def on_disk(path: Path, names: Mapping[str, bytes]) -> dict[str, bytes | None]:
    """The bytes now at each file the lock is about to write beside ``path`` (None: absent)."""
    found: dict[str, bytes | None] = {}
    for name in names:
        target = path if name == "envbuild.lock" else path.parent / name
        found[name] = target.read_bytes() if target.is_file() else None
    return found


def lock_json(path: Path, lockset: LockSet, before: Mapping[str, bytes | None],
              held: Mapping[str, tuple[HeldBack, ...]]) -> str:
    """The --json document: each target (with the packages wheels-only resolution held back),
    each file written with its sha256, and whether any file's bytes differ from what was there before."""
    import hashlib
    import json

    files = lockset.files()
    written = [{"path": name if name != "envbuild.lock" else path.name,
                "sha256": hashlib.sha256(data).hexdigest(), "changed": before.get(name) != data}
               for name, data in sorted(files.items())]
    return json.dumps({"schema": SCHEMA, "output": str(path),
                       "changed": any(f["changed"] for f in written),
                       "targets": [_target(name, lock, held.get(name, ()))
                                   for name, lock in sorted(lockset.targets.items())],
                       "files": written, "flags": list(lockset.flags)}, indent=2)


def _target(name: str, lock: Lock, held: tuple[HeldBack, ...]) -> dict[str, object]:
    s = lock.stack
    return {"name": name, "torch": s.torch, "variant": s.variant, "python": s.python,
            "platform": s.platform, "base_image": lock.base_image.split("@", 1)[0],
            "base_digest": lock.base_digest,
            "base_pinned": lock.base_digest is not None,
            "distributions": len(lock.packages),
            "pylock": None if lock.pylock is None else lock.pylock.file,
            "sdists": list(lock.sdists), "held_back": [h.to_json() for h in held],
            "sdist_kinds": {k.name: k.to_json() for k in lock.sdist_kinds}}
