"""The precompiled candidate index of one data set, and its on-disk cache.

Everything that needs ``packaging`` is computed once per data set, by ``build_index``:
version orders (toolkits, Ubuntu releases, each family's Pythons), normalised CUDA
release strings, release tuples for ranking, parsed arch lists, glibc floors. The index
is plain data; ``load_index`` keeps it in the cache directory as ``marshal`` output,
keyed by the data files' ``stat`` (sizes, inodes, change times), so a warm start reads
one small file instead of hashing and parsing every data file. What a request adds
(driver, GPUs, constraints) is then judged (``checks``) with dictionary lookups and
tuple compares, so ``envbuild resolve`` starts without ``re`` or ``packaging``.
"""

from __future__ import annotations

import os

from envbuild.data.matrix import file_identity
from envbuild.data.versions import DriverVersion
from envbuild.resolver.model import PIN_FIELDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from typing import Any

    from envbuild.data.gpus import ArchEntry
    from envbuild.data.matrix import Matrix, Row

# The rows the request builder (``selection``), the checks and ``explain`` read at run
# time, with the fields they read: the index keeps only these (the rest is precomputed),
# as a warm start's cost is mostly unmarshalling it. Code that reads another field adds it.
KEPT_FIELDS = {
    "cuda_toolkits": ("min_driver",),
    "cuda_compat": ("min_driver",),
    "gpus": ("name", "aliases", "compute_capability", "architecture", "family", "datacenter",
             "min_driver_branch", "last_driver_branch", "driver_source", "source", "assumed_for",
             "host_arch", "min_cuda"),
    "torch_variants": ("torch", "variant", "cuda", "python", "arch_list", "source", *PIN_FIELDS),
    "torch_pypi": ("torch", "default_variant", "python", "platform_tag", "source", *PIN_FIELDS),
    "torch_companions": ("torch", "torchvision", "torchaudio", "torchvision_python",
                         "torchaudio_python", "note"),
    "ubuntu_python": ("ubuntu", "python", "glibc"),
}
INDEX_FORMAT = 10  # 6: a driver keeps its text; 7: the GPU rows (with architecture and family) packed apart;
# 8: the recorded standalone CPython builds; 9: the companions' CPython versions, driver branches;
# 10: the linux/arm64 variant rows, standalone builds per architecture, GPUs' host architecture


def build_index(matrix: Matrix) -> dict[str, Any]:
    """Every version-dependent fact the checks need, as marshal-able plain data."""
    from contextlib import suppress

    from packaging.version import InvalidVersion, Version

    def release(text: str, into: dict[str, tuple[int, ...]]) -> None:
        with suppress(InvalidVersion):  # else looked up at run time, failing as it always did
            into[text] = Version(text).release

    import marshal

    from envbuild.data.gpus import gpu_keys, parse_arch_list

    rows = {name: [{k: v for k, v in r.items() if k in keep} for r in matrix.rows(name)]
            for name, keep in KEPT_FIELDS.items()}
    gpus = rows.pop("gpus")
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
    aarch64 = aarch64_variants(matrix, rows["torch_variants"], pypi)
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
                 for r in rows["torch_variants"] + aarch64 if r.get("arch_list")},
        "aarch64": aarch64,
        "too_old": {t: sorted(too_old_ubuntus(t, pypi, ubuntus)) for t in torches},
        # architecture → Python → the version of its recorded python-build-standalone build:
        # a Python no Ubuntu ships can still be installed.
        "standalone": {arch: {r["python"]: r["version"] for r in matrix.rows("python_standalone")
                              if r["arch"] == arch} for arch in ("x86_64", "aarch64")},
        # The GPU catalogue and its folded names, marshalled apart: only a request that names a
        # GPU unpacks them, so its size costs the other forms nothing.
        # Each row is packed on its own: a lookup unpacks the keys and the one row it finds.
        "gpus": marshal.dumps((gpu_keys(gpus), [marshal.dumps(row) for row in gpus])),
        # branch -> (designation, end of life "YYYY-MM" or None, source): the driver's lifecycle
        "branches": {r["branch"]: (r["designation"], r.get("end_of_life"), r["source"])
                     for r in matrix.rows("driver_branches")},
    }


def aarch64_variants(matrix: Matrix, variants: list[Row], pypi: Mapping[str, Row]) -> list[Row]:
    """The linux/arm64 candidates: each torch_aarch64 row as a variant row (CUDA, Pythons and
    pins from the x86_64 row of its release and variant, the aarch64 arch list and source),
    plus ``pytorch_index`` / ``pypi_default``. A package-index CPU wheel with no variant row
    takes its Pythons from that release's torch_pypi row."""
    by_key = {(r["torch"], r["variant"]): r for r in variants}
    out = []
    for row in matrix.rows("torch_aarch64"):
        base = by_key.get((row["torch"], row["variant"]))
        if base is None:
            on_index = pypi.get(row["torch"])
            if on_index is None:
                continue  # validated data has one; an index-only CPU wheel needs its Pythons
            base = {"torch": row["torch"], "variant": "cpu", "cuda": None, "python": on_index["python"]}
        merged = {k: v for k, v in base.items() if k != "arch_list"}
        if row.get("arch_list") is not None:
            merged["arch_list"] = row["arch_list"]
        merged.update(source=row["source"], pytorch_index=row["pytorch_index"],
                      pypi_default=row["pypi_default"])
        out.append(merged)
    return out


