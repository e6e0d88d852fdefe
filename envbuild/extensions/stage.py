"""A lock's extensions as a build context's files and the Dockerfile's build-stage values.

Each extension's sources are read again from the lock's directory (the project's) and must
still hash to the lock's sha256: a tree changed since ``lock`` is a stale lock (exit 11), never
built silently. The stage (templates/partials/extensions_stage.j2) starts from the image's own
base, installs the lock's torch (and project) layer from the same hash-pinned requirements as
the image, adds a C++ compiler and the Python headers, and runs ``pip wheel --no-deps
--no-build-isolation`` for each extension; the image installs only the built wheels.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuild.confine import quoted
from envbuild.errors import StaleLock, UsageError
from envbuild.extensions.record import BuildKey
from envbuild.extensions.tree import Extension, context_dir, source_tree, tree_sha256

CONTEXT_DIR = "extensions"  # in the build context: extensions/<dir>/...
STAGE = "envbuild-extensions"
PURE_STAGE = "envbuild-sdists"  # the pure-Python sdists, built from the system stage: no torch
# Its files in the build context: requirements/<name>.txt for the first two.
PURE_SDISTS = "sdists-pure"  # the pure sdists, hash-pinned
PURE_BUILD = "sdists-pure-build"  # the torch layer's packages their builds declare
PURE_SUMS = "built-sdists.sha256"  # the wheels envbuild.built.json records for them
PURE_FILES = (PURE_SDISTS, PURE_BUILD, PURE_SUMS)
SOURCES = "/tmp/envbuild-ext"  # where the stage builds them
CUDA_HOME = "/usr/local/cuda"  # the toolkit in NVIDIA's devel images (nvcc in its bin/)
# What building a torch.utils.cpp_extension needs beyond the venv: a C++ compiler; the Python
# headers too unless the standalone CPython (which carries its own) is the interpreter.
BUILD_APT = ("g++",)
HEADERS_APT = ("python3-dev",)
GIT_APT = ("git",)  # git sources (envbuild/pylock/sources.py) are checked out in the stage
_SM_RE = re.compile(r"sm_(\d+)(\d)([af]?)", re.ASCII)


def context_files(extensions: Sequence[Extension], root: Path | None) -> dict[str, bytes]:
    """{context path: bytes} of every extension's sources, read under ``root`` (the lock's
    directory) and checked against the lock's sha256."""
    if extensions and root is None:
        raise UsageError("a lock with extensions renders from its own file",
                         hint="pass --lock FILE (the extensions' directories are relative to it)")
    files: dict[str, bytes] = {}
    for ext in extensions:
        assert root is not None
        what = f"extension {quoted(ext.dir)}"
        tree = source_tree(root, ext.dir, what)
        if tree_sha256(tree) != ext.sha256:
            raise StaleLock(f"{what}: its sources changed since the lock (their sha256 differs)",
                            hint="run 'envbuild lock' and commit the result")
        files.update({f"{CONTEXT_DIR}/{context_dir(ext.dir)}/{name}": data for name, data in tree.items()})
    return files


def torch_cuda_arch_list(cuda: str | None, arch_list: Sequence[str]) -> str | None:
    """``TORCH_CUDA_ARCH_LIST`` for the stack: its arch list (sm_80 → 8.0, sm_90a → 9.0a),
    ';'-separated; None for a CPU stack or one whose arch list is not recorded."""
    if cuda is None:
        return None
    found = [_SM_RE.fullmatch(arch) for arch in arch_list]
    parts = [f"{m[1]}.{m[2]}{m[3]}" for m in found if m is not None]
    return ";".join(parts) or None


def build_keys(extensions: Sequence[Extension], sdists: Mapping[str, str], *, torch: str,
               cuda: str | None, arch_list: Sequence[str], python: str) -> list[BuildKey]:
    """The build key of each extension (its tree's sha256) and each sdist ({name: its sha256})."""
    archs = torch_cuda_arch_list(cuda, arch_list) or ""
    sources = {**{e.name: e.sha256 for e in extensions}, **sdists}
    return [BuildKey(name=name, source_sha256=sha, torch=torch, cuda=cuda, archs=archs, python=python)
            for name, sha in sorted(sources.items())]


def check_toolchain(extensions: Sequence[Extension], *, cuda: str | None, flavor: str) -> None:
    """A CUDA extension on a CUDA stack needs nvcc, which only the devel flavour's base has: a
    runtime base would build its C++ part alone (or fail), so it is refused before any build."""
    needing = [e.name for e in extensions if e.cuda]
    if cuda is not None and needing and flavor != "devel":
        raise UsageError(f"extension {', '.join(needing)} has CUDA sources (.cu), but the image's flavor is "
                         f"{flavor}: its base has no nvcc to compile them",
                         hint='set flavor = "devel" in the project (or lock --flavor devel)')


def git_context(git: Sequence[tuple[str, str, str]]) -> list[dict[str, str]]:
    """Each git source's values for templates/partials/extensions_git.j2: its URL (shell-quoted;
    envbuild/pylock/sources.py allowed only plain characters in it), the commit id (40 hex, as
    checked) and the directory it is checked out in."""
    return [{"url": shlex.quote(url), "commit": commit, "dir": shlex.quote(f"{SOURCES}-git/{name}")}
            for name, url, commit in git]


def stage_context(extensions: Sequence[Extension], *, cuda: str | None, arch_list: Sequence[str],
                  standalone: bool, sdists: bool = False, recorded: bool = False,
                  build_env: Sequence[tuple[str, str]] = (), offline_steps: bool = False,
                  git: Sequence[tuple[str, str, str]] = (), pure: Sequence[str] = ()) -> dict[str, Any]:
    """The template's values: the stage's name, each source directory (shell-quoted), whether
    sdists are built (requirements/sdists.txt) and recorded wheels checked
    (requirements/built.sha256), the apt packages building needs, the arch list, CUDA's home
    (a CUDA stack: the devel base's toolkit), the project's build-env (shell-quoted values) and
    whether the compiling steps run with no network (``RUN --network=none``: docker buildx); and
    the envbuild-sdists stage's: whether there is one, whether it installs build requirements
    from the torch layer and checks recorded wheels (``pure``: which of its files exist)."""
    return {
        "extension_cuda_home": CUDA_HOME if cuda is not None else None,
        "extension_build_env": [(key, shlex.quote(value)) for key, value in sorted(build_env)],
        "extension_offline": offline_steps,
        "extension_stage": STAGE if extensions or sdists or git else None,
        "sdist_stage": PURE_STAGE if PURE_SDISTS in pure else None,
        "sdist_build": PURE_BUILD in pure,
        "sdist_recorded": PURE_SUMS in pure,
        "extension_sdists": sdists,
        "extension_recorded": recorded,
        "extension_dirs": [shlex.quote(f"{SOURCES}/{context_dir(e.dir)}") for e in extensions],
        "extension_apt": sorted(BUILD_APT + (() if standalone else HEADERS_APT) + (GIT_APT if git else ())),
        "extension_git": git_context(git),
        "extension_sources": SOURCES,
        "torch_cuda_arch_list": torch_cuda_arch_list(cuda, arch_list),
    }
