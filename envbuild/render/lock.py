"""``envbuild.lock``: one resolved stack plus the render options, as deterministic JSON.

The lock is the single input of every renderer: re-rendering from a lock gives the same
bytes. It is also read back by the smoke test inside the image (``schema``, ``stack``
and ``packages`` are the keys it compares), so those names are part of its format.
Every string that reaches a rendered file is validated again when a lock is read, so a
hand-edited lock cannot inject an instruction either.

Format (schema 1, JSON object, keys sorted):
  schema            1
  stack             the resolver's Stack fields (see ``envbuild.resolver.model.Stack``)
  packages          exact pins: {"torch": "2.4.1+cu121", "torchvision": ..., "torchaudio": ...};
                    with the package index's default wheel also its nvidia-* Requires-Dist pins
                    for the stack's Python ({"nvidia-cudnn-cu12": "9.1.0.70", ...})
  index_url         the wheel index torch is installed from; null = pip's configured index
  base_image        the FROM reference (tag, and ``@sha256:...`` when given)
  base_digest       the digest part of base_image, or null
  flavor            runtime | devel
  python_provision  "distro" (Ubuntu's python3 is the stack's Python) | "standalone" |
                    "base" (a --base-image's own python3, checked against the stack's at build time)
  companions        false when only torch is installed (--no-companions); absent = true
  compile_toolchain false when the image (or host) goes without what torch.compile needs at run
                    time, a C/C++ compiler and the Python headers (--no-compile-toolchain,
                    ``compile-toolchain = false``); absent = true
  layers            optional: [{"name": "torch", "bytes": N, "source": "wheel sizes",
                    "wheels": {pin name: bytes}}], the torch install step's size estimated from
                    the wheel files' sizes (matrices/torch_wheels.yaml). Compressed wheel sizes:
                    a lower bound of the installed size (unpacked files are larger; unpinned
                    dependencies such as triton are not counted). Absent: sizes unknown (wheels
                    from PyTorch's own index, whose sizes are not recorded).
  python_standalone {"url": ..., "sha256": ...} for standalone, else null: --python-url and
                    --python-sha256 when given, else the stack's Python's x86_64 build recorded in
                    matrices/python_standalone.yaml
  matrices_digest   sha256 over the compatibility data the stack was resolved from
  apt_packages, pip_packages, env, user   the extra render options
  pylock            optional: the whole closure. {"file": "pylock.toml" | "pylock.NAME.toml"
                    (beside the lock), "sha256": of that file, "torch_layer": [canonical names
                    installed in the torch layer], "inputs_sha256": the fingerprint of the
                    closure's other inputs (``lock --check`` compares it; absent in locks made
                    before it, which --check calls stale), "exclude_newer": optional, the
                    cut-off the closure was resolved with (RFC 3339, UTC)}; ``packages`` then
                    holds EVERY distribution of the environment ({canonical name: version}) and
                    ``pip_packages`` is empty (the user's requirements are in the closure).
                    Absent: a stack-only lock (torch and its pins; pip resolves the rest at
                    build time).
  base_offline      optional, true when ``lock --offline`` kept the base image's tag unresolved
  fleet             optional: where the target's nodes live (the project file's nodes,
                    gpus-per-node, runs-on, slurm, kubernetes; ``envbuild/fleet/placement.py``).
                    Absent: no fleet keys (locks written before them read the same)
  extensions        optional: [{"dir": relative to the lock, "name": canonical, "sha256": of its
                    source tree, "cuda": true when it holds .cu/.cuh sources (absent: none)}],
                    built against the locked torch in the image build (``envbuild/extensions``);
                    built wheels' sha256: envbuild.built.json beside it
  sdists            optional: [canonical names], packages of the closure locked by their sdist
                    (its sha256 in the pylock) and built beside the extensions (build-sdists)
  sdist_kinds       optional: {name: {"kind": "pure", "requires": [canonical names its
                    [build-system] requires declares]} | {"kind": "native"}}, one per sdist
                    ``lock`` classified (envbuild/extensions/classify.py): a pure one is built in
                    the envbuild-sdists stage, without the torch layer; a native one (or an sdist
                    it does not name: locks written before kinds) in the extensions stage
  apt_snapshot      optional: "YYYYMMDDTHHMMSSZ", the time of the distribution's apt archive the
                    apt steps read (apt-snapshot; render/aptsnapshot.py). Absent: the live archive
  build_env         optional: [[KEY, VALUE]], the project's build-env, set in the extensions
                    stage only (checked as env is); absent: none
  gpu_archs         optional: ["sm_80", …], the target GPUs' architectures (``lock`` with GPUs named,
                    a CUDA stack): TORCH_CUDA_ARCH_LIST of the extensions stage, and what the
                    smoke test wants their device code for; absent: the stack's arch list

A lock file holds one such object per target inside a lock set (``render/lockset.py``,
schema 2); a schema-1 file is one stack-only object at the top level.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.confine import CANONICAL_NAME, quoted
from envbuild.data.matrix import Matrix, Row
from envbuild.errors import UsageError
from envbuild.fleet import placement as fleetmod
from envbuild.render.values import (
    check_debian_package,
    check_env_pair,
    check_image_reference,
    check_pip_requirement,
    check_printable,
    check_sha256,
    check_url,
    check_user_name,
)
from envbuild.resolver.model import AMD64, PYTORCH_INDEX, Stack
from envbuild.smoke.rules import is_arch, is_python_version, is_variant_selector

TYPE_CHECKING = False  # for the type checker only: read where a lock records sdist kinds, extensions
if TYPE_CHECKING:
    from envbuild.extensions.classify import Recorded
    from envbuild.extensions.tree import Extension

SCHEMA = 1
_VERSION_RE = re.compile(r"[0-9]+(?:\.[0-9]+){0,3}", re.ASCII)
_LOCAL_RE = re.compile(r"cpu|cu[0-9]{3,4}|rocm[0-9.]+", re.ASCII)
_UBUNTU_RE = re.compile(r"[0-9]{2}\.[0-9]{2}", re.ASCII)
_NVIDIA_RE = re.compile(r"nvidia-[a-z0-9][a-z0-9._-]*", re.ASCII)
_LAYER_RE = re.compile(r"[a-z][a-z0-9-]{0,31}", re.ASCII)
# A canonical distribution name (PEP 503) and a version as PEP 440 writes it (normalised form).
_PEP440_RE = re.compile(r"(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?"
                        r"(?:\.dev[0-9]+)?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?", re.ASCII)
_PLATFORM_RE = re.compile(r"(?:x86_64|aarch64)-manylinux_2_[0-9]{2}", re.ASCII)
_PYLOCK_NAME_RE = re.compile(r"pylock(?:\.[a-z0-9][a-z0-9_-]{0,31})?\.toml", re.ASCII)
_WHEEL_URL_RE = re.compile(r"https?://[A-Za-z0-9._~:/?&=%+!@-]+\.whl", re.ASCII)
LAYER_SOURCE = "wheel sizes"
INSTALLERS = ("uv",)  # what a lock may name to install its layers; else the image's pip


@dataclass(frozen=True, slots=True, kw_only=True)
class Standalone:
    """A pinned standalone CPython build (an ``install_only`` tarball) and its sha256."""

    url: str
    sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Installer:
    """The wheel of the installer a build runs for the closure's layers (uv), pinned like the
    closure: its version, the one file for the lock's platform and that file's sha256. It is
    installed outside the environment for the step that uses it and removed with the step."""

    name: str
    version: str
    url: str
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "url": self.url, "sha256": self.sha256}

    def requirement(self) -> str:
        return f"{self.name} @ {self.url} --hash=sha256:{self.sha256}\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One image layer's expected size: the sum of the wheel files it installs (a lower bound)."""

    name: str
    bytes: int
    wheels: Mapping[str, int]
    source: str = LAYER_SOURCE

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "source": self.source,
                "wheels": dict(sorted(self.wheels.items()))}


