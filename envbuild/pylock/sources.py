"""Direct sources that are built, not installed: ``name @ git+https://host/repo.git@REV`` (a git
repository, locked by commit) and ``name @ https://host/path/name-1.0.tar.gz[#sha256=HEX]`` (a
source archive by URL, locked by its sha256).

uv resolves both (it reads their static metadata, or builds it) and records them in the pylock as
PEP 751 says: ``vcs = {type = "git", url, requested-revision, commit-id}`` (a branch or tag, or no
revision at all, the commit the default branch points at, resolved when ``lock`` runs) and
``archive = {url, hashes.sha256}``. The image's build stage builds each into a wheel beside the
extensions: a checkout of exactly the recorded commit (``git rev-parse HEAD`` checked), or the
archive fetched by pip and checked against its sha256 (as a build-sdists sdist); the wheels are
recorded like the sdists' (envbuild.built.json).

Credentials in a URL are refused where the requirement is read, never echoed: a lock, a pylock
and an image hold none. http is allowed for git (the commit id names the content) and for an
archive that pins its ``#sha256=``; uv takes that pin unchecked, so ``lock`` fetches the file and
checks it (``envbuild.pylock.direct.check_hashes``, as for a wheel).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from packaging.requirements import Requirement
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename

from envbuild.confine import quoted, token
from envbuild.errors import UsageError
from envbuild.pylock.direct import check_project, is_source

GIT_SCHEMES = ("git+https", "git+http")
COMMIT = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HOST = re.compile(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]")
_PATH = re.compile(r"/[A-Za-z0-9._~/%+-]*")  # what a shell-quoted URL in the Dockerfile may hold
_REV = re.compile(r"[A-Za-z0-9._/+-]{1,200}")
_EGG = re.compile(r"egg=[A-Za-z0-9._-]+")
HINT_GIT = "name @ git+https://host/repo.git@TAG-BRANCH-OR-COMMIT"
HINT_ARCHIVE = "name @ https://host/path/name-1.0.tar.gz, optionally with #sha256=<64 hex>"


@dataclass(frozen=True, slots=True)
class GitRequirement:
    name: str  # canonical
    url: str  # https://host/repo.git (no git+, no revision)
    revision: str | None


@dataclass(frozen=True, slots=True)
class ArchiveRequirement:
    name: str  # canonical
    url: str  # without the fragment
    filename: str
    sha256: str | None


def _plain(url: str, schemes: tuple[str, ...], where: str, shown: str, hint: str) -> tuple[str, str, str]:
    """(scheme, host[:port], path) of a URL with no credentials, query or odd characters."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in schemes:
        raise UsageError(f"{where}: direct requirement {shown} is not {' or '.join(schemes)}", hint=hint)
    if "@" in parts.netloc:
        # the URL itself is never echoed: it holds a secret
        raise UsageError(f"{where}: the URL of a direct requirement carries credentials",
                         hint="a lock, a pylock and an image must hold no credentials: serve it without "
                              "them, or check it out into the project (-e ./dir)")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if not _HOST.fullmatch(parts.hostname or "") or parts.query or port == -1 \
            or not _PATH.fullmatch(parts.path):
        raise UsageError(f"{where}: direct requirement {shown} is not a plain URL", hint=hint)
    return parts.scheme.lower(), parts.netloc, parts.path


