"""``matrix refresh --only torchvision`` (or ``--only torchaudio``): the companion not read
keeps what the data records of it.

The pypi source writes both companions into one row per torch release (torch_companions) and
into torch_pypi's columns. When ``--only`` names one of them, the other is not read: its
versions, the wheel its row cites and the note parts that explain it are taken from the
recorded rows, so the rows come out as a full refresh would have left them for that project
(a refresh that once set every torchaudio to null without a reason failed validation, exit 4).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import replace

from envbuild.upstream.sources import Row
from envbuild.upstream.torch_facts import CompanionFact, CompanionRow

COMPANIONS = ("torchvision", "torchaudio")
PIN_NOTE = "torchaudio pin read from "  # the part build_documents writes first
PYTHON_NOTE = "torchvision_python/torchaudio_python: "  # and the one it writes last


def wheel_cited(row: Row, project: str, prefix: str) -> tuple[str, str | None] | None:
    """(file name, METADATA sha256 or None) of the ``project`` wheel a recorded row cites,
    in its source or in a note part; None when it cites none."""
    marker = f"{prefix}simple/{project}/#"
    for text in (str(row.get("source", "")), *str(row.get("note", "")).split("; ")):
        at = text.find(marker)
        if at != -1:
            filename, _, digest = text[at + len(marker):].partition("&sha256=")
            return filename, digest or None
    return None


def recorded_fact(row: Row, project: str, prefix: str) -> tuple[CompanionFact, str | None] | None:
    """The recorded ``project`` release of one torch_companions row (an exact pin of its torch).
    A hand-sourced row (its source is not the index) may cite no wheel of it: the version
    stands as recorded, since the refresh keeps that row as it is."""
    version = row.get(project)
    cited = wheel_cited(row, project, prefix)
    if cited is None and not str(row.get("source", prefix)).startswith(prefix):
        cited = ("", None)
    if version is None or cited is None:
        return None
    torch = str(row["torch"])
    python = tuple(str(v) for v in row.get(f"{project}_python") or ())
    fact = CompanionFact(project=project, version=str(version), torch=torch, python=python,
                         torch_requirement=f"=={torch}", filename=cited[0], metadata_bytes=0)
    return fact, cited[1]


def with_recorded(table: Iterable[CompanionRow], recorded_rows: Iterable[Row], unread: Collection[str],
                  prefix: str, digests: MutableMapping[str, str]) -> tuple[CompanionRow, ...]:
    """``table`` with the ``unread`` companions as recorded; their wheels' digests go to ``digests``."""
    recorded = {str(r["torch"]): r for r in recorded_rows}
    rows = []
    for row in table:
        changes: dict[str, CompanionFact | None] = {}
        for project in unread:
            found = recorded_fact(recorded.get(row.torch, {}), project, prefix)
            if found is not None and found[1]:
                digests[found[0].filename] = found[1]
            changes[project] = found[0] if found else None
        rows.append(replace(row, **changes))  # type: ignore[arg-type]
    return tuple(rows)


def _about(part: str) -> str:
    if part.startswith(PIN_NOTE):
        return "pin"
    if part.startswith(PYTHON_NOTE):
        return "python"
    for project in COMPANIONS:
        if part.startswith((f"no {project} ", f"{project} ")):
            return project
    return "other"


def _parts(note: object) -> list[str]:
    return [p for p in str(note or "").split("; ") if p]


def keep_recorded_notes(rows: Sequence[Row], recorded_rows: Iterable[Row], unread: Collection[str],
                        prefix: str) -> None:
    """Each row's note parts about an ``unread`` companion as recorded, in build_documents' order
    (other parts, the torchaudio pin, torchvision's, torchaudio's, where the Pythons come from).
    A row with neither companion keeps the recorded source when it cites an unread one (the
    evidence of why)."""
    recorded = {str(r["torch"]): r for r in recorded_rows}
    for row in rows:
        old = recorded.get(str(row["torch"]), {})
        new = _parts(row.get("note"))
        parts = [p for p in new if _about(p) in ("other", "pin")]
        for project in COMPANIONS:
            source = _parts(old.get("note")) if project in unread else new
            parts += [p for p in source if _about(p) == project]
        parts += [p for p in new if _about(p) == "python"]
        if parts:
            row["note"] = "; ".join(parts)
        else:
            row.pop("note", None)
        _keep_source(row, old, unread, prefix)


def _keep_source(row: Row, old: Mapping[str, object], unread: Collection[str], prefix: str) -> None:
    if "source" not in row or "torchvision" not in row or not old:
        return
    if row.get("torchvision") is None and row.get("torchaudio") is None and any(
            str(old.get("source", "")).startswith(f"{prefix}simple/{p}/") for p in unread):
        row["source"] = old["source"]