@dataclass(frozen=True, slots=True, kw_only=True)
class PylockRef:
    """A target's PEP 751 file beside the lock: its name, digest, and the torch layer's share."""

    file: str
    sha256: str
    torch_layer: tuple[str, ...]
    platform: str  # what the closure was resolved for: x86_64-manylinux_2_NN (NN: the Ubuntu's glibc)
    installer: Installer | None = None  # None: the image's own pip installs the layers
    # sha256 of every input the closure was resolved from that the lock records nowhere else
    # (the requirements given by flags, find-links, the default index, the installer choice:
    # commands/lock.py ``closure_inputs``), so ``lock --check`` sees them change. None: a lock
    # from before it was recorded, which --check reports as stale.
    inputs_sha256: str | None = None
    # exclude-newer (issue 41): the cut-off the closure was resolved with, an RFC 3339 UTC
    # timestamp (envbuild/pylock/cutoff.py); None: no cut-off. A span ("30 days") is recorded
    # as the instant it stood for when locked.
    exclude_newer: str | None = None
    text: str = field(default="", compare=False)  # the file's content when made or read

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"file": self.file, "sha256": self.sha256,
                                "torch_layer": list(self.torch_layer), "platform": self.platform}
        if self.installer is not None:
            data["installer"] = self.installer.to_json()
        if self.inputs_sha256 is not None:
            data["inputs_sha256"] = self.inputs_sha256
        if self.exclude_newer is not None:  # absent without a cut-off: older locks read the same
            data["exclude_newer"] = self.exclude_newer
        return data

    @property
    def glibc(self) -> str:
        """The glibc minor the platform names ("2.35")."""
        return self.platform.rsplit("_", 2)[-2] + "." + self.platform.rsplit("_", 1)[-1]

    @property
    def arch(self) -> str:
        """The CPU the platform names: x86_64 or aarch64."""
        return self.platform.split("-", 1)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Lock:
    stack: Stack
    packages: Mapping[str, str]
    index_url: str | None
    base_image: str
    base_digest: str | None
    flavor: str
    python_provision: str  # "distro" | "standalone" | "base"
    python_standalone: Standalone | None
    matrices_digest: str
    apt_packages: tuple[str, ...] = ()
    pip_packages: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str = "envbuild"
    companions: bool = True
    layers: tuple[Layer, ...] = ()
    pylock: PylockRef | None = None
    base_offline: bool = False
    fleet: fleetmod.Placement | None = None
    compile_toolchain: bool = True
    extensions: tuple[Extension, ...] = ()
    sdists: tuple[str, ...] = ()  # packages of the closure built from their sdist (extensions/sdists.py)
    sdist_kinds: tuple[Recorded, ...] = ()  # which sdists build without torch (extensions/classify.py)
    # apt-snapshot (issue 41): the distribution archive's time the apt steps read, YYYYMMDDTHHMMSSZ
    # (render/aptsnapshot.py); None: the live archive.
    apt_snapshot: str | None = None
    build_env: tuple[tuple[str, str], ...] = ()  # the extensions stage's variables (build-env)
    gpu_archs: tuple[str, ...] = ()  # the target GPUs' sm_XY: what extensions are compiled for

    def to_json(self) -> str:
        return json.dumps(self.to_mapping(), indent=2, sort_keys=True, ensure_ascii=True) + "\n"

    def to_mapping(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "stack": _stack_json(self.stack),
            "packages": dict(self.packages),
            "index_url": self.index_url,
            "base_image": self.base_image,
            "base_digest": self.base_digest,
            "flavor": self.flavor,
            "python_provision": self.python_provision,
            "python_standalone": None if self.python_standalone is None else {
                "url": self.python_standalone.url, "sha256": self.python_standalone.sha256},
            "matrices_digest": self.matrices_digest,
            "apt_packages": list(self.apt_packages),
            "pip_packages": list(self.pip_packages),
            "env": [[k, v] for k, v in self.env],
            "user": self.user,
        }
        if not self.companions:  # absent when true, so locks written before it read the same
            data["companions"] = False
        if not self.compile_toolchain:  # absent when true, as companions
            data["compile_toolchain"] = False
        if self.layers:  # absent when unknown, so locks written before it read the same
            data["layers"] = [layer.to_json() for layer in self.layers]
        if self.pylock is not None:
            data["pylock"] = self.pylock.to_json()
        if self.base_offline:
            data["base_offline"] = True
        if self.fleet is not None and not self.fleet.is_empty():
            data["fleet"] = self.fleet.to_json()
        if self.extensions:  # absent when none, so locks written before them read the same
            data["extensions"] = [e.to_json() for e in self.extensions]
        if self.sdists:  # absent when none, as extensions
            data["sdists"] = list(self.sdists)
        if self.sdist_kinds:  # absent when none (and in locks written before kinds)
            data["sdist_kinds"] = {k.name: k.to_json() for k in self.sdist_kinds}
        if self.apt_snapshot is not None:  # absent when none, as sdists
            data["apt_snapshot"] = self.apt_snapshot
        if self.build_env:  # absent when none, as extensions
            data["build_env"] = [[k, v] for k, v in self.build_env]
        if self.gpu_archs:  # absent when no GPU was named (or a CPU stack)
            data["gpu_archs"] = list(self.gpu_archs)
        return data


