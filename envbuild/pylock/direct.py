"""Direct-URL wheels among a project's dependencies: ``name @ https://…/name-ver-tags.whl``.

Compiled extensions (flash-attn, PyG, kaolin …) are published as wheels per torch and CUDA build,
outside any index. envbuild locks such a wheel as it locks an index file: https only, a wheel file
named for the requirement's project, its sha256 in the pylock (uv fetches the file once to hash it
when the URL carries no ``#sha256=``, and checks it when it does), its tags checked against the
target's CPython and platform before anything is resolved. A torch or CUDA build named in the
wheel's local version label (``+cu12torch2.6cxx11abiFALSE``, ``+pt21cu121``) narrows the target's
stack: an extension built for torch 2.6 runs only beside torch 2.6, so the resolver picks a stack
it covers, or says why none fits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from envbuild.confine import WHEEL_NAME, quoted, token
from envbuild.errors import DataError, UsageError

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HOST = re.compile(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]")
_TORCH = re.compile(r"torch(\d+)\.(\d+)")  # flash-attn: +cu12torch2.6cxx11abiFALSE
_PT = re.compile(r"(?:^|[^a-z])pt(\d)(\d+)")  # PyG: +pt21cu121, +pt113cu117
_CUDA = re.compile(r"cu(\d\d)(\d?)(?!\d)")  # cu12, cu121, cu118
ARCHIVE_SUFFIXES = (".tar.gz", ".zip")  # a source archive by URL (envbuild/pylock/sources.py)
HINT = "name @ https://host/path/name-version-tags.whl, optionally with #sha256=<64 hex>"


@dataclass(frozen=True, slots=True, kw_only=True)
class DirectWheel:
    """One direct-URL wheel requirement, checked: its URL, file name, tags, and the torch and
    CUDA builds its local version label names (None: it names none)."""

    requirement: str
    name: str  # canonical
    url: str  # without the fragment
    filename: str
    sha256: str | None
    tags: frozenset[Tag]
    torch: str | None  # "2.6"
    cuda: str | None  # "12" or "12.1"


def is_direct(text: str) -> bool:
    """True when ``text`` is a PEP 508 requirement with a URL (``name @ url``)."""
    try:
        return Requirement(text).url is not None
    except InvalidRequirement:
        return False


def is_source(text: str) -> bool:
    """True for a ``name @ git+…`` requirement or one whose URL names a source archive."""
    try:
        url = Requirement(text).url
    except InvalidRequirement:
        return False
    if url is None:
        return False
    lowered = url.lower()
    return lowered.startswith("git+") or urlsplit(lowered).path.endswith(ARCHIVE_SUFFIXES)


def direct_wheel(text: str, where: str) -> DirectWheel:
    """``text`` (``name @ URL``) as a usable direct-URL wheel; else UsageError naming ``where``."""
    requirement = Requirement(text)
    assert requirement.url is not None
    parts = urlsplit(requirement.url)
    shown = quoted(text)
    if parts.scheme != "https":
        raise UsageError(f"{where}: direct URL requirement {shown} is not https",
                         hint="a wheel fetched over plain http could be swapped in transit: use https")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise UsageError(f"{where}: direct URL requirement {token(requirement.name)} carries credentials",
                         hint="a lock and an image must hold no credentials: serve the wheel without "
                              "them, or put it in a find-links directory")
    if not _HOST.fullmatch(parts.hostname or "") or parts.query or not parts.path.startswith("/"):
        raise UsageError(f"{where}: direct URL requirement {shown} is not a plain https URL", hint=HINT)
    filename = unquote(parts.path.rsplit("/", 1)[-1])
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        raise UsageError(f"{where}: direct URL requirement {shown} does not name a wheel (.whl)",
                         hint="envbuild installs wheels only; an sdist or a source archive needs "
                              "building: publish a wheel, build it into a find-links directory, or "
                              "unpack it into the project and name the directory (-e ./dir)") from None
    if not WHEEL_NAME.fullmatch(filename):
        raise UsageError(f"{where}: direct URL requirement {shown} has characters a wheel name never has",
                         hint=HINT)
    check_project(requirement, name, f"{where}: direct URL requirement {shown}", "a wheel")
    sha256 = _fragment_sha256(parts.fragment, where, shown)
    local = version.local or ""
    return DirectWheel(requirement=text, name=name, url=parts._replace(fragment="").geturl(),
                       filename=filename, sha256=sha256, tags=frozenset(tags),
                       torch=_torch_build(local), cuda=_cuda_build(local))


def check_project(requirement: Requirement, found: str, what: str, kind: str) -> None:
    """UsageError unless the file a URL names (``kind``: "a wheel") is one of the requirement's
    project (``found``: canonical) and the requirement has no version specifier beside it."""
    if found != canonicalize_name(requirement.name):
        raise UsageError(f"{what} is {kind} of {token(found)}, not of {token(requirement.name)}",
                         hint=f"name the project the {'wheel' if kind == 'a wheel' else 'file'} is for")
    if requirement.specifier:
        raise UsageError(f"{what} has both a URL and a version specifier",
                         hint="the URL fixes the version: drop the specifier")


def _fragment_sha256(fragment: str, where: str, shown: str) -> str | None:
    if not fragment:
        return None
    key, _, value = fragment.partition("=")
    if key != "sha256" or not _HEX64.fullmatch(value.lower()):
        raise UsageError(f"{where}: direct URL requirement {shown} has a fragment other than "
                         "#sha256=<64 hex>", hint=HINT)
    return value.lower()


def _torch_build(local: str) -> str | None:
    found = _TORCH.search(local)
    if found:
        return f"{int(found[1])}.{int(found[2])}"
    found = _PT.search(local)
    return f"{found[1]}.{int(found[2])}" if found else None


def _cuda_build(local: str) -> str | None:
    found = _CUDA.search(local)
    if found is None:
        return None
    return f"{int(found[1])}.{found[2]}" if found[2] else str(int(found[1]))


def direct_wheels(requirements: Iterable[str]) -> list[DirectWheel]:
    """The direct-URL wheels among ``requirements`` (already checked where they were read)."""
    return [direct_wheel(r, "dependency") for r in requirements if is_direct(r) and not is_source(r)]


def check_platform(wheels: Iterable[DirectWheel], supported: list[Tag], *, python: str,
                   platform: str) -> None:
    """UsageError for a wheel none of whose tags the target's CPython and platform install."""
    allowed = set(supported)
    for wheel in wheels:
        if not wheel.tags & allowed:
            tags = ", ".join(sorted(str(t) for t in wheel.tags))
            raise UsageError(f"{token(wheel.filename)} is for {token(tags)}, "
                             f"not for CPython {python} on {platform} or older",
                             hint="use the wheel built for this target's Python and platform")


