"""``envbuild matrix refresh``: update the compatibility data from upstream, never corrupt it.

Plan: every selected source fetches and derives rows (nothing is written yet); the rows
are merged into the current data (``merge``), guarded against shrinking, and the whole
data set is validated. Only then are the changed files (and ``manifest.json``) written,
all or nothing (``journal``). Any failure raises ``DataError`` (exit 4) with the data
byte-identical. Provenance on each derived row: ``source`` (with ``#sha256=`` of the
fetched document) and ``retrieved``.

This module neither parses arguments nor prints: progress and retries go to ``log``,
warnings to ``warn``; ``envbuild.commands.refresh`` is the command line.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.errors import DataError, UsageError
from envbuild.upstream.journal import Log, commit, recover, refresh_lock

if TYPE_CHECKING:
    from envbuild.upstream.http_client import HttpPolicy
    from envbuild.upstream.merge import RelationChange
    from envbuild.upstream.sources import Row, Source, SourceResult

# Run in this order: later ones read earlier rows (wheels reads the pypi source's torch_pypi;
# python the CPython versions that the torch relations list).
ORDER = ("nvidia", "pypi", "wheels", "pytorch", "tags", "python")
# What ``--source all`` (and no --source) reads. The wheels source is asked for by name: it
# reads the METADATA of every torch wheel per CPython and lists every pinned nvidia-*
# project, many times the requests of the others, for sizes the resolver does not need.
SOURCES = ("nvidia", "pypi", "pytorch", "tags", "python")
PROJECTS = ("torch", "torchvision", "torchaudio", "cuda", "cudnn", "images", "python")
INDEX_SOURCES = frozenset({"pypi", "wheels"})  # the sources that read the package index
NO_INDEX = "https://no-index.invalid/"


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
    python_downloads_url: str | None = None  # uv's download-metadata.json
    uv_release: str | None = None  # read that list from this uv release's sdist on the index
    policy: HttpPolicy | None = None
    lock_timeout_s: float = 0.0
    retrieved: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
                           .date().isoformat())



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


def refresh(options: RefreshOptions, env: Mapping[str, str], log: Log, *, warn: Log | None = None,
            checkpoint: Callable[[str], None] | None = None) -> RefreshReport:
    """Refresh the data ``options`` name. ``warn`` defaults to ``log`` with a "warning: " prefix."""
    from envbuild.data import matrix
    from envbuild.upstream.merge import merge_all
    from envbuild.upstream.sources.fetch import Fetcher

    warned = warn or (lambda message: log(f"warning: {message}"))

    started = time.monotonic()
    check_upstream_urls(options)
    source_dir = options.matrices.resolve()
    check_writable_target(source_dir if options.out is None else options.out.resolve())
    cache = matrix.cache_directory(env)
    with refresh_lock(options.out or source_dir, options.lock_timeout_s, log):
        if options.out is None and not options.dry_run:
            recover(source_dir)
        documents = read_documents(source_dir)
        client = _client(options, env, log)  # offline: built, never used
        fetcher = Fetcher(client, cache_dir=cache / "refresh" if cache else None, offline=options.offline)
        results = collect(options, env, documents, fetcher, log, warned)
        texts, changes = merge_all(documents, results, options.allow_shrink)
        validate_texts(source_dir, texts)
        written = tuple(sorted(texts))
        if not options.dry_run and (texts or options.out is not None):
            target = source_dir if options.out is None else options.out.resolve()
            try:
                if options.out is not None:
                    prepare_out(source_dir, options.out)
                commit(target, {f"{k}.yaml": v for k, v in texts.items()}, checkpoint=checkpoint)
            except OSError as exc:
                raise _write_failed(target, exc) from exc
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: finish or drop the write now
                with contextlib.suppress(OSError):
                    recover(target)
                raise
    return RefreshReport(target=options.out or source_dir, changes=changes, written=written,
                         dry_run=options.dry_run, bytes_received=fetcher.bytes_received,
                         requests_made=fetcher.requests_made, cache_hits=fetcher.cache_hits,
                         seconds=time.monotonic() - started)


def _write_failed(target: Path, exc: OSError) -> DataError:
    """A full disk, a read-only or unwritable data directory: exit 4 like every refresh
    failure, with the data as it was (or, past the commit point, as the journal finishes
    it). Staging left by the failed write is removed now, not at the next refresh."""
    with contextlib.suppress(OSError):
        recover(target)
    where = exc.filename or target
    return DataError(f"cannot write the refreshed data to {target}: {where}: "
                     f"{exc.strerror or type(exc).__name__}",
                     hint="free space or make the directory writable, then run again; "
                          "the data files were left as they were")


def _client(options: RefreshOptions, env: Mapping[str, str], progress: Log) -> Any:
    from envbuild.upstream.pipconfig import index_url
    from envbuild.upstream.simple_api import IndexClient

    # The client is also the HTTP client of the other sources; only some need an index.
    reads_index = bool(INDEX_SOURCES & set(options.sources)) or (
        options.uv_release is not None and "python" in options.sources)
    index = index_url(options.index_url, env) if reads_index else NO_INDEX
    return IndexClient(index, env=env, policy=options.policy, log=progress)


def build_sources(options: RefreshOptions, client: Any) -> list[Source]:
    from envbuild.upstream.sources.nvidia_redistrib import DEFAULT_URL as NVIDIA
    from envbuild.upstream.sources.nvidia_redistrib import NvidiaSource
    from envbuild.upstream.sources.pypi_source import PypiSource
    from envbuild.upstream.sources.pypi_wheels import PypiWheelsSource
    from envbuild.upstream.sources.python_standalone import DEFAULT_URL as PYTHON_DOWNLOADS
    from envbuild.upstream.sources.python_standalone import PythonStandaloneSource
    from envbuild.upstream.sources.pytorch_index import DEFAULT_URL as PYTORCH
    from envbuild.upstream.sources.pytorch_index import PytorchIndexSource
    from envbuild.upstream.sources.registry_tags import DEFAULT_URL as REGISTRY
    from envbuild.upstream.sources.registry_tags import RegistryTagsSource

    made: dict[str, Source] = {
        "nvidia": NvidiaSource(base_url=options.nvidia_url or NVIDIA),
        "pypi": PypiSource(client=client, index=client.index),
        "wheels": PypiWheelsSource(client=client, index=client.index),
        "pytorch": PytorchIndexSource(base_url=options.pytorch_url or PYTORCH),
        "tags": RegistryTagsSource(repository_url=options.registry_url or REGISTRY),
        "python": PythonStandaloneSource(url=options.python_downloads_url or PYTHON_DOWNLOADS,
                                         index=client.index, uv_release=options.uv_release),
    }
    chosen = [made[name] for name in ORDER if name in options.sources]
    return [s for s in chosen if not options.only or options.only & s.projects]


def collect(options: RefreshOptions, env: Mapping[str, str], documents: Mapping[str, Any],
            fetcher: Any, progress: Log, warn: Log) -> list[SourceResult]:
    """Run every source; later sources see the rows earlier ones derived (merged)."""
    from envbuild.upstream.merge import merge_rows
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
                          only=options.only, progress=progress, warn=warn, debug=debug)
        result = _without_credentials(source.collect(context))
        results.append(result)
        for relation, rows in result.rows.items():
            merged, _ = merge_rows(relation, current.get(relation, ()), rows, result.owned,
                                   False)
            current[relation] = tuple(merged)
    return results


def _without_credentials(result: SourceResult) -> SourceResult:
    """The rows' provenance as the data files record it: an upstream URL given with
    ``user:token@`` or ``?token=`` is written without them (docs/faults.md E15)."""
    from dataclasses import replace

    from envbuild.redact import has_credentials, strip_credentials

    if not has_credentials(result.prefix) and not any(
            has_credentials(str(row.get("source", ""))) for rows in result.rows.values() for row in rows):
        return result
    rows = {relation: tuple({**row, "source": strip_credentials(str(row["source"]))}
                            if "source" in row else row for row in relation_rows)
            for relation, relation_rows in result.rows.items()}
    return replace(result, prefix=strip_credentials(result.prefix), rows=rows)


# --- reading and validating ----------------------------------------------------------------


def read_documents(directory: Path) -> dict[str, dict[str, Any]]:
    """Every relation file as parsed YAML plus its text (the manifest is not checked here,
    so a refresh can repair data a crash left inconsistent)."""
    import yaml

    from envbuild.data import yamlload
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
        try:  # libyaml's loader where PyYAML has it: the pure-Python one took 3 s for the data
            data = yamlload.load(text)
        except (yaml.YAMLError, yamlload.YamlProblem) as exc:
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
    if options.uv_release is not None and options.python_downloads_url is not None:
        raise UsageError("--uv-release and --python-downloads-url cannot be combined",
                         hint="read uv's list either from a URL or from a uv release on the index")
    for flag, url in (("--pytorch-url", options.pytorch_url), ("--nvidia-url", options.nvidia_url),
                      ("--registry-url", options.registry_url),
                      ("--python-downloads-url", options.python_downloads_url)):
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
    from envbuild.fs import check_not_special

    check_not_special(out)  # a link to an empty directory is refused, not written through
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty directory",
                         hint="choose a new directory; existing files are never overwritten")


