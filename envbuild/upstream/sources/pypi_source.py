"""The Python package index: torch_pypi and torch_companions rows from wheel METADATA.

Pages come through the refresh fetcher (ETag cache); each wheel's METADATA through
``envbuild.upstream.simple_api`` (PEP 658 file or HTTP range requests, never the whole wheel) and is
cached for good, since a published wheel never changes. Rows carry ``pip-index:///``
sources, relative to the configured index, so no file names the index's host.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuild.errors import DataError
from envbuild.upstream import companion_builds, simple_api, torch_facts
from envbuild.upstream.simple_api import IndexClient, MetadataRead, WheelFile
from envbuild.upstream.sources import Context, Fetch, Row, SourceResult, companions_kept, with_digest
from envbuild.upstream.torch_facts import CompanionFact, CompanionRow, PypiFacts, TorchWheelFact

PREFIX = "pip-index:///"
PROJECTS = frozenset({"torch", "torchvision", "torchaudio"})


class CachedIndex:
    """An ``IndexReader`` that reads pages through the fetcher and caches METADATA."""

    def __init__(self, client: IndexClient | None, fetch: Fetch, index: str) -> None:
        self.client = client
        self.fetch = fetch
        self.index = index.rstrip("/") + "/"
        self.digests: dict[str, str] = {}  # wheel filename → sha256 of its METADATA

    def list_wheels(self, project: str) -> tuple[WheelFile, ...]:
        name = canonicalize_name(project)
        page = self.fetch.document(f"{self.index}{name}/", headers={"Accept": simple_api.SIMPLE_JSON})
        return simple_api.parse_simple_page(page.body, page_url=page.url, project=name)

    def wheel_metadata(self, wheel: WheelFile) -> MetadataRead:
        fresh: list[MetadataRead] = []

        def produce() -> bytes:
            if self.client is None:
                raise DataError("no index client")  # offline: Fetch.immutable raises first
            read = self.client.wheel_metadata(wheel)
            fresh.append(read)
            return json.dumps({"text": read.text, "method": read.method}).encode()

        record = json.loads(self.fetch.immutable(wheel.url.split("#", 1)[0] + "#METADATA", produce))
        text = str(record["text"])
        self.digests[wheel.filename] = hashlib.sha256(text.encode()).hexdigest()
        if fresh:
            return fresh[0]
        if record.get("method") == "range":
            return MetadataRead(wheel=wheel, text=text, method="range", bytes_transferred=0)
        return MetadataRead(wheel=wheel, text=text, method="pep658", bytes_transferred=0)

    def build_of(self, wheel: WheelFile) -> str | None:
        """The build a companion wheel's version.py names (``0.29.2+cu132``), cached for good."""
        def produce() -> bytes:
            if self.client is None:
                raise DataError("no index client")
            text = self.client.optional_member(wheel, companion_builds.member_pattern(wheel.project))
            build = companion_builds.build_version(text, str(wheel.version)) if text else None
            return json.dumps({"build": build}).encode()

        record = json.loads(self.fetch.immutable(wheel.url.split("#", 1)[0] + "#version.py", produce))
        build = record.get("build")
        return build if isinstance(build, str) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PypiSource:
    name: str = "pypi"
    projects: frozenset[str] = PROJECTS
    client: IndexClient | None = None
    index: str = ""

    def collect(self, context: Context) -> SourceResult:
        reader = CachedIndex(self.client, context.fetch, self.index)
        only = context.only & PROJECTS or PROJECTS
        torch = torch_facts.torch_facts(reader, progress=context.progress)
        if not torch:
            raise DataError("the package index lists no torch release >= 1.13.0",
                            hint="check the index URL")
        rows: dict[str, tuple[Row, ...]] = {}
        if {"torchvision", "torchaudio"} & only:
            vision = companion_builds.place(_companions(reader, "torchvision", only, context), torch)
            audio = companion_builds.place(_companions(reader, "torchaudio", only, context), torch)
            table = torch_facts.companions_table([f.torch for f in torch], vision, audio)
            unread = frozenset(companions_kept.COMPANIONS) - only
            recorded = context.existing.get("torch_companions", ())
            if unread:  # --only torchvision / torchaudio: the other keeps its recorded facts
                table = companions_kept.with_recorded(table, recorded, unread, PREFIX, reader.digests)
            facts = PypiFacts(torch=torch, torchvision=vision, torchaudio=audio, companions=table)
            documents = build_documents(facts, context.retrieved, reader.digests)
            if unread:
                companions_kept.keep_recorded_notes(documents["torch_companions"]["rows"], recorded,
                                                    unread, PREFIX)
                companions_kept.keep_recorded_notes(documents["torch_pypi"]["rows"],
                                                    context.existing.get("torch_pypi", ()), unread, PREFIX)
            rows["torch_companions"] = tuple(documents["torch_companions"]["rows"])
        else:
            documents = build_documents(_torch_only(torch, context.existing), context.retrieved,
                                        reader.digests)
            _keep_companion_notes(documents["torch_pypi"]["rows"], context.existing)
        rows["torch_pypi"] = tuple(documents["torch_pypi"]["rows"])
        return SourceResult(name=self.name, prefix=PREFIX, rows=rows)


