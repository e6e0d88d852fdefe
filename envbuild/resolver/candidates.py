"""The resolver's core on plain data, and its precompiled candidate index.

``envbuild.resolve`` is the typed API (dataclasses); this module does the work, so that
``envbuild resolve`` can start without ``dataclasses``, ``typing``, ``re`` or
``packaging`` (issue 2: within 2x a bare interpreter's start-up).

Everything that needs ``packaging`` is computed once per data set, by ``build_index``:
version orders (toolkits, Ubuntu releases, each family's Pythons), normalised CUDA
release strings, release tuples for ranking, parsed arch lists, glibc floors. The index
is plain data; ``load_index`` keeps it in the cache directory as ``marshal`` output,
keyed by the data files' ``stat`` (sizes, inodes, change times), so a warm start reads
one small file instead of hashing and parsing every data file. What a request adds
(driver, GPUs, constraints) is then judged with dictionary lookups and tuple compares.
The checks and their order are documented in ``envbuild.resolve``.
"""

from __future__ import annotations

import os

from envbuild.data.versions import DriverVersion

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from typing import Any, TypeAlias

    from envbuild.data.gpus import ArchEntry, GpuTarget
    from envbuild.data.matrix import Matrix, Row
    from envbuild.data.versions import Requirement
    from envbuild.resolver.resolve import Request

    Ask: TypeAlias = "Request | Query"  # what the checks read: the typed Request or the fast path's

PYTORCH_INDEX = "https://download.pytorch.org/whl"
PIN_FIELDS = ("cuda_runtime", "cudnn", "nccl")
COMPAT_ORDER: dict[str | None, int] = {"native": 0, "minor-version": 1, "forward": 2, None: 3}
STACK_FIELDS = ("torch", "torchvision", "torchaudio", "variant", "index_url", "cuda", "cudnn",
                "nccl", "python", "ubuntu", "base_image", "base_cuda", "compat", "min_driver",
                "flavor", "arch_list", "notes")
REQUEST_FIELDS = ("driver", "gpus", "torch", "python", "cuda", "cudnn", "ubuntu", "variant",
                  "flavor", "package_index")
# The rows the request builder (``selection``) and the checks below read at run time, with
# the fields they read: the index keeps only these (the rest is precomputed), as a warm
# start's cost is mostly unmarshalling it. A check that reads another field adds it here.
KEPT_FIELDS = {
    "cuda_toolkits": ("min_driver",),
    "gpus": ("name", "aliases", "compute_capability", "datacenter", "min_driver_branch",
             "last_driver_branch", "driver_source", "source"),
    "torch_variants": ("torch", "variant", "cuda", "python", "arch_list", "source", *PIN_FIELDS),
    "torch_pypi": ("torch", "default_variant", "python", "platform_tag", "source", *PIN_FIELDS),
    "torch_companions": ("torch", "torchvision", "torchaudio"),
    "ubuntu_python": ("ubuntu", "python", "glibc"),
}
INDEX_FORMAT = 2


# --- plain values ----------------------------------------------------------------------


class Query:
    """A request, as the fast path builds it (same fields as ``resolve.Request``)."""

    __slots__ = REQUEST_FIELDS
    driver: DriverVersion | None
    gpus: tuple[GpuTarget, ...]
    torch: Requirement | None
    python: Requirement | None
    cuda: Requirement | None
    cudnn: Requirement | None
    ubuntu: str | None
    variant: str | None
    flavor: str
    package_index: str | None

    def __init__(self, *, driver: DriverVersion | None = None, gpus: tuple[GpuTarget, ...] = (),
                 torch: Requirement | None = None, python: Requirement | None = None,
                 cuda: Requirement | None = None, cudnn: Requirement | None = None,
                 ubuntu: str | None = None, variant: str | None = None, flavor: str = "runtime",
                 package_index: str | None = None) -> None:
        self.driver, self.gpus, self.torch, self.python = driver, gpus, torch, python
        self.cuda, self.cudnn, self.ubuntu, self.variant = cuda, cudnn, ubuntu, variant
        self.flavor, self.package_index = flavor, package_index

    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in REQUEST_FIELDS}


class Rejection:
    """Why one family (or the whole request) does not fit; a frozen value."""

    __slots__ = ("constraint", "family", "reason", "source")
    family: str
    constraint: str  # which check failed: torch, variant, python, gpu-arch, driver, ...
    reason: str
    source: str | None

    def __init__(self, *, family: str, constraint: str, reason: str, source: str | None = None) -> None:
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "constraint", constraint)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def renamed(self, family: str) -> Rejection:
        return Rejection(family=family, constraint=self.constraint, reason=self.reason,
                         source=self.source)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rejection):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash((self.family, self.constraint, self.reason, self.source))

    def __repr__(self) -> str:
        return (f"Rejection(family={self.family!r}, constraint={self.constraint!r}, "
                f"reason={self.reason!r}, source={self.source!r})")

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "constraint": self.constraint, "reason": self.reason,
                "source": self.source}