def distro_python(matrix: Matrix, ubuntu: str) -> str | None:
    """The python3 minor version Ubuntu ``ubuntu`` ships (ubuntu_python.yaml)."""
    for row in matrix.rows("ubuntu_python"):
        if str(row["ubuntu"]) == ubuntu:
            return str(row["python"])
    return None


def distro_glibc(matrix: Matrix, ubuntu: str) -> str | None:
    """The glibc minor version Ubuntu ``ubuntu`` ships (ubuntu_python.yaml): the manylinux
    level its wheels are chosen for."""
    for row in matrix.rows("ubuntu_python"):
        if str(row["ubuntu"]) == ubuntu and row.get("glibc"):
            return str(row["glibc"])
    return None


STANDALONE_ARCH = "x86_64"  # a linux/amd64 stack's; a linux/arm64 one installs the aarch64 build


def recorded_standalone(matrix: Matrix, python: str, arch: str = STANDALONE_ARCH) -> Standalone | None:
    """The python-build-standalone build python_standalone.yaml records for ``python`` on ``arch``."""
    for row in matrix.rows("python_standalone"):
        if row["python"] == python and row["arch"] == arch:
            return Standalone(url=str(row["url"]), sha256=str(row["sha256"]))
    return None


def pins(stack: Stack, *, companions: bool = True) -> dict[str, str]:
    """Exact pins. Wheels from PyTorch's own indexes carry the variant as a local tag
    (2.4.1+cu121); the package index's default wheel (no stack index) carries none.
    ``companions=False``: torch alone, for images that need neither torchvision nor torchaudio."""
    local = "" if stack.index_url is None or stack.variant == "default" else f"+{stack.variant}"
    versions = {"torch": stack.torch, "torchvision": stack.torchvision if companions else None,
                "torchaudio": stack.torchaudio if companions else None}
    return {name: f"{v}{local}" for name, v in versions.items() if v is not None}


def from_package_index(stack: Stack) -> bool:
    """True when torch comes from a package index's default wheel, not PyTorch's own index."""
    return stack.index_url is None or not stack.index_url.startswith(PYTORCH_INDEX)


def wheel_row(stack: Stack, matrix: Matrix) -> Row | None:
    """The torch_wheels row of the stack's default wheel (torch release × CPython), if any."""
    if stack.variant == "cpu" or not from_package_index(stack) or stack.platform != AMD64:
        return None  # torch_wheels records the x86_64 wheels only
    pypi = next((r for r in matrix.rows("torch_pypi") if r["torch"] == stack.torch), None)
    if pypi is None or stack.variant not in ("default", pypi["default_variant"]):
        return None
    return next((r for r in matrix.rows("torch_wheels")
                 if r["torch"] == stack.torch and r["python"] == stack.python), None)


