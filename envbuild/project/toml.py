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

# tomllib and check_key_parts: for the pylock reader too
__all__ = ["KeyPath", "check_key_parts", "dotted", "line_of", "parse", "tomllib"]
# A path into the parsed document: table and key names, and indexes into arrays.
KeyPath = Sequence[str | int]

_HEADER_RE = re.compile(r"\s*(\[\[?)\s*([^\]\[#]+?)\s*\]\]?\s*(?:#.*)?$")
_WHERE_RE = re.compile(r"\(at line (\d+), column (\d+)\)")
# A key at the start of a line (bare, "double" or 'single' quoted), then '=' or '.' (dotted).
_KEY_RE = re.compile(r"""\s*(?:([A-Za-z0-9_-]+)|"([^"]*)"|'([^']*)')\s*[=.]""")


MAX_KEY_PARTS = 64  # a dotted key or table header: tool.envbuild.targets is three


def parse(text: str, shown: str) -> dict[str, Any]:
    """The document in ``text``; a syntax error is a UsageError naming ``shown`` (the file
    as the user knows it) and the line, with the parser's own message (line and column).
    A dotted key of more than MAX_KEY_PARTS parts is refused before the parser sees it (its
    time grows with the square of the parts: 20,000 took ~16 s), and so, after, is an integer
    longer than Python converts (4,300 digits). A text is parsed once (``_loads``)."""
    check_key_parts(text, shown)
    try:
        return _loads(text)
    except ValueError as exc:
        if isinstance(exc, tomllib.TOMLDecodeError):
            raise _syntax_error(exc, shown) from None
        raise UsageError(f"{shown}: a value too large to read ({token(str(exc), 80)})",
                         hint="no project file or pylock needs a number of thousands of digits") from None
    except RecursionError:  # arrays or inline tables nested ~1000 deep: the parser recurses
        raise UsageError(f"{shown}: arrays or tables nested too deep to read",
                         hint="no project file or lock needs more than a few levels") from None


@functools.lru_cache(maxsize=4)
def _loads(text: str) -> dict[str, Any]:
    """One parse per text: finding the project file, reading it and its pyproject read the same
    text (callers never change the document they get)."""
    document: dict[str, Any] = tomllib.loads(text)
    return document


def _syntax_error(exc: ValueError, shown: str) -> UsageError:
    message = str(exc)
    found = _WHERE_RE.search(message)
    line = found.group(1) if found else "1"
    return UsageError(f"{shown}:{line}: TOML syntax error: {token(message, 200)}",
                      hint="fix the file; nothing was written")


def check_key_parts(text: str, shown: str) -> None:
    """UsageError when a run of dotted key parts (outside strings and comments, up to the next
    '=', ',', bracket, brace or line end) is longer than MAX_KEY_PARTS. One pass over the text."""
    dots, i, line, size = 0, 0, 1, len(text)
    while i < size:
        char = text[i]
        if char in "\"'":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else char
            end = _string_end(text, i + len(quote), quote)
            line += text.count("\n", i, end)
            i = end
            continue
        if char == "#":
            i = text.find("\n", i)
            i = size if i < 0 else i
            continue
        if char == ".":
            dots += 1
            if dots >= MAX_KEY_PARTS:
                raise UsageError(f"{shown}:{line}: a dotted key of more than {MAX_KEY_PARTS} parts",
                                 hint="no project file or pylock needs more than a few") from None
        elif char in "=,[]{}\n":
            dots = 0
            line += char == "\n"
        i += 1


def _string_end(text: str, start: int, quote: str) -> int:
    """The index just past the string that opened before ``start`` (the text's end if none)."""
    i = start
    while True:
        found = text.find(quote, i)
        if found < 0:
            return len(text)
        if quote[0] == "'" or not _escaped_at(text, found):
            if len(quote) == 1:
                return found + 1
            run = len(text[found:found + 5]) - len(text[found:found + 5].lstrip(quote[0]))
            return found + run  # up to two quotes of the content may stand before the closing three
        i = found + 1


def _escaped_at(text: str, index: int) -> bool:
    backslashes = 0
    while index - backslashes - 1 >= 0 and text[index - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


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