class DriverSummary:
    """What the host driver runs; a frozen value."""

    __slots__ = ("max_cuda", "max_cuda_release", "minor_compat", "needs_newer", "version")
    version: str
    max_cuda: str | None
    max_cuda_release: str | None
    minor_compat: str | None
    needs_newer: tuple[tuple[str, str], ...]  # (CUDA family, driver it needs)

    def __init__(self, *, version: str, max_cuda: str | None, max_cuda_release: str | None,
                 minor_compat: str | None, needs_newer: tuple[tuple[str, str], ...] = ()) -> None:
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "max_cuda", max_cuda)
        object.__setattr__(self, "max_cuda_release", max_cuda_release)
        object.__setattr__(self, "minor_compat", minor_compat)
        object.__setattr__(self, "needs_newer", needs_newer)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DriverSummary):
            return NotImplemented
        return (self.to_json(), self.needs_newer) == (other.to_json(), other.needs_newer)

    def __hash__(self) -> int:
        return hash((self.version, self.max_cuda, self.max_cuda_release, self.minor_compat,
                     self.needs_newer))

    def __repr__(self) -> str:
        return (f"DriverSummary(version={self.version!r}, max_cuda={self.max_cuda!r}, "
                f"max_cuda_release={self.max_cuda_release!r}, minor_compat={self.minor_compat!r}, "
                f"needs_newer={self.needs_newer!r})")

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "max_cuda": self.max_cuda,
                "max_cuda_release": self.max_cuda_release, "minor_compat": self.minor_compat}


class Pinned:
    """One fully pinned stack, with ``resolve.Stack``'s fields (``STACK_FIELDS``)."""

    __slots__ = STACK_FIELDS
    torch: str
    torchvision: str | None
    torchaudio: str | None
    variant: str
    index_url: str | None
    cuda: str | None
    cudnn: str | None
    nccl: str | None
    python: str
    ubuntu: str
    base_image: str
    base_cuda: str | None
    compat: str | None
    min_driver: str | None
    flavor: str
    arch_list: tuple[str, ...]
    notes: tuple[str, ...]

    def __init__(self, values: Mapping[str, Any]) -> None:
        for name in STACK_FIELDS:
            setattr(self, name, values[name])

    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in STACK_FIELDS}

    def to_json(self) -> dict[str, Any]:
        return stack_json(self)


def stack_json(stack: Pinned | Any) -> dict[str, Any]:
    """A stack's JSON object (``resolve.Stack.to_json`` is this too)."""
    body = {name: getattr(stack, name) for name in STACK_FIELDS}
    body["arch_list"] = list(stack.arch_list)
    body["notes"] = list(stack.notes)
    return body


class Outcome:
    """``resolve.Resolution``'s fields, with the core's plain stacks."""

    __slots__ = ("driver", "global_conflicts", "rejected", "stacks")

    def __init__(self, *, stacks: tuple[Pinned, ...], rejected: tuple[Rejection, ...],
                 driver: DriverSummary | None, global_conflicts: tuple[Rejection, ...]) -> None:
        self.stacks, self.rejected, self.driver = stacks, rejected, driver
        self.global_conflicts = global_conflicts


# --- the index: built once per data set with packaging, then plain lookups ----------------


def build_index(matrix: Matrix) -> dict[str, Any]:
    """Every version-dependent fact the checks need, as marshal-able plain data."""
    from contextlib import suppress

    from packaging.version import InvalidVersion, Version

    def release(text: str, into: dict[str, tuple[int, ...]]) -> None:
        with suppress(InvalidVersion):  # else looked up at run time, failing as it always did
            into[text] = Version(text).release

    from envbuild.data.gpus import parse_arch_list

    rows = {name: [{k: v for k, v in r.items() if k in keep} for r in matrix.rows(name)]
            for name, keep in KEPT_FIELDS.items()}
    toolkits = sorted(((Version(r["cuda"]), r) for r in matrix.rows("cuda_toolkits")),
                      key=lambda t: t[0], reverse=True)
    compat = matrix.rows("cuda_compat")
    ubuntus = {r["ubuntu"]: r for r in rows["ubuntu_python"]}
    pypi = {r["torch"]: r for r in rows["torch_pypi"]}
    releases: dict[str, tuple[int, ...]] = {}
    pythons: dict[tuple[str, ...], list[str]] = {}
    for r in rows["torch_variants"] + rows["torch_pypi"]:
        variant = r.get("default_variant") or "cpu"  # an index-only family's CUDA, as it is derived
        derived = None if variant == "cpu" else f"{variant[2:-1]}.{variant[-1]}"
        for text in (r["torch"], r.get("cuda"), r.get("cuda_runtime"), derived):
            if text:
                release(text, releases)
        listed = tuple(r["python"])
        for py in listed:
            release(py.rstrip("t"), releases)
        with suppress(InvalidVersion):
            pythons[listed] = sorted((py for py in listed if not py.endswith("t")), key=Version,
                                     reverse=True)
    for u in ubuntus:
        release(u, releases)
    torches = [r["torch"] for r in rows["torch_variants"] + rows["torch_pypi"]]
    return {
        "rows": rows,
        "toolkits": [(str(v), v.major, v.minor, _driver_parts(r["min_driver"]), r["source"])
                     for v, r in toolkits],
        "floors": {r["cuda_major"]: (_driver_parts(r["min_driver"]), r["source"]) for r in compat
                   if r["mode"] == "minor-version" and "min_driver" in r},
        "forward": {r["cuda_major"]: (tuple(r.get("driver_branches", ())), r["source"]) for r in compat
                    if r["mode"] == "forward"},
        "images": {(r["cuda"], r["ubuntu"]): r["flavors"] for r in matrix.rows("cuda_images")},
        "ubuntus": sorted(ubuntus, key=Version, reverse=True),
        "releases": releases,
        "pythons": pythons,
        "arch": {tuple(r["arch_list"]): parse_arch_list(r["arch_list"])
                 for r in rows["torch_variants"] if r.get("arch_list")},
        "too_old": {t: sorted(too_old_ubuntus(t, pypi, ubuntus)) for t in torches},
    }


