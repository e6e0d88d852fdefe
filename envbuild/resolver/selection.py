"""Turn the stack selectors (the user's strings, as a command parsed them) into a ``Request``.

Every user string is validated here, before anything is resolved or written. On
``envbuild resolve``'s start-up path: no ``re`` and no ``argparse`` import.
"""

from __future__ import annotations

from envbuild.data.versions import DriverVersion, Requirement, parse_requirement
from envbuild.resolver.model import Request
from envbuild.smoke.rules import is_python_version, is_variant_selector

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Protocol

    from envbuild.data.gpus import GpuTarget
    from envbuild.resolver.model import Flavor

    class HasRows(Protocol):
        """A Matrix, or the resolver's index of one."""

        def rows(self, relation: str) -> Sequence[Mapping[str, Any]]: ...


SELECTOR_FIELDS = ("driver", "host", "gpu", "arch", "datacenter", "torch", "python", "cuda", "cudnn",
                   "ubuntu", "variant", "flavor", "index_url", "project_torch", "platform")


class Selectors:
    """The stack selectors as the user wrote them (strings, unparsed): what every command
    that resolves a stack takes. A plain class, as ``envbuild resolve`` starts without
    ``dataclasses``; ``of`` copies them from any object with these attributes."""

    __slots__ = SELECTOR_FIELDS
    driver: str | None
    host: bool
    gpu: Sequence[str]
    arch: Sequence[str]
    datacenter: bool
    torch: str | None
    python: str | None
    cuda: str | None
    cudnn: str | None
    ubuntu: str | None
    variant: str | None
    flavor: Flavor  # runtime or devel: the CLI's choices
    index_url: str | None
    project_torch: str | None  # a specifier set: the project's own torch requirement (lock)
    platform: str | None  # linux/amd64 or linux/arm64, as Docker spells it

    def __init__(self, *, driver: str | None = None, host: bool = False, gpu: Sequence[str] = (),
                 arch: Sequence[str] = (), datacenter: bool = False, torch: str | None = None,
                 python: str | None = None, cuda: str | None = None, cudnn: str | None = None,
                 ubuntu: str | None = None, variant: str | None = None, flavor: Flavor = "runtime",
                 index_url: str | None = None, project_torch: str | None = None,
                 platform: str | None = None) -> None:
        self.driver, self.host, self.gpu, self.arch = driver, host, tuple(gpu), tuple(arch)
        self.datacenter, self.torch, self.python, self.cuda = datacenter, torch, python, cuda
        self.cudnn, self.ubuntu, self.variant, self.flavor = cudnn, ubuntu, variant, flavor
        self.index_url, self.project_torch, self.platform = index_url, project_torch, platform

    @classmethod
    def of(cls, values: object) -> Selectors:
        return cls(**{name: getattr(values, name) for name in SELECTOR_FIELDS
                      if getattr(values, name, None) is not None})


def build_request(args: Selectors, matrix: HasRows, env: Mapping[str, str]) -> Request:
    """The request ``args`` make, validated (``matrix``: a Matrix or the resolver's index)."""
    # "" is not "no driver": an empty --driver is an invalid one (exit 2), as is any text
    # NVIDIA would not write.
    driver = DriverVersion.parse(args.driver) if args.driver is not None else None
    if driver is not None:
        check_known_branch(driver, matrix)
    gpus: list[GpuTarget] = []
    if args.gpu or args.arch:  # gpus.py (and re) only when a GPU is named
        from envbuild.data.gpus import find_gpu, target_from_arch

        rows, keys = _gpu_lookup(matrix)
        gpus = [find_gpu(rows, name, keys) for name in args.gpu]
        gpus += [target_from_arch(arch, datacenter=True if args.datacenter else None)
                 for arch in args.arch]
    cpu_host = False
    platform = check_platform(args.platform)
    if args.host:
        host_driver, host_gpus, host_platform = host_targets(matrix, env)
        platform = platform or host_platform
        # Nothing found and nothing named: a machine without an NVIDIA GPU, which runs the
        # CPU wheels (offered first); the CUDA stacks follow, each with the driver it needs.
        cpu_host = host_driver is None and not host_gpus and driver is None and not gpus
        if driver is None:
            driver = host_driver
        gpus += host_gpus
    if args.datacenter:
        gpus = [_as_datacenter(g) for g in gpus]
    return Request(
        driver=driver,
        gpus=tuple(gpus),
        torch=parse_requirement("torch", args.torch) if args.torch is not None else None,
        python=_python_requirement(args.python),
        cuda=parse_requirement("cuda", args.cuda) if args.cuda is not None else None,
        cudnn=parse_requirement("cudnn", args.cudnn) if args.cudnn is not None else None,
        ubuntu=_ubuntu(args.ubuntu),
        variant=_variant(args.variant),
        flavor=args.flavor,
        package_index=args.index_url or env.get("PIP_INDEX_URL") or None,
        cpu_host=cpu_host,
        project_torch=None if not args.project_torch else parse_requirement("torch", args.project_torch),
        platform=platform or implied_platform(gpus),
        platform_given=platform is not None,
    )


