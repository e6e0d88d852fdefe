"""Resolve fully pinned Ubuntu / CUDA / cuDNN / PyTorch / Python stacks.

The search space is small: every (torch release, wheel variant) row of
``torch_variants.yaml`` is a *family*. Each family is checked against the request in a
fixed order (the user's own constraints first, then facts: GPU architecture, driver,
base images); the first failing check is its rejection, with the fact's source. A
family that passes becomes one pinned ``Stack``, and ``rank_key`` orders them.

Compatibility modes, strongest first:
- native: the driver is at least the toolkit driver of the wheel's CUDA release;
- minor-version: the driver meets the CUDA major's floor. The wheel's bundled runtime
  works, but PTX from the newer toolkit cannot be JIT-compiled, so the GPU must be
  covered by SASS. The base image is then the newest CUDA release of that major the
  driver runs natively, because a newer image's NVIDIA_REQUIRE_CUDA refuses to start;
- forward: datacenter GPUs only, through the cuda-compat package, on the driver
  branches NVIDIA lists for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Literal

from packaging.version import Version as _Version

from envbuild.errors import NoCompatibleStack
from envbuild.gpus import GpuTarget, coverage
from envbuild.matrix import Matrix, Row
from envbuild.versions import DriverVersion, Requirement

Compat = Literal["native", "minor-version", "forward"]
Flavor = Literal["runtime", "devel"]
PYTORCH_INDEX = "https://download.pytorch.org/whl"
PIN_FIELDS = ("cuda_runtime", "cudnn", "nccl")


@cache
def Version(text: str) -> _Version:  # a memoised stand-in for the class
    """Versions repeat across rows and checks; parse each string once."""
    return _Version(text)

COMPAT_ORDER: dict[str | None, int] = {"native": 0, "minor-version": 1, "forward": 2, None: 3}


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What the user asked for, parsed; None means unconstrained."""

    driver: DriverVersion | None = None
    gpus: tuple[GpuTarget, ...] = ()
    torch: Requirement | None = None
    python: Requirement | None = None
    cuda: Requirement | None = None
    cudnn: Requirement | None = None
    ubuntu: str | None = None
    variant: str | None = None  # "cu124", "cpu" or "default"
    flavor: Flavor = "runtime"
    package_index: str | None = None  # where "default" wheels come from


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    torch: str
    torchvision: str | None
    torchaudio: str | None
    variant: str
    index_url: str | None
    cuda: str | None  # the CUDA runtime the wheel bundles (pin when known)
    cudnn: str | None
    nccl: str | None
    python: str
    ubuntu: str
    base_image: str
    base_cuda: str | None
    compat: Compat | None  # None for CPU stacks
    min_driver: str | None
    flavor: Flavor
    arch_list: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "torchvision": self.torchvision,
            "torchaudio": self.torchaudio,
            "variant": self.variant,
            "index_url": self.index_url,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "nccl": self.nccl,
            "python": self.python,
            "ubuntu": self.ubuntu,
            "base_image": self.base_image,
            "base_cuda": self.base_cuda,
            "compat": self.compat,
            "min_driver": self.min_driver,
            "flavor": self.flavor,
            "arch_list": list(self.arch_list),
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    family: str
    constraint: str  # which check failed: torch, variant, python, gpu-arch, driver, ...
    reason: str
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "constraint": self.constraint, "reason": self.reason,
                "source": self.source}


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverSummary:
    version: str
    max_cuda: str | None
    max_cuda_release: str | None
    minor_compat: str | None
    needs_newer: tuple[tuple[str, str], ...] = ()  # (CUDA family, driver it needs)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "max_cuda": self.max_cuda,
                "max_cuda_release": self.max_cuda_release, "minor_compat": self.minor_compat}


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    stacks: tuple[Stack, ...]
    rejected: tuple[Rejection, ...]
    driver: DriverSummary | None
    global_conflicts: tuple[Rejection, ...] = field(default=())