# A direct wheel is read whole to hash it (compiled extensions are tens to hundreds of MB).
MAX_WHEEL_BYTES = 2 * 1024 ** 3
FETCH_TIMEOUT_S = 1800.0


def served_sha256(url: str, env: Mapping[str, str]) -> str:
    """The sha256 of the file at ``url``, fetched once (https only, redirects checked, a size cap
    and a deadline: envbuild's one HTTP client)."""
    from envbuild.upstream.http_client import HttpClient, HttpPolicy

    policy = HttpPolicy(total_timeout_s=FETCH_TIMEOUT_S, max_body_bytes=MAX_WHEEL_BYTES)
    return HttpClient(env=env, policy=policy).get(url).sha256


class Pinned(Protocol):
    """A file by URL: a direct wheel, or a source archive (envbuild/pylock/sources.py)."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def filename(self) -> str: ...
    @property
    def sha256(self) -> str | None: ...


def check_hashes(wheels: Iterable[Pinned], recorded: Mapping[str, str],
                 served: Callable[[str], str]) -> None:
    """DataError unless each file (a wheel, a source archive), fetched and hashed (``served``),
    has the sha256 the project pins (``#sha256=``) and the one uv recorded (``recorded``:
    {canonical name: sha256}). uv takes a URL's fragment as the file's hash without checking it
    (of a file in its cache), so envbuild checks."""
    for wheel in wheels:
        got = served(wheel.url)
        for what, expected in (("the project pins", wheel.sha256), ("uv recorded", recorded.get(wheel.name))):
            if expected is not None and expected != got:
                raise DataError(f"{token(wheel.filename)}: {what} sha256 {expected} but the file served "
                                f"at its URL has sha256 {got}",
                                hint="the file changed under the URL, or the pin is wrong: check with the "
                                     "publisher before changing the pin")


def stack_constraints(wheels: Iterable[DirectWheel]) -> tuple[list[str], list[str], list[str]]:
    """(torch specifiers, CUDA specs, the requirements they come from) that the wheels' local
    version labels impose on the stack: ``torch==2.6.*`` for a ``torch2.6`` build."""
    torch: list[str] = []
    cuda: list[str] = []
    origins: list[str] = []
    for wheel in wheels:
        if wheel.torch is not None:
            torch.append(f"=={wheel.torch}.*")
        if wheel.cuda is not None:
            cuda.append(wheel.cuda)
        if wheel.torch is not None or wheel.cuda is not None:
            origins.append(wheel.filename)
    return sorted(set(torch)), sorted(set(cuda)), origins
