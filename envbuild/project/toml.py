"""Reading TOML, and finding the line a key was written on.

``tomllib`` is in the standard library from Python 3.11; on 3.10 the same parser is the
``tomli`` package (a dependency there only). Parsed TOML keeps no line numbers, so
``line_of`` finds a key's line in the text: good enough for keys written on their own
line, and the table's header line otherwise.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

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
        raise UsageError(f"{shown}:{line}: TOML syntax error: {message}",
                         hint="fix the file; nothing was written") from None


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


def _headers(lines: Sequence[str]) -> list[tuple[int, tuple[str, ...], bool]]:
    """(line number, table name, is an array-of-tables header) for each header line."""
    found = []
    for number, line in enumerate(lines, start=1):
        match = _HEADER_RE.match(line)
        if match:
            found.append((number, _header_name(match.group(2)), match.group(1) == "[["))
    return found


def _table_line(headers: list[tuple[int, tuple[str, ...], bool]],
                prefix: KeyPath) -> int | None:
    """The header line of the table ``prefix`` names (0 for the root table), or None."""
    if not prefix:
        return 0
    index: int | None = None
    names = list(prefix)
    last = names[-1]
    if isinstance(last, int):
        index = last
        names.pop()
    if not all(isinstance(n, str) for n in names):
        return None
    name = tuple(str(n) for n in names)
    seen = 0
    for number, header, is_array in headers:
        if header != name:
            continue
        if index is None and not is_array:
            return number
        if index is not None and is_array:
            if seen == index:
                return number
            seen += 1
    return None


def line_of(text: str, path: KeyPath) -> int:
    """The line ``path`` was written on, as near as the text tells: the key's own line in
    the deepest table that has it (a dotted or inline key is found in its parent table),
    else the deepest table header on the path, else 1."""
    lines = text.splitlines()
    headers = _headers(lines)
    starts = [h[0] for h in headers]
    fallback: int | None = None
    for cut in range(len(path), -1, -1):
        start = _table_line(headers, path[:cut])
        if start is None:
            continue
        if fallback is None:
            fallback = max(start, 1)
        following = [s for s in starts if s > start]
        end = following[0] - 1 if following else len(lines)
        if cut < len(path) and isinstance(path[cut], str):
            key = re.escape(str(path[cut]))
            pattern = re.compile(rf"\s*(?:{key}|\"{key}\"|'{key}')\s*[=.]")
            for number in range(start + 1, end + 1):
                if pattern.match(lines[number - 1]):
                    return number
    return fallback or 1