# --- facts read from the matrix --------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """Indexes over the matrix rows that the checks need, built once per resolve."""

    matrix: Matrix
    toolkits: tuple[tuple[_Version, DriverVersion, Row], ...]  # newest first
    by_family: Mapping[str, tuple[tuple[_Version, DriverVersion, Row], ...]]
    floors: Mapping[int, Row]
    forward: Mapping[int, Row]
    images: Mapping[tuple[str, str], Row]  # (cuda release, ubuntu) -> row
    ubuntus: Mapping[str, Row]  # ubuntu -> ubuntu_python row
    companions: Mapping[str, Row]
    pypi: Mapping[str, Row]

    @classmethod
    def of(cls, matrix: Matrix) -> Facts:
        toolkits = sorted(
            ((Version(r["cuda"]), DriverVersion.parse(r["min_driver"]), r)
             for r in matrix.rows("cuda_toolkits")),
            key=lambda t: t[0], reverse=True,
        )
        compat = matrix.rows("cuda_compat")
        by_family: dict[str, list[tuple[_Version, DriverVersion, Row]]] = {}
        for item in toolkits:
            by_family.setdefault(f"{item[0].major}.{item[0].minor}", []).append(item)
        return cls(
            matrix=matrix,
            toolkits=tuple(toolkits),
            by_family={k: tuple(v) for k, v in by_family.items()},
            floors={r["cuda_major"]: r for r in compat if r["mode"] == "minor-version"
                    and "min_driver" in r},
            forward={r["cuda_major"]: r for r in compat if r["mode"] == "forward"},
            images={(r["cuda"], r["ubuntu"]): r for r in matrix.rows("cuda_images")},
            ubuntus={r["ubuntu"]: r for r in matrix.rows("ubuntu_python")},
            companions={r["torch"]: r for r in matrix.rows("torch_companions")},
            pypi={r["torch"]: r for r in matrix.rows("torch_pypi")},
        )

    def releases_of(self, cuda_minor: str) -> list[tuple[_Version, DriverVersion, Row]]:
        return list(self.by_family.get(cuda_minor, ()))

    def floor(self, major: int) -> DriverVersion | None:
        row = self.floors.get(major)
        return DriverVersion.parse(row["min_driver"]) if row else None


def summarize_driver(driver: DriverVersion, facts: Facts) -> DriverSummary:
    native = [t for t in facts.toolkits if driver.satisfies(t[1])]
    newest = native[0][0] if native else None
    majors = sorted((m for m in facts.floors if (f := facts.floor(m)) and driver.satisfies(f)),
                    reverse=True)
    needs: dict[str, str] = {}
    for version, minimum, _row in reversed(facts.toolkits):
        family = f"{version.major}.{version.minor}"
        if not driver.satisfies(minimum) and family not in needs:
            needs[family] = minimum.full()
    return DriverSummary(
        version=str(driver),
        max_cuda=f"{newest.major}.{newest.minor}" if newest else None,
        max_cuda_release=str(newest) if newest else None,
        minor_compat=f"{majors[0]}.x" if majors else None,
        needs_newer=tuple(needs.items()),
    )


# --- the checks: each returns a Rejection or a refined candidate ------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    row: Row  # torch_variants row
    variant: str  # as shown: "cu124", or the default wheel's variant
    index_url: str | None
    python: tuple[str, ...]
    pins: Mapping[str, str]

    @property
    def label(self) -> str:
        return f"torch {self.row['torch']}+{self.row['variant']}"