def nvidia_pins(row: Row | None) -> dict[str, str]:
    """The default wheel's exact nvidia-* pins, as its METADATA writes them."""
    return {} if row is None else {str(k): str(v) for k, v in sorted(row["nvidia"].items())}


def layers(row: Row | None, packages: Mapping[str, str]) -> tuple[Layer, ...]:
    """The torch install step's size from the wheel sizes of every pin whose size is known."""
    if row is None:
        return ()
    known = {"torch": row["bytes"], **row["nvidia_bytes"]}
    for companion in ("torchvision", "torchaudio"):
        if f"{companion}_bytes" in row:
            known[companion] = row[f"{companion}_bytes"]
    wheels = {name: int(known[name]) for name in packages if name in known}
    return (Layer(name="torch", bytes=sum(wheels.values()), wheels=wheels),)


def make_lock(
    stack: Stack,
    matrix: Matrix,
    *,
    base_image: str | None = None,
    index_url: str | None = None,
    python_standalone: Standalone | None = None,
    apt_packages: Sequence[str] = (),
    pip_packages: Sequence[str] = (),
    env: Sequence[tuple[str, str]] = (),
    user: str = "envbuild",
    companions: bool = True,
    compile_toolchain: bool = True,
) -> Lock:
    """Validate the options and freeze them with ``stack`` (overrides win over the stack).

    The stack's Python: Ubuntu's python3 when it is the stack's; else ``python_standalone``
    (--python-url/--python-sha256); else, under a --base-image, that image's own python3
    (checked at build time); else the build python_standalone.yaml records for it."""
    image = check_image_reference(base_image if base_image is not None else stack.base_image,
                                   "--base-image")
    provision = "distro" if distro_python(matrix, stack.ubuntu) == stack.python else "standalone"
    if provision == "standalone" and python_standalone is None and base_image is not None \
            and not stack.python.endswith("t"):
        # A mirror or private base: its own python3 may well be the stack's (the build checks
        # it and stops with a clear message when it is not).
        provision = "base"
    if provision == "standalone" and python_standalone is None:
        python_standalone = recorded_standalone(matrix, stack.python, stack.machine)
    if provision == "standalone" and python_standalone is None:
        raise UsageError(
            f"Python {stack.python} is not Ubuntu {stack.ubuntu}'s python3, and no standalone "
            "build of it is recorded (matrices/python_standalone.yaml) or given",
            hint="pass --python-url URL --python-sha256 HEX (a python-build-standalone "
                 "install_only tarball for this Python), or choose the distro's --python")
    row = wheel_row(stack, matrix)
    packages = {**pins(stack, companions=companions), **nvidia_pins(row)}
    lock = Lock(
        stack=stack,
        packages=packages,
        index_url=index_url if index_url is not None else stack.index_url,
        base_image=image,
        base_digest=image.split("@", 1)[1] if "@" in image else None,
        flavor=stack.flavor,
        python_provision=provision,
        python_standalone=python_standalone if provision == "standalone" else None,
        matrices_digest=matrix.digest,
        apt_packages=tuple(sorted(set(apt_packages))),
        pip_packages=tuple(sorted(set(pip_packages))),
        env=tuple(sorted(dict(env).items())),
        user=user,
        companions=companions,
        layers=layers(row, packages),
        compile_toolchain=compile_toolchain,
    )
    check_lock(lock)
    return lock


# nvidia/cuda tag flavours and what each adds over ``base`` (NVIDIA's image descriptions:
# runtime = base + the CUDA math libraries and NCCL; devel = runtime + headers and tools;
# a cudnn tag adds cuDNN).
_RUNTIME_LIBS = ("cublas", "cufft", "curand", "cusolver", "cusparse", "nccl")


