"""What ``install.sh`` sets up around the stack on a host: the driver branch and its kernel
module flavour, NVSwitch handling and the container runtime.

The branch: the one the user gave (``--driver``, or the host's with ``--host``), else the
newest production or long-term support branch in ``matrices/driver_branches.yaml`` that runs
the stack (its ``min_driver``) and every target GPU (``min_driver_branch`` ..
``last_driver_branch`` of ``gpus.yaml``); never merely the stack's minimum.

The flavour, by NVIDIA's guidance (https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html,
read 2026-11-24): the proprietary modules are required for Maxwell, Pascal and Volta (the open
ones need the GSP that Turing introduced); from the 560 series the open modules are the default
for Turing and later; Blackwell and Grace Hopper run only on the open modules. A combination no
flavour or branch can serve is a ``PreflightFailed`` (exit 9) naming why. Ubuntu's package for
each: ``nvidia-driver-<branch>-open`` or ``nvidia-driver-<branch>``
(https://packages.ubuntu.com/noble-updates/nvidia-driver-580, read 2026-11-24).

A forward-compatibility stack (``compat: forward``) was resolved for one driver branch: NVIDIA's
``cuda-compat`` packages each support a listed set of older branches and are not supported on
later ones (matrices/cuda_compat.yaml, from
https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html, read 2026-11-21 and
2026-11-24), and forward compatibility runs on datacenter GPUs only (other GeForce/RTX parts fail
with CUDA error 804, same page). So its branch is the stack's own, never a newer one, and a
``--driver`` of another branch or a GPU that is not a datacenter part is a ``PreflightFailed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envbuild.data.gpus import GpuTarget, fold_name
from envbuild.data.relations import Row
from envbuild.errors import DataError, PreflightFailed

OPEN_DEFAULT_FROM = 560  # the first branch whose default flavour is the open modules


@dataclass(frozen=True, slots=True)
class Toolkit:
    """The NVIDIA Container Toolkit pin (matrices/container_toolkit.yaml)."""

    version: str
    repository: str
    key_url: str
    key_fingerprint: str
    smoke_image: str = ""  # the GPU container check's image, by digest ("": none recorded)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSetup:
    branch: str  # "" for a CPU stack
    modules: str  # "open" | "proprietary" | ""
    why: str  # one line for the script's header: how the branch was chosen
    nvswitch: bool = False  # --nvswitch: fabric manager whatever detection finds
    runtime: str = "docker"
    toolkit: Toolkit | None = None
    # linux/arm64 (SBSA) hosts: NVIDIA's sbsa repository; Grace superchips (GH200, GB200, GB300):
    # the coherent-memory module option from R580 and the 64K-page advice; GB200/GB300 NVL72:
    # NVLink 5 switch trays, so IMEX, NSCQ and NVLSM beside the fabric manager.
    sbsa: bool = False
    grace: bool = False
    nvlink5: bool = False


def grace_superchip(gpu: GpuTarget) -> bool:
    """GH200, GB200, GB300: a datacenter GPU built into a Grace (Arm) system."""
    return gpu.host_arch == "aarch64" and bool(gpu.datacenter)


def nvlink5_rack(gpu: GpuTarget) -> bool:
    """GB200 / GB300: sold as NVL72 racks whose NVLink 5 switches are trays of their own."""
    return fold_name(gpu.label)[:5] in ("gb200", "gb300")


def _pre_turing(gpu: GpuTarget) -> bool:
    return tuple(map(int, gpu.compute_capability.split("."))) < (7, 5)


def _open_only(gpu: GpuTarget) -> str | None:
    """Why ``gpu`` needs the open modules, or None: Blackwell (compute capability 10 and
    later) and the Grace Hopper / Grace Blackwell superchips (GH200, GB200, ...)."""
    folded = fold_name(gpu.label)
    if folded[:2] in ("gh", "gb") and folded[2:3].isdigit():
        return f"{gpu.label} (Grace) runs only on the open kernel modules"
    if int(gpu.compute_capability.split(".")[0]) >= 10:
        return f"{gpu.label} (Blackwell) runs only on the open kernel modules"
    return None


def _supports(gpu: GpuTarget, branch: int) -> bool:
    return (gpu.min_driver_branch or 0) <= branch <= (gpu.last_driver_branch or branch)


def _forward(floor: int, gpus: Sequence[GpuTarget], driver_branch: int | None) -> None:
    """What a forward-compatibility stack, resolved for branch ``floor``, cannot run on."""
    if driver_branch is not None and driver_branch != floor:
        raise PreflightFailed(f"the stack runs its CUDA through forward compatibility resolved for "
                              f"driver branch {floor}; --driver {driver_branch} is another branch",
                              hint=f"resolve again with --driver {driver_branch} (its own stacks), "
                                   f"or render for --driver {floor}")
    for gpu in gpus:
        if not gpu.datacenter:
            raise PreflightFailed(f"{gpu.label} is not a datacenter GPU: forward compatibility "
                                  "(cuda-compat) runs on datacenter GPUs only (CUDA error 804)",
                                  hint="resolve for this GPU (a stack its driver runs natively), or "
                                       "pass --datacenter with --arch for a datacenter part")


def choose(min_driver: str | None, branches: Sequence[Row], gpus: Sequence[GpuTarget],
           driver_branch: int | None, *, forward: bool = False) -> tuple[str, str, str]:
    """(branch, flavour, why) for a stack whose driver floor is ``min_driver``; ``forward``:
    the stack runs through forward compatibility, on exactly the branch of ``min_driver``."""
    if not min_driver:
        return "", "", "a CPU stack: no driver"
    floor = int(min_driver.split(".")[0])
    names = ", ".join(g.label for g in gpus)
    if forward:
        _forward(floor, gpus, driver_branch)
        driver_branch = floor
    if driver_branch is not None:
        branch, why = driver_branch, f"the branch given (--driver {driver_branch})"
        if forward:
            why = f"the branch the stack's forward compatibility was resolved for ({branch}), kept"
        if branch < floor:
            raise PreflightFailed(f"driver branch {branch} is older than {floor}, the oldest that "
                                  f"runs CUDA of this stack (needs >= {min_driver})",
                                  hint=f"pass --driver {floor} or newer, or resolve for branch {branch}")
        for gpu in gpus:
            if not _supports(gpu, branch):
                first, last = gpu.min_driver_branch or "any", gpu.last_driver_branch or "current"
                raise PreflightFailed(f"driver branch {branch} does not support {gpu.label} "
                                      f"(branches {first} to {last})",
                                      hint=f"pass a --driver branch from {first} to {last}")
    else:
        usable = sorted((r["branch"] for r in branches if r["designation"] in ("production", "lts")
                         and r["branch"] >= floor and all(_supports(g, r["branch"]) for g in gpus)),
                        reverse=True)
        if not usable:
            raise PreflightFailed(f"no production or long-term support driver branch (driver_branches.yaml) "
                                  f"runs this stack (>= {min_driver})" + (f" and {names}" if gpus else ""),
                                  hint="pass --driver BRANCH")
        branch, why = usable[0], "the newest production or long-term support branch that runs the stack" + (
            f" and {names}" if gpus else "")
    old = [g.label for g in gpus if _pre_turing(g)]
    needs_open = [reason for g in gpus if (reason := _open_only(g))]
    if old and needs_open:
        raise PreflightFailed(f"no kernel module flavour drives both {', '.join(old)} (Maxwell to Volta: "
                              f"proprietary modules only) and {needs_open[0].split(' runs')[0]} (open "
                              "modules only)", hint="set up these GPUs on separate hosts")
    if old:
        return str(branch), "proprietary", why
    if needs_open or branch >= OPEN_DEFAULT_FROM:
        return str(branch), "open", why
    return str(branch), "proprietary", why


def host_setup(min_driver: str | None, branches: Sequence[Row], toolkit_rows: Sequence[Row],
               gpus: Sequence[GpuTarget] = (), driver_branch: int | None = None, *,
               nvswitch: bool = False, runtime: str = "docker", forward: bool = False,
               platform: str = "linux/amd64") -> HostSetup:
    branch, modules, why = choose(min_driver, branches, gpus, driver_branch, forward=forward)
    if not branch:
        runtime = "none"  # a CPU stack: no GPU to hand to containers
    toolkit = None
    if runtime != "none":
        if len(toolkit_rows) != 1:
            raise DataError("container_toolkit.yaml must hold exactly one row (the pinned release)",
                            hint="restore matrices/container_toolkit.yaml, or render with "
                                 "--container-runtime none")
        r = toolkit_rows[0]
        toolkit = Toolkit(version=r["version"], repository=r["repository"], key_url=r["key_url"],
                          key_fingerprint=r["key_fingerprint"], smoke_image=r.get("smoke_image") or "")
    jetson = [g.label for g in gpus if g.family == "Jetson"]
    if jetson:
        raise PreflightFailed(f"{jetson[0]} is a Jetson module: JetPack (L4T) installs its driver and "
                              "CUDA, which this script does not", hint="use NVIDIA's JetPack for Jetson")
    sbsa = platform == "linux/arm64"
    if not sbsa and any(g.host_arch == "aarch64" for g in gpus):
        raise PreflightFailed("a Grace or DGX Spark GPU needs a linux/arm64 host script",
                              hint="render for a linux/arm64 stack (--platform linux/arm64)")
    return HostSetup(branch=branch, modules=modules, why=why, nvswitch=nvswitch, runtime=runtime,
                     toolkit=toolkit, sbsa=sbsa, grace=sbsa and any(grace_superchip(g) for g in gpus),
                     nvlink5=sbsa and any(nvlink5_rack(g) for g in gpus))


def default_setup(min_driver: str | None) -> HostSetup:
    """Without the matrix (a caller that passes none): the stack's own branch, no container
    toolkit. ``render script`` always passes a chosen setup."""
    branch = min_driver.split(".")[0] if min_driver else ""
    modules = "" if not branch else "open" if int(branch) >= OPEN_DEFAULT_FROM else "proprietary"
    return HostSetup(branch=branch, modules=modules, why="the stack's oldest branch", runtime="none")
