"""A registry's tag list: cuda_images rows (nvidia/cuda tags per CUDA x.y.z × Ubuntu).

Reads ``<repository>/tags/list?n=1000`` (the OCI distribution API) and follows the
``Link: <...>; rel="next"`` header page by page. A registry that answers 401 with a
``Bearer`` challenge (Docker Hub, NGC) gets an anonymous pull token first.
Only Ubuntu tags of the form ``X.Y.Z[-cudnnN]-(base|runtime|devel)-ubuntuYY.MM`` count.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from envbuild.errors import DataError
from envbuild.upstream.sources import Context, Document, Row, SourceResult, cuda_minors, with_digest

DEFAULT_URL = "https://registry-1.docker.io/v2/nvidia/cuda/"
PAGE_SIZE = 1000
MAX_PAGES = 100
TAG = re.compile(r"(\d+\.\d+\.\d+)-(?:(cudnn\d*)-)?(base|runtime|devel)-ubuntu(\d+\.\d+)")
FLAVORS = ("base", "runtime", "devel")
NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def parse_tags(document: Document) -> list[str]:
    try:
        data: Any = json.loads(document.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{document.url} is not JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("tags"), list):
        raise DataError(f"{document.url}: field 'tags' missing or not a list (upstream format changed?)")
    return [t for t in data["tags"] if isinstance(t, str)]


def next_page(document: Document) -> str | None:
    match = NEXT.search(document.headers.get("Link", "") or "")
    return urljoin(document.url, match[1]) if match else None


def image_rows(tags: Iterable[str], minors: set[str], source: str, retrieved: str) -> list[Row]:
    """One row per (CUDA, Ubuntu) with the plain and cuDNN flavours its tags show."""
    plain: dict[tuple[str, str], set[str]] = {}
    cudnn: dict[tuple[str, str], dict[str, set[str]]] = {}
    for tag in tags:
        match = TAG.fullmatch(tag)
        if not match:
            continue
        cuda, cudnn_tag, flavor, ubuntu = match.groups()
        key = (cuda, ubuntu)
        plain.setdefault(key, set())
        if cudnn_tag:
            cudnn.setdefault(key, {}).setdefault(cudnn_tag, set()).add(flavor)
        else:
            plain[key].add(flavor)
    rows = []
    for key in sorted(plain, key=lambda k: (tuple(map(int, k[0].split("."))), k[1])):
        if ".".join(key[0].split(".")[:2]) not in minors:
            continue  # the validator needs the CUDA family in cuda_toolkits.yaml
        rows.append(_row(key, plain[key], cudnn.get(key, {}), source, retrieved))
    return rows


def _row(key: tuple[str, str], flavors: set[str], cudnn: dict[str, set[str]], source: str,
         retrieved: str) -> Row:
    row: Row = {"cuda": key[0], "ubuntu": key[1], "flavors": [f for f in FLAVORS if f in flavors],
                "cudnn_tag": None}
    if cudnn:
        name = sorted(cudnn)[-1]
        row["cudnn_tag"] = name
        row["cudnn_flavors"] = [f for f in FLAVORS[1:] if f in cudnn[name]]
    row |= {"source": source, "retrieved": retrieved,
            "note": "flavours seen in the registry's tag list on the retrieved date"}
    if len(cudnn) > 1:
        row["note"] += "; other cuDNN tags: " + ", ".join(sorted(cudnn)[:-1])
    return row


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryTagsSource:
    name: str = "tags"
    projects: frozenset[str] = frozenset({"images"})
    repository_url: str = DEFAULT_URL

    def collect(self, context: Context) -> SourceResult:
        base = self.repository_url.rstrip("/") + "/"
        first = urljoin(base, "tags/list?" + urlencode({"n": PAGE_SIZE}))
        tags, digest = self._all_tags(first, context)
        context.progress(f"tags: {len(tags)} tags")
        source = with_digest(first, digest)
        rows = image_rows(tags, cuda_minors(context.existing), source, context.retrieved)
        return SourceResult(name=self.name, prefix=base, rows={"cuda_images": tuple(rows)})

    def _all_tags(self, url: str, context: Context) -> tuple[list[str], str]:
        tags: list[str] = []
        pages = hashlib.sha256()
        headers: dict[str, str] = {}
        next_url: str | None = url
        for _ in range(MAX_PAGES):
            if next_url is None:
                return tags, pages.hexdigest()
            page = context.fetch.document(next_url, headers=headers, allow=frozenset({401}))
            if page.status == 401 and not headers:
                headers = {"Authorization": f"Bearer {self._token(page, context)}"}
                continue
            if page.status == 401:
                raise DataError(f"{next_url}: the registry refused the pull token (HTTP 401)")
            pages.update(page.body)
            tags.extend(parse_tags(page))
            next_url = next_page(page)
        raise DataError(f"{url}: more than {MAX_PAGES} pages of tags")

    def _token(self, page: Document, context: Context) -> str:
        """An anonymous pull token from the realm the 401's Bearer challenge names."""
        challenge = page.headers.get("WWW-Authenticate", "") or ""
        fields = dict(CHALLENGE.findall(challenge))
        realm = fields.pop("realm", "")
        if not challenge.lower().startswith("bearer") or not realm:
            raise DataError(f"{page.url}: HTTP 401 without a Bearer challenge",
                            hint="this registry needs credentials envbuild does not handle")
        if urlsplit(realm).scheme != urlsplit(page.url).scheme:
            raise DataError(f"{page.url}: token realm {realm} changes scheme; refused")
        reply = context.fetch.document(realm + "?" + urlencode(sorted(fields.items())))
        try:
            data = json.loads(reply.body)
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise DataError(f"{realm}: no token in the reply")
        return token
