"""uv's list of python-build-standalone downloads: python_standalone rows.

uv installs CPython from the python-build-standalone project and keeps the list of the
builds it offers, with each archive's URL and sha256, in one JSON document
(``crates/uv-python-managed/download-metadata.json`` in uv's repository since late 2026,
``crates/uv-python/`` before; the same file ships in uv's sdist on the Python package
index, which ``uv_release`` reads instead: ``uv_sdist``): an object whose values
each describe one build (``name``, ``os``, ``libc``, ``arch.family``, ``arch.variant``,
``major``, ``minor``, ``patch``, ``prerelease``, ``variant``, ``url``, ``sha256``,
``build``). This source keeps, per CPython minor that the torch relations list and per
architecture, the newest final release for Linux with glibc: the baseline x86_64 build (no
``x86_64_v2``-style micro-architecture level, so that it runs on every x86_64) and the
aarch64 one; the free-threaded build for a ``3.Nt`` Python. The archives are the
``install_only_stripped`` flavour, the only one that list names for current builds.
Prereleases (``rc1``) are left out: a stack is built on a final release.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from envbuild.errors import DataError
from envbuild.upstream.sources import Context, Row, SourceResult, uv_sdist, with_digest

DEFAULT_URL = ("https://raw.githubusercontent.com/astral-sh/uv/main/crates/uv-python-managed/"
               "download-metadata.json")
INDEX_PREFIX = "pip-index:///simple/uv/"  # rows read from a uv sdist on the package index
ARCHES = ("x86_64", "aarch64")
FLAVOURS = ("install_only_stripped.tar.gz", "install_only.tar.gz")  # preferred first
_SHA256 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(r"https://[A-Za-z0-9.-]+/[A-Za-z0-9._~%+=,/-]+", re.ASCII)
_PYTHON = re.compile(r"3\.(\d+)(t?)")


def pythons_used(existing: Any) -> set[str]:
    """Every CPython ("3.12", "3.13t") that a torch wheel of the data is built for."""
    used: set[str] = set()
    for relation in ("torch_variants", "torch_pypi"):
        for row in existing.get(relation, ()):
            used.update(str(p) for p in row.get("python", ()))
    return used


def _builds(document_url: str, body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{document_url} is not JSON ({exc})") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise DataError(f"{document_url}: expected a JSON object of build objects")
    return data


def _field(build: dict[str, Any], key: str, name: str, url: str) -> Any:
    value: Any = build
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise DataError(f"{url}: {key}: field {name!r} missing (upstream format changed?)")
        value = value[part]
    return value


Rank = tuple[int, str, bool]


def candidates(document_url: str, body: bytes) -> dict[tuple[str, str], tuple[Rank, Row]]:
    """(python, arch) → ((patch, build, stripped), row facts) of the newest final build of each."""
    best: dict[tuple[str, str], tuple[Rank, Row]] = {}
    for key, build in _builds(document_url, body).items():
        if build.get("name") != "cpython" or build.get("os") != "linux" or build.get("libc") != "gnu":
            continue
        arch = _field(build, key, "arch", document_url)
        family = arch.get("family") if isinstance(arch, dict) else None
        if family not in ARCHES or arch.get("variant") is not None:
            continue
        variant = build.get("variant")
        if variant not in (None, "freethreaded") or build.get("prerelease"):
            continue
        major, minor, patch = (_field(build, key, f, document_url) for f in ("major", "minor", "patch"))
        url, sha256 = _field(build, key, "url", document_url), _field(build, key, "sha256", document_url)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (major, minor, patch)):
            raise DataError(f"{document_url}: {key}: major, minor and patch must be integers")
        if major != 3 or not isinstance(url, str) or not url.endswith(FLAVOURS):
            continue
        if not _URL.fullmatch(url) or not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise DataError(f"{document_url}: {key}: not an https URL and a sha256: {url!r}, {sha256!r}")
        python = f"3.{minor}{'t' if variant == 'freethreaded' else ''}"
        rank: Rank = (patch, str(build.get("build", "")), url.endswith(FLAVOURS[0]))
        found = best.get((python, family))
        if found is None or rank > found[0]:
            best[(python, family)] = (rank, {
                "python": python, "version": f"3.{minor}.{patch}", "arch": family,
                "build": str(build.get("build", "")), "url": url, "sha256": sha256,
                "note": f"uv download-metadata key {key}"})
    return best


def standalone_rows(document_url: str, body: bytes, sha256: str, pythons: set[str],
                    retrieved: str, *, source: str | None = None, note: str = "") -> list[Row]:
    """The python_standalone rows for ``pythons``, sorted by Python and architecture. ``source``:
    the provenance to record when it is not the document's URL and digest; ``note``: appended."""
    found = candidates(document_url, body)
    rows = []
    for (python, _arch), (_, facts) in found.items():
        if python not in pythons:
            continue
        row = {k: v for k, v in facts.items() if k != "note" and (k != "build" or v)}
        rows.append({**row, "source": source or with_digest(document_url, sha256),
                     "retrieved": retrieved, "note": facts["note"] + note})

    def order(row: Row) -> tuple[int, bool, int]:
        match = _PYTHON.fullmatch(row["python"])
        return (int(match.group(1)) if match else 0, row["python"].endswith("t"),
                ARCHES.index(row["arch"]))

    return sorted(rows, key=order)


