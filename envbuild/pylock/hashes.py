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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from urllib.parse import unquote, urljoin, urlsplit

from envbuild.errors import DataError
from envbuild.pylock.files import Pylock
from envbuild.redact import redact
from envbuild.upstream.http_client import HttpClient, HttpPolicy

ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
WORKERS = 8
_SHA256_FRAGMENT = re.compile(r"(?:^|&)sha256=([0-9a-fA-F]{64})(?:&|$)")


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


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
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    for href in parser.hrefs:
        parts = urlsplit(urljoin(page_url, href))
        match = _SHA256_FRAGMENT.search(parts.fragment)
        found[unquote(parts.path.rsplit("/", 1)[-1])] = match[1].lower() if match else None
    return found


def check_index_hashes(pylock: Pylock, index_of: Callable[[str], str], *, env: Mapping[str, str],
                       timeout: float) -> None:
    """DataError unless every http(s) file of ``pylock`` is listed with its sha256 on the page
    of its package on index ``index_of(name)``. Files the page does not list came from
    elsewhere (a find-links page) and are let through."""
    # A direct-URL wheel is on no index: uv hashed the file it fetched (and checked a #sha256=).
    work = [p for p in pylock.packages if not p.direct
            and any(not f.is_local for f in (*p.wheels, *([p.sdist] if p.sdist else [])))]
    work = [p for p in work if urlsplit(index_of(p.name)).scheme in ("http", "https")]
    if not work:
        return
    client = HttpClient(env=env, policy=HttpPolicy(total_timeout_s=timeout))

    def fetch(name: str) -> tuple[str, dict[str, str | None]]:
        page = urljoin(index_of(name).rstrip("/") + "/", f"{name}/")
        reply = client.get(page, {"Accept": ACCEPT}, allow=frozenset({404}))
        if reply.status == 404:  # not on that index at all: its files came from a find-links page
            return page, {}
        return page, page_hashes(reply.body, reply.headers.get("Content-Type", ""), reply.url)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        pages = list(pool.map(fetch, [p.name for p in work]))
    for package, (page, listed) in zip(work, pages, strict=True):
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
