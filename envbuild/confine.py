"""Files a project file or a lock names, read as hostile input; and their text in errors.

A project file, a requirements file or a pylock may come from a pull request, so a path it
names is confined: after resolving links it must lie inside one of the roots the caller
declares (the project's directory, a find-links or wheelhouse directory), be a regular
file (never a FIFO that hangs the read, a device that never ends it, a directory), and be
opened without following a link swapped in after the check (``O_NOFOLLOW``, ``fstat`` on
the opened descriptor). It is read in bounded chunks up to a size cap. Anything else is a
UsageError (exit 2) naming the file, never its content.

An error that quotes input quotes it through :func:`token` or :func:`quoted`: at most ~100
characters, control characters escaped, credentials masked. ``/proc/self/environ`` named as a
requirements file is refused unread (it is outside the project), so the environment is never
printed; a file inside the project shows at most the first 100 characters of a bad line.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from envbuild.errors import UsageError
from envbuild.redact import SCAN_LIMIT, cut, redact

TEXT_LIMIT = 16 * 1024 * 1024  # a project file, a requirements file, a pylock
WHEEL_LIMIT = 16 * 1024 ** 3  # the largest torch wheels are a few GB
TOKEN_LIMIT = 100
_CHUNK = 1024 * 1024
# A wheel file name (PEP 427) with nothing a shell or a Dockerfile could read as syntax: what
# a local wheel (a --wheelhouse's, a pylock's) must be called to be copied anywhere.
WHEEL_NAME = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_]*)?"
                        r"-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl", re.ASCII)
# A canonical project name (PEP 503 normalized: lower case, runs of -_. as one "-").
CANONICAL_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*", re.ASCII)
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def token(text: str, limit: int = TOKEN_LIMIT) -> str:
    """``text`` as an error may show it: cut at ``limit`` characters (``…`` marks a cut),
    every character that is not printable escaped (``\\n``, ``\\x00``, ``\\u2028``: no
    line break or terminal escape reaches the error line), credentials masked."""
    masked = redact(text[:SCAN_LIMIT])  # before the cut: no part of a credential is left
    return cut("".join(c if c.isprintable() else _escaped(c) for c in masked[:limit + 1]), limit)


def quoted(text: object) -> str:
    """``text`` as errors quote a value, cut and escaped like ``token``: ``'2.3.1\\n'`` (what
    ``repr`` shows, for a short value); a value that is not a string by its type only (a
    nested table's repr is neither short nor safe)."""
    if not isinstance(text, str):
        return f"(a {type(text).__name__})"
    return repr(cut(text, TOKEN_LIMIT))


def _escaped(char: str) -> str:
    return char.encode("unicode_escape", "backslashreplace").decode("ascii")


def confined(path: Path, roots: Sequence[Path] | None, what: str, *,
             outside_hint: str = "") -> Path:
    """``path`` with its links resolved, when inside one of ``roots`` (None: anywhere, for
    a path the user named on the command line); else UsageError naming ``what``."""
    try:
        real = Path(os.path.realpath(path))
    except ValueError:  # a NUL character
        raise UsageError(f"{what} is not a usable path (it holds a NUL character)") from None
    if roots is None:
        return real
    for root in roots:
        top = Path(os.path.realpath(root))
        if real == top or top in real.parents:
            return real
    raise UsageError(f"{what} is outside the project (links resolved)",
                     hint=outside_hint or "name a file inside the project's directory")


def open_regular(path: Path, what: str, *, limit: int, missing_hint: str = "") -> int:
    """A descriptor of ``path`` opened without following a link, when it is a regular file
    of at most ``limit`` bytes; else UsageError naming ``what``. The caller closes it."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise UsageError(f"{what} does not exist", hint=missing_hint) from None
    except ValueError:
        raise UsageError(f"{what} is not a usable path (it holds a NUL character)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{what} is a symbolic link", hint="name the file itself") from None
        raise UsageError(f"cannot read {what}: {exc.strerror}") from None
    info = os.fstat(fd)
    mode, size = info.st_mode, info.st_size
    problem = ("is a directory" if stat.S_ISDIR(mode) else
               "is not a regular file" if not stat.S_ISREG(mode) else
               f"is larger than {_size(limit)}" if size > limit else None)
    if problem is not None:
        os.close(fd)
        raise UsageError(f"{what} {problem}", hint="name a regular file (a FIFO, socket or device "
                                                   "is never read)")
    return fd


def read_regular(path: Path, what: str, *, limit: int = TEXT_LIMIT, missing_hint: str = "") -> bytes:
    """The bytes of the regular file ``path`` (see ``open_regular``), read in chunks and
    never more than ``limit`` of them (a file that grows while read is refused too)."""
    fd = open_regular(path, what, limit=limit, missing_hint=missing_hint)
    chunks: list[bytes] = []
    total = 0
    try:
        while chunk := os.read(fd, _CHUNK):
            total += len(chunk)
            if total > limit:
                raise UsageError(f"{what} is larger than {_size(limit)}", hint="name a regular file")
            chunks.append(chunk)
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_confined(path: Path, roots: Sequence[Path] | None, what: str, *,
                  limit: int = TEXT_LIMIT, missing_hint: str = "") -> bytes:
    """``path`` confined to ``roots`` (see ``confined``), then read as ``read_regular`` reads.
    The resolved path is what is opened, so a link swapped in meanwhile is refused."""
    real = confined(path, roots, what)
    return read_regular(real, what, limit=limit, missing_hint=missing_hint)


def _size(limit: int) -> str:
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2)):
        if limit > 1024 ** 2 and limit % scale == 0:
            return f"{limit // scale} {unit}"
    return f"{limit // 1024} KiB"
