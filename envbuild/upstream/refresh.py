"""``envbuild matrix refresh``: update the compatibility data from upstream, never corrupt it.

Plan: every selected source fetches and derives rows (nothing is written yet); the rows
are merged into the current data, guarded against shrinking, and the whole data set is
validated. Only then are the changed files (and ``manifest.json``) written: staged in a
sibling directory, committed by one journal rename, then moved into place. A crash
before the journal leaves the old data; after it, the next refresh rolls forward.
Any failure raises ``DataError`` (exit 4) with the data byte-identical.

Merging: a derived row replaces the row with the same key only when that row came from
the same source (its ``source`` starts with the source's prefix); hand-sourced rows are
kept as they are, and rows with new keys are appended. Provenance on each derived row:
``source`` (with ``#sha256=`` of the fetched document) and ``retrieved``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.errors import DataError, UsageError

if TYPE_CHECKING:
    from envbuild.upstream.http_client import HttpPolicy
    from envbuild.upstream.sources import Row, Source, SourceResult

SOURCES = ("nvidia", "pypi", "pytorch", "tags")  # run in this order: later ones read earlier rows
PROJECTS = ("torch", "torchvision", "torchaudio", "cuda", "cudnn", "images")
KEYS: Mapping[str, tuple[str, ...]] = {
    "cuda_toolkits": ("cuda",), "cudnn": ("cudnn",), "torch_variants": ("torch", "variant"),
    "torch_pypi": ("torch",), "torch_companions": ("torch",), "cuda_images": ("cuda", "ubuntu"),
}
NO_INDEX = "https://no-index.invalid/"
MAX_SHRINK = 0.10  # more than this fewer rows from one source looks like upstream trouble
JOURNAL = ".refresh-journal.json"
STAGING_PREFIX = ".refresh-staging-"
Log = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RefreshOptions:
    matrices: Path
    out: Path | None = None
    sources: tuple[str, ...] = SOURCES
    only: frozenset[str] = frozenset()
    offline: bool = False
    dry_run: bool = False
    allow_shrink: bool = False
    index_url: str | None = None
    pytorch_url: str | None = None
    nvidia_url: str | None = None
    registry_url: str | None = None
    policy: HttpPolicy | None = None
    lock_timeout_s: float = 0.0
    retrieved: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
                           .date().isoformat())


@dataclass(frozen=True, slots=True, kw_only=True)
class RelationChange:
    added: int = 0
    updated: int = 0
    kept_hand_sourced: int = 0
    dropped: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RefreshReport:
    target: Path
    changes: Mapping[str, RelationChange]
    written: tuple[str, ...]
    dry_run: bool
    bytes_received: int
    requests_made: int
    cache_hits: int
    seconds: float

    @property
    def up_to_date(self) -> bool:
        return not self.written and not any(c.added or c.updated or c.dropped
                                            for c in self.changes.values())

    def to_json(self) -> dict[str, Any]:
        return {"target": str(self.target), "dry_run": self.dry_run, "up_to_date": self.up_to_date,
                "written": list(self.written), "bytes_received": self.bytes_received,
                "requests_made": self.requests_made, "cache_hits": self.cache_hits,
                "seconds": round(self.seconds, 3),
                "changes": {k: {"added": c.added, "updated": c.updated, "dropped": c.dropped,
                                "kept_hand_sourced": c.kept_hand_sourced}
                            for k, c in sorted(self.changes.items())}}


# --- the flow ------------------------------------------------------------------------------


def refresh(options: RefreshOptions, env: Mapping[str, str], progress: Log,
            checkpoint: Callable[[str], None] | None = None) -> RefreshReport:
    from envbuild.data import matrix
    from envbuild.upstream.sources.fetch import Fetcher

    started = time.monotonic()
    check_upstream_urls(options)
    source_dir = options.matrices.resolve()
    check_writable_target(source_dir if options.out is None else options.out.resolve())
    cache = matrix.cache_directory(env)
    with refresh_lock(options.out or source_dir, cache, options.lock_timeout_s, progress):
        if options.out is None and not options.dry_run:
            recover(source_dir)
        documents = read_documents(source_dir)
        client = _client(options, env, progress)  # offline: built, never used
        fetcher = Fetcher(client, cache_dir=cache / "refresh" if cache else None, offline=options.offline)
        results = collect(options, env, documents, fetcher, progress)
        texts, changes = merge_all(documents, results, options)
        validate_texts(source_dir, texts)
        written = tuple(sorted(texts))
        if not options.dry_run and (texts or options.out is not None):
            target = source_dir if options.out is None else prepare_out(source_dir, options.out)
            commit(target, {f"{k}.yaml": v for k, v in texts.items()}, checkpoint=checkpoint)
    return RefreshReport(target=options.out or source_dir, changes=changes, written=written,
                         dry_run=options.dry_run, bytes_received=fetcher.bytes_received,
                         requests_made=fetcher.requests_made, cache_hits=fetcher.cache_hits,
                         seconds=time.monotonic() - started)


def _client(options: RefreshOptions, env: Mapping[str, str], progress: Log) -> Any:
    from envbuild.upstream.pipconfig import index_url
    from envbuild.upstream.simple_api import IndexClient

    # The client is also the HTTP client of the other sources; only pypi needs an index.
    index = index_url(options.index_url, env) if "pypi" in options.sources else NO_INDEX
    return IndexClient(index, env=env, policy=options.policy, log=progress)


def build_sources(options: RefreshOptions, client: Any) -> list[Source]:
    from envbuild.upstream.sources.nvidia_redistrib import DEFAULT_URL as NVIDIA
    from envbuild.upstream.sources.nvidia_redistrib import NvidiaSource
    from envbuild.upstream.sources.pypi_source import PypiSource
    from envbuild.upstream.sources.pytorch_index import DEFAULT_URL as PYTORCH
    from envbuild.upstream.sources.pytorch_index import PytorchIndexSource
    from envbuild.upstream.sources.registry_tags import DEFAULT_URL as REGISTRY
    from envbuild.upstream.sources.registry_tags import RegistryTagsSource

    made: dict[str, Source] = {
        "nvidia": NvidiaSource(base_url=options.nvidia_url or NVIDIA),
        "pypi": PypiSource(client=client, index=client.index),
        "pytorch": PytorchIndexSource(base_url=options.pytorch_url or PYTORCH),
        "tags": RegistryTagsSource(repository_url=options.registry_url or REGISTRY),
    }
    chosen = [made[name] for name in SOURCES if name in options.sources]
    return [s for s in chosen if not options.only or options.only & s.projects]


def collect(options: RefreshOptions, env: Mapping[str, str], documents: Mapping[str, Any],
            fetcher: Any, progress: Log) -> list[SourceResult]:
    """Run every source; later sources see the rows earlier ones derived (merged)."""
    from envbuild.upstream.sources import Context

    sources = build_sources(options, fetcher.client)
    if not sources:
        raise UsageError("no source selected", hint="--only names nothing the chosen --source reads")
    debug = (lambda m: progress(f"debug: {m}")) if env.get("ENVBUILD_DEBUG") else (lambda m: None)
    results: list[SourceResult] = []
    current: dict[str, tuple[Row, ...]] = {k: tuple(d["rows"]) for k, d in documents.items()}
    for source in sources:
        progress(f"refreshing from {source.name}")
        context = Context(fetch=fetcher, existing=current, retrieved=options.retrieved,
                          only=options.only, progress=progress, debug=debug)
        result = source.collect(context)
        results.append(result)
        for relation, rows in result.rows.items():
            merged, _ = merge_rows(relation, current.get(relation, ()), rows, result.prefix,
                                   False)
            current[relation] = tuple(merged)
    return results


# --- merge and shrink guard ----------------------------------------------------------------


def merge_rows(relation: str, old: Sequence[Row], new: Sequence[Row], prefix: str, allow_shrink: bool
               ) -> tuple[list[Row], RelationChange]:
    """Old rows with the derived ones folded in (see the module docstring)."""
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
    owned = sum(1 for row in old if str(row.get("source", "")).startswith(result.prefix))
    if owned and len(new) < owned * (1 - MAX_SHRINK):
        percent = round(100 * (owned - len(new)) / owned)
        raise DataError(
            f"refusing to shrink data by {percent}%: {result.name} gave {len(new)} {relation} rows, "
            f"{owned} were recorded from it",
            hint="upstream may be broken; check it, or pass --allow-shrink")


def merge_all(documents: Mapping[str, dict[str, Any]], results: Sequence[SourceResult],
              options: RefreshOptions) -> tuple[dict[str, bytes], dict[str, RelationChange]]:
    """New file texts for the relations that change, and what changed in each."""
    from envbuild.upstream.sources.yamlout import render_document

    texts: dict[str, bytes] = {}
    changes: dict[str, RelationChange] = {}
    current: dict[str, list[Row]] = {k: list(d["rows"]) for k, d in documents.items()}
    for result in results:
        for relation, rows in result.rows.items():
            if relation not in documents:
                raise DataError(f"{relation}.yaml missing from the data directory")
            if not options.allow_shrink:
                check_shrink(relation, current[relation], rows, result)
            merged, change = merge_rows(relation, current[relation], rows, result.prefix,
                                        options.allow_shrink)
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


# --- reading and validating ----------------------------------------------------------------


def read_documents(directory: Path) -> dict[str, dict[str, Any]]:
    """Every relation file as parsed YAML plus its text (the manifest is not checked here,
    so a refresh can repair data a crash left inconsistent)."""
    import yaml

    from envbuild.data.matrix import RELATIONS

    if not directory.is_dir():
        raise UsageError(f"matrices directory not found: {directory}",
                         hint="point --matrices or ENVBUILD_MATRICES at a copy of matrices/")
    documents: dict[str, dict[str, Any]] = {}
    for name in RELATIONS:
        path = directory / f"{name}.yaml"
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise DataError(f"{path} is not valid YAML", hint="restore it from git or reinstall") from exc
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise DataError(f"{path}: expected a mapping with a 'rows' list")
        documents[name] = {**data, "_text": text}
    return documents


def validate_texts(directory: Path, texts: Mapping[str, bytes]) -> None:
    """Validate the data as it would be after the refresh (every file, cross-references)."""
    from envbuild.data.matrix import RELATIONS
    from envbuild.data.validate import parse_all

    files = {name: (directory / f"{name}.yaml").read_bytes() for name in RELATIONS
             if (directory / f"{name}.yaml").is_file()}
    parse_all({**files, **texts})


def check_upstream_urls(options: RefreshOptions) -> None:
    """Rows cite their upstream by URL and the data accepts only https ones: refuse others early."""
    for flag, url in (("--pytorch-url", options.pytorch_url), ("--nvidia-url", options.nvidia_url),
                      ("--registry-url", options.registry_url)):
        if url is not None and not url.startswith("https://"):
            raise UsageError(f"{flag} {url!r} is not an https:// URL",
                             hint="upstream data is read over verified TLS only")


# --- where we may write --------------------------------------------------------------------


def check_writable_target(target: Path) -> None:
    """Refuse the data inside an installed envbuild; a repository checkout is fine."""
    package = Path(__file__).resolve().parents[1]  # the envbuild package
    inside = target == package / "matrices" or package in target.parents
    if inside and not (package.parent / ".git").exists():
        raise UsageError(
            f"refusing to refresh the data inside the installed envbuild package ({target})",
            hint="pass --out DIR for a refreshed copy and point ENVBUILD_MATRICES at it")


def prepare_out(source: Path, out: Path) -> Path:
    """Copy the current data to ``out`` (created; must be empty) so the refresh lands there."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            shutil.copy2(path, out / path.name)
    return out


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty directory",
                         hint="choose a new directory; existing files are never overwritten")


