"""Parse user-supplied versions once into immutable values.

Driver versions are NVIDIA's ``branch[.minor[.patch]]``; a partial version names the
newest release of that branch (or minor), which is what a user typing ``--driver 550``
means. Component specifiers (``--torch``, ``--cuda`` …) become ``SpecifierSet``s; a
bare version like ``2.3`` means "any 2.3.x", and the resolver always pins one exact
release, so no wildcard reaches an output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from envbuild.errors import UsageError

if TYPE_CHECKING:  # specifiers compile a large grammar: imported only when one is given
    from packaging.specifiers import SpecifierSet

_DRIVER_RE = re.compile(r"(\d{3})(?:\.(\d{1,3})(?:\.(\d{1,3}))?)?")
# Characters a version specifier can ever need; anything else (spaces, newlines,
# quotes, ';', '$', Unicode separators) is rejected before packaging sees it.
_VERSION_HINT = "give an exact version (2.4.1), a series (2.4) or a specifier (>=2.3,<2.5)"
_SPEC_CHARS_RE = re.compile(r"[0-9A-Za-z.*,<>=!~+]+")


@total_ordering
@dataclass(frozen=True, slots=True)
class DriverVersion:
    """An NVIDIA Linux driver version; ``minor``/``patch`` are None when not given."""

    branch: int
    minor: int | None = None
    patch: int | None = None

    @classmethod
    def parse(cls, text: str) -> DriverVersion:
        match = _DRIVER_RE.fullmatch(text)
        if match is None:
            raise UsageError(
                f"invalid driver version {text!r}",
                hint="give the NVIDIA driver as 550, 550.54 or 550.54.15",
            )
        branch, minor, patch = match.groups()
        return cls(
            int(branch),
            int(minor) if minor is not None else None,
            int(patch) if patch is not None else None,
        )

    @property
    def parts(self) -> tuple[int, ...]:
        return tuple(p for p in (self.branch, self.minor, self.patch) if p is not None)

    def satisfies(self, minimum: DriverVersion) -> bool:
        """True when this driver is at least ``minimum``.

        Only the components the user gave are compared: ``550`` satisfies 550.54.15
        (the newest 550 release does), ``550.40`` does not.
        """
        mine = self.parts
        return mine >= minimum.parts[: len(mine)]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        return self.parts < other.parts

    def __str__(self) -> str:
        return ".".join(str(p) for p in self.parts)

    def full(self) -> str:
        """NVIDIA writes patch numbers with two digits (550.54.15, 450.36.06)."""
        text = f"{self.branch}"
        if self.minor is not None:
            text += f".{self.minor:02d}"
        if self.patch is not None:
            text += f".{self.patch:02d}"
        return text


def parse_version(kind: str, text: str) -> Version:
    """An exact version (data files and pins); a clear error for anything else."""
    _reject_odd_characters(kind, text)
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"invalid {kind} version {text!r}", hint=_VERSION_HINT) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
    """A user's constraint on one component: a specifier plus an optional local tag.

    ``--torch 2.3.1+cu121`` keeps ``cu121`` aside as a variant request, since local
    versions cannot carry meaning inside a ``SpecifierSet``.
    """

    kind: str
    text: str
    specifier: SpecifierSet
    local: str | None = None

    def admits(self, version: Version | str) -> bool:
        value = version if isinstance(version, Version) else Version(version)
        return self.specifier.contains(value, prereleases=True)

    def __str__(self) -> str:
        return self.text


def parse_requirement(kind: str, text: str) -> Requirement:
    """``2.3`` → any 2.3.x; ``2.3.1`` → exactly that; ``>=2.3,<2.5`` as given."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    _reject_odd_characters(kind, text)
    if text[0].isdigit():
        return _bare_version_requirement(kind, text)
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        raise UsageError(
            f"invalid {kind} version {text!r}",
            hint=_VERSION_HINT,
        ) from None
    if any(s.version.endswith(".*") and s.operator not in ("==", "!=") for s in spec):
        raise UsageError(f"invalid {kind} version {text!r}", hint=_VERSION_HINT)
    return Requirement(kind=kind, text=text, specifier=spec)


def _bare_version_requirement(kind: str, text: str) -> Requirement:
    from packaging.specifiers import SpecifierSet

    if text.endswith(".*"):  # "2.3.*" is the same series as "2.3"
        text = text[:-2]
        if "*" in text:
            raise UsageError(f"invalid {kind} version {text + '.*'!r}", hint=_VERSION_HINT)
    try:
        version = Version(text)
    except InvalidVersion:
        raise UsageError(f"invalid {kind} version {text!r}", hint=_VERSION_HINT) from None
    if version.local is not None and text.count("+") != 1:
        raise UsageError(f"invalid {kind} version {text!r}", hint=_VERSION_HINT)
    public = version.public
    # "2.3" (or Python "3.11") names a series; three components name one release.
    spec = SpecifierSet(f"=={public}.*" if len(version.release) < 3 else f"=={public}")
    return Requirement(kind=kind, text=text, specifier=spec, local=version.local)


def _reject_odd_characters(kind: str, text: str) -> None:
    if not text or _SPEC_CHARS_RE.fullmatch(text) is None:
        raise UsageError(
            f"invalid {kind} version {text!r}",
            hint="only digits, letters, '.', '*', ',', '+' and comparison operators are allowed",
        )


def cuda_tag(cuda: str) -> str:
    """``12.4`` → ``cu124``: the wheel-variant name PyTorch uses for a CUDA major.minor."""
    major, minor = cuda.split(".")[:2]
    return f"cu{major}{minor}"