def duplicate_cuda(lock: Lock) -> list[str]:
    """Warnings for a base image that ships CUDA libraries the torch wheels bring again.

    A CUDA torch wheel carries cuBLAS, cuDNN and NCCL (as nvidia-* packages, or inside the
    wheel for older PyTorch-index builds), so a cudnn/runtime/devel base image under it holds
    the same libraries twice. The resolver picks a *base* image; this catches overrides.
    A devel image is wanted for the devel flavour (building extensions), so only a devel
    base under a runtime lock is reported."""
    s = lock.stack
    if s.cuda is None:
        return []  # CPU wheels carry no CUDA libraries
    reference = lock.base_image.split("@", 1)[0]
    name, _, tag = reference.rpartition(":") if ":" in reference.rsplit("/", 1)[-1] \
        else (reference, "", "")
    words = set(re.split(r"[^a-z0-9]+", f"{name.rsplit('/', 1)[-1]} {tag}".lower()))
    nvidia = sorted(k for k in lock.packages if _NVIDIA_RE.fullmatch(k))
    sizes = {k: v for layer in lock.layers for k, v in layer.wheels.items()}
    warnings: list[str] = []

    def carried(libraries: Sequence[str], fallback: str) -> str:
        names = [n for n in nvidia if any(n.startswith(f"nvidia-{lib}") for lib in libraries)]
        if not names:
            return fallback
        total = sum(sizes.get(n, 0) for n in names)
        size = f", {total / 1e6:.0f} MB of wheels" if total else ""
        return f"{', '.join(names)}{size}"

    image = f"base image {lock.base_image}"
    fix = (f"use a CUDA *base* image or plain Ubuntu (the resolver's choice was "
           f"{s.base_image})")
    if any(w.startswith("cudnn") for w in words):
        what = carried(("cudnn",), f"cuDNN {s.cudnn}" if s.cudnn else "cuDNN")
        warnings.append(f"{image} ships cuDNN and the torch wheels bring it again "
                        f"({what}): the same libraries twice; {fix}")
    if "devel" in words and lock.flavor != "devel":
        warnings.append(f"{image} is a devel image (toolkit, headers, math libraries) under "
                        f"a runtime lock whose wheels bring their own CUDA libraries "
                        f"({carried(_RUNTIME_LIBS, 'inside the torch wheel')}); {fix}")
    elif "runtime" in words:
        warnings.append(f"{image} ships the CUDA math libraries and NCCL, and the torch "
                        f"wheels bring them again "
                        f"({carried(_RUNTIME_LIBS, 'inside the torch wheel')}); {fix}")
    return warnings


def check_lock(lock: Lock) -> None:
    """Every string that reaches a rendered file, checked (UsageError names the field)."""
    s = lock.stack
    for name, value in (("torch", s.torch), ("torchvision", s.torchvision),
                        ("torchaudio", s.torchaudio)):
        if value is not None and not _VERSION_RE.fullmatch(value):
            raise UsageError(f"invalid {name} version {quoted(value)} in the lock")
    for name, value in (("cuda", s.cuda), ("cudnn", s.cudnn), ("nccl", s.nccl),
                        ("base_cuda", s.base_cuda), ("min_driver", s.min_driver)):
        if value is not None and not _VERSION_RE.fullmatch(value):
            raise UsageError(f"invalid {name} version {quoted(value)} in the lock")
    # The stack's own base image and index are rendered too (the Dockerfile names the base
    # a --base-image stands in for; the pins' local tag follows the index), and read by
    # the smoke test: the same checks as --base-image and --index-url.
    check_image_reference(s.base_image, "stack base_image")
    if s.index_url is not None:
        check_url(s.index_url, "stack index_url")
    for note in s.notes:
        check_printable(note, "stack note")
    _match(is_variant_selector, s.variant, "variant")
    if s.platform not in ("linux/amd64", "linux/arm64"):
        raise UsageError(f"invalid platform {quoted(s.platform)} in the lock",
                         hint="linux/amd64 or linux/arm64")
    _match(is_python_version, s.python, "python")
    _match(_UBUNTU_RE, s.ubuntu, "ubuntu")
    for arch in s.arch_list:
        _match(is_arch, arch, "arch_list")
    for arch in lock.gpu_archs:
        _match(lambda a: is_arch(a) and a.startswith("sm_") and "+" not in a, arch, "gpu_archs")
    if lock.flavor not in ("runtime", "devel") or s.flavor != lock.flavor:
        raise UsageError(f"invalid flavor {quoted(lock.flavor)} in the lock")
    if s.compat not in (None, "native", "minor-version", "forward"):
        raise UsageError(f"invalid compat {quoted(s.compat)} in the lock")
    if lock.python_provision not in ("distro", "standalone", "base") or (
            (lock.python_provision == "standalone") != (lock.python_standalone is not None)):
        raise UsageError("invalid python_provision in the lock")
    if lock.python_standalone is not None:
        check_url(lock.python_standalone.url, "--python-url")
        check_sha256(lock.python_standalone.sha256, "--python-sha256")
    torch_pins = pins(s, companions=lock.companions)
    extra = {k: v for k, v in lock.packages.items() if k not in torch_pins}
    # A whole closure holds every distribution; a stack-only lock torch's nvidia-* pins only.
    name_ok, version_ok = ((CANONICAL_NAME, _PEP440_RE) if lock.pylock is not None
                           else (_NVIDIA_RE, _VERSION_RE))
    if {k: lock.packages.get(k) for k in torch_pins} != torch_pins or any(
            not name_ok.fullmatch(k) or not version_ok.fullmatch(v) for k, v in extra.items()):
        raise UsageError("lock packages do not match its stack", hint="re-create the lock")
    if lock.pylock is not None:
        check_pylock_ref(lock.pylock, lock.packages)
        if lock.pip_packages:
            raise UsageError("a locked closure has no pip_packages: the requirements are in it",
                             hint="re-create the lock")
    for layer in lock.layers:
        check_layer(layer, lock.packages)
    check_image_reference(lock.base_image, "base_image")
    if lock.base_digest != (lock.base_image.split("@", 1)[1] if "@" in lock.base_image else None):
        raise UsageError("lock base_digest does not match base_image")
    if lock.index_url is not None:
        check_url(lock.index_url, "--index-url")
    if not re.fullmatch(r"[0-9a-f]{64}|", lock.matrices_digest):
        raise UsageError("invalid matrices_digest in the lock")
    for apt in lock.apt_packages:
        check_debian_package(apt, "--apt-package")
    pinned = {re.sub(r"[-_.]+", "-", name).lower() for name in lock.packages}
    for pip in lock.pip_packages:
        check_pip_requirement(pip, "--pip-package")
        # A later pip install of a pinned nvidia-* library would change what the lock records.
        if re.sub(r"[-_.]+", "-", pip.split("==")[0]).lower() in pinned:
            raise UsageError(f"--pip-package {quoted(pip)} would override the lock's own pin",
                             hint="the stack pins it already; drop the --pip-package")
    for key, value in (*lock.env, *lock.build_env):
        # The pair as --env KEY=VALUE would split it: a key holding '=' ("A=x y") would have
        # passed as key A and rendered a second ENV pair.
        if check_env_pair(f"{key}={value}", "--env") != (key, value):
            raise UsageError(f"invalid environment key {quoted(key)} in the lock",
                             hint="KEY matching [A-Za-z_][A-Za-z0-9_]*")
    check_user_name(lock.user, "--user")
    check_extensions(lock)
    from envbuild.render import aptsnapshot

    aptsnapshot.check_recorded(lock.apt_snapshot)
    aptsnapshot.check_nvidia_pins(lock.apt_snapshot, lock.apt_packages)


