"""Reading YAML that may be hostile: bounded nesting, no duplicate keys.

libyaml's composer recurses once per nesting level in C, so a document nested some
30,000 deep overflows the stack and kills the process: no exception to catch. Its
parser, though, is a state machine, so the event stream is walked first (cheaply,
without building anything) and a document deeper than ``MAX_DEPTH`` is refused before
it is composed. PyYAML also lets a later duplicate key silently win; in hand-edited data
that hides a typo, so the constructor refuses it with the line of both keys.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 64  # the data files nest 4 deep; anything near this limit is not data


class YamlProblem(ValueError):
    """A document that must not be loaded; ``line`` is 1-based."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_Base):  # type: ignore[misc]
    """The safe loader, refusing duplicate mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:
                continue  # an unhashable key: the base constructor reports it
            if first != line:
                raise YamlProblem(f"duplicate key {key!r} (first at line {first})", line)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _StrictLoader.construct_mapping)


def check_depth(data: bytes | str, limit: int = MAX_DEPTH) -> None:
    depth = 0
    for event in yaml.parse(data, Loader=_Base):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limit:
                mark = event.start_mark
                raise YamlProblem(f"nested deeper than {limit} levels", mark.line + 1 if mark else 0)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load(data: bytes | str) -> Any:
    """The document in ``data``; ``YamlProblem`` or ``yaml.YAMLError`` when it is refused."""
    check_depth(data)
    return yaml.load(data, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
