"""Write a relation file back: appended rows keep the file's bytes, otherwise one clean dump.

Versions (3.13t too), dates and specifiers are always double-quoted (as in the generated
files), so YAML never reads ``3.10`` as a float or a date as a date.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

_QUOTE = re.compile(r"[\d.]+t?|[<>=!~].*|\d{4}-\d{2}-\d{2}")  # 3.13t: a free-threaded CPython
_BLOCK_ROWS = re.compile(r"^rows:[ \t]*$", re.MULTILINE)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    plain_tag = dumper.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    if _QUOTE.fullmatch(value) or plain_tag != "tag:yaml.org,2002:str":
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


_Dumper.add_representer(str, _str)


def dump(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=None,
                     allow_unicode=True, width=100)


def render_document(document: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> bytes:
    """The file for ``document`` with ``rows``; ``document['_text']`` is the current file."""
    text = str(document["_text"])
    old = document["rows"]
    keys = [k for k in document if k != "_text"]
    # An empty list is written "[]" (perhaps on the line after "rows:"): never append to it.
    appended = 0 < len(old) <= len(rows) and all(a is b for a, b in zip(old, rows, strict=False))
    if appended and keys[-1:] == ["rows"] and _BLOCK_ROWS.search(text) and text.endswith("\n"):
        return (text + dump([dict(r) for r in rows[len(old):]])).encode()
    lines = text.splitlines(keepends=True)
    header = "".join(lines[: next((i for i, x in enumerate(lines) if not x.startswith("#")), len(lines))])
    body = {k: document[k] for k in keys}
    body["rows"] = [dict(r) for r in rows]
    return (header + dump(body)).encode()
