"""The checks that turn one candidate family into a pinned ``Stack`` or a ``Rejection``.

THE CHECK ORDER (``evaluate``); the first check that fails is the family's rejection:
1. host-level conflicts (``global_conflicts``: a GPU outside the driver's branch range, a
   variant that no release has) reject every family alike, before any family check;
2. the user's own constraints (``check_user_constraints``), in this order: --torch
   (release, the project's own torch requirement, then --torch's +variant tag), --variant,
   the CPU wheel unless asked for, --cuda, --cudnn, --python;
3. GPU architecture (``check_gpus``): every GPU named is in the wheel's arch list;
4. driver (``runtime.driver_verdict``): native, minor-version or forward compatibility;
5. base image and interpreter (``choose_base``): an Ubuntu whose glibc the wheel accepts,
   with an nvidia/cuda image of the flavour, else (runtime flavour) plain Ubuntu; and the
   stack's Python: an Ubuntu whose own python3 is one the wheel is built for comes first (it
   needs nothing extra), else a python-build-standalone build recorded in
   python_standalone.yaml on the Ubuntu chosen as before. A family with neither is rejected
   ("python"): no stack is offered that its recipes could not install.
A family that passes every check becomes one ``Stack`` (``build_stack``). User filters
come first so that a rejection says what the user can change; the facts come after.
"""

from __future__ import annotations

from envbuild.resolver.model import Rejection, Stack
from envbuild.resolver.runtime import driver_verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from envbuild.data.gpus import GpuTarget
    from envbuild.resolver.families import Family
    from envbuild.resolver.index import Index
    from envbuild.resolver.model import Request
    from envbuild.resolver.runtime import Runtime

    Base = tuple[str, str, str | None]  # (ubuntu, base image, base CUDA release)


def check_user_constraints(family: Family, ask: Request, ix: Index) -> Rejection | None:
    row = family.row

    def reject(constraint: str, reason: str) -> Rejection:
        return Rejection(family=family.label, constraint=constraint, reason=reason,
                         source=row["source"])

    if ask.torch and not ask.torch.admits(row["torch"]):
        return reject("torch", f"torch {row['torch']} does not match --torch {ask.torch}")
    if ask.project_torch and not ask.project_torch.admits(row["torch"]):
        return reject("torch", f"torch {row['torch']} does not match the project's "
                               f"torch{ask.project_torch.spec}")
    if ask.torch and ask.torch.local and ask.torch.local != row["variant"]:
        return reject("torch", f"variant {row['variant']} is not +{ask.torch.local}")
    if ask.variant not in (None, "default") and ask.variant != row["variant"]:
        return reject("variant", f"variant {row['variant']} is not --variant {ask.variant}")
    if ask.variant is None and row["variant"] == "cpu" and not ask.cpu_host:
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


def pythons(family: Family, ask: Request, ix: Index) -> list[str]:
    """Admissible Pythons, newest first; free-threaded builds only when asked for."""
    asked = ask.python
    if asked is not None and asked.text.endswith("t"):
        return [py for py in family.python if py == asked.text]
    if asked is None:  # newest first, those the companions have wheels for before the rest
        row = ix.companions.get(family.row["torch"])
        newest = list(ix.pythons_newest_first(family.python))
        if not row or not any(row.get(f"{name}_python") for name in COMPANIONS):
            return newest  # no companion records its Pythons: every Python has them all
        recorded = _recorded(row)  # once, not per comparison: this runs for every family
        return sorted(newest, key=lambda py: len(companions_for(py, row)) < recorded)
    return [py for py in ix.pythons_newest_first(family.python) if asked.admits(py)]