def origin(url: str) -> str:
    """``https://host[:port]/``: the rows' owner prefix (the document's path moves with
    every commit a row may cite)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/"


@dataclass(frozen=True, slots=True, kw_only=True)
class ListRead:
    """uv's download list as read: where (for errors), its bytes, the provenance rows record."""

    where: str
    body: bytes
    source: str
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PythonStandaloneSource:
    name: str = "python"
    projects: frozenset[str] = frozenset({"python"})
    url: str = DEFAULT_URL
    index: str = ""  # the package index, read when ``uv_release`` is set
    uv_release: str | None = None  # a uv version, or "latest": read the list from its sdist

    def collect(self, context: Context) -> SourceResult:
        read = self._from_index(context) if self.uv_release else self._from_url(context)
        pythons = pythons_used(context.existing)
        rows = standalone_rows(read.where, read.body, "", pythons, context.retrieved,
                               source=read.source, note=read.note)
        have = {r["python"] for r in rows}
        for python in sorted(pythons - have):
            context.warn(f"python-build-standalone: no final Linux build of CPython {python} "
                         f"in {read.where}")
        context.progress(f"python-build-standalone: {len(rows)} builds for "
                         f"{len(have)} CPython versions")
        prefix = INDEX_PREFIX if self.uv_release else origin(read.where)
        # Rows read from uv's list are this source's wherever they were read: the code host
        # or a uv release on the index (a refresh from either replaces the other's).
        owns = tuple(p for p in (origin(DEFAULT_URL), INDEX_PREFIX) if p != prefix)
        return SourceResult(name=self.name, prefix=prefix, also_owns=owns,
                            rows={"python_standalone": tuple(rows)})

    def _from_url(self, context: Context) -> ListRead:
        document = context.fetch.document(self.url)
        return ListRead(where=document.url, body=document.body,
                        source=with_digest(document.url, document.sha256))

    def _from_index(self, context: Context) -> ListRead:
        from envbuild.upstream.simple_api import SIMPLE_JSON

        page = context.fetch.document(f"{self.index.rstrip('/')}/{uv_sdist.PROJECT}/",
                                      headers={"Accept": SIMPLE_JSON})
        wanted = None if self.uv_release == "latest" else self.uv_release
        sdist = uv_sdist.pick_sdist(page.body, page.url, wanted)
        uv_sdist.check_size(sdist)
        context.progress(f"python-build-standalone: reading uv's list from {sdist.filename}")

        def produce() -> bytes:
            body = context.fetch.document(sdist.url).body
            uv_sdist.check_digest(sdist, body)
            member, content = uv_sdist.read_member(sdist.filename, body)
            return member.encode() + b"\0" + content

        # Keyed by the sdist's sha256: the same release's list is read once, then offline too.
        cached = context.fetch.immutable(f"{sdist.url}#sha256={sdist.sha256}#download-metadata", produce)
        member, _, body = cached.partition(b"\0")
        digest = hashlib.sha256(body).hexdigest()
        return ListRead(where=f"{sdist.filename}:{member.decode()}", body=body,
                        source=with_digest(f"{INDEX_PREFIX}#{sdist.filename}", sdist.sha256),
                        note=f"; read from {member.decode()} (sha256 {digest}) in that uv sdist")
