"""The Python package index again: torch_wheels rows (sizes and nvidia-* pins per CPython).

For every final torch release (>= 1.13.0) whose default Linux x86_64 wheel requires
nvidia-* packages, one row per CPython tag: the torch wheel's file size (the JSON simple
API's ``size``), its exact nvidia-* Requires-Dist pins (markers evaluated for Linux x86_64
and that Python; METADATA read as the pypi source reads it, cached for good), each pinned
nvidia-* wheel's size, and the sizes of the torchvision/torchaudio wheels that
torch_pypi.yaml pairs with this torch (so this source runs after the pypi source).
Sources are ``pip-index://`` URIs relative to the index, so no file names its host.
"""

from __future__ import annotations

import email.parser
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuild.errors import DataError
from envbuild.upstream.simple_api import IndexClient, WheelFile, cpython_of
from envbuild.upstream.sources import Context, Log, Row, SourceResult
from envbuild.upstream.sources.pypi_source import PREFIX, CachedIndex, source_uri
from envbuild.upstream.torch_facts import FIRST_TORCH, LINUX_MARKERS, LINUX_X86_64, exact_pin, releases

NVIDIA = re.compile(r"nvidia-.+")
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_x86_64")
# Legacy manylinux aliases and the glibc they stand for (PEP 600).
_LEGACY = {"manylinux1_x86_64": (2, 5), "manylinux2010_x86_64": (2, 12),
           "manylinux2014_x86_64": (2, 17), "linux_x86_64": (0, 0)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Pins:
    """The Requires-Dist facts of one torch wheel for one Python."""

    nvidia: Mapping[str, str]
    loose: tuple[str, ...]  # nvidia-* requirements that are not exact pins
    cuda_toolkit: str | None
    cuda_toolkit_extras: tuple[str, ...]


@dataclass(slots=True)
class Pages:
    """The index pages already read in this run, so each project is listed once."""

    reader: CachedIndex
    pages: dict[str, tuple[WheelFile, ...]] = field(default_factory=dict)

    def wheels(self, project: str) -> tuple[WheelFile, ...]:
        name = canonicalize_name(project)
        if name not in self.pages:
            self.pages[name] = self.reader.list_wheels(name)
        return self.pages[name]


@dataclass(frozen=True, slots=True, kw_only=True)
class PypiWheelsSource:
    name: str = "wheels"
    projects: frozenset[str] = frozenset({"torch", "torchvision", "torchaudio"})
    client: IndexClient | None = None
    index: str = ""

    def collect(self, context: Context) -> SourceResult:
        pages = Pages(reader=CachedIndex(self.client, context.fetch, self.index))
        rows = torch_rows(pages, context.existing.get("torch_pypi", ()), context.retrieved,
                          context.progress)
        return SourceResult(name=self.name, prefix=PREFIX, rows={"torch_wheels": tuple(rows)})


def python_of(wheel: WheelFile) -> str | None:
    """"3.11" (or "3.13t") for a CPython wheel's tag; None for abi3 or non-CPython tags."""
    for tag in sorted(wheel.tags, key=str):
        found = cpython_of(tag) if tag.abi != "none" else None
        if found is not None:
            return found
    return None


def linux_x86_64(wheel: WheelFile) -> bool:
    return any(LINUX_X86_64.fullmatch(tag.platform) for tag in wheel.tags)


def glibc(wheel: WheelFile) -> tuple[int, int]:
    """The newest glibc any of the wheel's x86_64 platform tags names (pip prefers it)."""
    best = (0, 0)
    for tag in wheel.tags:
        match = _MANYLINUX.fullmatch(tag.platform)
        found = (int(match[1]), int(match[2])) if match else _LEGACY.get(tag.platform, (0, 0))
        best = max(best, found)
    return best


def pick(wheels: Iterable[WheelFile]) -> WheelFile | None:
    """The one wheel pip would take on a current glibc: newest manylinux, then build, then name."""
    candidates = sorted(wheels, key=lambda w: w.filename)
    if not candidates:
        return None
    return max(candidates, key=lambda w: (glibc(w), w.build))


def markers_for(python: str) -> dict[str, str]:
    version = python.rstrip("t")
    # Marker.evaluate fills the keys not given here from the running interpreter.
    return {**LINUX_MARKERS, "python_version": version, "python_full_version": f"{version}.0"}


def parse_pins(metadata_text: str, python: str) -> Pins:
    """Exact nvidia-* pins (as written) and the cuda-toolkit pin that apply to ``python``."""
    metadata = email.parser.HeaderParser().parsestr(metadata_text)
    nvidia: dict[str, str] = {}
    loose: list[str] = []
    toolkit: tuple[str | None, tuple[str, ...]] = (None, ())
    env = markers_for(python)
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker and not requirement.marker.evaluate(env):
            continue
        name = canonicalize_name(requirement.name)
        pinned = exact_pin(requirement)
        if NVIDIA.fullmatch(name):
            if pinned is None:
                loose.append(f"{requirement.name}{requirement.specifier}")
            else:
                nvidia[requirement.name] = pinned
        elif name == "cuda-toolkit" and pinned is not None:
            toolkit = (pinned, tuple(sorted(requirement.extras)))
    return Pins(nvidia=dict(sorted(nvidia.items())), loose=tuple(loose),
                cuda_toolkit=toolkit[0], cuda_toolkit_extras=toolkit[1])


def wheel_of(pages: Pages, project: str, version: str, python: str | None) -> WheelFile | None:
    """``project``'s Linux x86_64 wheel of ``version`` for ``python`` (None: any Python)."""
    wanted = Version(version)
    found = [w for w in pages.wheels(project)
             if w.version == wanted and not w.yanked and linux_x86_64(w)
             and (python is None or python_of(w) in (python, None))]
    # A wheel for exactly this CPython beats an abi3 / py3 one.
    exact = [w for w in found if python is not None and python_of(w) == python]
    return pick(exact or found)


def torch_rows(pages: Pages, pypi_rows: Sequence[Mapping[str, object]], retrieved: str,
               progress: Log) -> list[Row]:
    companions = {str(r["torch"]): r for r in pypi_rows}
    rows: list[Row] = []
    for version, wheels in releases(pages.wheels("torch"), since=FIRST_TORCH):
        by_python: dict[str, list[WheelFile]] = {}
        for wheel in wheels:
            python = python_of(wheel)
            if python is not None and linux_x86_64(wheel):
                by_python.setdefault(python, []).append(wheel)
        for python in sorted(by_python, key=lambda p: (Version(p.rstrip("t")), p)):
            chosen = pick(by_python[python])
            assert chosen is not None  # by_python holds non-empty lists only
            read = pages.reader.wheel_metadata(chosen)
            pins = parse_pins(read.text, python)
            progress(f"wheels: torch {version} {python}: {len(pins.nvidia)} nvidia pins "
                     f"({read.bytes_transferred} bytes, {read.method})")
            if not pins.nvidia and pins.cuda_toolkit is None:
                continue  # a CPU-only default wheel: nothing to pin or double up
            source = source_uri("torch", chosen.filename, pages.reader.digests)
            rows.append(row(pages, chosen, python, pins, companions.get(str(version)), retrieved,
                            source))
    return rows


def row(pages: Pages, torch: WheelFile, python: str, pins: Pins,
        companions: Mapping[str, object] | None, retrieved: str, source: str) -> Row:
    if torch.size is None:
        raise DataError(f"the index gives no size for {torch.filename}",
                        hint="use an index that serves the JSON simple API's size field")
    out: Row = {"torch": str(torch.version), "python": python, "platform_tag": torch.platform,
                "bytes": torch.size, "nvidia": dict(pins.nvidia)}
    files: dict[str, str] = {}
    sizes: dict[str, int] = {}
    notes: list[str] = []
    for name, pinned in pins.nvidia.items():
        wheel = wheel_of(pages, name, pinned, None)
        if wheel is None or wheel.size is None:
            notes.append(f"no Linux x86_64 wheel size for {name}=={pinned}")
            continue
        sizes[name] = wheel.size
        files[name] = source_uri(wheel.project, wheel.filename)
    out["nvidia_bytes"] = sizes
    if pins.cuda_toolkit is not None:
        out["cuda_toolkit"] = pins.cuda_toolkit
        out["cuda_toolkit_extras"] = list(pins.cuda_toolkit_extras)
    for project in ("torchvision", "torchaudio"):
        version = companions.get(project) if companions else None
        if version is None:
            continue
        wheel = wheel_of(pages, project, str(version), python)
        out[project] = str(version)
        if wheel is None or wheel.size is None:
            notes.append(f"no Linux x86_64 {project} {version} wheel for Python {python}")
            continue
        out[f"{project}_bytes"] = wheel.size
        files[project] = source_uri(wheel.project, wheel.filename)
    out["files"] = dict(sorted(files.items()))
    out["source"] = source
    out["retrieved"] = retrieved
    if pins.loose:
        notes.append("nvidia requirements without an exact pin: " + ", ".join(pins.loose))
    if notes:
        out["note"] = "; ".join(notes)
    return out
