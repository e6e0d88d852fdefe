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

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from envbuild.data.gpus import GpuTarget
from envbuild.data.matrix import Matrix
from envbuild.data.versions import DriverVersion, Requirement
from envbuild.errors import NoCompatibleStack
from envbuild.resolver import candidates
from envbuild.resolver.candidates import (
    COMPAT_ORDER,
    PIN_FIELDS,
    PYTORCH_INDEX,
    DriverSummary,
    Rejection,
    group_rejections,
    stack_json,
)

__all__ = ["COMPAT_ORDER", "PIN_FIELDS", "PYTORCH_INDEX", "Compat", "DriverSummary", "Flavor",
           "Rejection", "Request", "Resolution", "Stack", "explain_failure", "group_rejections",
           "rank_key", "resolve"]

Compat = Literal["native", "minor-version", "forward"]
Flavor = Literal["runtime", "devel"]


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
        return stack_json(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    stacks: tuple[Stack, ...]
    rejected: tuple[Rejection, ...]
    driver: DriverSummary | None
    global_conflicts: tuple[Rejection, ...] = field(default=())


def resolve(request: Request, matrix: Matrix) -> Resolution:
    """All stacks that fit, best first, plus every rejected family with its reason.

    The checks run in ``envbuild.candidates`` on plain data (shared with the CLI's fast
    path); this wraps what they found in the typed values above."""
    outcome = candidates.solve(request, candidates.index_of(matrix))
    return Resolution(stacks=tuple(Stack(**s.fields()) for s in outcome.stacks),
                      rejected=outcome.rejected, driver=outcome.driver,
                      global_conflicts=outcome.global_conflicts)


def rank_key(stack: Stack) -> tuple[Any, ...]:
    """The ranking policy (see ``candidates.rank_key``) for any stack."""
    from packaging.version import Version

    return candidates.rank_key(stack, lambda text: Version(text).release)


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
    drivers = {DriverVersion.parse(r["min_driver"]) for relation in ("cuda_toolkits", "cuda_compat")
                  for r in matrix.rows(relation) if "min_driver" in r}
    drivers |= {DriverVersion(g.min_driver_branch) for g in request.gpus if g.min_driver_branch}
    for driver in sorted(drivers):
        if current is not None and not current < driver:
            continue
        stacks = resolve(replace(request, driver=driver), matrix).stacks
        if stacks:
            return f"upgrade the driver to >= {driver.full()} (then: {describe(stacks[0])})"
    return None


def describe(stack: Stack) -> str:
    return f"torch {stack.torch}+{stack.variant}, Python {stack.python}, Ubuntu {stack.ubuntu}"