# --- lock ------------------------------------------------------------------------------------


@contextlib.contextmanager
def refresh_lock(target: Path, cache: Path | None, timeout_s: float, progress: Log) -> Iterator[None]:
    """One refresh per data directory at a time (fcntl lock, released when the process ends)."""
    import tempfile

    name = hashlib.sha256(str(target.resolve()).encode()).hexdigest()[:16]
    where = cache / "locks" if cache else Path(tempfile.gettempdir())
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"refresh-{name}.lock"
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise DataError(f"refresh in progress: another envbuild holds {path}",
                                    hint="wait for it to finish, then run again") from None
                progress("waiting for another refresh to finish")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- atomic, all-or-nothing write -----------------------------------------------------------


def commit(target: Path, files: Mapping[str, bytes],
           checkpoint: Callable[[str], None] | None = None) -> None:
    """Replace ``files`` (name → bytes) and the manifest in ``target`` all together."""
    import shutil
    import tempfile

    from envbuild.data import matrix

    mark = checkpoint or (lambda stage: None)
    recover(target)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target))
    for path in sorted(target.glob("*.yaml")):
        shutil.copy2(path, staging / path.name)
    for name, data in files.items():
        _write_synced(staging / name, data, (target / name).stat().st_mode & 0o777
                      if (target / name).exists() else 0o644)
    matrix.write_manifest(staging)
    mark("staged")
    moves = [[str(staging / name), str(target / name)] for name in [*sorted(files), matrix.MANIFEST]]
    journal = json.dumps({"staging": str(staging), "moves": moves}).encode()
    _write_synced(target / f"{JOURNAL}.tmp", journal, 0o644)
    os.replace(target / f"{JOURNAL}.tmp", target / JOURNAL)  # the commit point
    _sync_directory(target)
    mark("committed")
    roll_forward(target, mark)


