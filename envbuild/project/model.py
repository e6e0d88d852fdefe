"""The project file's values, validated: what ``load_project`` returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.extensions.tree import Extension
from envbuild.fleet.placement import Placement
from envbuild.project import INSTALLER_CHOICES as INSTALLER_CHOICES  # re-exported: config.py reads it here


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
    file's directory); ``inputs_digest`` is the sha256 over every file read."""

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
    inputs_digest: str = ""
    sources: tuple[str, ...] = ()

    def target(self, name: str) -> Target:
        """The target called ``name``; KeyError when there is none."""
        for target in self.targets:
            if target.name == name:
                return target
        raise KeyError(name)
