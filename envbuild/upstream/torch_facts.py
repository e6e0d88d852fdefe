"""Facts about torch releases read from the package index: the default Linux x86_64
wheel's CPython versions, CUDA runtime/cuDNN/NCCL pins and variant, and the
torchvision/torchaudio releases that pin each torch."""

from __future__ import annotations

import email.parser
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from envbuild.upstream.simple_api import MetadataRead, WheelFile, cpython_of

LINUX_X86_64 = re.compile(r"(many)?linux(1|2010|2014|_\d+_\d+)?_x86_64")
PREFERRED_PYTHON = "cp311"
# PyPI names of the CUDA libraries a torch wheel pins. Since CUDA 13 the ``-cuXX``
# suffix is gone for some of them (``nvidia-cuda-runtime``), so the suffix is optional.
CUDA_PIN_NAMES: Mapping[str, re.Pattern[str]] = {
    "cuda_runtime": re.compile(r"nvidia-cuda-runtime(-cu\d+)?"),
    "cudnn": re.compile(r"nvidia-cudnn(-cu\d+)?"),
    "nccl": re.compile(r"nvidia-nccl(-cu\d+)?"),
}
# The environment a Linux x86_64 CPython 3.11 install evaluates Requires-Dist markers in.
LINUX_MARKERS: Mapping[str, str] = {
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "extra": "",
}



@dataclass(frozen=True, slots=True, kw_only=True)
class TorchWheelFact:
    """What the index says about one torch release's default Linux x86_64 wheels."""

    torch: str
    default_variant: str | None
    python: tuple[str, ...]
    free_threaded: tuple[str, ...]
    requires_python: str | None
    platform_tag: str
    other_platform_tags: tuple[str, ...]
    cuda_runtime: str | None
    cuda_runtime_via: str | None
    cudnn: str | None
    nccl: str | None
    filename: str
    metadata_bytes: int
    upload_time: str | None = None  # of the wheel read, as the index gives it


@dataclass(frozen=True, slots=True, kw_only=True)
class CompanionFact:
    """A torchvision/torchaudio release and the torch it pins (None: not pinned). Without a
    pin, ``build`` is the ``__version__`` its wheel's ``version.py`` holds (``0.29.2+cu132``)
    and ``built_for`` the torch release that build and the upload time tie it to
    (``companion_builds``), ``evidence`` saying how."""

    project: str
    version: str
    torch: str | None
    torch_requirement: str | None
    filename: str
    metadata_bytes: int
    upload_time: str | None = None
    python: tuple[str, ...] = ()  # CPython versions of its Linux x86_64 wheels (none: stable ABI only)
    build: str | None = None
    built_for: str | None = None
    evidence: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CompanionRow:
    torch: str
    torchvision: CompanionFact | None
    torchaudio: CompanionFact | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PypiFacts:
    torch: tuple[TorchWheelFact, ...]
    torchvision: tuple[CompanionFact, ...]
    torchaudio: tuple[CompanionFact, ...]
    companions: tuple[CompanionRow, ...]


Progress = Callable[[str], None]
FIRST_TORCH = Version("1.13.0")


class IndexReader(Protocol):
    """What the fact collectors need from an index: IndexClient, or a cache in front of it."""

    def list_wheels(self, project: str) -> tuple[WheelFile, ...]: ...

    def wheel_metadata(self, wheel: WheelFile) -> MetadataRead: ...


def torch_facts(
    client: IndexReader, *, since: Version = FIRST_TORCH, progress: Progress | None = None
) -> tuple[TorchWheelFact, ...]:
    """One fact per final torch release >= ``since`` that has Linux x86_64 CPython wheels."""
    facts: list[TorchWheelFact] = []
    for version, wheels in releases(client.list_wheels("torch"), since=since):
        linux = [w for w in wheels if is_linux_x86_64_cpython(w)]
        if not linux:
            continue
        read = client.wheel_metadata(preferred_wheel(linux))
        facts.append(torch_fact(version, linux, read))
        _report(progress, f"torch {version}: metadata {how_read(read)}")
    return tuple(facts)


def torch_fact(version: Version, linux: Sequence[WheelFile], read: MetadataRead) -> TorchWheelFact:
    metadata = email.parser.HeaderParser().parsestr(read.text)
    pins = cuda_pins(metadata.get_all("Requires-Dist") or [])
    runtime = pins.get("cuda_runtime")
    platforms = sorted({w.platform for w in linux} - {read.wheel.platform})
    return TorchWheelFact(
        torch=str(version),
        default_variant=variant_of(runtime[0]) if runtime else None,
        python=_pythons(linux, free_threaded=False),
        free_threaded=_pythons(linux, free_threaded=True),
        requires_python=metadata.get("Requires-Python") or read.wheel.requires_python,
        platform_tag=read.wheel.platform,
        other_platform_tags=tuple(platforms),
        cuda_runtime=runtime[0] if runtime else None,
        cuda_runtime_via=runtime[1] if runtime else None,
        cudnn=pins["cudnn"][0] if "cudnn" in pins else None,
        nccl=pins["nccl"][0] if "nccl" in pins else None,
        filename=read.wheel.filename,
        metadata_bytes=read.bytes_transferred,
        upload_time=read.wheel.upload_time,
    )