def _driver_parts(text: str) -> tuple[int | str | None, ...]:
    """``DriverVersion``'s arguments: its numbers and the text as the data writes it."""
    driver = DriverVersion.parse(text)
    return (driver.branch, driver.minor, driver.patch, driver.text)


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


class PackedRows:
    """Rows marshalled one by one, unpacked on first access: a read-only sequence."""

    __slots__ = ("_packed", "_rows")

    def __init__(self, packed: list[bytes]) -> None:
        self._packed = packed
        self._rows: list[Row | None] = [None] * len(packed)

    def __len__(self) -> int:
        return len(self._packed)

    def __getitem__(self, position: int) -> Row:
        row = self._rows[position]
        if row is None:
            import marshal

            row = self._rows[position] = marshal.loads(self._packed[position])
        return row

    def __iter__(self) -> Iterator[Row]:
        return (self[i] for i in range(len(self._packed)))


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
        self._standalone: dict[str, dict[str, str]] = data["standalone"]
        self.standalone: dict[str, str] = self._standalone["x86_64"]
        self.aarch64: list[Row] = data["aarch64"]
        self.branches: dict[int, tuple[str, str | None, str]] = data["branches"]
        self._gpus_packed: bytes = data["gpus"]
        self._gpus: tuple[dict[str, int], PackedRows] | None = None
        self._native: dict[tuple[int, ...], set[Toolkit]] = {}

    def _gpu_data(self) -> tuple[dict[str, int], PackedRows]:
        if self._gpus is None:
            import marshal

            keys, packed = marshal.loads(self._gpus_packed)
            self._gpus = keys, PackedRows(packed)
        return self._gpus

    @property
    def gpu_keys(self) -> dict[str, int]:
        """Folded GPU names → ``rows("gpus")`` positions."""
        return self._gpu_data()[0]

    def gpu_rows(self) -> PackedRows:
        """The GPU rows, each unpacked when first read (a lookup reads one)."""
        return self._gpu_data()[1]

    def rows(self, relation: str) -> list[Row]:
        if relation == "gpus":
            return list(self.gpu_rows())
        return self.relations.get(relation, [])

    def variant_rows(self, platform: str) -> list[Row]:
        """The wheel variants of one platform: torch_variants for linux/amd64, the merged
        aarch64 rows (``aarch64_variants``) for linux/arm64."""
        return self.aarch64 if platform == "linux/arm64" else self.rows("torch_variants")

    def standalone_for(self, platform: str) -> dict[str, str]:
        """Python → its recorded python-build-standalone version for the platform's CPU."""
        return self._standalone["aarch64" if platform == "linux/arm64" else "x86_64"]

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
    """The index of an in-memory matrix, built once per Matrix; for a matrix ``matrix.load``
    read with a cache directory, kept there (keyed by every data file's content and this
    file's identity), so that ``lock`` starts without building it again (15 ms)."""
    index = matrix.derived.get("index")
    if index is None:
        cache = matrix.derived.get("cache")
        data = _kept_index(*cache) if cache is not None else None
        if data is None:
            data = build_index(matrix)
            if cache is not None:
                _save(_kept_file(cache[0]), {"format": INDEX_FORMAT, "code": file_identity(__file__),
                                             "key": cache[1], "index": data})
        index = matrix.derived["index"] = Index(data)
    return index


# --- the on-disk index: the fast path's cache ---------------------------------------------


def _signature(directory: str) -> tuple[Any, ...]:
    """Identity of every data file: any write changes a file's size or change time."""
    from envbuild.data.matrix import MANIFEST, RELATIONS

    names = [f"{name}.yaml" for name in RELATIONS] + [MANIFEST]
    directory_id = file_identity(directory)
    # This file's identity too: another envbuild (an upgrade, an edit) may lay out the
    # index differently while the data stays the same.
    return (file_identity(__file__), directory_id[1:3] if directory_id else None,
            *((name, file_identity(os.path.join(directory, name))) for name in names))


def _cache_file(cache_dir: str, directory: str) -> str:
    import sys

    digest = 0xCBF29CE484222325  # FNV-1a: a stable name per directory without hashlib
    for byte in os.fsencode(directory):
        digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    tag = sys.implementation.cache_tag or "py"  # marshal's format follows the interpreter
    return os.path.join(cache_dir, f"resolve-index-{digest:016x}.{tag}.marshal")


def _kept_file(cache_dir: str) -> str:
    import sys

    return os.path.join(cache_dir, f"matrix-index.{sys.implementation.cache_tag or 'py'}.marshal")


def _kept_index(cache_dir: str, key: str) -> dict[str, Any] | None:
    """The index kept for the data files whose content digest is ``key``, if this code wrote it."""
    import marshal

    try:
        with open(_kept_file(cache_dir), "rb") as handle:
            saved = marshal.loads(handle.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if (isinstance(saved, dict) and saved.get("format") == INDEX_FORMAT and saved.get("key") == key
            and saved.get("code") == file_identity(__file__)):
        kept = saved.get("index")
        if isinstance(kept, dict):
            return kept
    return None


def load_index(directory: str, cache_dir: str | None) -> Index:
    """The index of ``directory``: from the cache when no data file changed since it was
    written, else through ``matrix.load`` (validation, manifest, errors) and saved.

    ``matrix.load`` is given ``directory`` as written, so that its errors name the path
    the user gave; the cache is keyed by the real path."""
    import marshal

    given, directory = directory, os.path.realpath(directory)
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

    loaded = matrix.load(Path(given), cache_dir=Path(cache_dir) if cache_dir else None)
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