def families(request: Request, facts: Facts) -> Iterator[Family | Rejection]:
    """One family per variant row, plus the package index's default wheel of any release
    without variant rows; ``--variant default`` keeps only the index's default wheels."""
    with_rows = set()
    for row in facts.matrix.rows("torch_variants"):
        with_rows.add(row["torch"])
        pins: dict[str, str] = {k: row[k] for k in PIN_FIELDS if k in row}
        family = Family(row=row, variant=row["variant"],
                        index_url=f"{PYTORCH_INDEX}/{row['variant']}",
                        python=tuple(row["python"]), pins=pins)
        if request.variant != "default":
            yield family
            continue
        pypi = facts.pypi.get(row["torch"])
        if pypi is None or pypi["default_variant"] != row["variant"]:
            reason = (f"not the default wheel of torch {row['torch']} on the package index"
                      if pypi else f"no package-index record for torch {row['torch']}")
            yield Rejection(family=family.label, constraint="variant", reason=reason,
                            source=pypi["source"] if pypi else None)
            continue
        yield _from_index(family, pypi, request)
    for pypi in facts.matrix.rows("torch_pypi"):
        if pypi["torch"] not in with_rows:
            yield _index_only_family(pypi, request)


def _from_index(family: Family, pypi: Row, request: Request) -> Family:
    pins: dict[str, str] = {k: pypi[k] for k in PIN_FIELDS if k in pypi}
    return replace(family, index_url=request.package_index, python=tuple(pypi["python"]),
                   pins={**family.pins, **pins})


def _index_only_family(pypi: Row, request: Request) -> Family:
    """A release whose variant set is unsourced: only its package-index wheel is known.

    Its CUDA comes from the wheel's runtime pin; its arch list is unknown, so any GPU
    check refuses it instead of guessing."""
    variant = pypi["default_variant"]
    cuda = None if variant == "cpu" else f"{variant[2:-1]}.{variant[-1]}"
    row = {"torch": pypi["torch"], "variant": variant, "cuda": cuda, "python": pypi["python"],
           "source": pypi["source"]}
    return _from_index(Family(row=row, variant=variant, index_url=None,
                              python=tuple(pypi["python"]), pins={}), pypi, request)


def check_user_constraints(family: Family, request: Request, facts: Facts) -> Rejection | None:
    row = family.row

    def reject(constraint: str, reason: str) -> Rejection:
        return Rejection(family=family.label, constraint=constraint, reason=reason,
                         source=row["source"])

    if request.torch and not request.torch.admits(row["torch"]):
        return reject("torch", f"torch {row['torch']} does not match --torch {request.torch}")
    if request.torch and request.torch.local and request.torch.local != row["variant"]:
        return reject("torch", f"variant {row['variant']} is not +{request.torch.local}")
    if request.variant not in (None, "default") and request.variant != row["variant"]:
        return reject("variant", f"variant {row['variant']} is not --variant {request.variant}")
    if request.variant is None and row["variant"] == "cpu":
        return reject("variant", "CPU-only wheel (ask with --variant cpu)")
    if request.cuda and (row["cuda"] is None or not any(
            request.cuda.admits(str(t[0])) for t in facts.releases_of(row["cuda"]))):
        return reject("cuda", f"CUDA {row['cuda'] or 'none (CPU wheel)'} does not match "
                              f"--cuda {request.cuda}")
    cudnn = family.pins.get("cudnn")
    if request.cudnn and (cudnn is None or not request.cudnn.admits(cudnn)):
        return reject("cudnn", f"bundled cuDNN {cudnn or 'unknown'} does not match "
                               f"--cudnn {request.cudnn}")
    if not pythons(family, request):
        wanted = f" (--python {request.python})" if request.python else ""
        return reject("python", f"no wheel for the Python asked for{wanted}; "
                                f"torch {row['torch']} has wheels for Python "
                                f"{', '.join(family.python)}")
    return None


def pythons(family: Family, request: Request) -> list[str]:
    """Admissible Pythons, newest first; free-threaded builds only when asked for."""
    asked = request.python
    if asked is not None and asked.text.endswith("t"):
        return [py for py in family.python if py == asked.text]
    found = []
    for py in family.python:
        if py.endswith("t"):
            continue
        if asked is None or asked.admits(py):
            found.append(py)
    return sorted(found, key=Version, reverse=True) if found else []


