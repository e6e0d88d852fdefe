"""Parse user-supplied versions once into immutable values.

Driver versions are NVIDIA's ``branch[.minor[.patch]]``; a partial version names the
newest release of that branch (or minor), which is what a user typing ``--driver 550``
means. Component specifiers (``--torch``, ``--cuda`` …) become ``SpecifierSet``s; a
bare version like ``2.3`` means "any 2.3.x", and the resolver always pins one exact
release, so no wildcard reaches an output.

This module is on ``envbuild resolve``'s start-up path (within 2x a bare interpreter's
start-up), so it imports nothing at load: no ``re``, no ``dataclasses`` (whose
``inspect`` import alone costs more than a resolve), and ``packaging`` only for the
specifier forms ``Requirement`` does not judge itself. The two value classes are
therefore written out by hand, with the frozen-dataclass behaviour they replace:
keyword construction, equality, hashing, repr.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy reads these; at run time they would cost the imports above
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

_VERSION_HINT = "give an exact version (2.4.1), a series (2.4) or a specifier (>=2.3,<2.5)"
# Characters a version specifier can ever need; anything else (spaces, newlines,
# quotes, ';', '$', Unicode separators) is rejected before packaging sees it.
_SPEC_CHARS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.*,<>=!~+")


def _usage(message: str, hint: str) -> Exception:
    from envbuild.errors import UsageError  # errors imports typing: only on the error path

    return UsageError(message, hint=hint)


def _quoted(text: str) -> str:
    """``text`` as an error may quote it (confine.quoted: short, no control characters),
    imported only on the error path: resolve's start-up imports nothing more."""
    from envbuild.confine import quoted

    return quoted(text)


def _digits(text: str, low: int, high: int) -> bool:
    """``low`` to ``high`` decimal digits (any script's, as the regex ``\\d`` allowed)."""
    return low <= len(text) <= high and text.isdecimal()


def _tail(parts: list[str]) -> tuple[int | None, int | None]:
    minor = int(parts[1]) if len(parts) > 1 else None
    patch = int(parts[2]) if len(parts) > 2 else None
    return minor, patch


class DriverVersion:
    """An NVIDIA Linux driver version; ``minor``/``patch`` are None when not given.

    ``text`` is the version as written (``535.104.05``, never ``535.104.5``): what every
    output prints. Comparison and equality are numeric, on the components."""

    __slots__ = ("branch", "minor", "parts", "patch", "text")
    branch: int
    minor: int | None
    patch: int | None
    parts: tuple[int, ...]  # the components given; computed once, the resolver compares often
    text: str

    def __init__(self, branch: int, minor: int | None = None, patch: int | None = None,
                 text: str | None = None) -> None:
        object.__setattr__(self, "branch", branch)
        object.__setattr__(self, "minor", minor)
        object.__setattr__(self, "patch", patch)
        object.__setattr__(self, "parts", tuple(p for p in (branch, minor, patch) if p is not None))
        if text is None:  # built from numbers: as NVIDIA writes them, two-digit fields
            text = f"{branch}"
            if minor is not None:
                text += f".{minor:02d}"
            if patch is not None:
                text += f".{patch:02d}"
        object.__setattr__(self, "text", text)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")  # frozen, like the dataclass was

    @classmethod
    def parse(cls, text: str) -> DriverVersion:
        parts = text.split(".")
        if not (text.isascii() and len(parts) <= 3 and _digits(parts[0], 3, 3)
                and all(_digits(p, 1, 3) for p in parts[1:])):
            raise _usage(f"invalid driver version {_quoted(text)}",
                         "give the NVIDIA driver as nvidia-smi prints it: 550, 550.54 or 550.54.15")
        return cls(int(parts[0]), *_tail(parts), text=text)

    @property
    def partial(self) -> bool:
        """Fewer than three components: ``550`` names a branch, ``550.54`` a minor."""
        return self.patch is None

    def oldest(self) -> DriverVersion:
        """The lowest build this (partial) version can name: ``550`` → 550.0.0, as a bound.

        No build of branch 550 is older than 550.0.0, so whatever it runs, every 550 build
        runs. Never printed: a bound, not a driver NVIDIA released."""
        return DriverVersion(self.branch, self.minor or 0, self.patch or 0)

    def satisfies(self, minimum: DriverVersion) -> bool:
        """True when this driver is at least ``minimum``.

        Only the components the user gave are compared: ``550`` satisfies 550.54.15
        (the newest 550 release does), ``550.40`` does not.
        """
        mine = self.parts
        return mine >= minimum.parts[: len(mine)]

    def _key(self) -> tuple[int | None, ...]:
        return (self.branch, self.minor, self.patch)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        return self.parts < other.parts

    # As functools.total_ordering derived them from __lt__ and the field-wise __eq__.
    def __gt__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        return not self < other and self != other

    def __le__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        return self < other or self == other

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, DriverVersion):
            return NotImplemented
        return not self < other

    def __repr__(self) -> str:
        return (f"DriverVersion(branch={self.branch!r}, minor={self.minor!r}, "
                f"patch={self.patch!r}, text={self.text!r})")

    def __str__(self) -> str:
        return self.text

    def full(self) -> str:
        """The version as written (NVIDIA writes patch numbers with two digits: 550.54.15,
        450.36.06); the same as ``str``."""
        return self.text


