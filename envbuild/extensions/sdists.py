"""Requirements built from their sdist (``build-sdists = ["flash-attn"]``): locked by the sdist's
sha256, built in the extensions stage against the lock's torch, installed as the built wheel.

``lock`` asks uv to take these packages (and only these) from their sdist (``--no-binary NAME``
beside ``--only-binary :all:``): uv reads the sdist's static metadata and records its URL and
sha256 in the pylock as for any file. The image's build stage then builds each with the venv's
pip (``pip wheel --no-deps --no-build-isolation --require-hashes``): the file is fetched and
checked against the pylock's sha256, and built against the torch installed from the lock.

A lock and its pylock may come from a pull request: each name must be one the lock declares,
its pylock entry an sdist named ``{name}-{version}.tar.gz`` (or ``.zip``) at a plain http(s) URL
(a local sdist is refused: serve it from an index or a find-links URL), and the line written
for pip cannot carry an option.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from packaging.utils import InvalidSdistFilename, parse_sdist_filename

from envbuild.confine import CANONICAL_NAME, quoted, token
from envbuild.errors import DataError, UsageError
from envbuild.extensions.classify import Recorded, classify
from envbuild.pylock.files import Pylock, PylockPackage
from envbuild.pylock.install import is_remote_url

FILE = "sdists.txt"  # under requirements/: the hash-pinned sdists the stage builds


def _sdist_of(package: PylockPackage, where: str) -> str:
    """The hash-pinned requirement line for ``package``'s sdist."""
    sdist = package.sdist
    if sdist is None or package.wheels or package.direct:
        raise UsageError(f"{where}: {token(package.name)} is not locked as an sdist alone",
                         hint="run 'envbuild lock': a build-sdists package is locked by its sdist")
    try:
        name, version = parse_sdist_filename(sdist.filename)
    except InvalidSdistFilename:
        raise UsageError(f"{where}: {quoted(sdist.filename)} is not named like an sdist",
                         hint="lock again: uv writes NAME-VERSION.tar.gz") from None
    if name != package.name or str(version) != package.version \
            or not re.fullmatch(r"[A-Za-z0-9_.+!-]+\.(?:tar\.gz|zip)", sdist.filename, re.ASCII):
        raise UsageError(f"{where}: {quoted(sdist.filename)} is not the sdist of "
                         f"{token(package.name)} {token(package.version)}")
    if sdist.is_local:
        raise UsageError(f"{where}: the sdist of {token(package.name)} is a local file",
                         hint="serve it from an index or a find-links URL: the build stage fetches "
                              "it by URL, checked against its sha256")
    assert sdist.url is not None
    if not is_remote_url(sdist.url) or sdist.url.rsplit("/", 1)[-1].split("#")[0] == "":
        raise UsageError(f"{where}: the url of {quoted(sdist.filename)} is not a plain http(s) URL",
                         hint="lock again: uv writes only such URLs")
    return f"{package.name} @ {sdist.url} --hash=sha256:{sdist.sha256}"


def sdist_requirements(pylock: Pylock, names: Iterable[str]) -> str:
    """``name @ URL --hash=sha256:HEX`` for each sdist ``names`` declares, sorted."""
    lines = []
    for name in sorted(set(names)):
        package = pylock.package(name)
        lines.append(_sdist_of(package, f"pylock: {token(name)}"))
    return "".join(f"{line}\n" for line in lines)


def sdist_sha256(pylock: Pylock, name: str) -> str:
    """The locked sdist's sha256: the source half of its build's cache key."""
    sdist = pylock.package(name).sdist
    if sdist is None:
        raise UsageError(f"pylock: {token(name)} has no sdist", hint="run 'envbuild lock'")
    return sdist.sha256


def check_lock_sdists(names: Sequence[str], packages: Iterable[str]) -> None:
    """A lock's ``sdists``: canonical names, sorted, each once, each a locked package."""
    if list(names) != sorted(set(names)) or any(not CANONICAL_NAME.fullmatch(n) for n in names):
        raise UsageError("lock 'sdists' must be sorted canonical distribution names, each once",
                         hint="re-create the lock")
    missing = sorted(set(names) - set(packages))
    if missing:
        raise UsageError(f"lock 'sdists' names {token(missing[0])}, which the lock's packages lack",
                         hint="re-create the lock")


MAX_SDIST_BYTES = 512 * 1024 ** 2
FETCH_TIMEOUT_S = 900.0
Fetch = Callable[[str], bytes]


def classify_locked(pylock: Pylock, names: Iterable[str], *, env: Mapping[str, str], offline: bool,
                    previous: Mapping[str, tuple[str, Recorded]] = {},
                    fetch: Fetch | None = None) -> tuple[tuple[Recorded, ...], list[str]]:
    """Each sdist's kind (envbuild/extensions/classify.py) and a line saying it: the file fetched
    by the pylock's URL and checked against its sha256 (DataError, exit 4, when it differs), or
    the previous lock's kind for the same sha256. A git source, a local file and, offline, an sdist
    not classified before are native: built in the extensions stage, as before there were kinds."""
    get = fetch or _fetcher(env)
    kinds: list[Recorded] = []
    said: list[str] = []
    for name in sorted(set(names)):
        package = pylock.package(name)
        sdist = package.sdist
        if package.vcs is not None or sdist is None or sdist.is_local or sdist.url is None:
            kinds.append(Recorded(name=name, pure=False))
            said.append(f"{name}: built in the extensions stage (a git source or local file)")
            continue
        before = previous.get(name)
        if before is not None and before[0] == sdist.sha256:
            kind, why = before[1], "as the previous lock classified the same sdist"
        elif offline:
            kind, why = Recorded(name=name, pure=False), "--offline: not fetched to be classified"
        else:
            import hashlib  # only where an sdist is fetched: lock starts uv before OpenSSL loads

            data = get(sdist.url)
            served = hashlib.sha256(data).hexdigest()
            if served != sdist.sha256:
                raise DataError(f"{token(sdist.filename)}: the pylock records sha256 {sdist.sha256} but the "
                                f"file served has {served}",
                                hint="the index changed the file: check it, then lock again")
            found = classify(data, sdist.filename)
            kind, why = Recorded(name=name, pure=found.pure, requires=found.requires), found.why
        kinds.append(kind)
        stage = "without torch (pure Python)" if kind.pure else "in the extensions stage"
        said.append(f"{name}: built {stage}: {why}")
    return tuple(kinds), said


def _fetcher(env: Mapping[str, str]) -> Fetch:
    from envbuild.upstream.http_client import HttpClient, HttpPolicy

    client = HttpClient(env=env, policy=HttpPolicy(total_timeout_s=FETCH_TIMEOUT_S,
                                                   max_body_bytes=MAX_SDIST_BYTES))
    return lambda url: client.get(url).body


def pure_names(kinds: Iterable[Recorded]) -> list[str]:
    return sorted(k.name for k in kinds if k.pure)
