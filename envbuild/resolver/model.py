"""The resolver's values: what is asked (``Request``), what fits (``Stack``), what does not
(``Rejection``), what the driver runs (``DriverSummary``) and the whole answer
(``Resolution``). One model, for the ``envbuild resolve`` fast path and every command alike.

They are plain slotted classes, immutable once built, with what a frozen keyword-only
dataclass would give (keyword construction, field-wise equality and hashing, a repr) plus
``fields()`` and ``replace(**changes)``. Not dataclasses: ``import dataclasses`` costs
about as much as a whole ``envbuild resolve`` may (twice a bare interpreter's start-up).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Literal, TypeAlias, TypeVar

    from envbuild.data.gpus import GpuTarget
    from envbuild.data.versions import DriverVersion, Requirement

    Compat: TypeAlias = Literal["native", "minor-version", "forward"]
    Flavor: TypeAlias = Literal["runtime", "devel"]
    V = TypeVar("V", bound="Value")
else:  # run-time names for importers; the Literal narrowing is mypy's business only
    Compat = Flavor = str

PYTORCH_INDEX = "https://download.pytorch.org/whl"
PIN_FIELDS = ("cuda_runtime", "cudnn", "nccl")  # the pins a wheel record may carry
# Field orders (the values' __slots__): the order of reprs and of the JSON a stack writes.
REQUEST_FIELDS = ("driver", "gpus", "torch", "python", "cuda", "cudnn", "ubuntu", "variant",
                  "flavor", "package_index", "cpu_host", "project_torch", "platform",
                  "platform_given")
STACK_FIELDS = ("torch", "torchvision", "torchaudio", "variant", "index_url", "cuda", "cudnn",
                "nccl", "python", "ubuntu", "base_image", "base_cuda", "compat", "min_driver",
                "flavor", "arch_list", "notes", "platform")
# The platforms a stack is resolved for, as Docker spells them (``--platform``), and the CPU
# architecture each one's wheels are built for (manylinux_2_28_<arch>, python-build-standalone).
AMD64, ARM64 = "linux/amd64", "linux/arm64"
PLATFORMS = {AMD64: "x86_64", ARM64: "aarch64"}


class Value:
    """An immutable value whose fields are its class's ``__slots__``, in order: that order
    is the repr's and the JSON's, so the subclasses keep it rather than sorting it."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        names: tuple[str, ...] = cls.__slots__
        return names

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.fields()}

    def replace(self: V, **changes: Any) -> V:
        unknown = set(changes) - set(self.fields())
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        return type(self)(**{**self.as_dict(), **changes})

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.fields())

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Value)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.fields())
        return f"{type(self).__name__}({body})"


class Request(Value):
    """What the user asked for, parsed; None means unconstrained."""

    __slots__ = REQUEST_FIELDS
    driver: DriverVersion | None
    gpus: tuple[GpuTarget, ...]
    torch: Requirement | None
    python: Requirement | None
    cuda: Requirement | None
    cudnn: Requirement | None
    ubuntu: str | None
    variant: str | None  # "cu124", "cpu" or "default"
    flavor: Flavor
    package_index: str | None  # where "default" wheels come from
    cpu_host: bool  # --host found no NVIDIA driver and no GPU: CPU stacks are offered first
    # The project's own torch requirement (its dependencies, an extension wheel's build): it
    # narrows the stack like --torch, but no way out offered relaxes it.
    project_torch: Requirement | None
    platform: str  # linux/amd64 or linux/arm64: given, the host's, or implied by a Grace GPU
    platform_given: bool  # --platform (or the host's) named it, rather than the default

    def __init__(self, *, driver: DriverVersion | None = None, gpus: tuple[GpuTarget, ...] = (),
                 torch: Requirement | None = None, python: Requirement | None = None,
                 cuda: Requirement | None = None, cudnn: Requirement | None = None,
                 ubuntu: str | None = None, variant: str | None = None,
                 flavor: Flavor = "runtime", package_index: str | None = None,
                 cpu_host: bool = False, project_torch: Requirement | None = None,
                 platform: str = AMD64, platform_given: bool = False) -> None:
        self._set(driver=driver, gpus=tuple(gpus), torch=torch, python=python, cuda=cuda,
                  cudnn=cudnn, ubuntu=ubuntu, variant=variant, flavor=flavor,
                  package_index=package_index, cpu_host=cpu_host, project_torch=project_torch,
                  platform=platform, platform_given=platform_given)