def _driver_parts(text: str) -> tuple[int | None, ...]:
    driver = DriverVersion.parse(text)
    return (driver.branch, driver.minor, driver.patch)


def too_old_ubuntus(torch: str, pypi: Mapping[str, Row], ubuntus: Mapping[str, Row]) -> set[str]:
    """Ubuntu releases whose glibc is older than the wheel's manylinux baseline."""
    from packaging.version import Version

    tag = pypi.get(torch, {}).get("platform_tag", "")
    need = _manylinux_glibc(tag)
    return {u for u, row in ubuntus.items()
            if need and "glibc" in row and Version(row["glibc"]) < Version(need)}


def _manylinux_glibc(tag: str) -> str | None:
    legacy = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}
    name = tag.removesuffix("_x86_64")
    if name in legacy:
        return legacy[name]
    if name.startswith("manylinux_2_"):
        return f"2.{name.removeprefix('manylinux_2_')}"
    return None


class Toolkit:
    """A CUDA toolkit release: its version as packaging prints it, and its driver."""

    __slots__ = ("cuda", "driver", "major", "minor", "source")

    def __init__(self, cuda: str, major: int, minor: int, driver: DriverVersion, source: str) -> None:
        self.cuda, self.major, self.minor, self.driver, self.source = cuda, major, minor, driver, source


class Index:
    """The index of one data set, ready for ``solve``."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.relations: Mapping[str, list[Row]] = data["rows"]
        self.toolkits = [Toolkit(cuda, major, minor, DriverVersion(*parts), source)
                         for cuda, major, minor, parts, source in data["toolkits"]]
        self.by_family: dict[str, list[Toolkit]] = {}
        for item in self.toolkits:
            self.by_family.setdefault(f"{item.major}.{item.minor}", []).append(item)
        self.floors: dict[int, tuple[DriverVersion, str]] = {
            major: (DriverVersion(*parts), source) for major, (parts, source) in data["floors"].items()}
        self.forward: dict[int, tuple[tuple[int, ...], str]] = data["forward"]
        self.images: dict[tuple[str, str], list[str]] = data["images"]
        self.ubuntus: list[str] = data["ubuntus"]  # newest first
        self.ubuntu_rows = {r["ubuntu"]: r for r in self.relations["ubuntu_python"]}
        self.companions = {r["torch"]: r for r in self.relations["torch_companions"]}
        self.pypi = {r["torch"]: r for r in self.relations["torch_pypi"]}
        self._releases: dict[str, tuple[int, ...]] = data["releases"]
        self._pythons: dict[tuple[str, ...], list[str]] = data["pythons"]
        self._arch: dict[tuple[str, ...], list[ArchEntry]] = data["arch"]
        self._too_old: dict[str, list[str]] = data["too_old"]
        self._native: dict[tuple[int, ...], set[Toolkit]] = {}

    def rows(self, relation: str) -> list[Row]:
        return self.relations.get(relation, [])

    def releases_of(self, cuda_minor: str) -> list[Toolkit]:
        return list(self.by_family.get(cuda_minor, ()))

    def native(self, driver: DriverVersion) -> set[Toolkit]:
        """The toolkits ``driver`` runs natively (each check asks again: computed once)."""
        found = self._native.get(driver.parts)
        if found is None:
            found = self._native[driver.parts] = {t for t in self.toolkits if driver.satisfies(t.driver)}
        return found

    def floor(self, major: int) -> DriverVersion | None:
        found = self.floors.get(major)
        return found[0] if found else None

    def release(self, text: str) -> tuple[int, ...]:
        found = self._releases.get(text)
        if found is None:
            from packaging.version import Version

            found = Version(text).release
        return found

    def pythons_newest_first(self, listed: tuple[str, ...]) -> list[str]:
        found = self._pythons.get(listed)
        if found is None:
            from packaging.version import Version

            found = sorted((py for py in listed if not py.endswith("t")), key=Version, reverse=True)
        return found

    def arch(self, arch_list: Iterable[str]) -> list[ArchEntry]:
        key = tuple(arch_list)
        found = self._arch.get(key)
        if found is None:
            from envbuild.data.gpus import parse_arch_list

            found = parse_arch_list(key)
        return found

    def too_old(self, torch: str) -> set[str] | list[str]:
        found = self._too_old.get(torch)
        return found if found is not None else too_old_ubuntus(torch, self.pypi, self.ubuntu_rows)


def index_of(matrix: Matrix) -> Index:
    """The index of an in-memory matrix, built once per Matrix."""
    index = matrix.derived.get("index")
    if index is None:
        index = matrix.derived["index"] = Index(build_index(matrix))
    return index


# --- the on-disk index: the fast path's cache ---------------------------------------------


def _signature(directory: str) -> tuple[Any, ...]:
    """Identity of every data file: any write changes a file's size or change time."""
    from envbuild.data.matrix import MANIFEST, RELATIONS

    def ident(path: str) -> tuple[int, ...] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    names = [f"{name}.yaml" for name in RELATIONS] + [MANIFEST]
    directory_id = ident(directory)
    # This file's identity too: another envbuild (an upgrade, an edit) may lay out the
    # index differently while the data stays the same.
    return (ident(__file__), directory_id[1:3] if directory_id else None,
            *((name, ident(os.path.join(directory, name))) for name in names))