def _companions(reader: CachedIndex, project: str, only: frozenset[str],
                context: Context) -> tuple[CompanionFact, ...]:
    if project not in only:
        return ()
    return torch_facts.companion_facts(reader, project, progress=context.progress,
                                       build_of=reader.build_of)


def _torch_only(torch: tuple[TorchWheelFact, ...], existing: Mapping[str, tuple[Row, ...]]) -> PypiFacts:
    """Facts for ``--only torch``: companions are taken from the rows already recorded."""
    recorded = {str(r["torch"]): r for r in existing.get("torch_pypi", ())}

    def known(version: str, project: str) -> CompanionFact | None:
        value = recorded.get(version, {}).get(project)
        return None if value is None else CompanionFact(
            project=project, version=str(value), torch=version, torch_requirement=f"=={version}",
            filename="", metadata_bytes=0)

    table = tuple(CompanionRow(torch=f.torch, torchvision=known(f.torch, "torchvision"),
                               torchaudio=known(f.torch, "torchaudio")) for f in torch)
    return PypiFacts(torch=torch, torchvision=(), torchaudio=(), companions=table)


COMPANION_NOTES = ("no torchvision", "no torchaudio", "torchvision ", "torchaudio ")


def _keep_companion_notes(rows: list[Row], existing: Mapping[str, tuple[Row, ...]]) -> None:
    """With --only torch the companions were not read: keep what the recorded notes say of them."""
    recorded = {str(r["torch"]): str(r.get("note", "")) for r in existing.get("torch_pypi", ())}
    for row in rows:
        kept = [p for p in recorded.get(row["torch"], "").split("; ") if p.startswith(COMPANION_NOTES)]
        if kept:
            row["note"] = "; ".join([*([row["note"]] if "note" in row else []), *kept])


# --- rows ---------------------------------------------------------------------------------------

TORCH_PYPI_DESCRIPTION = (
    "The default torch wheel for Linux x86_64 on the Python package index, per final "
    "release: the CPython versions it has wheels for (free-threaded builds in the note), "
    "Requires-Python, the platform tag, the CUDA runtime, cuDNN and NCCL pins read from "
    "the METADATA of the cp311 wheel, the wheel variant they imply (cu121 from a CUDA "
    "runtime 12.1.x pin), and the torchvision/torchaudio releases paired with this torch "
    "as in torch_companions.yaml (null where none is: the note says why). Sources are "
    "pip-index:// URIs: relative to the configured Python package index."
)
PAIRING_SOURCE = "https://github.com/pytorch/vision/blob/main/README.md, read 2026-11-24"
COMPANIONS_DESCRIPTION = (
    "The torchvision and torchaudio release for each torch release, read from the wheel "
    "METADATA on the Python package index. A release that pins exactly this torch "
    "(Requires-Dist: torch==X) wins, the newest of them. A release that only requires "
    "torch>=X.Y.0 (a lower bound on one torch minor, no upper bound) pairs with the newest "
    "torch X.Y patch releases, those newer than every X.Y patch pinned exactly, the newest "
    "such release each: PyTorch builds each torchvision/torchaudio minor for one torch "
    f"minor (torchvision's compatibility table, {PAIRING_SOURCE}). Before that rule, a release "
    "without an exact pin pairs with the one torch release whose default wheel has the CUDA "
    "build its wheel's version.py names (0.29.2+cu132) and that was uploaded within a day of "
    "it, when exactly one does (envbuild/upstream/companion_builds.py). null: no release on the "
    "index pairs with this torch, and the note says what the newest one declares; such a "
    "row's source is that newest release's wheel. Otherwise the source is the torchvision "
    "wheel (the torchaudio wheel when there is no torchvision) and the note names the other."
)