class Stack(Value):
    """One fully pinned stack."""

    __slots__ = STACK_FIELDS
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
    notes: tuple[str, ...]
    platform: str  # linux/amd64 or linux/arm64: which CPU architecture's wheels and image

    def __init__(self, *, torch: str, torchvision: str | None, torchaudio: str | None,
                 variant: str, index_url: str | None, cuda: str | None, cudnn: str | None,
                 nccl: str | None, python: str, ubuntu: str, base_image: str,
                 base_cuda: str | None, compat: Compat | None, min_driver: str | None,
                 flavor: Flavor, arch_list: tuple[str, ...], notes: tuple[str, ...] = (),
                 platform: str = AMD64) -> None:
        self._set(torch=torch, torchvision=torchvision, torchaudio=torchaudio, variant=variant,
                  index_url=index_url, cuda=cuda, cudnn=cudnn, nccl=nccl, python=python,
                  ubuntu=ubuntu, base_image=base_image, base_cuda=base_cuda, compat=compat,
                  min_driver=min_driver, flavor=flavor, arch_list=arch_list, notes=notes,
                  platform=platform)

    @property
    def machine(self) -> str:
        """The CPU architecture of its wheels: x86_64 or aarch64."""
        return PLATFORMS[self.platform]

    def to_json(self) -> dict[str, Any]:
        body = self.as_dict()
        body["arch_list"] = list(self.arch_list)
        body["notes"] = list(self.notes)
        return body


class Rejection(Value):
    """Why one family (or the whole request) does not fit."""

    __slots__ = ("family", "constraint", "reason", "source")  # noqa: RUF023
    family: str
    constraint: str  # which check failed: torch, variant, python, gpu-arch, driver, ...
    reason: str
    source: str | None

    def __init__(self, *, family: str, constraint: str, reason: str,
                 source: str | None = None) -> None:
        self._set(family=family, constraint=constraint, reason=reason, source=source)

    def renamed(self, family: str) -> Rejection:
        return self.replace(family=family)

    def to_json(self) -> dict[str, Any]:
        return self.as_dict()


class DriverSummary(Value):
    """What the host driver runs."""

    __slots__ = ("version", "max_cuda", "max_cuda_release", "minor_compat", "needs_newer",  # noqa: RUF023
                 "partial", "older", "lifecycle")
    version: str  # as written: 535.104.05, never 535.104.5
    max_cuda: str | None
    max_cuda_release: str | None
    minor_compat: str | None
    needs_newer: tuple[tuple[str, str], ...]  # (CUDA family, driver it needs)
    partial: bool  # 550 or 550.54: read as the newest build of that branch (or minor)
    # A partial version's builds below the first driver the newest-build reading needs:
    # (that driver, max_cuda, max_cuda_release, minor_compat); None: every build runs the same.
    older: tuple[str, str | None, str | None, str | None] | None
    # The branch in driver_branches.yaml: (designation, end of life "YYYY-MM" or None, source)
    lifecycle: tuple[str, str | None, str] | None

    def __init__(self, *, version: str, max_cuda: str | None, max_cuda_release: str | None,
                 minor_compat: str | None, needs_newer: tuple[tuple[str, str], ...] = (),
                 partial: bool = False,
                 older: tuple[str, str | None, str | None, str | None] | None = None,
                 lifecycle: tuple[str, str | None, str] | None = None) -> None:
        self._set(version=version, max_cuda=max_cuda, max_cuda_release=max_cuda_release,
                  minor_compat=minor_compat, needs_newer=needs_newer, partial=partial, older=older,
                  lifecycle=lifecycle)

    def to_json(self) -> dict[str, Any]:
        older = self.older
        return {"version": self.version, "max_cuda": self.max_cuda,
                "max_cuda_release": self.max_cuda_release, "minor_compat": self.minor_compat,
                "partial": self.partial,
                "older_builds": None if older is None else {
                    "below": older[0], "max_cuda": older[1], "max_cuda_release": older[2],
                    "minor_compat": older[3]},
                "branch": None if self.lifecycle is None else {
                    "designation": self.lifecycle[0], "end_of_life": self.lifecycle[1],
                    "source": self.lifecycle[2]}}


class Resolution(Value):
    """All stacks that fit, best first, and every rejected family with its reason."""

    __slots__ = ("stacks", "rejected", "driver", "global_conflicts")  # noqa: RUF023
    stacks: tuple[Stack, ...]
    rejected: tuple[Rejection, ...]
    driver: DriverSummary | None
    global_conflicts: tuple[Rejection, ...]  # host-level: every family fails with these

    def __init__(self, *, stacks: tuple[Stack, ...], rejected: tuple[Rejection, ...],
                 driver: DriverSummary | None, global_conflicts: tuple[Rejection, ...] = ()) -> None:
        self._set(stacks=stacks, rejected=rejected, driver=driver,
                  global_conflicts=global_conflicts)


def group_rejections(rejected: tuple[Rejection, ...] | list[Rejection]) -> dict[str, list[Rejection]]:
    """Rejections by the constraint that failed, in first-seen order."""
    groups: dict[str, list[Rejection]] = {}
    for rejection in rejected:
        groups.setdefault(rejection.constraint, []).append(rejection)
    return groups
