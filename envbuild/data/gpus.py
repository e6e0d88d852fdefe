"""GPU targets: what a stack must run on, from a name, an ``sm_XY`` or the host.

On ``envbuild resolve``'s start-up path: ``re`` and ``difflib`` are imported only when a
GPU is named, and ``GpuTarget`` is a hand-written frozen value rather than a dataclass
(see ``envbuild.versions`` for why).
"""

from __future__ import annotations

from envbuild.smoke import rules
from envbuild.smoke.rules import parse_arch_list as parse_arch_list  # the resolver's index stores its output

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, Literal

    from envbuild.smoke.rules import ArchEntry as ArchEntry

    Coverage = Literal["sass", "sass-compatible", "ptx"]


_FIELDS = ("label", "compute_capability", "datacenter", "min_driver_branch", "last_driver_branch",
           "source", "host_arch", "min_cuda", "family")


class GpuTarget:
    """One GPU a stack must run on, with what the data knows about its driver support."""

    __slots__ = _FIELDS
    label: str
    compute_capability: str
    datacenter: bool | None
    min_driver_branch: int | None
    last_driver_branch: int | None
    source: str | None
    host_arch: str | None  # "aarch64": built into an Arm system (Grace, DGX Spark)
    min_cuda: str | None  # the lowest CUDA whose wheels run on it, where the arch list is not enough
    family: str | None  # the product line (gpus.yaml): "Jetson" is out of scope

    def __init__(self, *, label: str, compute_capability: str, datacenter: bool | None = None,
                 min_driver_branch: int | None = None, last_driver_branch: int | None = None,
                 source: str | None = None, host_arch: str | None = None,
                 min_cuda: str | None = None, family: str | None = None) -> None:
        for name, value in zip(_FIELDS, (label, compute_capability, datacenter, min_driver_branch,
                                         last_driver_branch, source, host_arch, min_cuda, family),
                               strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")  # frozen

    def _key(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GpuTarget):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"GpuTarget({fields})"

    def with_datacenter(self) -> GpuTarget:
        fields = {name: getattr(self, name) for name in _FIELDS}
        return GpuTarget(**{**fields, "datacenter": True})

    @property
    def sm(self) -> str:
        return "sm_" + self.compute_capability.replace(".", "")


# A GPU name as the user may type it; checked and folded by hand, because ``re`` (with the
# enum module it imports) costs ``envbuild resolve --gpu`` a seventh of its start-up.
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 ._()/-")
_NOISE_WORDS = frozenset(("nvidia", "geforce", "tesla", "quadro"))


def _valid_name(name: str) -> bool:
    return 0 < len(name) <= 80 and all(c in _NAME_CHARS for c in name)


def _fold(name: str) -> str:
    """The name for lookups: casefolded, without the vendor words (whole words only) and
    without spaces, underscores and hyphens ("NVIDIA GeForce RTX-4090" -> "rtx4090")."""
    text, out, i = name.casefold(), [], 0
    while i < len(text):
        word = text[i].isalnum() or text[i] == "_"
        j = i + 1
        while j < len(text) and (text[j].isalnum() or text[j] == "_") == word:
            j += 1
        run = text[i:j]
        if word:
            if run not in _NOISE_WORDS:
                out.append(run.replace("_", ""))
        else:
            out.append("".join(c for c in run if not c.isspace() and c != "-"))
        i = j
    return "".join(out)


fold_name = _fold  # the one folding of GPU names: lookups, the index and ``matrix validate``


def gpu_keys(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Every GPU name and alias, folded, to the position of its row (the first row wins).
    The resolver's index keeps this, so a lookup folds one name instead of all of them."""
    keys: dict[str, int] = {}
    for position, row in enumerate(rows):
        for alias in (row["name"], *row.get("aliases", ())):
            keys.setdefault(_fold(alias), position)
    return keys


def find_gpu(rows: Sequence[Mapping[str, Any]], name: str,
             keys: Mapping[str, int] | None = None) -> GpuTarget:
    """Look a GPU up by name or alias, forgiving case, spaces and vendor words; ``keys``:
    ``gpu_keys(rows)``, when already at hand."""
    if not _valid_name(name):
        from envbuild.errors import UsageError  # errors imports typing: only on the error path

        raise UsageError(f"invalid GPU name {name!r}",
                         hint="letters, digits, spaces and . _ - ( ) / only")
    if keys is None:
        keys = gpu_keys(rows)
    position = keys.get(_fold(name))
    if position is None:
        from envbuild.errors import UsageError

        names = suggest(rows, name, keys)
        hint = f"Perhaps you meant {' or '.join(names)}?" if names else (
            "give --arch sm_XY instead, or see 'envbuild matrix show gpus'"
        )
        raise UsageError(f"unknown GPU {name!r}", hint=hint)
    found = rows[position]
    typed = _fold(name)
    if any(_fold(alias) == typed for alias in found.get("assumed_for", ())):
        # "RTX PRO 6000" names two editions (one a datacenter part): say which one was taken
        return target_from_row(found, label=f"{found['name']} (assumed for {name!r}; give the name "
                                              "nvidia-smi prints for another edition)")
    return target_from_row(found, label=found["name"])


def _models(folded: str) -> list[tuple[str, str]]:
    """The model numbers in a folded name, as (letters, digits): "rtx3080ti" -> [("rtx", "3080")]."""
    import re

    return re.findall(r"([a-z]*)(\d+)", folded)


def _same_series(typed: tuple[str, str], model: tuple[str, str]) -> bool:
    """One product series: the same letters (or none typed) and, for numbers of four digits or
    more, the same leading digits ("3080" and "3060" are both 30-series; "4080" is not)."""
    (t_letters, t_digits), (letters, digits) = typed, model
    if t_letters and letters != t_letters:
        return False
    if len(t_digits) >= 4:
        return len(digits) == len(t_digits) and digits[:-2] == t_digits[:-2]
    return bool(t_letters) and len(digits) == len(t_digits)


def suggest(rows: Sequence[Mapping[str, Any]], name: str, keys: Mapping[str, int] | None = None,
            limit: int = 3) -> list[str]:
    """GPU names to offer for an unknown ``name``, best first: the same model number (a variant),
    then the same series, generation (architecture) and family, then the closest spelling.
    "RTX 3080 Foo" offers the RTX 3080 and other Ampere GeForce cards before an RTX 4080."""
    import difflib

    if keys is None:
        keys = gpu_keys(rows)
    typed = _fold(name)
    typed_models = _models(typed)
    by_row: dict[int, list[str]] = {}
    for key, position in keys.items():
        by_row.setdefault(position, []).append(key)
    series = [p for p, ks in by_row.items()
              if any(_same_series(t, m) for t in typed_models for k in ks for m in _models(k))]
    archs = [rows[p].get("architecture") for p in series]
    families = [rows[p].get("family") for p in series]
    arch = max(set(archs), key=archs.count) if archs else None  # the series' generation
    family = max(set(families), key=families.count) if families else None
    scored = []
    for position, ks in by_row.items():
        ratio = max(difflib.SequenceMatcher(None, typed, k).ratio() for k in ks)
        models = {m for k in ks for m in _models(k)}
        same_model = any(t in models or any(t[1] == m[1] and (not t[0] or t[0] == m[0]) for m in models)
                         for t in typed_models)
        in_series = position in series
        row = rows[position]
        same_arch = arch is not None and row.get("architecture") == arch
        same_family = family is not None and row.get("family") == family
        if ratio < 0.6 and not same_model and not in_series:
            continue
        scored.append(((not same_model, not in_series, not same_arch, not same_family, -ratio,
                        position), row["name"]))
    return [n for _, n in sorted(scored)][:limit]


def target_from_row(row: Mapping[str, Any], *, label: str) -> GpuTarget:
    return GpuTarget(
        label=label,
        compute_capability=row["compute_capability"],
        datacenter=row["datacenter"],
        min_driver_branch=row.get("min_driver_branch"),
        last_driver_branch=row.get("last_driver_branch"),
        source=row.get("driver_source") or row["source"],
        host_arch=row.get("host_arch"),
        min_cuda=row.get("min_cuda"),
        family=row.get("family"),
    )


def target_from_arch(arch: str, *, datacenter: bool | None) -> GpuTarget:
    entry = rules.parse_arch_entry(arch)
    if entry is None or entry[0] != "sm" or entry[2] or entry[3]:  # a GPU's own arch: plain sm_XY
        from envbuild.errors import UsageError

        raise UsageError(f"invalid GPU architecture {arch!r}", hint="write it as sm_89, sm_90 or sm_120")
    major, minor = entry[1]
    return GpuTarget(label=arch, compute_capability=f"{major}.{minor}", datacenter=datacenter)


def coverage(compute_capability: str, arch_list: Iterable[str]) -> Coverage | None:
    """How a wheel compiled for ``arch_list`` can run on a GPU, best way first.

    Exact SASS; SASS of the same major and a lower minor (binary compatible, except the
    arch-specific ``a`` targets and integrated GPUs); or PTX the driver JIT-compiles (see
    ``envbuild.smoke.rules.arch_runs_on``, the rule the smoke test applies to the real
    GPU). None: "no kernel image is available" at the first kernel.
    """
    return coverage_of(compute_capability, parse_arch_list(arch_list))


def coverage_of(compute_capability: str, entries: Iterable[ArchEntry]) -> Coverage | None:
    """``coverage`` over an arch list already parsed by ``parse_arch_list``."""
    major, minor = (int(p) for p in compute_capability.split("."))
    how, _ = rules.arch_runs_on(list(entries), (major, minor))
    return _COVERAGE_NAMES.get(how)


# rules' names for how an arch list runs -> the resolver's (None: it does not run).
_COVERAGE_NAMES: dict[str, Coverage] = {rules.SASS_EXACT: "sass", rules.SASS_COMPATIBLE: "sass-compatible",
                                        rules.PTX_JIT: "ptx"}