def roll_forward(target: Path, mark: Callable[[str], None] = lambda stage: None) -> None:
    import shutil

    journal = json.loads((target / JOURNAL).read_text(encoding="utf-8"))
    for source, destination in journal["moves"]:
        if os.path.exists(source):
            os.replace(source, destination)
            mark("moved")
    _sync_directory(target)
    shutil.rmtree(journal["staging"], ignore_errors=True)
    (target / JOURNAL).unlink()


def recover(target: Path) -> None:
    """Finish a committed refresh a crash interrupted; drop an uncommitted one's leftovers."""
    import shutil

    if (target / JOURNAL).is_file():
        roll_forward(target)
    for leftover in target.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (target / f"{JOURNAL}.tmp").unlink()


def _write_synced(path: Path, data: bytes, mode: int) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(path, mode)


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- command line ---------------------------------------------------------------------------


def add_refresh_arguments(p: argparse.ArgumentParser) -> None:
    """``envbuild matrix refresh``'s options (the CLI creates the subcommand)."""
    p.add_argument("--source", action="append", choices=(*SOURCES, "all"),
                   help="which upstream to read (repeatable; default: all)")
    p.add_argument("--only", action="append", choices=PROJECTS,
                   help="limit to these projects (repeatable)")
    p.add_argument("--out", metavar="DIR", help="write a refreshed copy to DIR (new or empty)")
    p.add_argument("--offline", action="store_true",
                   help="no network: derive from the refresh cache only")
    p.add_argument("--dry-run", action="store_true", help="fetch and check, write nothing")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--allow-shrink", action="store_true",
                   help="accept a source giving fewer rows than recorded (drops the missing ones)")
    p.add_argument("--index-url", metavar="URL",
                   help="Python package index (default: $PIP_INDEX_URL, then pip's configuration)")
    p.add_argument("--pytorch-url", metavar="URL", help="PyTorch wheel indexes (default: "
                   "https://download.pytorch.org/whl/)")
    p.add_argument("--nvidia-url", metavar="URL", help="NVIDIA redist base (default: "
                   "https://developer.download.nvidia.com/compute/)")
    p.add_argument("--registry-url", metavar="URL", help="the nvidia/cuda repository's registry "
                   "API (default: https://registry-1.docker.io/v2/nvidia/cuda/)")
    p.set_defaults(run=cmd_refresh)


