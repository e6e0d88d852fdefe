"""How a CUDA family runs on the host's driver: the driver check and the driver summary.

Compatibility modes, strongest first:
- native: the driver is at least the toolkit driver of the wheel's CUDA release;
- minor-version: the driver meets the CUDA major's floor. The wheel's bundled runtime
  works, but PTX from the newer toolkit cannot be JIT-compiled, so the GPU must be
  covered by SASS. The base image is then the newest CUDA release of that major the
  driver runs natively, because a newer image's NVIDIA_REQUIRE_CUDA refuses to start;
- forward: datacenter GPUs only, through the cuda-compat package, on the driver
  branches NVIDIA lists for it.

One minimum driver per CUDA release x.y, everywhere (a stack's ``min_driver``, a
rejection's "needs driver >=", the header's "needs driver >=", the upgrade fix): the
toolkit driver of its oldest release in cuda_toolkits.yaml, the GA (CUDA 13.0: 580.65.06,
not 13.0 Update 2's 580.95.05). A base image of a later update of x.y starts on it too:
its NVIDIA_REQUIRE_CUDA asks for CUDA x.y, which that driver supports.
"""

from __future__ import annotations

from envbuild.data.versions import DriverVersion
from envbuild.resolver.model import DriverSummary, Rejection

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from envbuild.data.gpus import ArchEntry, GpuTarget
    from envbuild.resolver.families import Family
    from envbuild.resolver.index import Index, Toolkit
    from envbuild.resolver.model import Compat, Request


class Runtime:
    """How a CUDA family runs on the host: mode, base-image CUDA release, needed driver."""

    __slots__ = ("base_releases", "compat", "min_driver", "source")

    def __init__(self, compat: Compat, base_releases: list[str], min_driver: DriverVersion,
                 source: str) -> None:
        self.compat = compat
        self.base_releases = base_releases  # CUDA releases a base image may carry, best first
        self.min_driver, self.source = min_driver, source


def summarize_driver(driver: DriverVersion, ix: Index) -> DriverSummary:
    """What ``driver`` runs; a partial version (``550``) is read as its newest build, and
    ``older`` says what the builds below the first driver that reading needs run (the
    data records toolkit drivers, not every build of a branch)."""
    newest, runs, majors = _runs(driver, ix)
    needs: dict[str, str] = {}
    for toolkit in reversed(ix.toolkits):
        family = f"{toolkit.major}.{toolkit.minor}"
        if toolkit not in runs and family not in needs:
            needs[family] = toolkit.driver.text
    older = _older_builds(driver, ix) if driver.partial else None
    return DriverSummary(
        version=driver.text,
        max_cuda=f"{newest.major}.{newest.minor}" if newest else None,
        max_cuda_release=newest.cuda if newest else None,
        minor_compat=f"{majors[0]}.x" if majors else None,
        needs_newer=tuple(needs.items()),
        partial=driver.partial,
        older=older,
        lifecycle=ix.branches.get(driver.branch),
    )


def _runs(driver: DriverVersion, ix: Index) -> tuple[Toolkit | None, set[Toolkit], list[int]]:
    """(the newest toolkit run natively, every one run natively, the CUDA majors whose
    minor-version floor it meets, newest first)."""
    runs = ix.native(driver)
    native = [t for t in ix.toolkits if t in runs]
    majors = sorted((m for m in ix.floors if (f := ix.floor(m)) and driver.satisfies(f)),
                    reverse=True)
    return (native[0] if native else None), runs, majors


def _older_builds(driver: DriverVersion, ix: Index) -> tuple[str, str | None, str | None,
                                                              str | None] | None:
    """(the first driver the newest-build reading needs that the oldest possible build does
    not, and what builds below it run: max CUDA, newest release, minor-version family);
    None when every build the partial version names runs the same."""
    lowest = driver.oldest()
    thresholds = [t.driver for t in ix.toolkits] + [floor for floor, _ in ix.floors.values()]
    splits = sorted(d for d in thresholds if driver.satisfies(d) and not lowest.satisfies(d))
    if not splits:
        return None
    newest, _, majors = _runs(lowest, ix)
    return (splits[0].text, f"{newest.major}.{newest.minor}" if newest else None,
            newest.cuda if newest else None, f"{majors[0]}.x" if majors else None)


def check_driver(family: Family, ask: Request, ix: Index) -> Runtime | Rejection:
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
    first = releases[-1]  # the CUDA release's minimum driver: its oldest release's (GA)
    if driver is None:
        need = max(first.driver, DriverVersion(gpu_floor)) if gpu_floor else first.driver
        return Runtime("native", [t.cuda for t in releases], need, first.source)
    runs = ix.native(driver)
    native = [t for t in releases if t in runs]
    if native:
        return Runtime("native", [t.cuda for t in native], first.driver, first.source)
    result = _minor_or_forward(family, ask, ix, releases, driver)
    if isinstance(result, Rejection) and ask.driver is None and ceiling is not None:
        gpu = next(g for g in ask.gpus if g.last_driver_branch == ceiling)
        return Rejection(family=result.family, constraint="gpu-driver", source=gpu.source,
                         reason=f"{result.reason.split(' (host')[0]}, but {gpu.label} is "
                                f"supported only up to driver branch {ceiling}")
    return result


def driver_verdict(family: Family, ask: Request, ix: Index,
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


def _minor_or_forward(family: Family, ask: Request, ix: Index, releases: list[Toolkit],
                      driver: DriverVersion) -> Runtime | Rejection:
    row = family.row
    major = releases[0].major
    floor = ix.floor(major)
    oldest = releases[-1]
    why = f"CUDA {row['cuda']} needs driver >= {oldest.driver.text} (host: {driver.text})"
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
        # The base image's cuda-compat libraries are what run it: the family's own release
        # first, else an older one of the same major (the wheel's newer minor then runs on the
        # compat driver through minor-version compatibility).
        older = [t.cuda for t in ix.toolkits if t.major == major and t.minor < oldest.minor]
        return Runtime("forward", [t.cuda for t in releases] + older, DriverVersion(driver.branch),
                       forward[1])
    if floor is not None:
        why += f"; minor-version compatibility needs >= {floor.text}"
    return Rejection(family=family.label, constraint="driver", reason=why, source=oldest.source)


def _ptx_only(gpus: Iterable[GpuTarget], entries: list[ArchEntry]) -> list[GpuTarget]:
    from envbuild.data.gpus import coverage_of

    return [g for g in gpus if coverage_of(g.compute_capability, entries) == "ptx"]
