"""Check that the index itself gave the sha256 of every file in a closure.

uv records a hash for every file of a pylock; where the index gave none it downloads the
file and hashes what it received, which proves nothing about the file. envbuild refuses
that: for every file uv took from an http(s) index, the project's page on that index
(PEP 691 JSON, or PEP 503 HTML) must list the file with the same sha256. Local files
(find-links directories, ``file://`` indexes) are the user's own and are not checked.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urljoin, urlsplit

from envbuild.errors import DataError, UsageError
from envbuild.fs import write_file
from envbuild.redact import redact, strip_credentials

if TYPE_CHECKING:  # the pylock's module too: read once uv's closure run has started (uv.py)
    from concurrent.futures import Future, ThreadPoolExecutor

    from envbuild.pylock.files import Pylock, PylockFile, PylockPackage
    from envbuild.upstream.http_client import HttpClient

ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
WORKERS = 8
_SHA256_FRAGMENT = re.compile(r"(?:^|&)sha256=([0-9a-fA-F]{64})(?:&|$)")


def _hrefs(html: str) -> list[str]:
    """Every link's href on an HTML page (html.parser is read here: most indexes answer JSON)."""
    from html.parser import HTMLParser

    hrefs: list[str] = []

    class Links(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "a":
                href = dict(attrs).get("href")
                if href:
                    hrefs.append(href)

    Links().feed(html)
    return hrefs


def page_hashes(body: bytes, content_type: str, page_url: str) -> dict[str, str | None]:
    """{file name: sha256 or None} from one project page of a simple index."""
    found: dict[str, str | None] = {}
    if "json" in content_type:
        try:
            data = json.loads(body)
            files = data["files"]
            for entry in files:
                sha = entry.get("hashes", {}).get("sha256")
                found[str(entry["filename"])] = sha.lower() if isinstance(sha, str) else None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"index page {redact(page_url)} is not a simple API JSON page ({exc})") from exc
        return found
    for href in _hrefs(body.decode("utf-8", "replace")):
        parts = urlsplit(urljoin(page_url, href))
        match = _SHA256_FRAGMENT.search(parts.fragment)
        found[unquote(parts.path.rsplit("/", 1)[-1])] = match[1].lower() if match else None
    return found


def check_index_hashes(pylock: Pylock, index_of: Callable[[str], str], *, env: Mapping[str, str],
                       timeout: float) -> None:
    """DataError unless every http(s) file of ``pylock`` is listed with its sha256 on the page
    of its package on index ``index_of(name)``. Files the page does not list came from
    elsewhere (a find-links page) and are let through."""
    with IndexPages(index_of, env=env, timeout=timeout) as pages:
        pages.check(pylock)