PLATFORM_NAMES = ("linux/amd64", "linux/arm64")


def check_platform(text: str | None) -> str | None:
    """``--platform``: linux/amd64 or linux/arm64 (exit 2 otherwise)."""
    if text is not None and text not in PLATFORM_NAMES:
        from envbuild.errors import UsageError

        hint = (" (--arch names the GPU's sm_XY)" if text.startswith("sm_") else "")
        raise UsageError(f"unknown platform {text!r}",
                         hint=f"give linux/amd64 or linux/arm64{hint}")
    return text


def implied_platform(gpus: Sequence[GpuTarget]) -> str:
    """linux/arm64 where a GPU is built into an Arm system (Grace, DGX Spark), else linux/amd64."""
    return "linux/arm64" if any(g.host_arch == "aarch64" for g in gpus) else "linux/amd64"


def _gpu_lookup(matrix: HasRows) -> tuple[Sequence[Mapping[str, Any]], Mapping[str, int] | None]:
    """The GPU rows and folded names: an Index's packed ones (one row unpacked per lookup),
    else the matrix's rows (``find_gpu`` folds their names)."""
    gpu_rows = getattr(matrix, "gpu_rows", None)
    if gpu_rows is not None:
        return gpu_rows(), matrix.gpu_keys  # type: ignore[attr-defined]
    return matrix.rows("gpus"), None


def check_known_branch(driver: DriverVersion, matrix: HasRows) -> None:
    """A branch newer than every driver the data knows is a typo or stale data."""
    branches = [DriverVersion.parse(r["min_driver"]).branch for r in matrix.rows("cuda_toolkits")]
    newest = max(branches, default=0)
    if newest and driver.branch > newest + 50:
        from envbuild.errors import UsageError

        raise UsageError(
            f"unknown driver branch {driver.branch} (newest known: {newest})",
            hint="check the version, or run 'envbuild matrix refresh' for newer data",
        )


def host_targets(matrix: HasRows, env: Mapping[str, str]) -> tuple[DriverVersion | None,
                                                                   list[GpuTarget], str | None]:
    from envbuild.data.gpus import GpuTarget, find_gpu
    from envbuild.errors import UsageError
    from envbuild.host import probe as host

    facts = host.probe_host(env)
    driver = DriverVersion.parse(facts.driver_version) if facts.driver_version else None
    targets = []
    for gpu in facts.gpus:
        try:
            rows, keys = _gpu_lookup(matrix)
            targets.append(find_gpu(rows, gpu.name, keys))
        except UsageError:
            if gpu.compute_capability is None:
                raise UsageError(f"GPU {gpu.name!r} is not in gpus.yaml and its compute "
                                 "capability is unknown", hint="pass --arch sm_XY") from None
            targets.append(GpuTarget(label=gpu.name, compute_capability=gpu.compute_capability))
    return driver, targets, facts.platform


def _as_datacenter(gpu: GpuTarget) -> GpuTarget:
    return gpu if gpu.datacenter else gpu.with_datacenter()


def _decimal(text: str, low: int, high: int) -> bool:
    """``low`` to ``high`` decimal digits, as the regex ``\\d{low,high}`` matched them."""
    return low <= len(text) <= high and text.isdecimal()


def _python_requirement(text: str | None) -> Requirement | None:
    if text is None:
        return None
    if text.endswith("t") and is_python_version(text):
        # A free-threaded build ("3.13t"), matched by its name.
        return Requirement(kind="python", text=text, spec=f"=={text[:-1]}.*")
    return parse_requirement("python", text)


def _ubuntu(text: str | None) -> str | None:
    if text is not None and not (len(text) == 5 and text[2] == "." and _decimal(text[:2], 2, 2)
                                 and _decimal(text[3:], 2, 2)):
        from envbuild.errors import UsageError

        raise UsageError(f"invalid Ubuntu release {text!r}", hint="write it as 22.04 or 24.04")
    return text


def _variant(text: str | None) -> str | None:
    if text is not None and not is_variant_selector(text):
        from envbuild.errors import UsageError

        raise UsageError(f"invalid wheel variant {text!r}",
                         hint="write it as cu124, cpu or default")
    return text

