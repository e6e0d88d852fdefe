"""What a wheels-only closure cannot lock, or holds back: read from a second uv run that may
take sdists.

``lock`` resolves wheels only (``--only-binary :all:``), so a requirement the index has only
as an sdist either stops the run (uv names one such package per run) or, where an older
release had a wheel, is silently resolved to that older release (rouge-score 0.1.2, an
sdist, became 0.0.4 of 2020). envbuild writes no resolver: uv resolves the same project a
second time with sdists allowed (the *survey*), and this module compares the two answers:

- :func:`sdist_only`: every package of the survey whose chosen release has an sdist and no
  wheel for the target's platform (uv's pylock lists only the wheels that fit it), each with
  the chain of requirements it comes from (uv's ``# via`` annotations);
- :func:`held_back`: every package the wheels-only closure locks at an older version than
  the survey's, which is the newest the requirements allow (the survey keeps no previous pin;
  a previous pin the lock kept is no downgrade, unless the newer release is an sdist only).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuild.pylock.files import Pylock

PROJECT = "the project"
_REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_VIA_ONE = re.compile(r"\s+# via (.+)")
_VIA_MORE = re.compile(r"\s+#   (.+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class SdistOnly:
    """A package of the closure that only an sdist provides for the platform."""

    name: str
    version: str
    via: tuple[str, ...]  # the requirement chain up to the project: ("omegaconf", "hydra-core")

    def shown(self) -> str:
        return f"{self.name} {self.version} ({origin(self.via)})"


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldBack:
    """A package locked older than the newest its requirements allow, because that newest (or
    something it needs) is an sdist only."""

    name: str
    locked: str
    newest: str
    sdist_only: bool  # the newest release itself has no wheel for the platform
    via: tuple[str, ...]

    def shown(self) -> str:
        why = "which is an sdist only" if self.sdist_only else "which needs an sdist-only package"
        return f"{self.name} {self.locked} locked, not {self.newest} ({why}; {origin(self.via)})"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "locked": self.locked, "newest": self.newest,
                "newest_sdist_only": self.sdist_only, "via": list(self.via)}


def origin(via: tuple[str, ...]) -> str:
    """"the project" for a direct requirement, else "via a ← b ← the project"."""
    return PROJECT if not via else "via " + " ← ".join((*via, PROJECT))


def parse_annotated(text: str, project: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{canonical name: (version, the names that require it)} from uv's annotated
    requirements.txt; the generated project (``project``) is left out of the requirers."""
    found: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        requirement = _REQUIREMENT.fullmatch(line.strip()) if not line.startswith(" ") else None
        if requirement is not None:
            current = str(canonicalize_name(requirement[1]))
            found[current] = (requirement[2], [])
            continue
        via = _VIA_ONE.fullmatch(line) or _VIA_MORE.fullmatch(line)
        if current is not None and via is not None:
            parent = via[1].split(" ", 1)[0]
            if parent and parent != project and not parent.startswith("-"):  # "-c held.txt": a constraint
                found[current][1].append(str(canonicalize_name(parent)))
    return {name: (version, tuple(parents)) for name, (version, parents) in found.items()}