class IndexPages:
    """The project pages the check reads, each fetched once, on a pool of threads.

    ``prefetch`` starts fetching pages (or reading what a page gave before) as soon as their
    names are known (the stack's pins and the project's requirements as uv starts; for a fresh
    lock each release uv selects, as its resolver's log says so while it runs), so that most
    pages are in when ``check`` gets the closure: the check then waits only for the pages
    nobody could name in advance. A page fetched for a name the closure does not hold is never
    read, and its failure is no error."""

    def __init__(self, index_of: Callable[[str], str], *, env: Mapping[str, str], timeout: float) -> None:
        from envbuild.data.matrix import cache_directory

        self._index_of = index_of
        self._seen = _Seen(cache_directory(env))
        self._env = env
        self._timeout = timeout
        self._client: HttpClient | None = None  # made (requests imported) for the first page read
        self._pool: ThreadPoolExecutor | None = None  # made for the first page read
        self._pages: dict[str, Future[tuple[str, dict[str, str | None]]]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> IndexPages:
        return self

    def __exit__(self, *_: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def prefetch(self, names: Iterable[str]) -> None:
        """Start fetching the pages of ``names`` (canonical project names) not asked for yet."""
        for name in names:
            remote = urlsplit(self._index_of(name)).scheme in ("http", "https")
            if remote and not self._seen.known(self._url(name)):
                self._page(name)

    def _url(self, name: str) -> str:
        return urljoin(self._index_of(name).rstrip("/") + "/", f"{name}/")

    def _page(self, name: str) -> Future[tuple[str, dict[str, str | None]]]:
        with self._lock:
            if name not in self._pages:
                if self._pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._pool = ThreadPoolExecutor(max_workers=WORKERS)
                self._pages[name] = self._pool.submit(self._fetch, name)
            return self._pages[name]

    def _fetch(self, name: str) -> tuple[str, dict[str, str | None]]:
        page = self._url(name)
        reply = self._http().get(page, {"Accept": ACCEPT}, allow=frozenset({404}))
        if reply.status == 404:  # not on that index at all: its files came from a find-links page
            return page, {}
        return page, page_hashes(reply.body, reply.headers.get("Content-Type", ""), reply.url)

    def _http(self) -> HttpClient:
        with self._lock:
            if self._client is None:
                from envbuild.upstream.http_client import HttpClient, HttpPolicy

                self._client = HttpClient(env=self._env, policy=HttpPolicy(total_timeout_s=self._timeout))
            return self._client

    def check(self, pylock: Pylock) -> None:
        """See :func:`check_index_hashes`."""
        # A direct-URL wheel is on no index: uv hashed the file it fetched (and checked a #sha256=).
        # A git source or an archive by URL is on none either (its commit, or the sha256 checked).
        work = [p for p in pylock.packages if not p.direct and not p.built
                and any(not f.is_local for f in (*p.wheels, *([p.sdist] if p.sdist else [])))]
        work = [p for p in work if urlsplit(self._index_of(p.name)).scheme in ("http", "https")]
        # A page that gave every file's sha256 before need not be read again (see _Seen).
        work = [p for p in work if not self._seen.gave(self._url(p.name), _remote(p))]
        futures = [self._page(p.name) for p in work]  # every missing page asked for at once
        for package, future in zip(work, futures, strict=True):
            page, listed = future.result()
            _check_package(package, page, listed)
            self._seen.add(page, {f.filename: f.sha256 for f in _remote(package)
                                  if listed.get(f.filename) == f.sha256})


def _remote(package: PylockPackage) -> list[PylockFile]:
    return [f for f in (*package.wheels, *([package.sdist] if package.sdist else [])) if not f.is_local]


class _Seen:
    """The sha256s index pages were seen to give, page by page, in
    ``$XDG_CACHE_HOME/envbuild/index-hashes/`` (none with ENVBUILD_NO_CACHE).

    What the check proves is that the index published a file's sha256; once seen, that stays
    true of those bytes: a lock that records the same file with the same sha256 pins the same
    bytes the index vouched for. A file recorded with another sha256 (the index replaced it)
    is not in here, and its page is read again. Each page is one JSON file named by the sha256
    of its URL without credentials; a file that cannot be read is an empty record."""

    def __init__(self, cache: Path | None) -> None:
        self._root = None if cache is None else cache / "index-hashes"
        self._pages: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def _path(self, page: str) -> Path | None:
        if self._root is None:
            return None
        import hashlib  # first read beside uv's closure run: lock starts uv before OpenSSL loads

        return self._root / (hashlib.sha256(strip_credentials(page).encode("utf-8")).hexdigest() + ".json")

    def _read(self, page: str) -> dict[str, str]:
        with self._lock:
            if page not in self._pages:
                self._pages[page] = _read_seen(self._path(page))
            return self._pages[page]

    def known(self, page: str) -> bool:
        return bool(self._read(page))

    def gave(self, page: str, files: list[PylockFile]) -> bool:
        seen = self._read(page)
        return bool(files) and all(seen.get(f.filename) == f.sha256 for f in files)

    def add(self, page: str, files: dict[str, str]) -> None:
        path = self._path(page)
        seen = self._read(page)
        if path is None or all(seen.get(n) == h for n, h in files.items()):
            return
        seen.update(files)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"format": 1, "files": seen}, sort_keys=True)
            write_file(path, text.encode("utf-8"), sync=False)
        except (OSError, UsageError):
            pass  # a cache that cannot be written only costs the next lock the page


def _read_seen(path: Path | None) -> dict[str, str]:
    from envbuild.pylock.files import SHA256

    if path is None:
        return {}
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("format") == 1 else None
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items()
            if isinstance(k, str) and isinstance(v, str) and SHA256.fullmatch(v)}


def _check_package(package: PylockPackage, page: str, listed: dict[str, str | None]) -> None:
    for file in (*package.wheels, *([package.sdist] if package.sdist else [])):
        if file.is_local or file.filename not in listed:
            continue
        given = listed[file.filename]
        if given is None:
            raise DataError(
                f"the index gives no sha256 for {file.filename} ({redact(page)})",
                hint="envbuild pins only files whose hash the index publishes: use an index "
                     "that gives hashes, or put the wheel in a find-links directory")
        if given != file.sha256:
            raise DataError(
                f"{file.filename}: uv recorded sha256 {file.sha256} but the index "
                f"({redact(page)}) gives {given}",
                hint="the index changed under the lock, or a cache is stale: lock again")