def check_extensions(lock: Lock) -> None:
    """Each extension's directory plain and relative, its name canonical, its digest hex;
    only in a locked closure (the image checks its installed set against the lock)."""
    if not (lock.extensions or lock.sdists or lock.sdist_kinds):
        return  # nothing to check: the checkers' modules are not read (a stack's lock, before uv)
    from envbuild.extensions.classify import check_recorded
    from envbuild.extensions.sdists import check_lock_sdists
    from envbuild.extensions.tree import check_dir

    if (lock.extensions or lock.sdists) and lock.pylock is None:
        raise UsageError("lock extensions need a locked closure (pylock)", hint="re-create the lock")
    check_lock_sdists(lock.sdists, lock.packages)
    check_recorded(lock.sdist_kinds, lock.sdists)
    for ext in lock.extensions:
        check_dir(ext.dir, "lock extension dir")
        check_sha256(ext.sha256, "extension sha256")
        if not CANONICAL_NAME.fullmatch(ext.name) or ext.name in lock.packages:
            raise UsageError(f"invalid extension name {quoted(ext.name)} in the lock",
                             hint="a canonical distribution name the closure does not hold")
    if len({e.dir for e in lock.extensions}) != len(lock.extensions) or \
            len({e.name for e in lock.extensions}) != len(lock.extensions):
        raise UsageError("lock extensions name a directory or distribution twice")


def check_pylock_ref(ref: PylockRef, packages: Mapping[str, str]) -> None:
    """The pylock entry: a plain file name beside the lock, a digest, a torch layer inside the closure."""
    if not isinstance(ref.file, str) or not _PYLOCK_NAME_RE.fullmatch(ref.file):
        raise UsageError(f"invalid pylock file name {quoted(ref.file)} in the lock",
                         hint="pylock.toml or pylock.NAME.toml, beside the lock")
    check_sha256(ref.sha256, "pylock sha256")
    if ref.inputs_sha256 is not None:
        check_sha256(ref.inputs_sha256, "pylock inputs_sha256")
    if ref.exclude_newer is not None:
        from envbuild.pylock.cutoff import format_instant, parse_timestamp

        if format_instant(parse_timestamp(ref.exclude_newer, "pylock exclude_newer")) != ref.exclude_newer:
            raise UsageError("the lock's pylock exclude_newer is not written as YYYY-MM-DDTHH:MM:SSZ",
                             hint="re-create the lock")
    if "torch" not in ref.torch_layer or not set(ref.torch_layer) <= set(packages) \
            or list(ref.torch_layer) != sorted(set(ref.torch_layer)):
        raise UsageError("invalid torch_layer in the lock: sorted names of the closure, torch among them",
                         hint="re-create the lock")
    if not _PLATFORM_RE.fullmatch(ref.platform):
        raise UsageError(f"invalid pylock platform {quoted(ref.platform)} in the lock",
                         hint="x86_64-manylinux_2_NN or aarch64-manylinux_2_NN")
    if ref.installer is not None:
        installer = ref.installer
        if installer.name not in INSTALLERS or not _PEP440_RE.fullmatch(installer.version):
            raise UsageError(f"invalid installer {quoted(installer.name)} "
                             f"{quoted(installer.version)} in the lock",
                             hint="re-create the lock")
        # The URL becomes a requirements line: nothing but a plain http(s) URL may reach it.
        check_url(installer.url, "installer url")
        if not _WHEEL_URL_RE.fullmatch(installer.url):
            raise UsageError("the lock's installer url is not a plain URL of a wheel",
                             hint="re-create the lock")
        check_sha256(installer.sha256, "installer sha256")


def check_layer(layer: Layer, packages: Mapping[str, str]) -> None:
    """A layer entry: a plain name, its wheels among the pins, sizes that add up."""
    sizes = list(layer.wheels.values())
    if not _LAYER_RE.fullmatch(layer.name) or layer.source != LAYER_SOURCE \
            or not set(layer.wheels) <= set(packages) \
            or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in sizes) \
            or not isinstance(layer.bytes, int) or isinstance(layer.bytes, bool) \
            or layer.bytes != sum(sizes):
        raise UsageError(f"invalid layer {quoted(layer.name)} in the lock", hint="re-create the lock")


