#!/usr/bin/env python3
"""Regenerate matrices/torch_pypi.yaml and matrices/torch_companions.yaml from the index.

The index is the configured one (--index-url, then PIP_INDEX_URL, then pip's own
configuration and default). Each row's ``source`` names the wheel whose METADATA was
read, as a URI relative to that index, so the files never name a registry host.
Both files are written to temporary files first and renamed into place together.

    python bin/update_pypi_facts.py [--index-url URL] [--matrices DIR] [--allow-shrink]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from envbuild.errors import DataError
from envbuild.pypi import (
    CompanionFact,
    CompanionRow,
    IndexClient,
    PypiFacts,
    TorchWheelFact,
    collect_facts,
    index_url,
)

TORCH_PYPI_DESCRIPTION = (
    "The default torch wheel for Linux x86_64 on the Python package index, per final "
    "release: the CPython versions it has wheels for (free-threaded builds in the note), "
    "Requires-Python, the platform tag, the CUDA runtime, cuDNN and NCCL pins read from "
    "the METADATA of the cp311 wheel, the wheel variant they imply (cu121 from a CUDA "
    "runtime 12.1.x pin), and the torchvision/torchaudio releases that pin exactly this "
    "torch (null where none does). Sources are pip-index:// URIs: relative to the "
    "configured Python package index."
)
COMPANIONS_DESCRIPTION = (
    "The torchvision and torchaudio releases whose wheel METADATA pins exactly this "
    "torch release (Requires-Dist: torch==X), read from the Python package index. "
    "null: no release of that project pins this torch. The source is the torchvision "
    "wheel (the torchaudio wheel when there is no torchvision); the note names the other."
)


class Quoted(str):
    """A string YAML must keep quoted (versions, dates)."""


class _Dumper(yaml.SafeDumper):
    pass


def _quoted(dumper: yaml.SafeDumper, value: Quoted) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style='"')


_Dumper.add_representer(Quoted, _quoted)


def source_uri(project: str, filename: str) -> str:
    return f"pip-index:///simple/{project}/#{filename}"


def torch_row(fact: TorchWheelFact, companions: CompanionRow, retrieved: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "torch": Quoted(fact.torch),
        "default_variant": fact.default_variant,
        "python": [Quoted(version) for version in fact.python],
        "requires_python": Quoted(fact.requires_python) if fact.requires_python else None,
        "platform_tag": fact.platform_tag,
        "torchvision": _version(companions.torchvision),
        "torchaudio": _version(companions.torchaudio),
    }
    for key in ("cuda_runtime", "cudnn", "nccl"):
        value = getattr(fact, key)
        if value is not None:
            row[key] = Quoted(value)
    row["source"] = source_uri("torch", fact.filename)
    row["retrieved"] = Quoted(retrieved)
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


def companion_row(row: CompanionRow, retrieved: str, notes: Sequence[str]) -> dict[str, Any] | None:
    first = row.torchvision or row.torchaudio
    if first is None:
        return None  # nothing pins this torch: no fact to record
    out: dict[str, Any] = {
        "torch": Quoted(row.torch),
        "torchvision": _version(row.torchvision),
        "torchaudio": _version(row.torchaudio),
        "source": source_uri(first.project, first.filename),
        "retrieved": Quoted(retrieved),
    }
    notes = list(notes)
    if row.torchvision and row.torchaudio:
        audio = source_uri(row.torchaudio.project, row.torchaudio.filename)
        notes.insert(0, f"torchaudio pin read from {audio}")
    if notes:
        out["note"] = "; ".join(notes)
    return out


def _version(fact: CompanionFact | None) -> Quoted | None:
    return Quoted(fact.version) if fact else None


def unpinned_notes(facts: PypiFacts) -> dict[str, list[str]]:
    """torch version → notes on companions that require torch without pinning it."""
    notes: dict[str, list[str]] = {}
    for row in facts.companions:
        for project, fact in (("torchvision", row.torchvision), ("torchaudio", row.torchaudio)):
            if fact is None:
                loose = _loose_companions(facts, project)
                notes.setdefault(row.torch, []).append(
                    f"no {project} release pins this torch{loose}"
                )
    return notes


def _loose_companions(facts: PypiFacts, project: str) -> str:
    releases = facts.torchvision if project == "torchvision" else facts.torchaudio
    loose = [f for f in releases if f.torch is None]
    if not loose:
        return ""
    described = ", ".join(f"{f.version} ({_requirement(f)})" for f in loose)
    return f"; {project} releases without an exact torch pin: {described}"


def _requirement(fact: CompanionFact) -> str:
    return f"torch{fact.torch_requirement}" if fact.torch_requirement else "no torch requirement"


def documents(facts: PypiFacts, retrieved: str) -> dict[str, dict[str, Any]]:
    companions = {row.torch: row for row in facts.companions}
    extra = unpinned_notes(facts)
    torch_rows = []
    for fact in facts.torch:
        row = torch_row(fact, companions[fact.torch], retrieved)
        notes = [row["note"]] if "note" in row else []
        notes += extra.get(fact.torch, [])
        if notes:
            row["note"] = "; ".join(notes)
        torch_rows.append(row)
    companion_rows = [
        companion_row(row, retrieved, extra.get(row.torch, [])) for row in facts.companions
    ]
    return {
        "torch_pypi": _document("torch_pypi", TORCH_PYPI_DESCRIPTION, torch_rows),
        "torch_companions": _document(
            "torch_companions",
            COMPANIONS_DESCRIPTION,
            [row for row in companion_rows if row is not None],
        ),
    }


def _document(relation: str, description: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"relation": relation, "description": description, "rows": rows}


def render(document: Mapping[str, Any]) -> str:
    header = "# Generated by bin/update_pypi_facts.py; edit the script, not this file.\n"
    body = yaml.dump(
        dict(document),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=None,
        allow_unicode=True,
        width=100,
    )
    return header + body


def check_no_shrink(path: Path, new_rows: int) -> None:
    """Refuse to replace a table with fewer rows: upstream trouble, not a real shrink."""
    if not path.exists():
        return
    try:
        old = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return  # a corrupt file may be replaced
    old_rows = len(old.get("rows") or []) if isinstance(old, dict) else 0
    if new_rows < old_rows:
        raise DataError(
            f"refusing to shrink {path.name} from {old_rows} to {new_rows} rows",
            hint="check the index, or pass --allow-shrink",
        )


def write_all(files: Mapping[Path, str]) -> None:
    """Write every file to a temporary sibling, then rename them all into place."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            staged.append((temp, path))
            # mkstemp makes 0600 files; data files are meant to be read by everyone.
            os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        for temp, path in staged:
            os.replace(temp, path)
    finally:
        for temp, _ in staged:
            if os.path.exists(temp):
                os.unlink(temp)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--index-url", help="the index to read (default: pip's configuration)")
    parser.add_argument(
        "--matrices",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "matrices",
        help="the directory holding the data files",
    )
    parser.add_argument("--allow-shrink", action="store_true", help="accept fewer rows")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    client = IndexClient(index_url(args.index_url, os.environ), env=os.environ)

    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr)

    facts = collect_facts(client, progress=progress)
    retrieved = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    outputs: dict[Path, str] = {}
    for relation, document in documents(facts, retrieved).items():
        path = args.matrices / f"{relation}.yaml"
        if not args.allow_shrink:
            check_no_shrink(path, len(document["rows"]))
        outputs[path] = render(document)
    write_all(outputs)
    per_release = sum(f.metadata_bytes for f in facts.torch) // max(1, len(facts.torch))
    progress(
        f"wrote {len(facts.torch)} torch releases; {facts.bytes_transferred} bytes in "
        f"{facts.requests_made} requests; {per_release} bytes of METADATA reads per torch release"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except DataError as error:
        print(error.one_line(), file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