def check_gpus(family: Family, ask: Request, ix: Index) -> Rejection | None:
    row = family.row
    if row["cuda"] is None and ask.gpus and ask.variant == "default":
        # a DGX Spark once got the package index's CPU-only aarch64 torch 2.10 this way
        instead = _variants_covering(ask.gpus[0], row["torch"], ask, ix)
        hint = f"; use variant {', '.join(instead)} (PyTorch's index)" if instead else ""
        return Rejection(family=family.label, constraint="gpu-arch", source=row["source"],
                         reason=f"the package index's default {ask.platform} torch {row['torch']} "
                                f"is a CPU-only build: it runs on no GPU{hint}")
    if row["cuda"] is None or not ask.gpus:
        return None
    for gpu in ask.gpus:  # before the arch list: it needs none, and says what to change
        if gpu.min_cuda and ix.release(row["cuda"]) < ix.release(gpu.min_cuda):
            instead = _variants_covering(gpu, row["torch"], ask, ix)
            hint = f"; use variant {', '.join(instead)}" if instead else ""
            return Rejection(
                family=family.label, constraint="gpu-arch", source=row["source"],
                reason=f"{gpu.label} ({gpu.sm}) needs CUDA >= {gpu.min_cuda} wheels: an older "
                       f"CUDA's runtime compiler rejects {gpu.sm}{hint}",
            )
    arch_list = row.get("arch_list")
    if not arch_list:
        return Rejection(family=family.label, constraint="gpu-arch", source=row["source"],
                         reason="its arch list is not recorded, so GPU support cannot be checked")
    from envbuild.data.gpus import coverage_of  # only with GPUs: a module fewer at start-up

    entries = ix.arch(arch_list)
    for gpu in ask.gpus:
        if coverage_of(gpu.compute_capability, entries) is None:
            instead = _variants_covering(gpu, row["torch"], ask, ix)
            hint = f"; use variant {', '.join(instead)}" if instead else ""
            return Rejection(
                family=family.label, constraint="gpu-arch", source=row["source"],
                reason=f"{gpu.sm} ({gpu.label}) not in its arch list [{', '.join(arch_list)}]{hint}",
            )
    return None


def _variants_covering(gpu: GpuTarget, torch: str, ask: Request, ix: Index) -> list[str]:
    from envbuild.data.gpus import coverage_of

    return [r["variant"] for r in ix.variant_rows(ask.platform)
            if r["torch"] == torch and r["cuda"] and r.get("arch_list")
            and coverage_of(gpu.compute_capability, ix.arch(r["arch_list"])) is not None
            and not (gpu.min_cuda and ix.release(r["cuda"]) < ix.release(gpu.min_cuda))]


def choose_base(family: Family, runtime: Runtime | None, ask: Request,
                ix: Index) -> tuple[str, str, str | None, str] | Rejection:
    """(ubuntu, base image, base CUDA release, Python). The base: an nvidia/cuda image for the
    newest Ubuntu that has one, else (runtime flavour) plain Ubuntu, since the wheels carry
    CUDA's libraries and the rendered image sets the NVIDIA_* variables itself. The Python: the
    Ubuntu's own python3 where one of the usable Ubuntus ships a Python the wheel is built for
    (the newest such Ubuntu, by the same base rule), else the newest such Python with a
    recorded standalone build, on the base chosen from every usable Ubuntu."""
    ubuntus = [u for u in ix.ubuntus if ask.ubuntu in (None, u)]
    too_old = ix.too_old(family.row["torch"])
    usable = [u for u in ubuntus if u not in too_old]
    if not usable:
        where = f"Ubuntu {ask.ubuntu}" if ask.ubuntu else "any Ubuntu in ubuntu_python.yaml"
        why = f" (its glibc is older than the wheel's {family.pins.get('platform_tag')})" \
            if ubuntus else ""
        return Rejection(family=family.label, constraint="ubuntu", source=None,
                         reason=f"no base for {where}{why}")
    candidates = pythons(family, ask, ix)
    own = [u for u in usable if ix.ubuntu_rows.get(u, {}).get("python") in candidates]
    if own:
        base = _base_on(own, family, runtime, ask, ix)
        if base is not None:
            return (*base, str(ix.ubuntu_rows[base[0]]["python"]))
    base = _base_on(usable, family, runtime, ask, ix)
    if base is None:
        where = f"Ubuntu {ask.ubuntu}" if ask.ubuntu else "any Ubuntu"
        if runtime is not None and runtime.compat == "forward":
            major = str(family.row["cuda"]).split(".")[0]
            return Rejection(family=family.label, constraint="ubuntu", source=None,
                             reason=f"no nvidia/cuda {major}.x {_image_flavor(ask)} image for {where} in "
                                    "cuda_images.yaml: forward compatibility needs the "
                                    "cuda-compat libraries such an image carries")
        return Rejection(family=family.label, constraint="ubuntu", source=None,
                         reason=f"no nvidia/cuda {family.row['cuda']} devel image "
                                f"for {where} in cuda_images.yaml")
    standalone = next((py for py in candidates if py in ix.standalone_for(ask.platform)), None)
    if standalone is None:
        shipped = ", ".join(f"{u}: {ix.ubuntu_rows.get(u, {}).get('python', '?')}" for u in usable)
        return Rejection(
            family=family.label, constraint="python", source=None,
            reason=f"no interpreter for Python {', '.join(candidates)}: not the python3 of the "
                   f"usable Ubuntu releases ({shipped}) and no python-build-standalone build "
                   "is recorded (python_standalone.yaml)")
    return (*base, standalone)