def _cache_file(cache_dir: str, directory: str) -> str:
    import sys

    digest = 0xCBF29CE484222325  # FNV-1a: a stable name per directory without hashlib
    for byte in os.fsencode(directory):
        digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    tag = sys.implementation.cache_tag or "py"  # marshal's format follows the interpreter
    return os.path.join(cache_dir, f"resolve-index-{digest:016x}.{tag}.marshal")


def load_index(directory: str, cache_dir: str | None) -> Index:
    """The index of ``directory``: from the cache when no data file changed since it was
    written, else through ``matrix.load`` (validation, manifest, errors) and saved."""
    import marshal

    directory = os.path.realpath(directory)
    signature = _signature(directory)  # taken before reading: a later write invalidates it
    path = _cache_file(cache_dir, directory) if cache_dir else None
    if path is not None:
        try:
            with open(path, "rb") as handle:
                saved = marshal.loads(handle.read())  # marshal.load(handle) reads piecemeal: slower
        except (OSError, EOFError, ValueError, TypeError):
            saved = None
        if (isinstance(saved, dict) and saved.get("format") == INDEX_FORMAT
                and saved.get("directory") == directory and saved.get("signature") == signature):
            try:
                return Index(saved["index"])
            except (KeyError, TypeError, ValueError):
                pass  # not an index this code understands: rebuild it
    from pathlib import Path

    from envbuild.data import matrix

    loaded = matrix.load(Path(directory), cache_dir=Path(cache_dir) if cache_dir else None)
    data = build_index(loaded)
    if path is not None and not _racy(signature):
        _save(path, {"format": INDEX_FORMAT, "directory": directory, "signature": signature,
                     "index": data})
    return Index(data)


RACY_NS = 2_000_000_000  # wider than any file system's timestamp granularity


def _racy(signature: tuple[Any, ...]) -> bool:
    """Some data file changed too recently for its ``stat`` to tell the next change apart.

    A rewrite of the same size within one timestamp tick keeps size and times equal, so
    a signature taken in that tick could vouch for data it never saw (git's "racily
    clean" entries). Such a signature is not saved: the index is built again until
    the files have been still for ``RACY_NS``."""
    import time

    changed = [ident[-1] for _, ident in signature[2:] if ident is not None]  # data files' ctimes
    return bool(changed) and time.time_ns() - max(changed) < RACY_NS


def _save(path: str, body: dict[str, Any]) -> None:
    import marshal

    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        payload = marshal.dumps(body)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass  # a cache is an optimisation; an unwritable home must not fail a resolve


# --- the checks: each returns a Rejection or a refined candidate ------------------------


class Family:
    """One (torch release, wheel variant) candidate."""

    __slots__ = ("index_url", "pins", "python", "row", "variant")

    def __init__(self, *, row: Row, variant: str, index_url: str | None, python: tuple[str, ...],
                 pins: dict[str, str]) -> None:
        self.row, self.variant, self.index_url, self.python, self.pins = row, variant, index_url, python, pins

    @property
    def label(self) -> str:
        return f"torch {self.row['torch']}+{self.row['variant']}"


class Runtime:
    """How a CUDA family runs on the host: mode, base-image CUDA release, needed driver."""

    __slots__ = ("base_releases", "compat", "min_driver", "source")

    def __init__(self, compat: str, base_releases: list[str], min_driver: DriverVersion,
                 source: str) -> None:
        self.compat = compat
        self.base_releases = base_releases  # CUDA releases a base image may carry, best first
        self.min_driver, self.source = min_driver, source