def options_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> RefreshOptions:
    from envbuild.data.matrix import default_directory

    chosen = tuple(args.source or ["all"])
    out = Path(args.out) if args.out else None
    if out is not None:
        check_out(out)
    return RefreshOptions(
        matrices=Path(args.matrices) if getattr(args, "matrices", None) else default_directory(env),
        out=out, sources=SOURCES if "all" in chosen else chosen, only=frozenset(args.only or ()),
        offline=args.offline, dry_run=args.dry_run, allow_shrink=args.allow_shrink,
        index_url=args.index_url, pytorch_url=args.pytorch_url, nvidia_url=args.nvidia_url,
        registry_url=args.registry_url)


def cmd_refresh(args: argparse.Namespace, env: Mapping[str, str], out: Callable[[str], None]) -> int:
    options = options_from_args(args, env)
    report = refresh(options, env, lambda message: print(message, file=sys.stderr, flush=True))
    if args.json:
        out(json.dumps(report.to_json(), indent=2))
    elif report.up_to_date:
        out(f"{report.target}: up to date")
    else:
        verb = "would write" if report.dry_run else "wrote"
        summary = ", ".join(f"{k} +{c.added} ~{c.updated} -{c.dropped}"
                            for k, c in sorted(report.changes.items()))
        out(f"{report.target}: {verb} {', '.join(report.written) or 'nothing'} ({summary}); "
            f"{report.bytes_received} bytes in {report.requests_made} requests")
    return 0