def parse_version(kind: str, text: str) -> Version:
    """An exact version (data files and pins); a clear error for anything else."""
    from packaging.version import InvalidVersion, Version

    _reject_odd_characters(kind, text)
    try:
        return Version(text)
    except InvalidVersion:
        raise _usage(f"invalid {kind} version {_quoted(text)}", _VERSION_HINT) from None


class Requirement:
    """A user's constraint on one component: a specifier plus an optional local tag.

    ``--torch 2.3.1+cu121`` keeps ``cu121`` aside as a variant request, since local
    versions cannot carry meaning inside a ``SpecifierSet``. ``spec`` is the specifier
    set's text; ``admits`` judges the common forms itself (see ``_simple_clauses``) and
    hands anything else to ``packaging``.
    """

    __slots__ = ("_clauses", "_specifier", "_verdicts", "kind", "local", "spec", "text")
    kind: str
    text: str
    spec: str
    local: str | None
    _clauses: tuple[_Clause, ...] | None
    _specifier: SpecifierSet | None
    _verdicts: dict[str, bool]  # admits' answers so far: a cache, not part of the value

    def __init__(self, *, kind: str, text: str, spec: str, local: str | None = None,
                 specifier: SpecifierSet | None = None) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "local", local)
        object.__setattr__(self, "_clauses", _simple_clauses(spec))
        object.__setattr__(self, "_specifier", specifier)  # built when first needed
        object.__setattr__(self, "_verdicts", {})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    @property
    def specifier(self) -> SpecifierSet:
        if self._specifier is None:
            from packaging.specifiers import SpecifierSet

            object.__setattr__(self, "_specifier", SpecifierSet(self.spec))
        assert self._specifier is not None
        return self._specifier

    def _key(self) -> tuple[object, ...]:
        return (self.kind, self.text, self.spec, self.local)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Requirement):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Requirement(kind={self.kind!r}, text={self.text!r}, "
                f"spec={self.spec!r}, local={self.local!r})")

    def admits(self, version: Version | str) -> bool:
        """``SpecifierSet(spec).contains(version, prereleases=True)``."""
        if self._clauses is not None and isinstance(version, str):
            # A resolve asks about the same few version texts hundreds of times.
            found = self._verdicts.get(version)
            if found is not None:
                return found
            release = _plain_release(version)
            if release is not None:
                found = self._verdicts[version] = all(_holds(clause, release)
                                                      for clause in self._clauses)
                return found
        from packaging.version import Version

        value = version if isinstance(version, Version) else Version(version)
        return self.specifier.contains(value, prereleases=True)

    def __str__(self) -> str:
        return self.text


# --- the common specifier forms without packaging ----------------------------------------
# ``import packaging.specifiers`` costs more than a whole ``envbuild resolve`` may, so the
# forms users type (2.4, ==2.4.1, >=2.3, >=2.3,<2.6, 2.4.*, !=2.5) are judged here, for
# versions that are plain releases (digits and dots: everything in the data). For those,
# packaging's rules reduce to comparing release tuples: ordering ignores trailing zeros
# (2.4 == 2.4.0); a prefix match pads the version with zeros and compares the first
# components; the pre-release, post-release and local exceptions of < and > cannot apply.
# tests/test_versions.py holds this to SpecifierSet on many versions, odd ones included.

_Clause = tuple[str, tuple[int, ...], bool]  # operator, release, prefix match (".*")
_OPERATORS = ("==", "!=", "<=", ">=", "<", ">")  # two-character ones first


