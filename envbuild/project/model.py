"""The project file's values, validated: what ``load_project`` returns."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from envbuild.confine import quoted
from envbuild.errors import UsageError
from envbuild.fleet.placement import Placement
from envbuild.project import INSTALLER_CHOICES as INSTALLER_CHOICES  # re-exported: config.py reads it here

TYPE_CHECKING = False  # for the type checker only: the extension tree's module is read where
if TYPE_CHECKING:      # a project has extensions (it is not on the way to uv's run)
    from envbuild.extensions.tree import Extension

# base-glibc (project key, lock --base-glibc): the glibc of a custom base image, which the
# closure's wheels are resolved for instead of the stack's Ubuntu's. uv resolves manylinux
# platforms from 2.17 (manylinux2014) on.
_BASE_GLIBC = re.compile(r"2\.(\d{1,2})")
OLDEST_BASE_GLIBC = 17


def check_base_glibc(value: str) -> str:
    """``value`` as "2.N", or UsageError (exit 2) saying what is wrong with it."""
    match = _BASE_GLIBC.fullmatch(value.strip())
    if match is None:
        raise UsageError(f"base-glibc {quoted(value)} is not a glibc version 2.N",
                         hint='write it as "2.36" (Debian 12): `ldd --version` in the base image prints it')
    if int(match[1]) < OLDEST_BASE_GLIBC:
        raise UsageError(f"base-glibc {value} is older than glibc 2.{OLDEST_BASE_GLIBC}, the oldest "
                         "manylinux platform a closure is resolved for",
                         hint=f"use a base image with glibc 2.{OLDEST_BASE_GLIBC} or newer")
    return f"2.{int(match[1])}"


@dataclass(frozen=True)
class Target:
    """One kind of machine the environment is locked for (a node type of a GPU cloud)."""

    name: str
    driver: str | None = None
    gpus: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    datacenter: bool = False
    platform: str | None = None  # linux/amd64 | linux/arm64; None: inferred from its GPUs
    placement: Placement = field(default_factory=Placement)  # nodes, gpus-per-node, runs-on, slurm, …


@dataclass(frozen=True)
class Project:
    """A loaded project file. Paths in ``sources`` are relative to ``root`` (the project
    file's directory); ``inputs`` are the files read, each (relative path, bytes), and
    ``inputs_digest`` the sha256 over them."""

    path: Path
    root: Path
    targets: tuple[Target, ...]
    torch: str | None = None
    python: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    ubuntu: str | None = None
    variant: str | None = None
    flavor: str = "runtime"
    companions: bool = True
    compile_toolchain: bool = True  # compile-toolchain: what torch.compile needs at run time
    dependencies: tuple[str, ...] = ()
    torch_constraints: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()  # from -c files: uv's constraints (torch's narrow the stack)
    # (canonical name, FILE:LINE, sha256s): a requirements file's --hash options, checked
    # against the files locked (envbuild/pylock/hashed.py)
    hashes: tuple[tuple[str, str, frozenset[str]], ...] = ()
    apt_packages: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str = "envbuild"
    base_image: str | None = None
    base_glibc: str | None = None  # the custom base image's glibc ("2.36"): the closure's platform
    index_url: str | None = None
    torch_index_url: str | None = None
    find_links: tuple[str, ...] = ()
    registry_mirrors: Mapping[str, str] = field(default_factory=dict, hash=False)
    extensions: tuple[Extension, ...] = ()  # built against the locked torch, in the image build
    build_sdists: tuple[str, ...] = ()  # canonical names locked by their sdist and built beside them
    all_sdists: bool = False  # build-sdists = true: every package only an sdist provides
    build_env: tuple[tuple[str, str], ...] = ()  # set in the extensions stage only (MAX_JOBS, …)
    installer: str | None = None  # what the build installs the closure with: "uv" | "pip"; None: uv
    exclude_newer: str | None = None  # the cut-off as given: a timestamp or "30 days" (pylock/cutoff.py)
    apt_snapshot: str | None = None  # "YYYYMMDDTHHMMSSZ" or "auto" (render/aptsnapshot.py)
    inputs: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    sources: tuple[str, ...] = ()

    @cached_property
    def inputs_digest(self) -> str:
        """sha256 over each input (relative path, bytes), each length-prefixed:
        computed where it is read (the lock records it after uv's run), so that ``lock`` starts uv
        before hashlib (and OpenSSL, ~4 ms) is loaded. The inputs are sorted by path, each read
        once: an extension tree's digest over them."""
        from envbuild.extensions.tree import tree_sha256

        return tree_sha256(dict(self.inputs))

    def target(self, name: str) -> Target:
        """The target called ``name``; KeyError when there is none."""
        for target in self.targets:
            if target.name == name:
                return target
        raise KeyError(name)