def _image_flavor(ask: Request) -> str:
    """The nvidia/cuda image flavour a request's flavor takes: base (runtime) or devel."""
    return "base" if ask.flavor == "runtime" else "devel"


def _base_on(usable: list[str], family: Family, runtime: Runtime | None, ask: Request,
             ix: Index) -> Base | None:
    """The base image on one of ``usable`` (newest first); None: no devel image there."""
    if runtime is None:  # CPU wheel
        return usable[0], f"ubuntu:{usable[0]}", None
    flavor = _image_flavor(ask)
    for release in runtime.base_releases:
        for ubuntu in usable:
            flavors = ix.images.get((release, ubuntu))
            if flavors is not None and flavor in flavors:
                return ubuntu, f"nvidia/cuda:{release}-{flavor}-ubuntu{ubuntu}", release
    if ask.flavor == "runtime" and runtime.compat != "forward":  # plain Ubuntu has no cuda-compat
        built_for = {u for (cuda, u) in ix.images if cuda.startswith(f"{family.row['cuda']}.")}
        ubuntu = next((u for u in usable if u in built_for), usable[0])
        return ubuntu, f"ubuntu:{ubuntu}", None
    return None


COMPANIONS = ("torchvision", "torchaudio")


def _recorded(row: Mapping[str, Any] | None) -> int:
    return sum(1 for name in COMPANIONS if row and row.get(name) is not None)


def companions_missing(torch: str, row: Mapping[str, Any] | None) -> str | None:
    """"no torchvision/torchaudio for torch X: why", from the torch_companions row's note.

    The refresh writes one note part per missing companion, starting "no PROJECT"; a row
    without one (written by hand, or before the refresh said why) and a torch without a row
    are named as such."""
    missing = [name for name in COMPANIONS if row is None or row.get(name) is None]
    if not missing:
        return None
    if row is None:
        reasons = ["torch_companions.yaml has no row for this torch"]
    else:
        parts = str(row.get("note") or "").split("; ")
        reasons = [next((p for p in parts if p.startswith(f"no {name} ")),
                        f"torch_companions.yaml records no {name} and no reason") for name in missing]
    return f"no {'/'.join(missing)} for torch {torch}: {'; '.join(reasons)}"


def companions_for(python: str, row: Mapping[str, Any] | None) -> dict[str, str]:
    """The companions (name -> version) that have a wheel for ``python``: a recorded
    ``<name>_python`` list that lacks it drops the companion (torchvision 0.20 has no cp313)."""
    found: dict[str, str] = {}
    for name in COMPANIONS:
        version = (row or {}).get(name)
        built_for = (row or {}).get(f"{name}_python")
        if version is not None and (built_for is None or python.rstrip("t") in built_for):
            found[name] = version
    return found


def companions_unbuilt(python: str, row: Mapping[str, Any] | None) -> str | None:
    """"no wheel for Python 3.13: torchvision 0.20.1 has wheels for Python 3.9, ..." or None."""
    if not row:
        return None
    held = companions_for(python, row)
    lacking = [f"{name} {row[name]} has wheels for Python {', '.join(row[f'{name}_python'])}"
               for name in COMPANIONS if row.get(name) is not None and name not in held]
    return f"no companion wheel for Python {python}: {'; '.join(lacking)}" if lacking else None


