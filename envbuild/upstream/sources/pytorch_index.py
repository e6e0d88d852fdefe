"""PyTorch's own wheel indexes: torch_variants rows (variant × CPython per release).

Each variant has a PEP 503 page, ``<base><variant>/torch/``; wheel file names are parsed
with ``packaging``. The variants read are those the data already names (torch_variants,
and the package index's default variant of each release, refreshed first) plus ``cpu``,
so a new CUDA variant is found as soon as a release on the package index uses it.
Local tags that are not a CUDA/CPU variant (``+rocm6.1``, ``+xpu``) are skipped.
"""

from __future__ import annotations

import html.parser
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuild.errors import DataError
from envbuild.smoke.rules import is_wheel_variant
from envbuild.upstream.sources import Context, Log, Row, SourceResult, cuda_minors, with_digest
from envbuild.upstream.torch_facts import FIRST_TORCH, LINUX_X86_64

DEFAULT_URL = "https://download.pytorch.org/whl/"


class _Links(html.parser.HTMLParser):
    """File names of a PEP 503 page: each anchor's href basename (the text may differ)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[str] = []
        self.anchors = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.anchors += 1
            self.files.append(unquote(urlsplit(href).path.rsplit("/", 1)[-1]))


def wheel_files(body: bytes, url: str) -> list[str]:
    """Wheel file names on a PEP 503 page; a page with no wheel link is not an index page."""
    parser = _Links()
    try:
        parser.feed(body.decode("utf-8"))
        parser.close()
    except UnicodeDecodeError as exc:
        raise DataError(f"{url} is not a PEP 503 page (not UTF-8: {exc})") from exc
    wheels = [name for name in parser.files if name.endswith(".whl")]
    if not wheels:
        raise DataError(f"{url} is not a PEP 503 index page: no wheel links",
                        hint="an error page served with 200? check the PyTorch index URL")
    return wheels


def cuda_of(variant: str) -> str | None:
    """``cu121`` → ``12.1``, ``cu118`` → ``11.8``, ``cpu`` → None."""
    if variant == "cpu":
        return None
    digits = variant[2:]
    return f"{int(digits[:2])}.{int(digits[2:])}"


def pythons_by_release(files: Iterable[str], variant: str, debug: Log | None = None
                       ) -> dict[Version, set[Version]]:
    """Final releases >= 1.13.0 → the CPython versions with a Linux x86_64 wheel of ``variant``."""
    found: dict[Version, set[Version]] = {}
    for name in files:
        try:
            _, version, _, tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        local = version.local or ""
        if local != variant:
            if debug is not None:
                debug(f"skipping {name}: local tag {local or 'none'!r} is not {variant}")
            continue
        release = Version(version.base_version)
        if version.pre or version.dev or version.post or release < FIRST_TORCH:
            continue
        for tag in tags:
            match = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
            if match and LINUX_X86_64.fullmatch(tag.platform) and not tag.abi.endswith("t"):
                found.setdefault(release, set()).add(Version(f"{match[1]}.{match[2]}"))
    return found


def variants_to_read(existing: Mapping[str, tuple[Row, ...]]) -> list[str]:
    named = {str(r["variant"]) for r in existing.get("torch_variants", ())}
    named |= {str(r["default_variant"]) for r in existing.get("torch_pypi", ())}
    named.add("cpu")
    return sorted(v for v in named if is_wheel_variant(v))


@dataclass(frozen=True, slots=True, kw_only=True)
class PytorchIndexSource:
    name: str = "pytorch"
    projects: frozenset[str] = frozenset({"torch"})
    base_url: str = DEFAULT_URL

    def collect(self, context: Context) -> SourceResult:
        base = self.base_url.rstrip("/") + "/"
        minors = cuda_minors(context.existing)
        rows: list[Row] = []
        for variant in variants_to_read(context.existing):
            rows.extend(self._variant_rows(base, variant, minors, context))
        return SourceResult(name=self.name, prefix=base, rows={"torch_variants": tuple(rows)})

    def _variant_rows(self, base: str, variant: str, minors: set[str], context: Context) -> list[Row]:
        page = context.fetch.document(urljoin(base, f"{variant}/torch/"))
        releases = pythons_by_release(wheel_files(page.body, page.url), variant, context.debug)
        context.progress(f"pytorch {variant}: {len(releases)} releases")
        cuda = cuda_of(variant)
        if cuda is not None and cuda not in minors:
            context.warn(f"pytorch {variant}: skipped, CUDA {cuda} is not in cuda_toolkits.yaml "
                             "(refresh the nvidia source first)")
            return []
        source = with_digest(page.url, page.sha256)
        return [
            {"torch": str(release), "variant": variant, "cuda": cuda,
             "python": [str(p) for p in sorted(pythons)], "source": source,
             "retrieved": context.retrieved,
             "note": "variant and CPython versions from the Linux x86_64 wheels on PyTorch's index"}
            for release, pythons in sorted(releases.items())
        ]
