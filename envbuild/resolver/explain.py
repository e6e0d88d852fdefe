"""Nothing fits: the conflicts to show, and ways out that are re-solved before they are offered."""

from __future__ import annotations

from envbuild.data.versions import DriverVersion
from envbuild.errors import NoCompatibleStack
from envbuild.resolver.resolve import resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from envbuild.data.matrix import Matrix
    from envbuild.resolver.index import Index
    from envbuild.resolver.model import Request, Resolution, Stack


RELAXABLE: tuple[tuple[str, str], ...] = (
    ("driver", "--driver"), ("torch", "--torch"), ("python", "--python"), ("cuda", "--cuda"),
    ("cudnn", "--cudnn"), ("ubuntu", "--ubuntu"), ("variant", "--variant"),
)


def explain_failure(request: Request, matrix: Matrix | Index, resolution: Resolution) -> NoCompatibleStack:
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


def _verified_fixes(request: Request, matrix: Matrix | Index) -> Iterator[str]:
    """Drop one constraint at a time; offer a concrete change only if it re-solves."""
    for name, flag in RELAXABLE:
        if getattr(request, name) is None:
            continue
        relaxed = resolve(request.replace(**{name: None}), matrix).stacks
        if not relaxed:
            continue
        fix = _concrete_fix(name, flag, relaxed, request, matrix)
        if fix:
            yield fix


def _concrete_fix(name: str, flag: str, stacks: Iterable[Stack], request: Request,
                  matrix: Matrix | Index) -> str | None:
    if name == "driver":
        return _driver_fix(request, matrix)
    best = next(iter(stacks))
    value = {"torch": best.torch, "python": best.python, "cuda": best.cuda, "cudnn": best.cudnn,
             "ubuntu": best.ubuntu, "variant": best.variant}[name]
    return f"use {flag} {value} instead of {getattr(request, name)} ({describe(best)})"


def _driver_fix(request: Request, matrix: Matrix | Index) -> str | None:
    """The smallest known driver (a toolkit's, a compat floor, a GPU's branch) that re-solves."""
    current = request.driver
    drivers = {DriverVersion.parse(r["min_driver"]) for relation in ("cuda_toolkits", "cuda_compat")
                  for r in matrix.rows(relation) if "min_driver" in r}
    drivers |= {DriverVersion(g.min_driver_branch) for g in request.gpus if g.min_driver_branch}
    for driver in sorted(drivers):
        if current is not None and not current < driver:
            continue
        stacks = resolve(request.replace(driver=driver), matrix).stacks
        if stacks:
            return f"upgrade the driver to >= {driver.full()} (then: {describe(stacks[0])})"
    return None


def describe(stack: Stack) -> str:
    return f"torch {stack.torch}+{stack.variant}, Python {stack.python}, Ubuntu {stack.ubuntu}"