def summarize_driver(driver: DriverVersion, ix: Index) -> DriverSummary:
    runs = ix.native(driver)
    native = [t for t in ix.toolkits if t in runs]
    newest = native[0] if native else None
    majors = sorted((m for m in ix.floors if (f := ix.floor(m)) and driver.satisfies(f)),
                    reverse=True)
    needs: dict[str, str] = {}
    for toolkit in reversed(ix.toolkits):
        family = f"{toolkit.major}.{toolkit.minor}"
        if toolkit not in runs and family not in needs:
            needs[family] = toolkit.driver.full()
    return DriverSummary(
        version=str(driver),
        max_cuda=f"{newest.major}.{newest.minor}" if newest else None,
        max_cuda_release=newest.cuda if newest else None,
        minor_compat=f"{majors[0]}.x" if majors else None,
        needs_newer=tuple(needs.items()),
    )


def families(ask: Ask, ix: Index) -> Iterator[Family | Rejection]:
    """One family per variant row, plus the package index's default wheel of any release
    without variant rows; ``--variant default`` keeps only the index's default wheels."""
    with_rows = set()
    for row in ix.rows("torch_variants"):
        with_rows.add(row["torch"])
        pins: dict[str, str] = {k: row[k] for k in PIN_FIELDS if k in row}
        family = Family(row=row, variant=row["variant"],
                        index_url=f"{PYTORCH_INDEX}/{row['variant']}",
                        python=tuple(row["python"]), pins=pins)
        if ask.variant != "default":
            yield family
            continue
        pypi = ix.pypi.get(row["torch"])
        if pypi is None or pypi["default_variant"] != row["variant"]:
            reason = (f"not the default wheel of torch {row['torch']} on the package index"
                      if pypi else f"no package-index record for torch {row['torch']}")
            yield Rejection(family=family.label, constraint="variant", reason=reason,
                            source=pypi["source"] if pypi else None)
            continue
        yield _from_index(family, pypi, ask)
    for pypi in ix.rows("torch_pypi"):
        if pypi["torch"] not in with_rows:
            yield _index_only_family(pypi, ask)


def _from_index(family: Family, pypi: Row, ask: Ask) -> Family:
    pins: dict[str, str] = {k: pypi[k] for k in PIN_FIELDS if k in pypi}
    return Family(row=family.row, variant=family.variant, index_url=ask.package_index,
                  python=tuple(pypi["python"]), pins={**family.pins, **pins})


def _index_only_family(pypi: Row, ask: Ask) -> Family:
    """A release whose variant set is unsourced: only its package-index wheel is known.

    Its CUDA comes from the wheel's runtime pin; its arch list is unknown, so any GPU
    check refuses it instead of guessing."""
    variant = pypi["default_variant"]
    cuda = None if variant == "cpu" else f"{variant[2:-1]}.{variant[-1]}"
    row = {"torch": pypi["torch"], "variant": variant, "cuda": cuda, "python": pypi["python"],
           "source": pypi["source"]}
    return _from_index(Family(row=row, variant=variant, index_url=None,
                              python=tuple(pypi["python"]), pins={}), pypi, ask)


def check_user_constraints(family: Family, ask: Ask, ix: Index) -> Rejection | None:
    row = family.row

    def reject(constraint: str, reason: str) -> Rejection:
        return Rejection(family=family.label, constraint=constraint, reason=reason,
                         source=row["source"])

    if ask.torch and not ask.torch.admits(row["torch"]):
        return reject("torch", f"torch {row['torch']} does not match --torch {ask.torch}")
    if ask.torch and ask.torch.local and ask.torch.local != row["variant"]:
        return reject("torch", f"variant {row['variant']} is not +{ask.torch.local}")
    if ask.variant not in (None, "default") and ask.variant != row["variant"]:
        return reject("variant", f"variant {row['variant']} is not --variant {ask.variant}")
    if ask.variant is None and row["variant"] == "cpu":
        return reject("variant", "CPU-only wheel (ask with --variant cpu)")
    cuda = ask.cuda
    if cuda and (row["cuda"] is None or not any(
            cuda.admits(t.cuda) for t in ix.releases_of(row["cuda"]))):
        return reject("cuda", f"CUDA {row['cuda'] or 'none (CPU wheel)'} does not match "
                              f"--cuda {cuda}")
    cudnn = family.pins.get("cudnn")
    if ask.cudnn and (cudnn is None or not ask.cudnn.admits(cudnn)):
        return reject("cudnn", f"bundled cuDNN {cudnn or 'unknown'} does not match "
                               f"--cudnn {ask.cudnn}")
    if not pythons(family, ask, ix):
        wanted = f" (--python {ask.python})" if ask.python else ""
        return reject("python", f"no wheel for the Python asked for{wanted}; "
                                f"torch {row['torch']} has wheels for Python "
                                f"{', '.join(family.python)}")
    return None