def check_gpus(family: Family, request: Request, facts: Facts) -> Rejection | None:
    row = family.row
    if row["cuda"] is None or not request.gpus:
        return None
    arch_list = row.get("arch_list")
    if not arch_list:
        return Rejection(family=family.label, constraint="gpu-arch", source=row["source"],
                         reason="its arch list is not recorded, so GPU support cannot be checked")
    for gpu in request.gpus:
        if coverage(gpu.compute_capability, arch_list) is None:
            instead = _variants_covering(gpu, row["torch"], facts)
            hint = f"; use variant {', '.join(instead)}" if instead else ""
            return Rejection(
                family=family.label, constraint="gpu-arch", source=row["source"],
                reason=f"{gpu.sm} ({gpu.label}) not in its arch list [{', '.join(arch_list)}]{hint}",
            )
    return None


def _variants_covering(gpu: GpuTarget, torch: str, facts: Facts) -> list[str]:
    return [r["variant"] for r in facts.matrix.rows("torch_variants")
            if r["torch"] == torch and r["cuda"] and r.get("arch_list")
            and coverage(gpu.compute_capability, r["arch_list"]) is not None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    """How a CUDA family runs on the host: mode, base-image CUDA release, needed driver."""

    compat: Compat
    base_releases: tuple[_Version, ...]  # CUDA releases a base image may carry, best first
    min_driver: DriverVersion
    source: str


def check_driver(family: Family, request: Request, facts: Facts) -> Runtime | Rejection:
    row = family.row
    releases = [t for t in facts.releases_of(row["cuda"])
                if request.cuda is None or request.cuda.admits(str(t[0]))]
    if not releases:
        return Rejection(family=family.label, constraint="cuda", source=row["source"],
                         reason=f"no CUDA {row['cuda']} toolkit release in cuda_toolkits.yaml")
    gpu_floor = max((g.min_driver_branch or 0 for g in request.gpus), default=0)
    ceiling = min((g.last_driver_branch for g in request.gpus if g.last_driver_branch),
                  default=None)
    driver = request.driver
    if driver is None and ceiling is not None:
        # A retired GPU caps the driver: judge the family on the newest driver it supports.
        driver = DriverVersion(ceiling)
    if driver is None:
        newest = releases[0]
        need = max(newest[1], DriverVersion(gpu_floor)) if gpu_floor else newest[1]
        return Runtime(compat="native", base_releases=tuple(t[0] for t in releases),
                       min_driver=need, source=newest[2]["source"])
    native = [t for t in releases if driver.satisfies(t[1])]
    if native:
        return Runtime(compat="native", base_releases=tuple(t[0] for t in native),
                       min_driver=native[0][1], source=native[0][2]["source"])
    result = _minor_or_forward(family, request, facts, releases, driver)
    if isinstance(result, Rejection) and request.driver is None and ceiling is not None:
        gpu = next(g for g in request.gpus if g.last_driver_branch == ceiling)
        return replace(result, constraint="gpu-driver", source=gpu.source,
                       reason=f"{result.reason.split(' (host')[0]}, but {gpu.label} is "
                              f"supported only up to driver branch {ceiling}")
    return result


def _minor_or_forward(family: Family, request: Request, facts: Facts,
                      releases: list[tuple[_Version, DriverVersion, Row]],
                      driver: DriverVersion) -> Runtime | Rejection:
    row = family.row
    major = releases[0][0].major
    floor = facts.floor(major)
    oldest = releases[-1]
    why = f"CUDA {row['cuda']} needs driver >= {oldest[1].full()} (host: {driver})"
    if floor is not None and driver.satisfies(floor):
        ptx_only = [g for g in request.gpus
                    if coverage(g.compute_capability, row.get("arch_list", ())) == "ptx"]
        if ptx_only:
            return Rejection(family=family.label, constraint="driver", source=facts.floors[major]["source"],
                             reason=f"{why}; minor-version compatibility cannot JIT its PTX for "
                                    f"{ptx_only[0].sm}")
        bases = tuple(t[0] for t in facts.toolkits if t[0].major == major
                      and driver.satisfies(t[1]))
        return Runtime(compat="minor-version", base_releases=bases, min_driver=floor,
                       source=facts.floors[major]["source"])
    forward = facts.forward.get(major)
    if (forward and request.gpus and all(g.datacenter for g in request.gpus)
            and driver.branch in forward.get("driver_branches", ())):
        return Runtime(compat="forward", base_releases=tuple(t[0] for t in releases),
                       min_driver=DriverVersion(driver.branch), source=forward["source"])
    if floor is not None:
        why += f"; minor-version compatibility needs >= {floor.full()}"
    return Rejection(family=family.label, constraint="driver", reason=why, source=oldest[2]["source"])


def choose_base(family: Family, runtime: Runtime | None, request: Request,
                facts: Facts) -> tuple[str, str, str | None] | Rejection:
    """(ubuntu, base image, base CUDA release): an nvidia/cuda image for the newest Ubuntu
    that has one, else (runtime flavour) plain Ubuntu, since the wheels carry CUDA's
    libraries and the rendered image sets the NVIDIA_* variables itself."""
    ubuntus = [u for u in sorted(facts.ubuntus, key=Version, reverse=True)
               if request.ubuntu in (None, u)]
    too_old = _glibc_too_old(family, facts)
    usable = [u for u in ubuntus if u not in too_old]
    if not usable:
        where = f"Ubuntu {request.ubuntu}" if request.ubuntu else "any Ubuntu in ubuntu_python.yaml"
        why = f" (its glibc is older than the wheel's {family.pins.get('platform_tag')})" \
            if ubuntus else ""
        return Rejection(family=family.label, constraint="ubuntu", source=None,
                         reason=f"no base for {where}{why}")
    if runtime is None:  # CPU wheel
        return usable[0], f"ubuntu:{usable[0]}", None
    flavor = "base" if request.flavor == "runtime" else "devel"
    for release in map(str, runtime.base_releases):
        for ubuntu in usable:
            image = facts.images.get((release, ubuntu))
            if image and flavor in image["flavors"]:
                return ubuntu, f"nvidia/cuda:{release}-{flavor}-ubuntu{ubuntu}", release
    if request.flavor == "runtime":
        built_for = {u for (cuda, u) in facts.images if cuda.startswith(f"{family.row['cuda']}.")}
        ubuntu = next((u for u in usable if u in built_for), usable[0])
        return ubuntu, f"ubuntu:{ubuntu}", None
    where = f"Ubuntu {request.ubuntu}" if request.ubuntu else "any Ubuntu"
    return Rejection(family=family.label, constraint="ubuntu", source=None,
                     reason=f"no nvidia/cuda {family.row['cuda']} devel image "
                            f"for {where} in cuda_images.yaml")


def _glibc_too_old(family: Family, facts: Facts) -> set[str]:
    """Ubuntu releases whose glibc is older than the wheel's manylinux baseline."""
    tag = facts.pypi.get(family.row["torch"], {}).get("platform_tag", "")
    need = _manylinux_glibc(tag)
    return {u for u, row in facts.ubuntus.items()
            if need and "glibc" in row and Version(row["glibc"]) < need}


def _manylinux_glibc(tag: str) -> _Version | None:
    legacy = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}
    name = tag.removesuffix("_x86_64")
    if name in legacy:
        return Version(legacy[name])
    if name.startswith("manylinux_2_"):
        return Version(f"2.{name.removeprefix('manylinux_2_')}")
    return None