def git_requirement(text: str, where: str) -> GitRequirement:
    """``name @ git+https://host/repo.git[@REV][#egg=name]`` checked; else UsageError naming ``where``."""
    requirement = Requirement(text)
    assert requirement.url is not None
    shown = quoted(text) if "@" not in urlsplit(requirement.url).netloc else token(requirement.name)
    url, _, fragment = requirement.url.partition("#")
    if fragment and not _EGG.fullmatch(fragment):
        raise UsageError(f"{where}: git requirement {shown} has a fragment other than #egg=name",
                         hint="a subdirectory of a repository is not built: " + HINT_GIT)
    revision: str | None = None
    path = urlsplit(url).path
    if "@" in path:
        revision = path.rpartition("@")[2]
        url = url[:len(url) - len(revision) - 1]
        if not _REV.fullmatch(revision) or revision.startswith("-"):
            raise UsageError(f"{where}: git requirement {shown} names an unusable revision", hint=HINT_GIT)
    scheme, netloc, path = _plain(url, GIT_SCHEMES, where, shown, HINT_GIT)
    if requirement.specifier:
        raise UsageError(f"{where}: git requirement {shown} has both a URL and a version specifier",
                         hint="the commit fixes the version: drop the specifier")
    return GitRequirement(name=canonicalize_name(requirement.name),
                          url=f"{scheme.removeprefix('git+')}://{netloc}{path}", revision=revision)


def archive_requirement(text: str, where: str) -> ArchiveRequirement:
    """``name @ https://host/path/name-1.0.tar.gz[#sha256=HEX]`` checked; else UsageError."""
    requirement = Requirement(text)
    assert requirement.url is not None
    url, _, fragment = requirement.url.partition("#")
    shown = quoted(text) if "@" not in urlsplit(url).netloc else token(requirement.name)
    sha256 = None
    if fragment:
        key, _, value = fragment.partition("=")
        if key != "sha256" or not _HEX64.fullmatch(value.lower()):
            raise UsageError(f"{where}: source archive {shown} has a fragment other than #sha256=<64 hex>",
                             hint=HINT_ARCHIVE)
        sha256 = value.lower()
    scheme, _, path = _plain(url, ("https", "http"), where, shown, HINT_ARCHIVE)
    if scheme == "http" and sha256 is None:
        raise UsageError(f"{where}: source archive {shown} is fetched over plain http with no #sha256=",
                         hint="use https, or pin the file: add #sha256=<64 hex> to the URL")
    filename = unquote(path.rsplit("/", 1)[-1])
    try:
        name, _ = parse_sdist_filename(filename)
    except InvalidSdistFilename:
        raise UsageError(f"{where}: source archive {shown} is not named NAME-VERSION.tar.gz (or .zip)",
                         hint=HINT_ARCHIVE) from None
    check_project(requirement, name, f"{where}: source archive {shown}", "one")
    return ArchiveRequirement(name=name, url=url, filename=filename, sha256=sha256)


def check_source(text: str, where: str) -> None:
    """A git or source-archive requirement, checked (UsageError naming ``where``)."""
    url = Requirement(text).url or ""
    if url.lower().startswith("git+"):
        git_requirement(text, where)
    else:
        archive_requirement(text, where)


def archives(requirements: Iterable[str]) -> list[ArchiveRequirement]:
    return [archive_requirement(r, "dependency") for r in requirements
            if is_source(r) and not (Requirement(r).url or "").lower().startswith("git+")]


@dataclass(frozen=True, slots=True)
class VcsSource:
    """A pylock package's ``vcs`` table: a git repository at one commit."""

    url: str
    commit: str
    requested: str | None


def pylock_vcs(entry: object, name: str, where: str) -> VcsSource:
    """A pylock ``vcs`` table as envbuild builds it: git, a plain http(s) URL without
    credentials, a 40-hex commit id; else UsageError (a pylock may come from a pull request)."""
    if not isinstance(entry, dict) or entry.get("type") != "git":
        raise UsageError(f"pylock: {where}.vcs: {token(name)} is not a git source",
                         hint="envbuild builds git sources only")
    url, commit, requested = entry.get("url"), entry.get("commit-id"), entry.get("requested-revision")
    if not isinstance(url, str) or not isinstance(commit, str) or not COMMIT.fullmatch(commit) \
            or (requested is not None and (not isinstance(requested, str) or not _REV.fullmatch(requested))):
        raise UsageError(f"pylock: {where}.vcs: {token(name)} needs a url and a 40-hex commit-id",
                         hint="lock again: uv records the commit")
    _plain(url, ("https", "http"), f"pylock: {where}.vcs", token(name), HINT_GIT)
    return VcsSource(url=url, commit=commit, requested=requested)