def _match(pattern: re.Pattern[str] | Callable[[str], bool], value: str, name: str) -> None:
    if not isinstance(value, str) or not (pattern(value) if callable(pattern) else pattern.fullmatch(value)):
        raise UsageError(f"invalid {name} {quoted(value)} in the lock")


def load_json(text: str) -> Any:
    """JSON as a lock is read: a key twice in one object is refused (ValueError), never
    silently the last one (a reviewer reads the first, envbuild would use the second)."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        twice = next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1)
        raise ValueError(f"the key {twice[:40]!r} appears twice in one object")
    return data


def from_json(text: str) -> Lock:
    """Parse and validate a lock; any problem is a UsageError (exit 2)."""
    try:
        data = load_json(text)
        if not isinstance(data, dict) or type(data.get("schema")) is not int \
                or data["schema"] != SCHEMA:  # not true or 1.0, which compare equal to 1
            raise UsageError(f"not an envbuild lock of schema {SCHEMA}")
        lock = _from_mapping(data)
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"invalid lock: {type(exc).__name__}: {exc}",
                         hint="re-create it with 'envbuild lock'") from None
    except RecursionError:  # '[[[[…' nested deeper than the JSON parser recurses
        raise UsageError("invalid lock: nested too deeply",
                         hint="re-create it with 'envbuild lock'") from None
    check_lock(lock)
    return lock


_KEYS = frozenset({"schema", "stack", "packages", "index_url", "base_image", "base_digest",
                   "flavor", "python_provision", "python_standalone", "matrices_digest",
                   "apt_packages", "pip_packages", "env", "user"})
_OPTIONAL_KEYS = frozenset({"companions", "layers", "pylock", "base_offline", "fleet",
                            "compile_toolchain", "extensions", "sdists", "sdist_kinds", "apt_snapshot",
                            "build_env", "gpu_archs"})


def _stack_json(stack: Stack) -> dict[str, Any]:
    """The stack as the lock records it: ``platform`` only for linux/arm64, so every amd64 lock
    (and its digest) stays what it was before there were two platforms."""
    body = stack.to_json()
    if body["platform"] == AMD64:
        del body["platform"]
    return body


def _from_mapping(data: Mapping[str, Any]) -> Lock:
    """Types only, nothing coerced (a number is not a version string); ``check_lock`` then
    checks every value as the command line would."""
    if not _KEYS <= set(data) <= _KEYS | _OPTIONAL_KEYS:
        raise UsageError("lock has missing or unknown fields", hint="re-create the lock")
    raw = data["stack"]
    if isinstance(raw, dict) and "platform" not in raw:
        raw = {**raw, "platform": AMD64}  # written before linux/arm64 stacks, or amd64 (_stack_json)
    if not isinstance(raw, dict) or set(raw) != set(Stack.fields()):
        raise UsageError("lock 'stack' has missing or unknown fields")
    optional = {name for name, kind in Stack.__annotations__.items() if "None" in str(kind)}
    fields: dict[str, Any] = {}
    for name in Stack.fields():
        if name in ("arch_list", "notes"):
            fields[name] = tuple(_strings(raw[name], f"stack {name}"))
        elif name in optional:
            fields[name] = _optional_str(raw[name], f"stack {name}")
        else:
            fields[name] = _str(raw[name], f"stack {name}")
    standalone = data["python_standalone"]
    if standalone is not None and (not isinstance(standalone, dict)
                                   or set(standalone) != {"url", "sha256"}):
        raise UsageError("lock 'python_standalone' must be null or {url, sha256}")
    env = data["env"]
    if not isinstance(env, list) or any(not isinstance(p, list) or len(p) != 2 for p in env):
        raise UsageError("lock 'env' must be a list of [KEY, VALUE] pairs")
    packages = data["packages"]
    if not isinstance(packages, dict):
        raise UsageError("lock 'packages' must be a mapping of names to versions")
    companions = data.get("companions", True)
    if not isinstance(companions, bool):
        raise UsageError("lock 'companions' must be true or false")
    layers = data.get("layers", [])
    if not isinstance(layers, list):
        raise UsageError("lock 'layers' must be a list")
    base_offline = data.get("base_offline", False)
    if not isinstance(base_offline, bool):
        raise UsageError("lock 'base_offline' must be true or false")
    toolchain = data.get("compile_toolchain", True)
    if not isinstance(toolchain, bool):
        raise UsageError("lock 'compile_toolchain' must be true or false")
    return Lock(
        stack=Stack(**fields),
        packages={_str(k, "package name"): _str(v, f"package {quoted(k)} version")
                  for k, v in packages.items()},
        index_url=_optional_str(data["index_url"], "index_url"),
        base_image=_str(data["base_image"], "base_image"),
        base_digest=_optional_str(data["base_digest"], "base_digest"),
        flavor=_str(data["flavor"], "flavor"),
        python_provision=_str(data["python_provision"], "python_provision"),
        python_standalone=None if standalone is None else Standalone(
            url=_str(standalone["url"], "python_standalone url"),
            sha256=_str(standalone["sha256"], "python_standalone sha256")),
        matrices_digest=_str(data["matrices_digest"], "matrices_digest"),
        apt_packages=tuple(_strings(data["apt_packages"], "apt_packages")),
        pip_packages=tuple(_strings(data["pip_packages"], "pip_packages")),
        env=tuple((_str(k, "env key"), _str(v, "env value")) for k, v in env),
        user=_str(data["user"], "user"),
        companions=companions,
        layers=tuple(_layer(raw) for raw in layers),
        pylock=_pylock(data["pylock"]) if "pylock" in data else None,
        base_offline=base_offline,
        fleet=fleetmod.from_json(data["fleet"]) if "fleet" in data else None,
        compile_toolchain=toolchain,
        extensions=tuple(_extension(raw) for raw in _list(data.get("extensions", []), "extensions")),
        sdists=tuple(_strings(data.get("sdists", []), "sdists")),
        sdist_kinds=_sdist_kinds(data.get("sdist_kinds", {})),
        apt_snapshot=_optional_str(data.get("apt_snapshot"), "apt_snapshot"),
        build_env=tuple(_env_pairs(data.get("build_env", []), "build_env")),
        gpu_archs=tuple(_strings(data.get("gpu_archs", []), "gpu_archs")),
    )


def _env_pairs(raw: Any, field: str) -> list[tuple[str, str]]:
    if not isinstance(raw, list) or any(not isinstance(p, list) or len(p) != 2 for p in raw):
        raise UsageError(f"lock {field!r} must be a list of [KEY, VALUE] pairs")
    return [(_str(k, f"{field} key"), _str(v, f"{field} value")) for k, v in raw]


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise UsageError(f"lock {field!r} must be a list")
    return value


_EXTENSION_KEYS = frozenset({"dir", "name", "sha256"})


def _sdist_kinds(raw: Any) -> tuple[Recorded, ...]:
    if raw == {}:  # most locks: the classifier's module is not read
        return ()
    from envbuild.extensions.classify import recorded_from_json

    return recorded_from_json(raw)


def _extension(raw: Any) -> Extension:
    from envbuild.extensions.tree import Extension

    if not isinstance(raw, dict) or not _EXTENSION_KEYS <= set(raw) <= {*_EXTENSION_KEYS, "cuda"} \
            or raw.get("cuda", True) is not True:
        raise UsageError("lock 'extensions' entries need dir, name and sha256 (cuda: true optional), "
                         "nothing else")
    return Extension(dir=_str(raw["dir"], "extension dir"), name=_str(raw["name"], "extension name"),
                     sha256=_str(raw["sha256"], "extension sha256"), cuda="cuda" in raw)


def _pylock(raw: Any) -> PylockRef:
    if not isinstance(raw, dict) or not {"file", "sha256", "torch_layer", "platform"} <= set(raw) \
            or not set(raw) <= {"file", "sha256", "torch_layer", "platform", "installer", "inputs_sha256",
                                "exclude_newer"}:
        raise UsageError("lock 'pylock' needs file, sha256, torch_layer and platform "
                         "(installer, inputs_sha256 and exclude_newer optional)")
    inputs = raw.get("inputs_sha256")
    cutoff = raw.get("exclude_newer")
    return PylockRef(file=_str(raw["file"], "pylock file"), sha256=_str(raw["sha256"], "pylock sha256"),
                     torch_layer=tuple(_strings(raw["torch_layer"], "pylock torch_layer")),
                     platform=_str(raw["platform"], "pylock platform"),
                     installer=_installer(raw["installer"]) if "installer" in raw else None,
                     inputs_sha256=None if inputs is None else _str(inputs, "pylock inputs_sha256"),
                     exclude_newer=None if cutoff is None else _str(cutoff, "pylock exclude_newer"))


def _installer(raw: Any) -> Installer:
    if not isinstance(raw, dict) or set(raw) != {"name", "version", "url", "sha256"}:
        raise UsageError("lock pylock 'installer' needs name, version, url and sha256")
    return Installer(name=_str(raw["name"], "installer name"),
                     version=_str(raw["version"], "installer version"),
                     url=_str(raw["url"], "installer url"), sha256=_str(raw["sha256"], "installer sha256"))


def _layer(raw: Any) -> Layer:
    if not isinstance(raw, dict) or set(raw) != {"name", "bytes", "source", "wheels"} \
            or not isinstance(raw["wheels"], dict):
        raise UsageError("lock 'layers' entries need name, bytes, source and wheels")
    return Layer(name=_str(raw["name"], "layer name"), bytes=raw["bytes"],
                 source=_str(raw["source"], "layer source"),
                 wheels={_str(k, "layer wheel"): v for k, v in raw["wheels"].items()})


def _str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"lock {field} must be a string, not {type(value).__name__}",
                         hint="re-create the lock")
    return value


def _strings(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"lock {field} must be a list of strings", hint="re-create the lock")
    return value


def _optional_str(value: Any, field: str) -> str | None:
    return None if value is None else _str(value, field)


def read_lock(path: Path) -> Lock:
    from envbuild.confine import read_regular

    try:  # a regular file of bounded size, opened without blocking (as read_lockset reads it)
        text = read_regular(path, f"lock {path}").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read lock {path}: {exc}") from None
    return from_json(text)
