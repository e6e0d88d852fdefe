"""Reading TOML, and finding the line a key was written on.

``tomllib`` is in the standard library from Python 3.11; on 3.10 the same parser is the
``tomli`` package (a dependency there only). Parsed TOML keeps no line numbers, so
``line_of`` finds a key's line in the text: good enough for keys written on their own
line, and the table's header line otherwise.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envbuild.confine import token
from envbuild.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["KeyPath", "dotted", "line_of", "parse", "tomllib"]  # tomllib: for the pylock reader too
# A path into the parsed document: table and key names, and indexes into arrays.
KeyPath = Sequence[str | int]

_HEADER_RE = re.compile(r"\s*(\[\[?)\s*([^\]\[#]+?)\s*\]\]?\s*(?:#.*)?$")
_WHERE_RE = re.compile(r"\(at line (\d+), column (\d+)\)")
# A key at the start of a line (bare, "double" or 'single' quoted), then '=' or '.' (dotted).
_KEY_RE = re.compile(r"""\s*(?:([A-Za-z0-9_-]+)|"([^"]*)"|'([^']*)')\s*[=.]""")


def parse(text: str, shown: str) -> dict[str, Any]:
    """The document in ``text``; a syntax error is a UsageError naming ``shown`` (the file
    as the user knows it) and the line, with the parser's own message (line and column)."""
    try:
        document: dict[str, Any] = tomllib.loads(text)
        return document
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _WHERE_RE.search(message)
        line = found.group(1) if found else "1"
        raise UsageError(f"{shown}:{line}: TOML syntax error: {token(message, 200)}",
                         hint="fix the file; nothing was written") from None
    except RecursionError:  # arrays or inline tables nested ~1000 deep: the parser recurses
        raise UsageError(f"{shown}: arrays or tables nested too deep to read",
                         hint="no project file or lock needs more than a few levels") from None


def dotted(path: KeyPath) -> str:
    """``["tool", "envbuild", "targets", 1, "driver"]`` → ``tool.envbuild.targets[1].driver``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"'
            text += f".{name}" if text else name
    return text


def _header_name(raw: str) -> tuple[str, ...]:
    return tuple(p.strip().strip("\"'") for p in raw.split("."))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Index:
    """One text's tables and keys, found once: line_of then answers in a few lookups (a file
    of 40,000 dependencies asks for thousands of lines)."""

    tables: dict[tuple[str, ...], int]  # [name] → its header's line
    arrays: dict[tuple[str, ...], list[int]]  # [[name]] → each header's line, in order
    keys: dict[int, dict[str, int]]  # header line (0: the root) → {key: its first line}


@functools.lru_cache(maxsize=8)
def _index(text: str) -> _Index:
    tables: dict[tuple[str, ...], int] = {}
    arrays: dict[tuple[str, ...], list[int]] = {}
    keys: dict[int, dict[str, int]] = {0: {}}
    block = keys[0]
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER_RE.match(line)
        if header:
            name = _header_name(header.group(2))
            if header.group(1) == "[[":
                arrays.setdefault(name, []).append(number)
            else:
                tables.setdefault(name, number)
            block = keys.setdefault(number, {})
            continue
        key = _KEY_RE.match(line)
        if key:
            block.setdefault(next(g for g in key.groups() if g is not None), number)
    return _Index(tables=tables, arrays=arrays, keys=keys)


def _table_line(index: _Index, prefix: KeyPath) -> int | None:
    """The header line of the table ``prefix`` names (0 for the root table), or None."""
    if not prefix:
        return 0
    names = list(prefix)
    last = names.pop() if isinstance(names[-1], int) else None
    if not all(isinstance(n, str) for n in names):
        return None
    name = tuple(str(n) for n in names)
    if last is None:
        return index.tables.get(name)
    lines = index.arrays.get(name, [])
    return lines[int(last)] if 0 <= int(last) < len(lines) else None


def line_of(text: str, path: KeyPath) -> int:
    """The line ``path`` was written on, as near as the text tells: the key's own line in
    the deepest table that has it (a dotted or inline key is found in its parent table),
    else the deepest table header on the path, else 1."""
    index = _index(text)
    fallback: int | None = None
    for cut in range(len(path), -1, -1):
        start = _table_line(index, path[:cut])
        if start is None:
            continue
        if fallback is None:
            fallback = max(start, 1)
        if cut < len(path) and isinstance(path[cut], str):
            found = index.keys.get(start, {}).get(str(path[cut]))
            if found is not None:
                return found
    return fallback or 1
