"""Folding a source's rows into the data: who owns a row, what counts as a change, and
the guard against an upstream that suddenly lists far fewer rows.

A derived row replaces the row with the same key only when that row came from the same
source (its ``source`` starts with the source's prefix); hand-sourced rows are kept as
they are, and rows with new keys are appended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envbuild.errors import DataError

if TYPE_CHECKING:
    from envbuild.upstream.sources import Row, SourceResult

KEYS: Mapping[str, tuple[str, ...]] = {
    "cuda_toolkits": ("cuda",), "cudnn": ("cudnn",), "torch_variants": ("torch", "variant"),
    "torch_pypi": ("torch",), "torch_companions": ("torch",), "cuda_images": ("cuda", "ubuntu"),
    "torch_wheels": ("torch", "python"), "python_standalone": ("python", "arch"),
}
MAX_SHRINK = 0.10  # more than this fewer rows from one source looks like upstream trouble


@dataclass(frozen=True, slots=True, kw_only=True)
class RelationChange:
    added: int = 0
    updated: int = 0
    kept_hand_sourced: int = 0
    dropped: int = 0



def merge_rows(relation: str, old: Sequence[Row], new: Sequence[Row], prefix: str | tuple[str, ...],
               allow_shrink: bool
               ) -> tuple[list[Row], RelationChange]:
    """Old rows with the derived ones folded in (see the module docstring). ``prefix``: the
    source's prefix, or every prefix of the rows it owns."""
    fields = KEYS[relation]

    def key_of(row: Row) -> tuple[str, ...]:
        return tuple(str(row.get(f)) for f in fields)

    derived = {key_of(row): row for row in new}
    merged: list[Row] = []
    added = updated = kept = dropped = 0
    for row in old:
        key = key_of(row)
        owned = str(row.get("source", "")).startswith(prefix)
        fresh = derived.pop(key, None)
        if fresh is None:
            if owned and allow_shrink:
                dropped += 1
                continue
            merged.append(row)
        elif not owned:
            kept += 1
            merged.append(row)
        elif _same(row, fresh):
            merged.append(row)  # unchanged facts and document: keep the row (and its date) as it is
        else:
            updated += 1
            # New facts or provenance; fields the source does not derive (a hand-added
            # pip_packages, say) stay.
            merged.append({**{k: v for k, v in row.items() if k not in _PROVENANCE}, **fresh})
    merged.extend(derived.values())
    added = len(derived)
    return merged, RelationChange(added=added, updated=updated, kept_hand_sourced=kept, dropped=dropped)


_PROVENANCE = ("source", "retrieved", "note")


def _same(old: Row, new: Row) -> bool:
    """Nothing but the date would change: the source read the same facts from the same
    document (same URL and digest). Fields only the old row has are not compared."""
    def plain(row: Row) -> str:
        return json.dumps({k: row.get(k) for k in new if k != "retrieved"}, sort_keys=True,
                          default=str)

    return plain(old) == plain(new)


def check_shrink(relation: str, old: Sequence[Row], new: Sequence[Row], result: SourceResult) -> None:
    owned = sum(1 for row in old if str(row.get("source", "")).startswith(result.owned))
    if owned and len(new) < owned * (1 - MAX_SHRINK):
        percent = round(100 * (owned - len(new)) / owned)
        raise DataError(
            f"refusing to shrink data by {percent}%: {result.name} gave {len(new)} {relation} rows, "
            f"{owned} were recorded from it",
            hint="upstream may be broken; check it, or pass --allow-shrink")


def merge_all(documents: Mapping[str, dict[str, Any]], results: Sequence[SourceResult],
              allow_shrink: bool) -> tuple[dict[str, bytes], dict[str, RelationChange]]:
    """New file texts for the relations that change, and what changed in each."""
    from envbuild.upstream.sources.yamlout import render_document

    texts: dict[str, bytes] = {}
    changes: dict[str, RelationChange] = {}
    current: dict[str, list[Row]] = {k: list(d["rows"]) for k, d in documents.items()}
    for result in results:
        for relation, rows in result.rows.items():
            if relation not in documents:
                raise DataError(f"{relation}.yaml missing from the data directory")
            if not allow_shrink:
                check_shrink(relation, current[relation], rows, result)
            merged, change = merge_rows(relation, current[relation], rows, result.owned,
                                        allow_shrink)
            current[relation] = merged
            changes[relation] = _add_changes(changes.get(relation), change)
    for relation, final in current.items():
        if relation in changes and _differs(documents[relation]["rows"], final):
            texts[relation] = render_document(documents[relation], final)
    return texts, changes


def _add_changes(a: RelationChange | None, b: RelationChange) -> RelationChange:
    if a is None:
        return b
    return RelationChange(added=a.added + b.added, updated=a.updated + b.updated,
                          kept_hand_sourced=a.kept_hand_sourced + b.kept_hand_sourced,
                          dropped=a.dropped + b.dropped)


def _differs(old: Sequence[Row], new: Sequence[Row]) -> bool:
    return len(old) != len(new) or any(a is not b for a, b in zip(old, new, strict=True))