def pythons(family: Family, ask: Ask, ix: Index) -> list[str]:
    """Admissible Pythons, newest first; free-threaded builds only when asked for."""
    asked = ask.python
    if asked is not None and asked.text.endswith("t"):
        return [py for py in family.python if py == asked.text]
    if asked is None:
        return ix.pythons_newest_first(family.python)
    return [py for py in ix.pythons_newest_first(family.python) if asked.admits(py)]


def check_gpus(family: Family, ask: Ask, ix: Index) -> Rejection | None:
    row = family.row
    if row["cuda"] is None or not ask.gpus:
        return None
    arch_list = row.get("arch_list")
    if not arch_list:
        return Rejection(family=family.label, constraint="gpu-arch", source=row["source"],
                         reason="its arch list is not recorded, so GPU support cannot be checked")
    from envbuild.data.gpus import coverage_of  # only with GPUs: a module fewer at start-up

    entries = ix.arch(arch_list)
    for gpu in ask.gpus:
        if coverage_of(gpu.compute_capability, entries) is None:
            instead = _variants_covering(gpu, row["torch"], ix)
            hint = f"; use variant {', '.join(instead)}" if instead else ""
            return Rejection(
                family=family.label, constraint="gpu-arch", source=row["source"],
                reason=f"{gpu.sm} ({gpu.label}) not in its arch list [{', '.join(arch_list)}]{hint}",
            )
    return None


def _variants_covering(gpu: GpuTarget, torch: str, ix: Index) -> list[str]:
    from envbuild.data.gpus import coverage_of

    return [r["variant"] for r in ix.rows("torch_variants")
            if r["torch"] == torch and r["cuda"] and r.get("arch_list")
            and coverage_of(gpu.compute_capability, ix.arch(r["arch_list"])) is not None]


def check_driver(family: Family, ask: Ask, ix: Index) -> Runtime | Rejection:
    row = family.row
    releases = [t for t in ix.releases_of(row["cuda"])
                if ask.cuda is None or ask.cuda.admits(t.cuda)]
    if not releases:
        return Rejection(family=family.label, constraint="cuda", source=row["source"],
                         reason=f"no CUDA {row['cuda']} toolkit release in cuda_toolkits.yaml")
    gpu_floor = max((g.min_driver_branch or 0 for g in ask.gpus), default=0)
    ceiling = min((g.last_driver_branch for g in ask.gpus if g.last_driver_branch),
                  default=None)
    driver = ask.driver
    if driver is None and ceiling is not None:
        # A retired GPU caps the driver: judge the family on the newest driver it supports.
        driver = DriverVersion(ceiling)
    if driver is None:
        newest = releases[0]
        need = max(newest.driver, DriverVersion(gpu_floor)) if gpu_floor else newest.driver
        return Runtime("native", [t.cuda for t in releases], need, newest.source)
    runs = ix.native(driver)
    native = [t for t in releases if t in runs]
    if native:
        return Runtime("native", [t.cuda for t in native], native[0].driver, native[0].source)
    result = _minor_or_forward(family, ask, ix, releases, driver)
    if isinstance(result, Rejection) and ask.driver is None and ceiling is not None:
        gpu = next(g for g in ask.gpus if g.last_driver_branch == ceiling)
        return Rejection(family=result.family, constraint="gpu-driver", source=gpu.source,
                         reason=f"{result.reason.split(' (host')[0]}, but {gpu.label} is "
                                f"supported only up to driver branch {ceiling}")
    return result


def driver_verdict(family: Family, ask: Ask, ix: Index,
                   verdicts: dict[Any, Runtime | Rejection]) -> Runtime | Rejection:
    """``check_driver``, reached once per CUDA series and request.

    The verdict depends on the family only through its CUDA series and, when GPUs are
    named, its arch list (the PTX check), so families that share both share it; a
    rejection is handed out under each family's own name. The one rejection that cites
    the family's own row (no toolkit release for its CUDA) is not shared."""
    row = family.row
    key = (row["cuda"], tuple(row.get("arch_list", ())) if ask.gpus else None)
    found = verdicts.get(key)
    if found is None:
        found = verdicts[key] = check_driver(family, ask, ix)
        return found
    if isinstance(found, Rejection):
        if found.constraint == "cuda":
            return check_driver(family, ask, ix)
        return found.renamed(family.label)
    return found