def build_stack(family: Family, runtime: Runtime | None, base: tuple[str, str, str | None, str],
                ask: Request, ix: Index) -> Stack:
    row = family.row
    ubuntu, image, base_cuda, python = base
    companions = companions_for(python, ix.companions.get(row["torch"]))
    notes = []
    if runtime and runtime.compat == "minor-version":
        notes.append(f"runs CUDA {row['cuda']} through minor-version compatibility: "
                     f"no PTX JIT of newer PTX; features needing a newer driver fail")
    if runtime and runtime.compat == "forward":
        notes.append("needs the cuda-compat package (forward compatibility, datacenter GPUs only)")
        compat_cuda = ".".join(base_cuda.split(".")[:2]) if base_cuda else None
        if compat_cuda is not None and compat_cuda != row["cuda"]:
            notes.append(f"the image's cuda-compat is CUDA {compat_cuda}'s: CUDA "
                         f"{row['cuda']} runs on it through minor-version compatibility")
    nvcc = ".".join(base_cuda.split(".")[:2]) if base_cuda else None
    if ask.flavor == "devel" and runtime and runtime.compat != "forward" and nvcc != row["cuda"]:
        notes.append(f"devel image's nvcc is CUDA {nvcc}, the wheel's CUDA {row['cuda']}: no "
                     f"CUDA {row['cuda']} image runs natively on this driver (its CUDA "
                     "requirement would stop the container); torch.utils.cpp_extension only "
                     "warns on a minor mismatch, and extensions must carry SASS for the GPU")
    if runtime and base_cuda is None:
        notes.append("plain Ubuntu base: no nvidia/cuda base image is recorded for this CUDA "
                     "release; the wheels carry the CUDA libraries")
    if not row.get("arch_list") and row["cuda"]:
        notes.append("arch list not recorded: GPU support of this wheel is unverified")
    for missing in (companions_missing(row["torch"], ix.companions.get(row["torch"])),
                    companions_unbuilt(python, ix.companions.get(row["torch"]))):
        if missing:
            notes.append(missing)
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
        flavor=ask.flavor,
        arch_list=tuple(row.get("arch_list", ())),
        notes=tuple(notes),
        platform=ask.platform,
    )


def evaluate(family: Family, ask: Request, ix: Index,
             verdicts: dict[Any, Runtime | Rejection]) -> Stack | Rejection:
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


def global_conflicts(ask: Request, ix: Index) -> list[Rejection]:
    found = _unknown_variant(ask, ix) + _platform_conflicts(ask, ix)
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


def _unknown_variant(ask: Request, ix: Index) -> list[Rejection]:
    """``--torch 2.3.1+cu999`` / ``--variant cu999``: name the variants that do exist."""
    torch = ask.torch
    wanted = torch.local if torch and torch.local else ask.variant
    if wanted in (None, "default"):
        return []
    rows = [r for r in ix.variant_rows(ask.platform) if torch is None or torch.admits(r["torch"])]
    if any(r["variant"] == wanted for r in rows):
        return []
    available = sorted({r["variant"] for r in rows})
    which = f"torch {torch.text.split('+')[0]}" if torch else "any torch release"
    return [Rejection(family="request", constraint="variant", source=None,
                      reason=f"no wheel variant {wanted} for {which}; "
                             f"available: {', '.join(available) or 'none'}")]


def _platform_conflicts(ask: Request, ix: Index) -> list[Rejection]:
    """GPUs the platform's wheels cannot serve, whatever the release: a Jetson module (JetPack's
    own builds), a Grace GPU asked for on linux/amd64, a GPU no aarch64 arch list covers."""
    found = []
    for gpu in ask.gpus:
        if gpu.family == "Jetson":
            found.append(Rejection(
                family="host", constraint="platform", source=gpu.source,
                reason=f"{gpu.label} ({gpu.sm}) is a Jetson module: its torch comes with JetPack "
                       "(NVIDIA's L4T builds and containers), which envbuild does not resolve"))
        elif gpu.host_arch == "aarch64" and ask.platform != "linux/arm64":
            found.append(Rejection(
                family="host", constraint="platform", source=gpu.source,
                reason=f"{gpu.label} is built into an Arm (Grace/SBSA) system: no {ask.platform} "
                       "stack runs on it"))
        elif ask.platform == "linux/arm64" and not _aarch64_covered(gpu, ix):
            lists = sorted({a for r in ix.variant_rows(ask.platform) for a in r.get("arch_list", ())},
                           key=lambda a: int("".join(c for c in a if c.isdigit())))
            found.append(Rejection(
                family="host", constraint="platform", source=None,
                reason=f"no linux/arm64 torch wheel runs on {gpu.sm} ({gpu.label}): PyTorch's "
                       f"aarch64 wheels are built for {', '.join(lists)} only"))
    return found


def _aarch64_covered(gpu: GpuTarget, ix: Index) -> bool:
    from envbuild.data.gpus import coverage_of

    return any(coverage_of(gpu.compute_capability, ix.arch(r["arch_list"])) is not None
               for r in ix.variant_rows("linux/arm64") if r.get("arch_list"))
