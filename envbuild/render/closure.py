"""A locked closure's install files: the hash-pinned requirements of each layer.

The torch layer holds the distributions the lock's ``torch_layer`` names (torch, its
companions and everything they pull in); the project layer the rest. Each line is
``name @ URL --hash=sha256:…`` for the one wheel the lock's platform installs, so the build
asks no index and resolves nothing (``pip install --no-deps --no-index --require-hashes``).
Wheels the lock names by local path (a find-links directory) are copied into the build
context and named under ``local_dir`` instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from envbuild.errors import UsageError
from envbuild.extensions.record import BuildKey, read_record, stage_sums
from envbuild.extensions.sdists import pure_names, sdist_requirements, sdist_sha256
from envbuild.extensions.stage import PURE_BUILD, PURE_SDISTS
from envbuild.extensions.stage import build_keys as stage_keys
from envbuild.pylock.files import Pylock, read_pylock
from envbuild.pylock.install import install_requirements, local_wheels
from envbuild.render.lock import Lock


def install_files(lock: Lock, *, local_dir: str | None,
                  roots: Sequence[Path] = ()) -> tuple[dict[str, str], list[Path]]:
    """The layers' requirements ({"torch": text, "project": text}; "project" only when the
    project adds distributions) and the wheel files the lock names on this machine, to copy
    into a build context, each confined to ``roots`` (the pylock's directory first); the
    pylock read once and checked against the lock's packages."""
    ref = lock.pylock
    if ref is None:
        raise UsageError("the lock holds no closure", hint="run 'envbuild lock'")
    pylock = read_pylock(ref.text)
    if pylock.versions() != dict(sorted(lock.packages.items())):
        differ = sorted(set(pylock.versions().items()) ^ set(lock.packages.items()))
        raise UsageError(f"the lock's packages and {ref.file} disagree "
                         f"({', '.join(f'{n} {v}' for n, v in differ[:5])})",
                         hint="run 'envbuild lock' again; never edit either by hand")
    torch_layer = sorted(ref.torch_layer)
    # build-sdists packages are built in the extensions stage: the image installs their wheels.
    rest = sorted(set(lock.packages) - set(torch_layer) - set(lock.sdists))
    files = {"torch": install_requirements(pylock, torch_layer, python=lock.stack.python,
                                           glibc=ref.glibc, local_dir=local_dir, arch=ref.arch)}
    if rest:
        files["project"] = install_requirements(pylock, rest, python=lock.stack.python,
                                                glibc=ref.glibc, local_dir=local_dir, arch=ref.arch)
    pure = pure_names(lock.sdist_kinds)  # built in the envbuild-sdists stage, without torch
    fetched = [n for n in lock.sdists if pylock.package(n).vcs is None and n not in pure]  # git: git_builds
    if fetched:
        files["sdists"] = sdist_requirements(pylock, fetched)
    if pure:
        files[PURE_SDISTS] = sdist_requirements(pylock, pure)
        build = _pure_build(lock, torch_layer)
        if build:
            files[PURE_BUILD] = install_requirements(pylock, build, python=lock.stack.python,
                                                     glibc=ref.glibc, local_dir=local_dir, arch=ref.arch)
    return files, ([] if local_dir is None else local_wheels(pylock, roots))


def _pure_build(lock: Lock, torch_layer: Sequence[str]) -> list[str]:
    """The packages of the torch layer that the pure sdists' ``[build-system] requires`` name
    (setuptools, on a Python whose venv has none): their stage installs the project layer and
    these, never torch."""
    wanted = {r for k in lock.sdist_kinds if k.pure for r in k.requires}
    return sorted((wanted & set(torch_layer)) - {"torch"} - set(lock.sdists))


def build_keys(lock: Lock) -> list[BuildKey]:
    """The build key of each of the lock's extensions and sdists (envbuild/extensions/record.py)."""
    if lock.pylock is None or not (lock.extensions or lock.sdists):
        return []
    pylock = read_pylock(lock.pylock.text)
    return stage_keys(lock.extensions, {n: _source_sha256(pylock, n) for n in lock.sdists},
                      torch=lock.packages.get("torch", ""), cuda=lock.stack.cuda,
                      arch_list=lock.gpu_archs or lock.stack.arch_list, python=lock.stack.python)


def _source_sha256(pylock: Pylock, name: str) -> str:
    """An sdist's sha256; for a git source, the sha256 of ``git:`` and its commit id."""
    vcs = pylock.package(name).vcs
    if vcs is None:
        return sdist_sha256(pylock, name)
    return hashlib.sha256(f"git:{vcs.commit}".encode()).hexdigest()


def git_builds(lock: Lock) -> list[tuple[str, str, str]]:
    """(name, URL, commit id) of each git source the lock builds (build-sdists' names among them)."""
    if lock.pylock is None or not lock.sdists:
        return []
    pylock = read_pylock(lock.pylock.text)
    found = [(n, pylock.package(n).vcs) for n in lock.sdists]
    return [(name, vcs.url, vcs.commit) for name, vcs in found if vcs is not None]


def recorded_sums(lock: Lock, lock_dir: Path | None, *, pure: bool = False) -> str:
    """``sha256sum -c`` lines of the wheels recorded beside the lock for its build keys ("" when
    none): the extensions stage's, or (``pure``) the envbuild-sdists stage's."""
    built_pure = set(pure_names(lock.sdist_kinds))
    keys = [k for k in build_keys(lock) if (k.name in built_pure) == pure]
    if not keys or lock_dir is None:
        return ""
    return stage_sums(read_record(lock_dir), keys)