def _minor_or_forward(family: Family, ask: Ask, ix: Index, releases: list[Toolkit],
                      driver: DriverVersion) -> Runtime | Rejection:
    row = family.row
    major = releases[0].major
    floor = ix.floor(major)
    oldest = releases[-1]
    why = f"CUDA {row['cuda']} needs driver >= {oldest.driver.full()} (host: {driver})"
    if floor is not None and driver.satisfies(floor):
        ptx_only = _ptx_only(ask.gpus, ix.arch(row.get("arch_list", ()))) if ask.gpus else []
        if ptx_only:
            return Rejection(family=family.label, constraint="driver", source=ix.floors[major][1],
                             reason=f"{why}; minor-version compatibility cannot JIT its PTX for "
                                    f"{ptx_only[0].sm}")
        runs = ix.native(driver)
        bases = [t.cuda for t in ix.toolkits if t.major == major and t in runs]
        return Runtime("minor-version", bases, floor, ix.floors[major][1])
    forward = ix.forward.get(major)
    if (forward and ask.gpus and all(g.datacenter for g in ask.gpus)
            and driver.branch in forward[0]):
        return Runtime("forward", [t.cuda for t in releases], DriverVersion(driver.branch), forward[1])
    if floor is not None:
        why += f"; minor-version compatibility needs >= {floor.full()}"
    return Rejection(family=family.label, constraint="driver", reason=why, source=oldest.source)


def _ptx_only(gpus: Iterable[GpuTarget], entries: list[ArchEntry]) -> list[GpuTarget]:
    from envbuild.data.gpus import coverage_of

    return [g for g in gpus if coverage_of(g.compute_capability, entries) == "ptx"]


def choose_base(family: Family, runtime: Runtime | None, ask: Ask,
                ix: Index) -> tuple[str, str, str | None] | Rejection:
    """(ubuntu, base image, base CUDA release): an nvidia/cuda image for the newest Ubuntu
    that has one, else (runtime flavour) plain Ubuntu, since the wheels carry CUDA's
    libraries and the rendered image sets the NVIDIA_* variables itself."""
    ubuntus = [u for u in ix.ubuntus if ask.ubuntu in (None, u)]
    too_old = ix.too_old(family.row["torch"])
    usable = [u for u in ubuntus if u not in too_old]
    if not usable:
        where = f"Ubuntu {ask.ubuntu}" if ask.ubuntu else "any Ubuntu in ubuntu_python.yaml"
        why = f" (its glibc is older than the wheel's {family.pins.get('platform_tag')})" \
            if ubuntus else ""
        return Rejection(family=family.label, constraint="ubuntu", source=None,
                         reason=f"no base for {where}{why}")
    if runtime is None:  # CPU wheel
        return usable[0], f"ubuntu:{usable[0]}", None
    flavor = "base" if ask.flavor == "runtime" else "devel"
    for release in runtime.base_releases:
        for ubuntu in usable:
            flavors = ix.images.get((release, ubuntu))
            if flavors is not None and flavor in flavors:
                return ubuntu, f"nvidia/cuda:{release}-{flavor}-ubuntu{ubuntu}", release
    if ask.flavor == "runtime":
        built_for = {u for (cuda, u) in ix.images if cuda.startswith(f"{family.row['cuda']}.")}
        ubuntu = next((u for u in usable if u in built_for), usable[0])
        return ubuntu, f"ubuntu:{ubuntu}", None
    where = f"Ubuntu {ask.ubuntu}" if ask.ubuntu else "any Ubuntu"
    return Rejection(family=family.label, constraint="ubuntu", source=None,
                     reason=f"no nvidia/cuda {family.row['cuda']} devel image "
                            f"for {where} in cuda_images.yaml")


def build_stack(family: Family, runtime: Runtime | None, base: tuple[str, str, str | None],
                ask: Ask, ix: Index) -> Pinned:
    row = family.row
    ubuntu, image, base_cuda = base
    distro = ix.ubuntu_rows.get(ubuntu, {}).get("python")
    candidates = pythons(family, ask, ix)
    python = distro if distro in candidates and ask.python is None else candidates[0]
    companions = ix.companions.get(row["torch"], {})
    notes = []
    if runtime and runtime.compat == "minor-version":
        notes.append(f"runs CUDA {row['cuda']} through minor-version compatibility: "
                     f"no PTX JIT of newer PTX; features needing a newer driver fail")
    if runtime and runtime.compat == "forward":
        notes.append("needs the cuda-compat package (forward compatibility, datacenter GPUs only)")
    if runtime and base_cuda is None:
        notes.append("plain Ubuntu base: no nvidia/cuda base image is recorded for this CUDA "
                     "release; the wheels carry the CUDA libraries")
    if not row.get("arch_list") and row["cuda"]:
        notes.append("arch list not recorded: GPU support of this wheel is unverified")
    return Pinned({
        "torch": row["torch"],
        "torchvision": companions.get("torchvision"),
        "torchaudio": companions.get("torchaudio"),
        "variant": family.variant,
        "index_url": family.index_url,
        "cuda": family.pins.get("cuda_runtime", row["cuda"]),
        "cudnn": family.pins.get("cudnn"),
        "nccl": family.pins.get("nccl"),
        "python": python,
        "ubuntu": ubuntu,
        "base_image": image,
        "base_cuda": base_cuda,
        "compat": runtime.compat if runtime else None,
        "min_driver": runtime.min_driver.full() if runtime else None,
        "flavor": ask.flavor,
        "arch_list": tuple(row.get("arch_list", ())),
        "notes": tuple(notes),
    })


