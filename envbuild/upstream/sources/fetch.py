"""Fetching for refresh: one HTTP client, an ETag cache, an immutable-document cache, offline mode.

The ETag cache lives in ``$XDG_CACHE_HOME/envbuild/refresh/``: for each URL the last body
and its ETag. A 304 answer serves the cached body, so an unchanged upstream costs one
small request. ``--offline`` serves only from the cache and never opens a socket.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from requests.structures import CaseInsensitiveDict

from envbuild.errors import DataError
from envbuild.fs import write_file
from envbuild.redact import strip_credentials
from envbuild.upstream.http_client import HttpClient
from envbuild.upstream.sources import Document

# Headers a source reads from a reply and the cache must keep with the body.
KEPT_HEADERS = ("Content-Type", "Link")


class Fetcher:
    def __init__(self, client: HttpClient | None, *, cache_dir: Path | None, offline: bool) -> None:
        self.client = client
        self.cache_dir = cache_dir
        self.offline = offline
        self.cache_hits = 0

    @property
    def bytes_received(self) -> int:
        return self.client.bytes_received if self.client else 0

    @property
    def requests_made(self) -> int:
        return self.client.requests_made if self.client else 0

    def document(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        allow: frozenset[int] = frozenset(),
    ) -> Document:
        cached = self._read_cached(url)
        if self.offline or self.client is None:
            if cached is None:
                raise DataError(f"offline, and {url} is not in the refresh cache",
                                hint="run once without --offline to fill the cache")
            return cached
        sent = dict(headers or {})
        etag = cached.headers.get("ETag") if cached else None
        if etag:
            sent["If-None-Match"] = etag
        reply = self.client.get(url, sent, allow=allow | {304} if etag else allow)
        if reply.status == 304 and cached is not None:
            self.cache_hits += 1
            return cached
        if reply.status == 200 and reply.headers.get("ETag"):
            self._write_cached(url, reply, str(reply.headers["ETag"]))
        return reply

    def immutable(self, key: str, produce: Callable[[], bytes]) -> bytes:
        """Bytes that never change for ``key`` (a wheel's METADATA): cached without revalidation."""
        path = self._path(key, ".immutable")
        if path is not None and path.is_file():
            self.cache_hits += 1
            return path.read_bytes()
        if self.offline or self.client is None:
            raise DataError(f"offline, and {key} is not in the refresh cache",
                            hint="run once without --offline to fill the cache")
        data = produce()
        if path is not None:
            _write_cache(path, data)
        return data

    # --- cache files ----------------------------------------------------------------------

    def _path(self, key: str, suffix: str) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + suffix)

    def _read_cached(self, url: str) -> Document | None:
        meta_path, body_path = self._path(url, ".json"), self._path(url, ".body")
        if meta_path is None or body_path is None:
            return None
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            body = body_path.read_bytes()
        except (OSError, ValueError):
            return None
        # A body that no longer matches its recorded hash is ignored, never trusted.
        if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(body).hexdigest():
            return None
        headers = CaseInsensitiveDict({k: str(v) for k, v in dict(meta.get("headers") or {}).items()})
        # The cache records URLs without credentials: the document's own URL, when it was not
        # redirected, is the one asked for now, credentials and all (relative links need them).
        final = str(meta.get("final_url") or "")
        return Document(url=url if final in ("", strip_credentials(url)) else final, status=200,
                        headers=headers, body=body, cached=True)

    def _write_cached(self, url: str, document: Document, etag: str) -> None:
        meta_path, body_path = self._path(url, ".json"), self._path(url, ".body")
        if meta_path is None or body_path is None:
            return
        headers = {k: document.headers[k] for k in KEPT_HEADERS if k in document.headers}
        meta = {"url": strip_credentials(url), "final_url": strip_credentials(document.url),
                "sha256": document.sha256,
                "headers": {**headers, "ETag": etag}}
        _write_cache(body_path, document.body)
        _write_cache(meta_path, json.dumps(meta, sort_keys=True).encode())


def _write_cache(path: Path, data: bytes) -> None:
    """A cache write: best effort (an unwritable cache must not fail a refresh), not synced
    (a cache lost in a crash is refetched)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, data, sync=False)
    except OSError:
        pass
