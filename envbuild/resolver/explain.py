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
    conflicts = _pin_clash(request, matrix) or _conflict_lines(resolution)
    fixes = list(_verified_fixes(request, matrix))
    first = _headline(request, resolution) or (conflicts[0] if conflicts else
                                               "no stack in the data fits")
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
    # Families the user's own --torch/--variant (or the CPU default) ruled out explain nothing
    # once some family got past them: "torch 1.13.0+cpu does not match --torch 2.15" is noise.
    passed = [r for r in resolution.rejected if r.constraint not in ("torch", "variant")]
    ranked = sorted(passed or resolution.rejected, key=lambda r: -order.index(r.constraint)
                    if r.constraint in order else 0)
    lines: list[str] = []
    for rejection in ranked:
        line = f"{rejection.family}: {rejection.reason}"
        if line not in lines:
            lines.append(line)
    return lines[:8]


def _pin_clash(request: Request, matrix: Matrix | Index) -> list[str]:
    """--torch and the project's own torch requirement admit no release in common: that one
    line, not every family's mismatch (torch 1.13 against --torch 2.13 explains nothing)."""
    from envbuild.resolver.index import Index, index_of

    flag, pin = request.torch, request.project_torch
    if pin is None:
        return []
    ix = matrix if isinstance(matrix, Index) else index_of(matrix)
    if any((flag is None or flag.admits(r["torch"])) and pin.admits(r["torch"])
           for r in ix.rows("torch_variants")):
        return []
    if flag is None:
        return [f"no torch release the data knows satisfies the project's requirement torch{pin.spec}"]
    return [f"the stack's torch {flag.text} (--torch, or the project's 'torch' key) and the project's "
            f"requirement torch{pin.spec} admit no release in common"]


def _headline(request: Request, resolution: Resolution) -> str | None:
    """One line for a --cuda that no wheel is built for (every family the earlier filters,
    --torch and --variant or the CPU wheel, let through is refused by it), not one arbitrary
    family's mismatch."""
    constraints = {r.constraint for r in resolution.rejected}
    if request.cuda is None or resolution.global_conflicts or "cuda" not in constraints or (
            constraints - {"cuda", "torch", "variant"}):
        return None
    return f"no torch wheel is built for --cuda {request.cuda}" + (
        " (nvidia-smi's 'CUDA Version' is the newest CUDA the driver runs, not a wheel's CUDA: "
        "give --driver instead)" if request.driver is None else "")


def _verified_fixes(request: Request, matrix: Matrix | Index) -> Iterator[str]:
    """Drop one constraint at a time; offer a concrete change only if it re-solves. Without
    a driver, a --cuda is first read as nvidia-smi's 'CUDA Version' (the driver's ceiling)."""
    if request.driver is None and request.cuda is not None:
        fix = _cuda_as_driver_fix(request, matrix)
        if fix:
            yield fix
    for name, flag in RELAXABLE:
        if getattr(request, name) is None:
            continue
        relaxed = resolve(request.replace(**{name: None}), matrix).stacks
        if not relaxed:
            continue
        fix = _concrete_fix(name, flag, relaxed, request, matrix)
        if fix:
            yield fix
    # last: changing the host is the largest change
    if request.platform_given:  # the GPU on the other platform's host (T4 on x86, GH200 on Arm)
        other = "linux/amd64" if request.platform == "linux/arm64" else "linux/arm64"
        moved = resolve(request.replace(platform=other), matrix).stacks
        if moved:
            yield f"use --platform {other} instead of {request.platform} ({describe(moved[0])})"


def _concrete_fix(name: str, flag: str, stacks: Iterable[Stack], request: Request,
                  matrix: Matrix | Index) -> str | None:
    if name == "driver":
        return _driver_fix(request, matrix)
    best = next(iter(stacks))
    value = {"torch": best.torch, "python": best.python, "cuda": best.cuda, "cudnn": best.cudnn,
             "ubuntu": best.ubuntu, "variant": best.variant}[name]
    needs = (f"; it needs driver >= {best.min_driver}: give --driver for what yours runs"
             if request.driver is None and best.min_driver else "")
    return f"use {flag} {value} instead of {getattr(request, name)} ({describe(best)}{needs})"


def _cuda_as_driver_fix(request: Request, matrix: Matrix | Index) -> str | None:
    """--cuda X without --driver: the stacks a driver that runs X natively gets (the oldest
    such driver: the toolkit driver of X's newest release), re-solved without --cuda."""
    from envbuild.resolver.index import Index, index_of

    ix = matrix if isinstance(matrix, Index) else index_of(matrix)
    cuda = request.cuda
    matching = [t for t in ix.toolkits if cuda is not None and cuda.admits(t.cuda)]
    if not matching:
        return None
    newest = matching[0]  # ix.toolkits is newest first
    stacks = resolve(request.replace(cuda=None, driver=newest.driver), matrix).stacks
    if not stacks:
        return None
    return (f"give your driver instead of --cuda {cuda} (--driver as nvidia-smi prints it): a "
            f"driver that runs CUDA {newest.cuda} (>= {newest.driver.text}) gets "
            f"{describe(stacks[0])}")


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
