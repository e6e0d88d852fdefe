"""Upstream sources for ``envbuild matrix refresh``.

Each source reads documents through a ``Fetch`` (retries, ETag cache, offline mode)
and turns them into rows of the existing relations, each row carrying its provenance.
Sources never write files: ``envbuild.upstream.refresh`` merges, validates and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from envbuild.upstream.http_client import Reply

Row = dict[str, Any]
Log = Callable[[str], None]


# A fetched document is the HTTP client's reply, with ``cached`` set when it came from
# the ETag cache (304 or offline).
Document = Reply


class Fetch(Protocol):
    def document(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        allow: frozenset[int] = frozenset(),
    ) -> Document: ...

    def immutable(self, key: str, produce: Callable[[], bytes]) -> bytes: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What a source may read: the fetcher, the data merged so far, today's date, and where
    to report: ``progress`` (what it is doing), ``warn`` (data it skipped), ``debug``."""

    fetch: Fetch
    existing: Mapping[str, tuple[Row, ...]]
    retrieved: str
    only: frozenset[str]
    progress: Log
    warn: Log
    debug: Log


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceResult:
    """Rows per relation. ``prefix``: the start of every source URI this source writes,
    which marks the rows it owns (rows with other sources are hand-sourced and kept)."""

    name: str
    prefix: str
    rows: Mapping[str, tuple[Row, ...]] = field(default_factory=dict)
    also_owns: tuple[str, ...] = ()  # other prefixes of rows this source wrote (another origin)

    @property
    def owned(self) -> tuple[str, ...]:
        return (self.prefix, *self.also_owns)


class Source(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def projects(self) -> frozenset[str]:  # what --only may pick from this source
        ...

    def collect(self, context: Context) -> SourceResult: ...


def with_digest(uri: str, sha256: str) -> str:
    """The provenance URI: where the fact was read plus the sha256 of the fetched bytes.

    The hash rides in the fragment (``#sha256=…``, the convention of PEP 503 links), added
    with ``&`` when the URI already has a fragment, since the row schema has no hash field.
    """
    return f"{uri}{'&' if '#' in uri else '#'}sha256={sha256}"


def cuda_minors(existing: Mapping[str, tuple[Row, ...]]) -> set[str]:
    """CUDA major.minor families known to cuda_toolkits.yaml (the validator's cross-reference)."""
    return {".".join(str(r["cuda"]).split(".")[:2]) for r in existing.get("cuda_toolkits", ())}