def chain(name: str, parents: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The first requirer of ``name``, its first requirer, … up to the project (no loop)."""
    found: list[str] = []
    current = name
    while parents.get(current) and len(found) < 32:
        current = parents[current][0]
        if current in found or current == name:
            break
        found.append(current)
    return tuple(found)


def sdist_only(survey: Pylock, annotated: Mapping[str, tuple[str, tuple[str, ...]]]) -> list[SdistOnly]:
    """Every package of the survey's pylock locked by an sdist alone, with its chain."""
    parents = {name: requirers for name, (_, requirers) in annotated.items()}
    return [SdistOnly(name=p.name, version=p.version, via=chain(p.name, parents))
            for p in sorted(survey.packages, key=lambda p: p.name)
            if p.sdist is not None and not p.wheels and not p.direct]


def held_back(locked: Mapping[str, str], survey: Pylock,
              annotated: Mapping[str, tuple[str, tuple[str, ...]]],
              kept: Mapping[str, str] | None = None) -> list[HeldBack]:
    """The packages ``locked`` (wheels only) holds at an older version than the survey's. A
    previous pin uv kept (``kept``: {name: version}) is no downgrade, unless the newer release
    is an sdist only, which no wheels-only lock would ever reach."""
    parents = {name: requirers for name, (_, requirers) in annotated.items()}
    found: list[HeldBack] = []
    for package in sorted(survey.packages, key=lambda p: p.name):
        mine = locked.get(package.name)
        if mine is None or not _older(mine, package.version):
            continue
        if (kept or {}).get(package.name) == mine and (package.sdist is None or package.wheels):
            continue
        found.append(HeldBack(name=package.name, locked=mine, newest=package.version,
                              sdist_only=package.sdist is not None and not package.wheels,
                              via=chain(package.name, parents)))
    return found


def _older(mine: str, newest: str) -> bool:
    try:
        return Version(mine) < Version(newest)
    except InvalidVersion:
        return False


def names_hint(found: list[SdistOnly], listed: tuple[str, ...] = ()) -> str:
    """The project keys that build them: ``build-sdists = true`` or the list of names (with
    those ``listed`` in it already)."""
    names = ", ".join(f'"{name}"' for name in sorted({*listed, *(s.name for s in found)}))
    return (f"to build them from their sdists (against the locked torch), add build-sdists = true (every "
            f"package only an sdist provides) or build-sdists = [{names}] to the project "
            "(docs/extensions.md)")


# --- the survey from uv's cache (envbuild/pylock/uv.py's _survey_after) -------------------


def pinned_versions(text: str) -> dict[str, str] | None:
    """{canonical name: version} of uv's requirements.txt output without annotations; None
    where a line is not ``NAME==VERSION`` (a URL, a marker): such an answer is not judged here."""
    versions: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _REQUIREMENT.fullmatch(line)
        if match is None:
            return None
        versions[canonicalize_name(match[1])] = match[2]
    return versions


_LOG_SEARCHED = re.compile(r"DEBUG Searching for a compatible version of ([A-Za-z0-9][A-Za-z0-9._-]*)")
_LOG_RESOLVED = re.compile(r"Resolved [0-9]+ packages? in ")
# uv -v: "DEBUG Selecting: numpy==2.4.6 [compatible] (numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl)"
_LOG_SELECTING = "DEBUG Selecting: "
_LOG_SELECTED = re.compile(r"DEBUG Selecting: ([A-Za-z0-9][A-Za-z0-9._-]*)==\S+ \[[a-z -]+\] \(([^()\s]+)\)")


def searched(log: str) -> frozenset[str]:
    """The canonical names uv's ``-v`` log says it searched a version of (their index pages read)."""
    return frozenset(canonicalize_name(m[1]) for m in map(_LOG_SEARCHED.match, log.splitlines()) if m)


def selected_name(line: str) -> str | None:
    """The canonical name of the release one line of uv's resolver log says it selected
    (``Selecting: NAME==VERSION [compatible] (FILE)``), else None: read as uv writes its log,
    so that what follows from the closure's names can begin while uv still resolves."""
    match = _LOG_SELECTED.fullmatch(line.strip()) if _LOG_SELECTING in line else None
    return None if match is None else canonicalize_name(match[1])


def wheels_alone(log: str, answer: frozenset[str]) -> bool:
    """Whether a run allowing sdists, whose ``-v`` log is ``log`` and whose answer holds the
    packages ``answer``, answered as the same run wheels-only (``--only-binary :all:``) would.

    The two runs read the same pages and metadata and take the same decisions until uv first
    meets a release that has an sdist and no wheel for the platform: wheels-only, uv passes it
    over; allowing sdists, it selects it and logs so, naming the file it would use
    (``Selecting: NAME==VERSION [compatible] (FILE)``; a wheel's metadata is read wherever a
    release has a wheel that fits, in both). So where every release the log shows selected is
    a wheel, no such release was met, and the wheels-only run would have answered alike. Every
    package of the answer must be among those selected: a log that does not name them
    (another uv's wording) proves nothing, nor does a selecting line of another form."""
    selected: set[str] = set()
    for line in log.splitlines():
        if _LOG_SELECTING not in line:
            continue
        match = _LOG_SELECTED.fullmatch(line.strip())
        if match is None or not match[2].endswith(".whl"):
            return False
        selected.add(canonicalize_name(match[1]))
    return bool(answer) and answer <= selected


def without_sdists(text: str) -> str:
    """uv's pylock from a run allowing sdists, less each package's ``sdist = {…}`` line: the
    wheels-only run's pylock where :func:`wheels_alone` holds (uv lists the wheels that fit the
    platform either way). The caller takes it only where no package is left with an sdist or
    without a wheel."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("sdist = "))


def answered_by_cache(log: str, answer: frozenset[str], locked: frozenset[str]) -> bool:
    """Whether an ``--offline -v`` run of uv, whose ``-v`` log is ``log``, answered ``answer``
    as the same run online would have, ``locked`` being the names the closure's run has just
    locked, reading their index pages as it did.

    uv decides a package with the versions its index page lists and the metadata of the release
    it tries. Offline it reads both from its cache, and a release whose metadata the cache lacks
    it passes over, logging that it tried to fetch it (``Sending … request``, then ``WARN …
    needs to be downloaded from a registry``). So the answer is the online one where the log
    has no line but uv's DEBUG ones and its summary, none of them a request, and every package
    it searched a version of (``Searching for a compatible version of NAME``) is one the
    closure's run locked, whose page it read from the index moments ago. Every package of the
    answer must be among those searched: a log that does not name them (another uv's wording)
    proves nothing, and the survey then asks the index."""
    for line in log.splitlines():
        if not line.strip() or _LOG_RESOLVED.match(line):
            continue
        if not line.startswith("DEBUG ") or "Sending " in line:
            return False
    return bool(answer) and answer <= searched(log) <= locked