def evaluate(family: Family, ask: Ask, ix: Index,
             verdicts: dict[Any, Runtime | Rejection]) -> Pinned | Rejection:
    """Run the checks in order; the first failure is the family's rejection.

    ``verdicts``: driver verdicts already reached for this request (see ``driver_verdict``)."""
    rejection = (check_user_constraints(family, ask, ix)
                 or check_gpus(family, ask, ix))
    if rejection:
        return rejection
    runtime: Runtime | None = None
    if family.row["cuda"] is not None:
        checked = driver_verdict(family, ask, ix, verdicts)
        if isinstance(checked, Rejection):
            return checked
        runtime = checked
    base = choose_base(family, runtime, ask, ix)
    if isinstance(base, Rejection):
        return base
    return build_stack(family, runtime, base, ask, ix)


# --- the ranking policy, in one place ---------------------------------------------------


def rank_key(stack: Pinned | Any, release: Any) -> tuple[Any, ...]:
    """Best first: newest torch; native before minor-version before forward; the newest
    CUDA variant; the newest Ubuntu; the newest Python; then the variant name, so that
    ties always break the same way (FAULTS B5). ``release``: version text → release tuple."""
    return _ranked(stack, lambda text: _neg(release(text)))


def _ranked(stack: Pinned | Any, newest_first: Any) -> tuple[Any, ...]:
    """``rank_key`` with ``newest_first``: version text → a key that sorts newest first."""
    return (
        newest_first(stack.torch),
        COMPAT_ORDER[stack.compat],
        newest_first(stack.cuda) if stack.cuda else _NO_CUDA,
        newest_first(stack.ubuntu),
        newest_first(stack.python.rstrip("t")),
        stack.variant,
    )


def _neg(release: tuple[int, ...]) -> tuple[int, ...]:
    return (*(-p for p in release), 1)


_NO_CUDA = _neg((0,))  # a CPU wheel ranks after every CUDA variant


# --- host-level conflicts, independent of any family ------------------------------------


def global_conflicts(ask: Ask, ix: Index) -> list[Rejection]:
    found = _unknown_variant(ask, ix)
    for gpu in ask.gpus:
        driver = ask.driver
        if driver and gpu.min_driver_branch and driver.branch < gpu.min_driver_branch:
            found.append(Rejection(
                family="host", constraint="gpu-driver", source=gpu.source,
                reason=f"{gpu.label} needs driver branch >= {gpu.min_driver_branch} (host: {driver})"))
        if driver and gpu.last_driver_branch and driver.branch > gpu.last_driver_branch:
            found.append(Rejection(
                family="host", constraint="gpu-driver", source=gpu.source,
                reason=f"{gpu.label} is supported only up to driver branch "
                       f"{gpu.last_driver_branch} (host: {driver})"))
    return found


def _unknown_variant(ask: Ask, ix: Index) -> list[Rejection]:
    """``--torch 2.3.1+cu999`` / ``--variant cu999``: name the variants that do exist."""
    torch = ask.torch
    wanted = torch.local if torch and torch.local else ask.variant
    if wanted in (None, "default"):
        return []
    rows = [r for r in ix.rows("torch_variants") if torch is None or torch.admits(r["torch"])]
    if any(r["variant"] == wanted for r in rows):
        return []
    available = sorted({r["variant"] for r in rows})
    which = f"torch {torch.text.split('+')[0]}" if torch else "any torch release"
    return [Rejection(family="request", constraint="variant", source=None,
                      reason=f"no wheel variant {wanted} for {which}; "
                             f"available: {', '.join(available) or 'none'}")]


def solve(ask: Ask, ix: Index) -> Outcome:
    """All stacks that fit, best first, plus every rejected family with its reason."""
    summary = summarize_driver(ask.driver, ix) if ask.driver else None
    conflicts = global_conflicts(ask, ix)
    stacks: list[Pinned] = []
    rejected: list[Rejection] = []
    verdicts: dict[Any, Runtime | Rejection] = {}
    for family in families(ask, ix):
        if isinstance(family, Rejection):
            rejected.append(family)
            continue
        result = conflicts[0] if conflicts else evaluate(family, ask, ix, verdicts)
        if isinstance(result, Rejection):
            rejected.append(result.renamed(family.label) if conflicts else result)
        else:
            stacks.append(result)
    keys: dict[str, tuple[int, ...]] = {}  # a few dozen version texts, each ranked once

    def newest_first(text: str) -> tuple[int, ...]:
        found = keys.get(text)
        if found is None:
            found = keys[text] = _neg(ix.release(text))
        return found

    stacks.sort(key=lambda s: _ranked(s, newest_first))
    return Outcome(stacks=tuple(stacks), rejected=tuple(rejected), driver=summary,
                   global_conflicts=tuple(conflicts))


def group_rejections(rejected: Iterable[Rejection]) -> dict[str, list[Rejection]]:
    groups: dict[str, list[Rejection]] = {}
    for rejection in rejected:
        groups.setdefault(rejection.constraint, []).append(rejection)
    return groups