def build_stack(family: Family, runtime: Runtime | None, base: tuple[str, str, str | None],
                request: Request, facts: Facts) -> Stack:
    row = family.row
    ubuntu, image, base_cuda = base
    distro = facts.ubuntus.get(ubuntu, {}).get("python")
    candidates = pythons(family, request)
    python = distro if distro in candidates and request.python is None else candidates[0]
    companions = facts.companions.get(row["torch"], {})
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
    return Stack(
        torch=row["torch"],
        torchvision=companions.get("torchvision"),
        torchaudio=companions.get("torchaudio"),
        variant=family.variant,
        index_url=family.index_url,
        cuda=family.pins.get("cuda_runtime", row["cuda"]),
        cudnn=family.pins.get("cudnn"),
        nccl=family.pins.get("nccl"),
        python=python,
        ubuntu=ubuntu,
        base_image=image,
        base_cuda=base_cuda,
        compat=runtime.compat if runtime else None,
        min_driver=runtime.min_driver.full() if runtime else None,
        flavor=request.flavor,
        arch_list=tuple(row.get("arch_list", ())),
        notes=tuple(notes),
    )


def evaluate(family: Family, request: Request, facts: Facts) -> Stack | Rejection:
    """Run the checks in order; the first failure is the family's rejection."""
    rejection = (check_user_constraints(family, request, facts)
                 or check_gpus(family, request, facts))
    if rejection:
        return rejection
    runtime: Runtime | None = None
    if family.row["cuda"] is not None:
        checked = check_driver(family, request, facts)
        if isinstance(checked, Rejection):
            return checked
        runtime = checked
    base = choose_base(family, runtime, request, facts)
    if isinstance(base, Rejection):
        return base
    return build_stack(family, runtime, base, request, facts)


