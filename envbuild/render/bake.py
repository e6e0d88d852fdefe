"""``envbuild ci bake``: a docker-bake.json with one target per stack, a group per CUDA major.

Plain JSON (``json.dumps``): nothing to escape by hand. Bake still reads ``${NAME}`` in JSON
strings as an interpolation, so the file's one is its own REGISTRY variable; every user value
that reaches it (the registry, label keys and values) was validated in ``render.ci`` and holds
no ``$``, and ``bake_json`` checks so again before writing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from envbuild.errors import UsageError
from envbuild.render.ci import CiOptions, CiStack, context_files, target_name

if TYPE_CHECKING:
    from envbuild.fs import FileData

BAKE_PATH = "docker-bake.json"
_REGISTRY = "${REGISTRY}"


def _group_order(name: str) -> tuple[int, int, str]:
    """cuda11 before cuda12 before cuda13 (numerically), then the others by name."""
    if name.startswith("cuda") and name[4:].isdigit():
        return (0, int(name[4:]), name)
    return (1, 0, name)


def bake_document(stacks: Sequence[CiStack], options: CiOptions) -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for s in stacks:
        groups.setdefault(s.group, []).append(target_name(s.id))
    targets: dict[str, Any] = {}
    for s in stacks:
        cache = f"type=registry,ref={_REGISTRY}:cache-{s.id}"
        targets[target_name(s.id)] = {
            "context": s.context,
            "dockerfile": "Dockerfile",
            "tags": [f"{_REGISTRY}:{s.id}"],
            "labels": dict(sorted([*options.labels, ("dev.envbuild.stack", s.id)])),
            "cache-from": [cache],
            "cache-to": [cache + ",mode=max"],
            **({"platforms": [s.lock.stack.platform]} if s.lock.stack.platform != "linux/amd64" else {}),
        }
    return {
        "variable": {"REGISTRY": {"default": options.registry}},
        "group": {"default": {"targets": [target_name(s.id) for s in stacks]},
                  **{g: {"targets": groups[g]} for g in sorted(groups, key=_group_order)}},
        "target": targets,
    }


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (k, *_strings(v))]
    if isinstance(value, list):
        return [t for v in value for t in _strings(v)]
    return []


def bake_json(stacks: Sequence[CiStack], options: CiOptions) -> bytes:
    document = bake_document(stacks, options)
    for text in _strings(document):  # the validators' promise, kept where it matters
        if "$" in text.replace(_REGISTRY, "") or "%{" in text:
            raise UsageError(f"value {text!r} would be read as a bake interpolation")
    return (json.dumps(document, indent=2, ensure_ascii=True) + "\n").encode("ascii")


def render_bake(stacks: Sequence[CiStack], options: CiOptions) -> dict[str, FileData]:
    return dict(sorted({BAKE_PATH: bake_json(stacks, options), **context_files(stacks)}.items()))