def source_uri(project: str, filename: str, digests: Mapping[str, str] | None = None) -> str:
    uri = f"{PREFIX}simple/{project}/#{filename}"
    digest = (digests or {}).get(filename)
    return with_digest(uri, digest) if digest else uri


def torch_row(fact: TorchWheelFact, companions: CompanionRow, retrieved: str,
              digests: Mapping[str, str] | None = None) -> Row:
    row: Row = {
        "torch": fact.torch,
        "default_variant": fact.default_variant,
        "python": list(fact.python),
        "requires_python": fact.requires_python or None,
        "platform_tag": fact.platform_tag,
        "torchvision": _version(companions.torchvision),
        "torchaudio": _version(companions.torchaudio),
    }
    for key in ("cuda_runtime", "cudnn", "nccl"):
        value = getattr(fact, key)
        if value is not None:
            row[key] = value
    row["source"] = source_uri("torch", fact.filename, digests)
    row["retrieved"] = retrieved
    notes = _torch_notes(fact)
    if notes:
        row["note"] = "; ".join(notes)
    return row


def _torch_notes(fact: TorchWheelFact) -> list[str]:
    notes: list[str] = []
    if fact.free_threaded:
        notes.append("free-threaded wheels for " + ", ".join(fact.free_threaded))
    if fact.cuda_runtime_via and not fact.cuda_runtime_via.startswith("nvidia-cuda-runtime"):
        notes.append(f"CUDA runtime pinned through {fact.cuda_runtime_via}")
    if fact.default_variant is None:
        notes.append("no CUDA runtime pin in METADATA")
    if fact.other_platform_tags:
        notes.append("other Linux x86_64 platform tags: " + ", ".join(fact.other_platform_tags))
    return notes


def companion_row(row: CompanionRow, retrieved: str, notes: Sequence[str],
                  digests: Mapping[str, str] | None = None,
                  newest: CompanionFact | None = None) -> Row | None:
    """The row of one torch release. Without any companion it is still written when
    ``newest`` (the newest release read) is given: its note says why, its source is that
    release's wheel, the evidence read."""
    first = row.torchvision or row.torchaudio or (newest if notes else None)
    if first is None:
        return None  # no companion read at all: nothing to record
    out: Row = {
        "torch": row.torch,
        "torchvision": _version(row.torchvision),
        "torchaudio": _version(row.torchaudio),
    }
    read = [fact for fact in (row.torchvision, row.torchaudio) if fact and fact.python]
    out.update({f"{fact.project}_python": list(fact.python) for fact in read})
    out.update(source=source_uri(first.project, first.filename, digests), retrieved=retrieved)
    notes = list(notes)
    if read:
        notes.append(python_note(read, retrieved))
    if row.torchvision and row.torchaudio and row.torchaudio.filename:
        audio = source_uri(row.torchaudio.project, row.torchaudio.filename)
        notes.insert(0, f"torchaudio pin read from {audio}")
    if notes:
        out["note"] = "; ".join(notes)
    return out