# --- the ranking policy, in one place ---------------------------------------------------


def rank_key(stack: Stack) -> tuple[Any, ...]:
    """Best first: newest torch; native before minor-version before forward; the newest
    CUDA variant; the newest Ubuntu; the newest Python; then the variant name, so that
    ties always break the same way (FAULTS B5)."""
    cuda = Version(stack.cuda) if stack.cuda else Version("0")
    return (
        _neg(Version(stack.torch)),
        COMPAT_ORDER[stack.compat],
        _neg(cuda),
        _neg(Version(stack.ubuntu)),
        _neg(Version(stack.python.rstrip("t"))),
        stack.variant,
    )


def _neg(version: _Version) -> tuple[int, ...]:
    return (*(-p for p in version.release), 1)


# --- host-level conflicts, independent of any family ------------------------------------


def global_conflicts(request: Request, facts: Facts) -> list[Rejection]:
    found = _unknown_variant(request, facts)
    for gpu in request.gpus:
        driver = request.driver
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


def _unknown_variant(request: Request, facts: Facts) -> list[Rejection]:
    """``--torch 2.3.1+cu999`` / ``--variant cu999``: name the variants that do exist."""
    wanted = request.torch.local if request.torch and request.torch.local else request.variant
    if wanted in (None, "default"):
        return []
    rows = [r for r in facts.matrix.rows("torch_variants")
            if request.torch is None or request.torch.admits(r["torch"])]
    if any(r["variant"] == wanted for r in rows):
        return []
    available = sorted({r["variant"] for r in rows})
    which = (f"torch {request.torch.text.split('+')[0]}" if request.torch
             else "any torch release")
    return [Rejection(family="request", constraint="variant", source=None,
                      reason=f"no wheel variant {wanted} for {which}; "
                             f"available: {', '.join(available) or 'none'}")]


def resolve(request: Request, matrix: Matrix) -> Resolution:
    """All stacks that fit, best first, plus every rejected family with its reason."""
    facts = Facts.of(matrix)
    summary = summarize_driver(request.driver, facts) if request.driver else None
    conflicts = global_conflicts(request, facts)
    stacks: list[Stack] = []
    rejected: list[Rejection] = []
    for family in families(request, facts):
        if isinstance(family, Rejection):
            rejected.append(family)
            continue
        result = conflicts[0] if conflicts else evaluate(family, request, facts)
        if isinstance(result, Rejection):
            rejected.append(replace(result, family=family.label) if conflicts else result)
        else:
            stacks.append(result)
    stacks.sort(key=rank_key)
    return Resolution(stacks=tuple(stacks), rejected=tuple(rejected), driver=summary,
                      global_conflicts=tuple(conflicts))


