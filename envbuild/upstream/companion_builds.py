"""Which torch release a torchvision/torchaudio release that pins none was built for.

Newer companion releases declare ``torch>=X.Y.0`` (or nothing) instead of ``torch==X.Y.Z``,
so their METADATA cannot tell a build for torch 2.14.1 from one for 2.15.0. Their wheels can:
``<project>/version.py`` holds the build's own version with the CUDA it was built against
(``__version__ = '0.29.2+cu132'``), and the index gives each wheel's upload time (PEP 700).
PyTorch uploads the companions of a release with it, built against the same CUDA as its
default wheel. So a companion pairs with torch T when T is the only torch release that

- its torch requirement admits (any, when it declares none),
- has a default wheel of the same build (``cu132`` from its CUDA runtime pin), and
- was uploaded within ``WINDOW`` of the companion's wheel.

Anything else (no build in version.py, no upload times, two candidates) leaves the companion
to the lower-bound rule of ``torch_facts.loose_pairs``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import replace

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from envbuild.upstream.torch_facts import CompanionFact, TorchWheelFact

WINDOW = datetime.timedelta(hours=24)
# The first assignment in version.py; the value is checked as a version below.
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*['"]([0-9A-Za-z.+_-]{1,64})['"]\s*$""", re.M)
_BUILD = re.compile(r"cu\d{2,3}|cpu")


def member_pattern(project: str) -> re.Pattern[str]:
    """The version.py member of a ``project`` wheel."""
    return re.compile(re.escape(project) + r"/version\.py")


def build_version(text: bytes, release: str) -> str | None:
    """``__version__`` of a version.py when it is ``release`` with a build tag, else None."""
    match = _VERSION_LINE.search(text.decode("utf-8", "replace"))
    if match is None:
        return None
    try:
        version = Version(match[1])
    except InvalidVersion:
        return None
    if version.public != release or not _BUILD.fullmatch(version.local or ""):
        return None
    return str(version)


def place(facts: Sequence[CompanionFact], torch: Sequence[TorchWheelFact]) -> tuple[CompanionFact, ...]:
    """``facts`` with ``built_for`` and ``evidence`` set on each unpinned one the evidence ties
    to exactly one torch release."""
    return tuple(_placed(fact, torch) for fact in facts)


def _placed(fact: CompanionFact, torch: Sequence[TorchWheelFact]) -> CompanionFact:
    uploaded = _when(fact.upload_time)
    if fact.torch is not None or fact.build is None or uploaded is None:
        return fact
    found = [(t, when) for t in torch if (when := _when(t.upload_time)) is not None
             and abs(uploaded - when) <= WINDOW and _matches(fact, t)]
    if len(found) != 1:
        return fact
    release, when = found[0]
    return replace(fact, built_for=release.torch, evidence=_evidence(fact, release, uploaded, when))


def _matches(fact: CompanionFact, torch: TorchWheelFact) -> bool:
    return torch.default_variant == _local(fact.build) and _admits(fact.torch_requirement, torch.torch)


def _admits(requirement: str | None, torch: str) -> bool:
    if not requirement:
        return True
    try:
        return SpecifierSet(requirement).contains(torch, prereleases=False)
    except InvalidSpecifier:
        return False


def _local(build: str | None) -> str | None:
    return Version(build).local if build else None


def _when(text: str | None) -> datetime.datetime | None:
    """An upload time as PEP 700 writes it (ISO 8601, ``Z``), in UTC; None when unreadable."""
    if not text:
        return None
    try:
        value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else None


def _evidence(fact: CompanionFact, torch: TorchWheelFact, ours: datetime.datetime,
              theirs: datetime.datetime) -> str:
    minutes = round((ours - theirs).total_seconds() / 60)
    when = f"{abs(minutes)} minutes {'after' if minutes >= 0 else 'before'}"
    return (f"its wheel's version.py reads {fact.build}, the build of torch {torch.torch}'s default "
            f"wheel ({torch.default_variant}), and was uploaded {ours:%Y-%m-%d %H:%M} UTC, {when} "
            f"torch {torch.torch}'s")