def python_note(read: Sequence[CompanionFact], retrieved: str) -> str:
    """Where ``torchvision_python`` / ``torchaudio_python`` come from."""
    releases = " and ".join(f"{fact.project} {fact.version}" for fact in read)
    lists = ", ".join(f"{PREFIX}simple/{project}/" for project in ("torchvision", "torchaudio"))
    return (f"torchvision_python/torchaudio_python: the CPython versions (cpXY-cpXY tags) of the Linux "
            f"x86_64 wheels of {releases} in the index's file lists ({lists}), read {retrieved}")


def _version(fact: CompanionFact | None) -> str | None:
    return fact.version if fact else None


def companion_notes(facts: PypiFacts, retrieved: str) -> dict[str, list[str]]:
    """torch version → what the index says of its companions when no release pins it exactly:
    which release the lower-bound rule paired with it, or why it has none (one note each)."""
    notes: dict[str, list[str]] = {}
    for row in facts.companions:
        for project, fact in (("torchvision", row.torchvision), ("torchaudio", row.torchaudio)):
            releases = facts.torchvision if project == "torchvision" else facts.torchaudio
            if fact is not None and fact.built_for is not None and fact.torch is None:
                notes.setdefault(row.torch, []).append(built_note(fact))
            elif fact is not None and fact.torch is None:
                notes.setdefault(row.torch, []).append(
                    f"{project} {fact.version} requires torch{fact.torch_requirement} without an "
                    f"exact pin: paired with the newest torch {_minor(row.torch)} patch releases "
                    f"(one {project} minor per torch minor, {PAIRING_SOURCE})")
            elif fact is None and releases:
                notes.setdefault(row.torch, []).append(missing_note(project, row.torch, releases,
                                                                    retrieved))
    return notes


def built_note(fact: CompanionFact) -> str:
    """How an unpinned companion was tied to its torch (``companion_builds``)."""
    declared = (f"requires torch{fact.torch_requirement} without an exact pin" if fact.torch_requirement
                else "declares no torch requirement")
    return (f"{fact.project} {fact.version} {declared}: paired with torch {fact.built_for} by its "
            f"build: {fact.evidence}")


def missing_note(project: str, torch: str, releases: Sequence[CompanionFact], retrieved: str) -> str:
    """Why ``torch`` has no ``project``: what the newest release on the index declares."""
    newest = max(releases, key=lambda fact: Version(fact.version))  # releases: never empty here
    if newest.torch is not None:
        declared = f"pins torch=={newest.torch}"
    elif newest.torch_requirement:
        declared = f"declares torch{newest.torch_requirement}"
    else:
        declared = "declares no torch requirement"
    return (f"no {project} release on the index as of {retrieved} pins torch {torch} or requires "
            f"torch>={_minor(torch)}.0: the newest, {newest.version}, {declared}")


def _minor(torch: str) -> str:
    return ".".join(torch.split(".")[:2])


def _newest(releases: Sequence[CompanionFact]) -> CompanionFact | None:
    return max(releases, key=lambda fact: Version(fact.version)) if releases else None


def build_documents(facts: PypiFacts, retrieved: str,
                    digests: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    companions = {row.torch: row for row in facts.companions}
    extra = companion_notes(facts, retrieved)
    torch_rows = []
    for fact in facts.torch:
        row = torch_row(fact, companions[fact.torch], retrieved, digests)
        notes = [row["note"]] if "note" in row else []
        notes += extra.get(fact.torch, [])
        if notes:
            row["note"] = "; ".join(notes)
        torch_rows.append(row)
    newest = _newest(facts.torchvision) or _newest(facts.torchaudio)
    companion_rows = [companion_row(row, retrieved, extra.get(row.torch, []), digests, newest)
                      for row in facts.companions]
    return {
        "torch_pypi": {"relation": "torch_pypi", "description": TORCH_PYPI_DESCRIPTION,
                       "rows": torch_rows},
        "torch_companions": {"relation": "torch_companions", "description": COMPANIONS_DESCRIPTION,
                             "rows": [row for row in companion_rows if row is not None]},
    }