# --- nothing fits: conflicts and re-solved ways out -------------------------------------

RELAXABLE: tuple[tuple[str, str], ...] = (
    ("driver", "--driver"), ("torch", "--torch"), ("python", "--python"), ("cuda", "--cuda"),
    ("cudnn", "--cudnn"), ("ubuntu", "--ubuntu"), ("variant", "--variant"),
)


def explain_failure(request: Request, matrix: Matrix, resolution: Resolution) -> NoCompatibleStack:
    conflicts = _conflict_lines(resolution)
    fixes = list(_verified_fixes(request, matrix))
    first = conflicts[0] if conflicts else "no stack in the data fits"
    return NoCompatibleStack(
        f"no compatible stack: {first}",
        conflicts=conflicts,
        fixes=fixes,
        hint=fixes[0] if fixes else "run with --explain to see why each family was rejected",
    )


def _conflict_lines(resolution: Resolution) -> list[str]:
    if resolution.global_conflicts:
        return [r.reason for r in resolution.global_conflicts]
    order = ["torch", "variant", "python", "cuda", "cudnn", "gpu-arch", "gpu-driver", "driver",
             "ubuntu"]
    # The most informative reasons are the ones that failed latest in the check order:
    # they passed every user filter and still did not fit.
    ranked = sorted(resolution.rejected, key=lambda r: -order.index(r.constraint)
                    if r.constraint in order else 0)
    lines: list[str] = []
    for rejection in ranked:
        line = f"{rejection.family}: {rejection.reason}"
        if line not in lines:
            lines.append(line)
    return lines[:8]


def _verified_fixes(request: Request, matrix: Matrix) -> Iterator[str]:
    """Drop one constraint at a time; offer a concrete change only if it re-solves."""
    for name, flag in RELAXABLE:
        if getattr(request, name) is None:
            continue
        relaxed = resolve(replace(request, **{name: None}), matrix).stacks  # type: ignore[arg-type]
        if not relaxed:
            continue
        fix = _concrete_fix(name, flag, relaxed, request, matrix)
        if fix:
            yield fix


def _concrete_fix(name: str, flag: str, stacks: Iterable[Stack], request: Request,
                  matrix: Matrix) -> str | None:
    if name == "driver":
        return _driver_fix(request, matrix)
    best = next(iter(stacks))
    value = {"torch": best.torch, "python": best.python, "cuda": best.cuda, "cudnn": best.cudnn,
             "ubuntu": best.ubuntu, "variant": best.variant}[name]
    return f"use {flag} {value} instead of {getattr(request, name)} ({describe(best)})"


def _driver_fix(request: Request, matrix: Matrix) -> str | None:
    """The smallest known driver (a toolkit's, a compat floor, a GPU's branch) that re-solves."""
    current = request.driver
    candidates = {DriverVersion.parse(r["min_driver"]) for relation in ("cuda_toolkits", "cuda_compat")
                  for r in matrix.rows(relation) if "min_driver" in r}
    candidates |= {DriverVersion(g.min_driver_branch) for g in request.gpus if g.min_driver_branch}
    for driver in sorted(candidates):
        if current is not None and not current < driver:
            continue
        stacks = resolve(replace(request, driver=driver), matrix).stacks
        if stacks:
            return f"upgrade the driver to >= {driver.full()} (then: {describe(stacks[0])})"
    return None


def describe(stack: Stack) -> str:
    return f"torch {stack.torch}+{stack.variant}, Python {stack.python}, Ubuntu {stack.ubuntu}"


def group_rejections(rejected: Iterable[Rejection]) -> dict[str, list[Rejection]]:
    groups: dict[str, list[Rejection]] = {}
    for rejection in rejected:
        groups.setdefault(rejection.constraint, []).append(rejection)
    return groups