def cuda_pins(requires_dist: Iterable[str]) -> dict[str, tuple[str, str]]:
    """{"cuda_runtime"|"cudnn"|"nccl": (pinned version, requirement it came from)}.

    Only ``==`` pins that apply on Linux x86_64. Since CUDA 13, torch pins the runtime
    through ``cuda-toolkit[cudart,...]==X`` instead of ``nvidia-cuda-runtime-cuXX``.
    """
    pins: dict[str, tuple[str, str]] = {}
    for line in requires_dist:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker and not requirement.marker.evaluate(dict(LINUX_MARKERS)):
            continue
        pinned = exact_pin(requirement)
        if pinned is None:
            continue
        name = canonicalize_name(requirement.name)
        for key, pattern in CUDA_PIN_NAMES.items():
            if pattern.fullmatch(name):
                pins[key] = (pinned, f"{name}=={pinned}")
        if name == "cuda-toolkit" and "cudart" in requirement.extras:
            pins.setdefault("cuda_runtime", (pinned, f"cuda-toolkit[cudart]=={pinned}"))
    return pins


def exact_pin(requirement: Requirement) -> str | None:
    specs = list(requirement.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def variant_of(cuda_runtime: str) -> str:
    """``cu117`` from a CUDA runtime pin such as 11.7.99."""
    release = Version(cuda_runtime).release
    return f"cu{release[0]}{release[1] if len(release) > 1 else 0}"


def how_read(read: MetadataRead) -> str:
    """How a wheel's metadata was had, for a progress line: from the cache, or what it cost."""
    if read.bytes_transferred == 0:
        return "from the refresh cache"
    how = "its .metadata file (PEP 658)" if read.method == "pep658" else "byte ranges of the wheel"
    return f"{read.bytes_transferred} bytes read, {how}"


def companion_facts(
    client: IndexReader,
    project: str,
    *,
    since: Version = FIRST_TORCH,
    progress: Progress | None = None,
    build_of: Callable[[WheelFile], str | None] | None = None,
) -> tuple[CompanionFact, ...]:
    """Releases of ``project`` (newest first) down to the first that pins a torch < ``since``;
    ``build_of`` reads the build of each release that pins no torch."""
    facts: list[CompanionFact] = []
    for version, wheels in reversed(releases(client.list_wheels(project))):
        wheel = preferred_wheel(wheels)
        read = client.wheel_metadata(wheel)
        requirement = torch_requirement(read.text)
        torch = exact_pin(requirement) if requirement else None
        _report(progress, f"{project} {version}: requires torch {torch or 'without an exact pin'} "
                          f"(metadata {how_read(read)})")
        if torch is not None and Version(torch) < since:
            break
        facts.append(
            CompanionFact(
                project=canonicalize_name(project),
                version=str(version),
                torch=torch,
                torch_requirement=str(requirement.specifier) if requirement else None,
                filename=read.wheel.filename,
                metadata_bytes=read.bytes_transferred,
                upload_time=wheel.upload_time,
                python=_pythons([w for w in wheels if is_linux_x86_64_cpython(w)], free_threaded=False),
                build=build_of(wheel) if build_of and torch is None else None,
            )
        )
    return tuple(sorted(facts, key=lambda fact: Version(fact.version)))


def torch_requirement(metadata_text: str) -> Requirement | None:
    """The unconditional ``Requires-Dist: torch...`` of a companion, if it has one."""
    metadata = email.parser.HeaderParser().parsestr(metadata_text)
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) == "torch" and not requirement.marker:
            return requirement
    return None


def companions_table(
    torch_versions: Iterable[str],
    vision: Iterable[CompanionFact],
    audio: Iterable[CompanionFact],
) -> tuple[CompanionRow, ...]:
    """For each torch version, its torchvision/torchaudio release (None: none on the index).

    A release pinning exactly this torch, or tied to it by its build (``built_for``), wins
    (the newest of them). Else ``loose_pairs``: a release that only requires ``torch>=X.Y.0``
    pairs with the newest patches of X.Y."""
    ordered = sorted(set(torch_versions), key=Version)
    by_torch_vision = loose_pairs(ordered, vision)
    by_torch_audio = loose_pairs(ordered, audio)
    return tuple(
        CompanionRow(
            torch=version,
            torchvision=by_torch_vision.get(version),
            torchaudio=by_torch_audio.get(version),
        )
        for version in ordered
    )