def _plain_release(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    if all(part.isascii() and part.isdigit() for part in parts):
        return tuple(int(part) for part in parts)
    return None


def _simple_clauses(spec: str) -> tuple[_Clause, ...] | None:
    """``spec``'s clauses when every one is a simple form, else None (packaging's job)."""
    clauses = []
    for item in spec.split(","):
        operator = next((op for op in _OPERATORS if item.startswith(op)), None)
        if operator is None:
            return None
        text = item[len(operator):]
        prefix = operator in ("==", "!=") and text.endswith(".*")
        release = _plain_release(text[:-2] if prefix else text)
        if release is None:  # "===", "~=", pre-releases, locals, epochs, spaces, ...
            return None
        clauses.append((operator, release, prefix))
    return tuple(clauses)


def _stripped(release: tuple[int, ...]) -> tuple[int, ...]:
    end = len(release)
    while end > 1 and release[end - 1] == 0:
        end -= 1
    return release[:end]


def _holds(clause: _Clause, release: tuple[int, ...]) -> bool:
    operator, wanted, prefix = clause
    if prefix:
        padded = release + (0,) * (len(wanted) - len(release))
        return (padded[: len(wanted)] == wanted) is (operator == "==")
    mine, theirs = _stripped(release), _stripped(wanted)
    if operator == "==":
        return mine == theirs
    if operator == "!=":
        return mine != theirs
    if operator == "<=":
        return mine <= theirs
    if operator == ">=":
        return mine >= theirs
    if operator == "<":
        return mine < theirs
    return mine > theirs


def parse_requirement(kind: str, text: str) -> Requirement:
    """``2.3`` → any 2.3.x; ``2.3.1`` → exactly that; ``>=2.3,<2.5`` as given."""
    _reject_odd_characters(kind, text)
    if text[0].isdigit():
        return _bare_version_requirement(kind, text)
    if _simple_clauses(text) is not None:  # valid as it is: packaging need not check it
        return Requirement(kind=kind, text=text, spec=text)
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        raise _usage(f"invalid {kind} version {_quoted(text)}", _VERSION_HINT) from None
    if any(s.version.endswith(".*") and s.operator not in ("==", "!=") for s in spec):
        raise _usage(f"invalid {kind} version {_quoted(text)}", _VERSION_HINT)
    return Requirement(kind=kind, text=text, spec=text, specifier=spec)


def _bare_version_requirement(kind: str, text: str) -> Requirement:
    if text.endswith(".*"):  # "2.3.*" is the same series as "2.3"
        text = text[:-2]
        if "*" in text:
            raise _usage(f"invalid {kind} version {_quoted(text + '.*')}", _VERSION_HINT)
    public, plus, local = text.partition("+")
    release = _plain_release(public)
    if release is not None and (not plus or (local.isascii() and local.isalnum()
                                             and local == local.lower())):
        public = ".".join(map(str, release))  # as packaging writes it: no leading zeros
        return _series_or_release(kind, text, public, len(release), local or None)
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(text)
    except InvalidVersion:
        raise _usage(f"invalid {kind} version {_quoted(text)}", _VERSION_HINT) from None
    if version.local is not None and text.count("+") != 1:
        raise _usage(f"invalid {kind} version {_quoted(text)}", _VERSION_HINT)
    requirement = _series_or_release(kind, text, version.public, len(version.release),
                                     version.local)
    requirement.specifier  # noqa: B018 - built now: a series packaging refuses fails here, as ever
    return requirement


def _series_or_release(kind: str, text: str, public: str, components: int,
                       local: str | None) -> Requirement:
    # "2.3" (or Python "3.11") names a series; three components name one release.
    spec = f"=={public}.*" if components < 3 else f"=={public}"
    return Requirement(kind=kind, text=text, spec=spec, local=local)


_MAX_SPEC = 100


def _reject_odd_characters(kind: str, text: str) -> None:
    if len(text) > _MAX_SPEC:  # a 5000-digit version is no version (and int() refuses it)
        raise _usage(f"invalid {kind} version: longer than {_MAX_SPEC} characters",
                     "write a version such as 2.3.1, or a range such as >=2.3,<2.5")
    if not text or not _SPEC_CHARS.issuperset(text):
        raise _usage(
            f"invalid {kind} version {_quoted(text)}",
            "only digits, letters, '.', '*', ',', '+' and comparison operators are allowed",
        )


def cuda_tag(cuda: str) -> str:
    """``12.4`` → ``cu124``: the wheel-variant name PyTorch uses for a CUDA major.minor."""
    major, minor = cuda.split(".")[:2]
    return f"cu{major}{minor}"