def loose_minor(fact: CompanionFact) -> tuple[int, int] | None:
    """(X, Y) when the companion requires ``torch>=X.Y.0`` (or ``>=X.Y``) and nothing else:
    a lower bound on one torch minor, no upper bound, no exact pin."""
    if fact.torch is not None or fact.built_for is not None or not fact.torch_requirement:
        return None
    match = _LOWER_BOUND.fullmatch(fact.torch_requirement.replace(" ", ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


_LOWER_BOUND = re.compile(r">=(\d+)\.(\d+)(?:\.0)?")


def loose_pairs(torch_versions: Sequence[str], facts: Iterable[CompanionFact]) -> dict[str, CompanionFact]:
    """torch version → companion, exact pins first, then the lower-bound rule.

    PyTorch builds each torchvision (and torchaudio) minor for one torch minor (torchvision's
    README compatibility table: torch 2.3 ↔ torchvision 0.18, ...). Newer companion patch
    releases declare ``torch>=X.Y.0`` instead of pinning: such a release pairs with the torch
    X.Y.z patches newer than every X.Y patch some release pins exactly (all of X.Y's patches
    when none is pinned), the newest such companion for each. An older, unpinned patch stays
    unpaired: the loose release was built after the pinned one, for the newest torch. A release
    whose build ties it to one torch (``built_for``, see ``companion_builds``) counts as a pin:
    the rule is only the fallback where a wheel gives no such evidence."""
    facts = sorted(facts, key=lambda f: Version(f.version))
    table = _newest_by_torch(facts)
    minors: dict[tuple[int, int], list[Version]] = {}
    for text in torch_versions:
        version = Version(text)
        minors.setdefault((version.major, version.minor), []).append(version)
    for minor, patches in minors.items():
        loose = [f for f in facts if loose_minor(f) == minor]
        if not loose:
            continue
        pinned = [p for p in patches if str(p) in table]
        floor = max(pinned) if pinned else None
        for patch in patches:
            if str(patch) not in table and (floor is None or patch > floor):
                table[str(patch)] = loose[-1]
    return table


def _newest_by_torch(facts: Iterable[CompanionFact]) -> dict[str, CompanionFact]:
    table: dict[str, CompanionFact] = {}
    for fact in sorted(facts, key=lambda f: Version(f.version)):
        torch = fact.torch or fact.built_for  # an exact pin, or the build ties it to one torch
        if torch is not None:
            table[str(Version(torch))] = fact
    return table


def releases(
    wheels: Iterable[WheelFile], *, since: Version | None = None
) -> list[tuple[Version, list[WheelFile]]]:
    """Final releases (oldest first) with their non-yanked wheels."""
    grouped: dict[Version, list[WheelFile]] = {}
    for wheel in wheels:
        version = wheel.version
        if wheel.yanked or version.is_prerelease or version.is_postrelease or version.local:
            continue
        if since is None or version >= since:
            grouped.setdefault(version, []).append(wheel)
    return sorted(grouped.items())


def is_linux_x86_64_cpython(wheel: WheelFile) -> bool:
    return any(
        tag.interpreter.startswith("cp") and LINUX_X86_64.fullmatch(tag.platform)
        for tag in wheel.tags
    )


def preferred_wheel(wheels: Sequence[WheelFile]) -> WheelFile:
    """The wheel whose METADATA stands for the release: Linux x86_64 cp311 if there is one.

    Among equals the highest build tag wins, as in pip (torch 2.10.0 was re-uploaded
    as build 3); then the file name, so the choice never depends on the index's order.
    """

    def rank(wheel: WheelFile) -> tuple[bool, bool, bool]:
        linux = any(LINUX_X86_64.fullmatch(tag.platform) for tag in wheel.tags)
        cp311 = any(tag.interpreter == PREFERRED_PYTHON == tag.abi for tag in wheel.tags)
        pure = all(tag.platform == "any" for tag in wheel.tags)
        return (not (linux and cp311), not linux, not pure)

    ordered = sorted(wheels, key=lambda wheel: wheel.filename)
    ordered.sort(key=lambda wheel: wheel.build, reverse=True)  # stable: names stay sorted
    return min(ordered, key=rank)  # min keeps the first of equal ranks


def _pythons(wheels: Iterable[WheelFile], *, free_threaded: bool) -> tuple[str, ...]:
    """CPython versions ("3.11") of the wheels, regular or free-threaded (abi ``cp314t``)."""
    found: set[Version] = set()
    for wheel in wheels:
        for tag in wheel.tags:
            python = cpython_of(tag)
            if python is not None and python.endswith("t") == free_threaded:
                found.add(Version(python.rstrip("t")))
    return tuple(str(version) for version in sorted(found))


def _report(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)
