"""``envbuild lock``: every target of the project (or of the flags) pinned, whole.

For each target: the stack as ``resolve`` ranks it, the base image by digest (the registry is
asked; ``--no-registry`` asks none and keeps the tag, recorded as unpinned, while uv still
reaches the package index; ``--offline`` also keeps uv to its cache), then every Python distribution the
environment will hold, resolved by uv for the stack's platform into a PEP 751 file beside the
lock. ``--stack-only`` writes the old stack lock (torch and its pins only, nothing resolved
beyond them). ``--check`` writes nothing and exits 11 when the lock is stale against the
project file or the matrices.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

from envbuild.commands.options import (
    Out,
    add_render_options,
    add_selectors,
    exit_at_once,
    load_matrix,
    progress,
    resolve_lock,
    warn,
)
from envbuild.errors import NoCompatibleStack, StaleLock, UsageError
from envbuild.project import INSTALLER_CHOICES

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from envbuild.commands.lockview import Steps
    from envbuild.data.matrix import Matrix
    from envbuild.extensions.classify import Recorded
    from envbuild.project.model import Project, Target
    from envbuild.pylock.sourceonly import HeldBack
    from envbuild.pylock.uv import ClosureSpec
    from envbuild.render.lock import Lock
    from envbuild.render.lockset import LockSet

# Selector attributes a project's values fill when the flag was not given.
_STACK_KEYS = ("torch", "python", "cuda", "cudnn", "ubuntu", "variant")


def add_commands(commands: Any) -> None:
    p = commands.add_parser("lock", help="pin every target's whole environment: envbuild.lock + pylock files")
    add_selectors(p)
    add_render_options(p)
    p.add_argument("-o", "--output", default="envbuild.lock", metavar="FILE",
                   help="lock file to write (default: envbuild.lock); pylock files go beside it")
    p.add_argument("--project", metavar="FILE",
                   help="envbuild.toml or pyproject.toml with [tool.envbuild] (default: found in the "
                        "current directory, if any)")
    p.add_argument("--no-project", action="store_true", help="ignore a project file in the current directory")
    p.add_argument("--offline", action="store_true",
                   help="nothing networked: ask no registry (keep the base image's tag, recorded in "
                        "the lock) and let uv use its cache only")
    p.add_argument("--no-registry", action="store_true",
                   help="ask no image registry: the base image stays a tag, recorded as unpinned "
                        "(render, build and --check say so); uv still reaches the package index")
    p.add_argument("--stack-only", action="store_true",
                   help="pin the stack and torch only (no closure: pip resolves the rest at build time)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 11 when the lock is stale against the project or the matrices")
    p.add_argument("--stacks", metavar="DIR",
                   help="with --check: also stale when the build contexts 'ci github --lock' wrote in "
                        "DIR are not what the lock renders now (default: stacks/ beside the lock, "
                        "when it holds matrix.json)")
    p.add_argument("--upgrade", action="store_true", help="re-resolve every distribution to its newest")
    p.add_argument("--upgrade-package", action="append", default=[], metavar="NAME",
                   help="re-resolve NAME only (repeatable); the other pins are kept")
    p.add_argument("--find-links", action="append", default=[], metavar="DIR",
                   help="also take wheels from DIR (a wheelhouse; recorded in the pylock by path)")
    p.add_argument("--installer", choices=INSTALLER_CHOICES, default=None,
                   help="what the build installs the closure with (default: the project's "
                        "'installer', else uv: its wheel is pinned in the lock like the rest, "
                        "used by the build step and not kept in the image; pip: the image's own)")
    p.add_argument("--base-glibc", metavar="2.N",
                   help="the glibc of --base-image (project key base-glibc): the closure's wheels are "
                        "resolved for it instead of the stack's Ubuntu's")
    p.add_argument("--exclude-newer", metavar="WHEN",
                   help="leave out files uploaded after WHEN: an RFC 3339 timestamp "
                        "(2026-11-01T00:00:00Z) or a span of days before now ('30 days', P30D); "
                        "overrides the project's exclude-newer; recorded in the lock")
    p.add_argument("--json", action="store_true",
                   help="print the targets and the files written as JSON (docs/schemas/lock.schema.json)")
    p.set_defaults(run=cmd_lock)


class _Plan:
    """What one target is locked from: the merged selectors and the project's extras. A plain
    class: neither dataclasses nor typing is imported for `lock --help`."""

    __slots__ = ("args", "dependencies", "name", "torch_constraints")

    def __init__(self, name: str, args: argparse.Namespace, dependencies: tuple[str, ...],
                 torch_constraints: tuple[str, ...]) -> None:
        self.name, self.args = name, args
        self.dependencies, self.torch_constraints = dependencies, torch_constraints


def cmd_lock(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    from dataclasses import replace
    from pathlib import Path

    from envbuild.fs import check_file_target

    path = Path(args.output)
    check_file_target(path)  # a directory, link or device is exit 2 before any resolving
    if not path.parent.resolve().is_dir():
        raise UsageError(f"directory of {path} does not exist")
    if args.upgrade and args.upgrade_package:
        raise UsageError("--upgrade and --upgrade-package cannot be combined",
                         hint="--upgrade already re-resolves every package")
    if args.stack_only and (args.upgrade or args.upgrade_package or args.find_links or args.check
                            or args.exclude_newer is not None):
        raise UsageError("--stack-only locks no closure: --upgrade, --upgrade-package, --find-links, "
                         "--exclude-newer and --check need one")
    if args.exclude_newer is not None:
        from envbuild.pylock.cutoff import parse_cutoff

        parse_cutoff(args.exclude_newer, "--exclude-newer")
    if args.json and (args.check or args.stack_only):
        raise UsageError("--json reports a lock written with its closure: not with --check or --stack-only")
    index = _configured_index(env) if not args.stack_only else _no_index
    uv = _uv_version_soon() if not (args.stack_only or args.check) else _no_uv
    project = _project(args)
    if args.stack_only:
        if project is not None:
            raise UsageError("--stack-only cannot lock a project's dependencies",
                             hint="drop --stack-only, or pass --no-project")
        return _stack_only(args, env, path, out)
    from envbuild.commands.lockflags import given, names_a_stack

    if project is None and not args.check and not args.no_project:
        if not names_a_stack(given(args)):
            _no_project_here()
        progress("lock: no project file here: locking the stack and packages the flags name")
    matrix = load_matrix(args, env)
    if args.check:
        return _check(args, env, matrix, project, path, out, index)

    previous = _previous(path)
    flags = given(args)
    if previous is not None and previous.flags and previous.flags != flags:
        warn(f"{path} was locked with {' '.join(previous.flags)}; this lock is made with "
             f"{' '.join(flags) or 'no flags'} (give them again to keep them)")
    held: dict[str, tuple[HeldBack, ...]] = {}
    lockset = _lock_all(args, env, matrix, _plans(args, project), project, index, previous=previous,
                        held=held, uv=uv)

    _write(path, replace(lockset, flags=flags), out, as_json=args.json, held=held)
    exit_at_once()  # the files are written, uv's runs and their threads ended
    return 0


def _configured_index(env: Mapping[str, str]) -> Callable[[], str]:
    """pip's index (PIP_INDEX_URL, else its configuration, which ``pip config list`` reads in
    a third of a second), the default where the project names none: asked on a thread from
    the start, while the project is read, the stack resolved and the base image pinned."""
    from envbuild.upstream.pipconfig import index_url

    return _soon(lambda: index_url(None, env))


def _uv_version_soon() -> Callable[[], str]:
    """The version of the uv that resolves the closure (``uv --version``, a process of its own,
    which the build installs with unless a previous lock names one): asked on a thread from the
    start, like pip's index; its error, if any, is raised where the version is read."""
    def version() -> str:
        from envbuild.pylock.uvbin import find_uv, uv_version  # not pylock.uv: that is heavier

        return uv_version(find_uv(None))

    return _soon(version)


def _soon(work: Callable[[], str]) -> Callable[[], str]:
    """``work`` begun now on a thread of its own; the call returned waits for its answer (and
    raises its error)."""
    from envbuild.threads import begin

    return begin(work, name="envbuild-soon").result


def _no_index() -> str:
    raise AssertionError("--stack-only resolves no closure")


def _no_uv() -> str:
    raise AssertionError("--check and --stack-only run no uv")


def _stack_only(args: argparse.Namespace, env: Mapping[str, str], path: Path, out: Out) -> int:
    from envbuild.commands.render import warn_duplicate_cuda

    lock = resolve_lock(args, env, load_matrix(args, env))
    warn_duplicate_cuda(lock)
    _write_files(path, lock.to_json().encode("utf-8"), {})
    out(f"wrote {path} (stack only: the distributions beyond torch's pins are not locked)")
    return 0


def _project(args: argparse.Namespace) -> Project | None:
    from pathlib import Path
    if args.no_project:
        if args.project:
            raise UsageError("--project and --no-project cannot be combined")
        return None
    cwd = Path.cwd()
    from envbuild.project.config import load_project, project_file_here

    if args.project is None and project_file_here(cwd) is None:
        return None
    return load_project(Path(args.project) if args.project else None, cwd)


def _no_project_here() -> None:
    """A bare ``lock`` with no project file: locking a default stack of nothing is not what
    anyone asked for, so it says which file it looked for (exit 2)."""
    from pathlib import Path

    from envbuild.project.config import find_project_file

    try:
        find_project_file(None, Path.cwd())
    except UsageError as exc:
        raise UsageError(exc.message, hint=f"{exc.hint}, or lock from flags alone: name the stack and "
                                           "packages (--driver, --gpu, --torch, --pip-package …) "
                                           "or pass --no-project") from None


def _plans(args: argparse.Namespace, project: Project | None) -> list[_Plan]:
    """One plan per target; flags override the file's values."""
    if project is None:
        from envbuild.render.lockset import DEFAULT_TARGET

        return [_Plan(DEFAULT_TARGET, args, tuple(args.pip_package), ())]
    return [_Plan(t.name, _merged(args, project, t), project.dependencies + tuple(args.pip_package),
                  project.torch_constraints) for t in project.targets]


def _merged(args: argparse.Namespace, project: Project, target: Target) -> argparse.Namespace:
    ns = argparse.Namespace(**vars(args))
    if args.driver is None and not args.host:  # --driver "" is refused later, not replaced
        ns.driver = target.driver
    if not (args.gpu or args.arch or args.host):
        ns.gpu, ns.arch = list(target.gpus), list(target.archs)
    ns.datacenter = args.datacenter or target.datacenter
    if getattr(args, "platform", None) is None:  # else inferred from its GPUs, as resolve does
        ns.platform = target.platform
    for key in _STACK_KEYS:
        if getattr(args, key) is None:
            setattr(ns, key, getattr(project, key))
    if args.flavor is None:  # not on the command line: the project's (itself runtime by default)
        ns.flavor = project.flavor
    ns.index_url = args.index_url or project.torch_index_url
    ns.base_image = args.base_image or project.base_image
    ns.base_glibc = args.base_glibc or project.base_glibc
    ns.apt_package = sorted(set(args.apt_package) | set(project.apt_packages))
    ns.env = [f"{k}={v}" for k, v in project.env] + list(args.env)
    ns.user = args.user if args.user != "envbuild" else project.user
    ns.companions = args.companions and project.companions
    ns.compile_toolchain = args.compile_toolchain and project.compile_toolchain
    ns.pip_package = []  # the project's requirements go into the closure, not a pip step
    return ns


def _torch_spec(args: argparse.Namespace, constraints: Sequence[str]) -> argparse.Namespace:
    """The project's own torch requirements narrow the stack's torch beside ``--torch`` (which
    keeps its own forms: ``2.12.1``, ``2.12``, ``==2.12.1``), so the resolver sees them and no
    way out it offers breaks them; torchvision/torchaudio ones go to uv."""
    from packaging.requirements import Requirement

    requirements = [Requirement(c) for c in constraints]
    specs = [str(r.specifier) for r in requirements if r.name.lower() == "torch" and r.specifier]
    return _project_torch(args, specs)


def _project_torch(args: argparse.Namespace, specs: Sequence[str]) -> argparse.Namespace:
    if not specs:
        return args
    ns = argparse.Namespace(**vars(args))
    ns.project_torch = ",".join(([args.project_torch] if getattr(args, "project_torch", None) else [])
                                + list(specs))
    return ns


def _previous(path: Path) -> LockSet | None:
    """The lock already there, whose pins uv keeps (unless told to upgrade); unreadable → none."""
    if not path.is_file():
        return None
    from envbuild.render.lockset import read_lockset

    try:
        return read_lockset(path)
    except UsageError as exc:
        warn(f"{path} is not read back ({exc.message}): every pin is resolved anew")
        return None


def _extension_spec(args: argparse.Namespace, dependencies: Sequence[str]) -> tuple[argparse.Namespace,
                                                                                   list[str]]:
    """A direct-URL wheel built for one torch (``+cu12torch2.6…``, ``+pt21cu121``) narrows the
    stack to that torch minor and CUDA major, since an extension runs only beside the torch it
    was compiled against; (the selectors, the wheels that narrowed them)."""
    from envbuild.pylock.direct import direct_wheels, stack_constraints

    torch, cuda, origins = stack_constraints(direct_wheels(dependencies))
    if not origins:
        return args, []
    majors = sorted({c.split(".")[0] for c in cuda})
    if len(majors) > 1 or len(torch) > 1:
        raise UsageError(f"the project's extension wheels were built for different stacks "
                         f"(torch {', '.join(t.strip('=.*') for t in torch) or 'any'}; CUDA "
                         f"{', '.join(majors) or 'any'}): {', '.join(origins)}",
                         hint="pick wheels built for one torch and one CUDA major")
    ns = _project_torch(argparse.Namespace(**vars(args)), torch)
    if majors:
        if args.cuda and not str(args.cuda).split(".")[0] == majors[0]:
            raise UsageError(f"--cuda {args.cuda}: the extension wheels need CUDA {majors[0]} "
                             f"({', '.join(origins)})", hint=f"use --cuda {majors[0]} or other wheels")
        ns.cuda = args.cuda or majors[0]
    return ns, origins


def _target_lock(args: argparse.Namespace, env: Mapping[str, str], matrix: Matrix, plan: _Plan) -> Lock:
    """The stack and image options of one target, before the closure."""
    narrowed = _torch_spec(plan.args, plan.torch_constraints)
    ns, built_for = _extension_spec(narrowed, plan.dependencies)
    try:
        return resolve_lock(ns, env, matrix, gpu_archs=True)
    except NoCompatibleStack as exc:
        if ns is plan.args:
            raise
        origin = ", ".join([*plan.torch_constraints, *(f"{w} (built for one torch)" for w in built_for)])
        raise NoCompatibleStack(f"target {plan.name!r}: {exc.message} (the project requires {origin})",
                                conflicts=exc.conflicts, fixes=exc.fixes, hint=exc.hint) from None


def _lock_all(args: argparse.Namespace, env: Mapping[str, str], matrix: Matrix, plans: Sequence[_Plan],
              project: Project | None, index: Callable[[], str], *, previous: LockSet | None,
              held: dict[str, tuple[HeldBack, ...]], uv: Callable[[], str]) -> LockSet:
    """Every target locked; ``held`` gets, per target, the packages wheels-only resolution held
    back (an sdist-only release: envbuild/pylock/sourceonly.py); ``uv``: the resolving uv's version."""
    from dataclasses import replace

    from envbuild.commands.lockview import Steps, base_text
    from envbuild.render.lock import check_lock, duplicate_cuda

    locks: dict[str, Lock] = {}
    for plan in plans:
        with Steps(target=plan.name) as steps:
            steps.step("resolving the stack")
            lock = _target_lock(args, env, matrix, plan)
            s = lock.stack
            steps.step(f"stack torch {s.torch} ({s.variant}), Python {s.python}; pinning the base image "
                       f"{lock.base_image.split('@', 1)[0]}")
            steps.warn(duplicate_cuda(lock))
            start, based = _pinning(args, env, project, lock, steps)
            old = previous.targets.get(plan.name) if previous is not None else None
            try:
                closed = _close(args, env, matrix, project, plan, lock, old, len(plans), steps, index,
                                uv, started=start, held=held)
            except Exception:
                based()  # the registry's error first, as when the base was pinned before uv ran
                raise
            pinned = based()
            steps.step(f"base {base_text(pinned)}")
            closed = replace(closed, base_image=pinned.base_image, base_digest=pinned.base_digest,
                             base_offline=pinned.base_offline)
            closed = replace(closed, apt_snapshot=_apt_snapshot(args, project, closed, old))
            check_lock(closed)
            steps.done(f"{len(closed.packages)} distributions, hashes checked")
        placement = None if project is None else project.target(plan.name).placement
        fleet = placement if placement is not None and not placement.is_empty() else None
        locks[plan.name] = replace(closed, fleet=fleet)
    from envbuild.render.lockset import LockSet, ProjectRef  # read while uv ran (envbuild/pylock/uv.py)

    ref = None if project is None else ProjectRef(file=project.path.name, inputs_sha256=project.inputs_digest)
    return LockSet(targets=locks, project=ref)


def _apt_snapshot(args: argparse.Namespace, project: Project | None, lock: Lock,
                  old: Lock | None) -> str | None:
    """The project's apt-snapshot as the lock records it: a timestamp as given, or for "auto"
    the cut-off's time (else now less 24 hours), kept from the previous lock unless --upgrade."""
    setting = None if project is None else project.apt_snapshot
    if setting is None:
        return None
    from envbuild.render import aptsnapshot

    if setting == aptsnapshot.AUTO and old is not None and old.apt_snapshot is not None and not args.upgrade:
        return old.apt_snapshot
    from datetime import datetime, timezone

    from envbuild.render.docker import custom_base

    cutoff = None
    if lock.pylock is not None and lock.pylock.exclude_newer is not None:
        cutoff = datetime.fromisoformat(lock.pylock.exclude_newer.replace("Z", "+00:00"))
    return aptsnapshot.resolve(setting, now=datetime.now(timezone.utc), cutoff=cutoff,
                               ubuntu_image=not custom_base(lock))


def _pinning(args: argparse.Namespace, env: Mapping[str, str], project: Project | None, lock: Lock,
             steps: Steps) -> tuple[Callable[[], None], Callable[[], Lock]]:
    """(start, result): the lock with its base pinned, to be had when the closure is resolved.
    The registry is asked on a thread that ``start`` begins once uv's closure run has started
    (the closure needs no digest, and the registry client's imports, begun earlier, shared the
    interpreter lock with the preparation of that run); ``result`` starts it if nothing did.
    Without a registry to ask, pinned at once."""
    if lock.base_digest is not None or args.offline or args.no_registry:
        pinned = _pin_base(args, env, project, lock, steps)
        return (lambda: None), (lambda: pinned)
    from envbuild.threads import Answer, begin

    begun: list[Answer[Lock]] = []

    def start() -> None:  # on the main thread, as result is: no lock needed
        if not begun:
            begun.append(begin(_pin_base, args, env, project, lock, steps, name="envbuild-registry"))

    def result() -> Lock:
        start()
        return begun[0].result()

    return start, result


def _pin_base(args: argparse.Namespace, env: Mapping[str, str], project: Project | None, lock: Lock,
              steps: Steps) -> Lock:
    """The base image by digest, from its registry; --no-registry (and --offline) keep the tag
    and record that."""
    from dataclasses import replace

    if lock.base_digest is not None:
        return lock
    if args.offline or args.no_registry:
        flag = "--offline" if args.offline else "--no-registry"
        steps.warn([f"{flag}: the base image stays the tag {lock.base_image} (recorded in the lock as "
                    "base_offline: unpinned); a registry may move it"])
        return replace(lock, base_offline=True)
    from envbuild.registry.digest import image_digest
    from envbuild.registry.reference import pinned

    mirrors = {} if project is None else dict(project.registry_mirrors)
    # An arm64 target's base by its arm64 manifest: a multi-arch index digest can run the
    # wrong architecture (under emulation) wherever the platform is not given.
    digest = image_digest(lock.base_image, mirrors=mirrors, env=env,
                          platform=lock.stack.platform if lock.stack.platform != "linux/amd64" else None)
    return replace(lock, base_image=pinned(lock.base_image, digest), base_digest=digest)


def _close(args: argparse.Namespace, env: Mapping[str, str], matrix: Matrix, project: Project | None,
           plan: _Plan, lock: Lock, old: Lock | None, targets: int, steps: Steps,
           index: Callable[[], str], uv: Callable[[], str], *, started: Callable[[], None] | None = None,
           held: dict[str, tuple[HeldBack, ...]] | None = None) -> Lock:
    """The target's whole closure by uv, into its pylock; ``packages`` becomes every distribution.
    ``started``: called once uv's closure run has started."""
    from dataclasses import replace

    from envbuild.pylock.uv import compile_closure, platform_tag
    from envbuild.render.docker import custom_base
    from envbuild.render.lock import Installer, PylockRef, check_lock


    spec = replace(_spec(args, env, matrix, project, plan, lock, index),
                   previous=None if old is None or old.pylock is None else old.pylock.text,
                   upgrade=args.upgrade, upgrade_packages=tuple(args.upgrade_package),
                   offline=args.offline, installer=_installer_version(args, project, old, uv))
    cutoff = cutoff_given(args, project)
    # The closure's fingerprint: needed before uv's run only to keep a previous cut-off's instant;
    # else made after it (hashlib, and the OpenSSL it loads, ~4 ms before uv otherwise).
    inputs = closure_inputs(spec, cutoff) if cutoff is not None else None
    spec = replace(spec, exclude_newer=_cutoff_instant(cutoff, old, inputs, args.upgrade))
    tag = platform_tag(spec.glibc, spec.arch)
    if getattr(plan.args, "base_glibc", None):
        whose = "the base image's glibc, base-glibc"
    elif custom_base(lock):
        whose = (f"Ubuntu {lock.stack.ubuntu}'s glibc; the base image is checked against it at build "
                 "time: set base-glibc where its glibc is older")
    else:
        whose = f"Ubuntu {lock.stack.ubuntu}'s glibc"
    steps.step(f"resolving the closure with uv for {tag} ({whose})")
    def begun() -> None:  # uv's closure run has started: the lock's own writer is read meanwhile
        import gc

        from envbuild.threads import read_soon

        gc.enable()  # off through the start-up, which frees nothing (envbuild/__main__.py)
        read_soon("envbuild.render.lockset")
        if started is not None:
            started()

    closure = compile_closure(spec, started=begun)
    from envbuild.render.lockset import pylock_name, sha256_text
    pylock = closure.pylock
    if project is not None and project.hashes:
        from envbuild.pylock.hashed import check_hashed

        check_hashed(pylock, project.hashes, python=spec.python,
                     glibc=spec.glibc, arch=spec.arch, sdists=closure.sdists)
    steps.warn([*closure.notes, *(f"{h.shown()}: wheels-only resolution held it back; build-sdists = "
                                  f"true (or [\"{h.name}\"]) builds the newest from its sdist"
                                  for h in closure.held_back)])
    if held is not None:
        held[plan.name] = closure.held_back
    for package in pylock.packages:
        vcs = package.vcs
        if vcs is not None and vcs.requested is None:  # locked at what the default branch is now
            steps.warn([f"{package.name}: its git requirement names no revision: locked at commit "
                        f"{vcs.commit}, where the repository's default branch points now"])
        elif vcs is not None:
            steps.step(f"{package.name}: git revision {vcs.requested!r} locked at commit {vcs.commit}")
    steps.step(f"{len(closure.packages)} distributions resolved; checking hashes")
    wheel = closure.installer
    ref = PylockRef(file=pylock_name(plan.name, targets), sha256=sha256_text(closure.pylock_text),
                    torch_layer=tuple(sorted(closure.torch_layer)),
                    platform=platform_tag(spec.glibc, spec.arch), text=closure.pylock_text,
                    installer=None if wheel is None else Installer(
                        name=wheel.name, version=wheel.version, url=wheel.url, sha256=wheel.sha256),
                    inputs_sha256=closure_inputs(spec, cutoff) if inputs is None else inputs,
                    exclude_newer=spec.exclude_newer)
    # git sources and source archives by URL are built in the image, as build-sdists' sdists are
    built = {p.name for p in pylock.packages if p.built}
    locked = replace(lock, packages=dict(sorted(closure.packages.items())), pylock=ref, pip_packages=(),
                     layers=(), extensions=() if project is None else project.extensions,
                     sdists=tuple(sorted(built | set(closure.sdists))),
                     build_env=() if project is None else project.build_env)
    if locked.sdists:  # which of them build without torch (a stage of their own)
        from envbuild.extensions.sdists import classify_locked

        kinds, said = classify_locked(pylock, locked.sdists, env=env, offline=args.offline,
                                      previous=_previous_kinds(old))
        for line in said:
            steps.step(line)
        locked = replace(locked, sdist_kinds=kinds)
    check_lock(locked)
    return locked


def _previous_kinds(old: Lock | None) -> dict[str, tuple[str, Recorded]]:
    """{name: (its sdist's sha256, its kind)} of the previous lock: an unchanged sdist is not
    fetched again to be classified."""
    if old is None or old.pylock is None or not old.sdist_kinds:
        return {}
    from envbuild.pylock.files import read_pylock

    pylock = read_pylock(old.pylock.text)
    found = {}
    for kind in old.sdist_kinds:
        sdist = pylock.package(kind.name).sdist
        if sdist is not None:
            found[kind.name] = (sdist.sha256, kind)
    return found


def _built(pylock_text: str) -> set[str]:
    """The packages a pylock locks as git sources or source archives by URL (built in the image)."""
    from envbuild.pylock.files import read_pylock

    return {p.name for p in read_pylock(pylock_text).packages if p.built}


def _spec(args: argparse.Namespace, env: Mapping[str, str], matrix: Matrix, project: Project | None,
          plan: _Plan, lock: Lock, index: Callable[[], str]) -> ClosureSpec:
    """What a target's closure is resolved from, before the previous pins and the installer's
    version: the same for ``lock`` and ``lock --check`` (which runs no uv)."""
    from envbuild.pylock.uv import ClosureSpec, platform_glibc
    from envbuild.render.lock import distro_glibc, pins

    distro = distro_glibc(matrix, lock.stack.ubuntu)
    if distro is None:
        raise UsageError(f"no glibc recorded for Ubuntu {lock.stack.ubuntu} (matrices/ubuntu_python.yaml)")
    if getattr(plan.args, "base_glibc", None):  # the flag, else the project's (_merged)
        distro = _base_glibc(plan.args.base_glibc, lock)
    user_index = project.index_url if project is not None and project.index_url else None
    return ClosureSpec(
        torch_pins=pins(lock.stack, companions=lock.companions),
        torch_index=lock.index_url,
        dependencies=tuple(plan.dependencies),
        torch_constraints=tuple(plan.torch_constraints),
        python=lock.stack.python,
        glibc=platform_glibc(distro),
        default_index=user_index or index(),
        find_links=tuple(args.find_links) + (() if project is None else tuple(project.find_links)),
        installer=None if installer_choice(args, project) == "pip" else "uv",
        no_binary=() if project is None else project.build_sdists,
        constraints=() if project is None else project.constraints,
        all_sdists=project is not None and project.all_sdists,
        env=env,
        arch=lock.stack.machine,
    )


def _base_glibc(given: str, lock: Lock) -> str:
    """The custom base image's glibc (base-glibc, --base-glibc), which the closure is resolved
    for; refused where the lock has no custom base (the stack's own is Ubuntu's)."""
    from envbuild.project.model import check_base_glibc
    from envbuild.render.docker import custom_base

    glibc = check_base_glibc(given)
    if not custom_base(lock):
        raise UsageError(f"base-glibc {glibc} names the glibc of a custom base image, and this lock's "
                         f"base is the stack's own ({lock.stack.base_image}, Ubuntu {lock.stack.ubuntu})",
                         hint="set base-image (or --base-image) too, or drop base-glibc")
    return glibc


def cutoff_given(args: argparse.Namespace, project: Project | None) -> str | None:
    """The exclude-newer setting as given: the flag, else the project's, else None."""
    given = getattr(args, "exclude_newer", None)
    if given is None and project is not None:
        given = project.exclude_newer
    if given is None:
        return None
    from envbuild.pylock.cutoff import parse_cutoff

    return parse_cutoff(given).given


def _cutoff_instant(given: str | None, old: Lock | None, inputs: str | None, upgrade: bool) -> str | None:
    """The instant the closure is resolved up to: the previous lock's, when it was locked with
    the same setting and inputs (a span stays the day it stood for, like every other pin), unless
    --upgrade; else the setting's, now."""
    if given is None:
        return None
    if not upgrade and old is not None and old.pylock is not None and old.pylock.exclude_newer \
            and old.pylock.inputs_sha256 == inputs:
        return old.pylock.exclude_newer
    from datetime import datetime, timezone

    from envbuild.pylock.cutoff import format_instant, parse_cutoff

    return format_instant(parse_cutoff(given).at(datetime.now(timezone.utc)))


def closure_inputs(spec: ClosureSpec, exclude_newer: str | None = None) -> str:
    """sha256 of every input of a closure that changes the lock and is recorded nowhere else in
    it: the requirements (the project's and ``--pip-package``), the torch pins and index, the
    platform, the default index (PIP_INDEX_URL or pip's configuration; its credentials left
    out), the find-links and the installer choice. The installer's version and the previous
    pins are kept by ``lock`` itself, so they are no input. ``exclude_newer``: the cut-off
    setting as given (a span's instant moves with the day; the lock records it apart)."""
    import hashlib
    import json

    from envbuild.redact import strip_credentials

    data = {"torch_pins": dict(sorted(spec.torch_pins.items())), "torch_index": spec.torch_index,
            "dependencies": list(spec.dependencies), "torch_constraints": list(spec.torch_constraints),
            "python": spec.python, "glibc": spec.glibc, "find_links": list(spec.find_links),
            "default_index": None if spec.default_index is None else strip_credentials(spec.default_index),
            "installer": "pip" if spec.installer is None else "uv"}
    if spec.no_binary:  # only when set: the fingerprint of a lock without them stays as it was
        data["no_binary"] = list(spec.no_binary)
    if spec.constraints:  # likewise
        data["constraints"] = list(spec.constraints)
    if spec.arch != "x86_64":  # likewise: an x86_64 lock's fingerprint is what it was
        data["arch"] = spec.arch
    if exclude_newer is not None:  # the setting as given ("30 days"), as no_binary: only when set
        data["exclude_newer"] = exclude_newer
    if spec.all_sdists:
        data["all_sdists"] = "true"
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()


def installer_choice(args: argparse.Namespace, project: Project | None) -> str:
    """uv or pip: the flag, else the project's ``installer``, else uv."""
    return str(args.installer or (project.installer if project is not None else None) or "uv")


def _installer_version(args: argparse.Namespace, project: Project | None, old: Lock | None,
                       uv: Callable[[], str]) -> str | None:
    """The uv version the build installs with: the previous lock's (kept like every other pin,
    unless --upgrade), else the version of the uv that resolves the closure (``uv``); None for pip."""
    if installer_choice(args, project) == "pip":
        return None
    if old is not None and old.pylock is not None and old.pylock.installer is not None and not args.upgrade \
            and "uv" not in args.upgrade_package:
        return old.pylock.installer.version
    return uv()


def _write(path: Path, lockset: LockSet, out: Out, *, as_json: bool = False,
           held: Mapping[str, tuple[HeldBack, ...]] | None = None) -> None:
    from envbuild.commands.lockview import base_text, lock_json, on_disk

    files = lockset.files()
    before = on_disk(path, files)
    progress(f"lock: writing {path} and {len(files) - 1} pylock file{'s' if len(files) != 2 else ''}")
    _write_files(path, files.pop("envbuild.lock"), files)
    if as_json:
        out(lock_json(path, lockset, before, held or {}))
        return
    for name, lock in sorted(lockset.targets.items()):
        assert lock.pylock is not None
        out(f"target {name}: torch {lock.stack.torch} ({lock.stack.variant}), Python {lock.stack.python}, "
            f"{len(lock.packages)} distributions in {lock.pylock.file}; base {base_text(lock)}")
    out(f"wrote {path}")


def _write_files(path: Path, lock: bytes, beside: Mapping[str, bytes]) -> None:
    """The lock and the pylock files beside it, as one (envbuild/fs.py ``replace_files``): all
    new, or, whatever fails or interrupts the writing, all as they were. The lock is renamed
    in last, so it never names a pylock not yet written."""
    from envbuild.fs import UnwritableDirectory, replace_files

    files = {path.parent / name: beside[name] for name in sorted(beside)}
    files[path] = lock
    try:
        replace_files(files)
    except UnwritableDirectory as exc:
        raise UsageError(f"cannot write to {exc.filename}: {exc.strerror}") from None


def _check(args: argparse.Namespace, env: Mapping[str, str], matrix: Matrix, project: Project | None,
           path: Path, out: Out, index: Callable[[], str]) -> int:
    """Stale when: no lock, another project input, another target set, another stack or option
    from today's matrices, or a pylock file that no longer matches. Nothing is asked of uv or
    a registry, so it runs offline in CI. The lock's recorded flags are checked with, unless
    result-changing flags are given (then those)."""
    from envbuild.commands.lockflags import applied, command, given
    from envbuild.render.lockset import read_lockset

    if not path.is_file():
        raise StaleLock(f"{path} does not exist", hint=f"run '{command(given(args))}'")
    try:
        lockset = read_lockset(path)
    except UsageError as exc:
        raise StaleLock(f"{path}: {exc.message}", hint=f"run '{command(given(args))}'") from None
    if not given(args) and lockset.flags:
        args = applied(args, lockset.flags)
    plans = _plans(args, project)
    reasons: list[str] = []
    digest = None if project is None else project.inputs_digest
    locked_digest = None if lockset.project is None else lockset.project.inputs_sha256
    if digest != locked_digest:
        reasons.append("the project file or a requirements file changed" if project and lockset.project
                       else "the lock was not made from this project" if project
                       else "the lock was made from a project file, and none is used now")
    names = {p.name for p in plans}
    if names != set(lockset.targets):
        reasons.append(f"targets now {', '.join(sorted(names))}; locked {', '.join(sorted(lockset.targets))}")
    for plan in plans:
        locked = lockset.targets.get(plan.name)
        if locked is None:
            continue
        if locked.pylock is None:
            reasons.append(f"target {plan.name}: a stack-only lock (no closure)")
            continue
        if locked.base_offline:
            from envbuild.commands.render import unpinned_base

            warn(unpinned_base(plan.name, locked.base_image))
        now = _target_lock(args, env, matrix, plan)
        found = _differences(locked, now, installer_choice(args, project))
        inputs = closure_inputs(_spec(args, env, matrix, project, plan, now, index),
                                cutoff_given(args, project))
        found += _closure_differences(locked, inputs)
        if (() if project is None else project.extensions) != locked.extensions:
            found.append("the extensions or their sources changed")
        if (() if project is None else project.build_env) != locked.build_env:
            found.append("build-env changed")
        if project is not None and project.all_sdists:
            pass  # the sdists uv chose: the closure's inputs say whether they could change
        elif set(() if project is None else project.build_sdists) != \
                set(locked.sdists) - _built(locked.pylock.text):
            found.append("build-sdists changed")
        setting = None if project is None else project.apt_snapshot
        if (setting is None) != (locked.apt_snapshot is None) or \
                (setting not in (None, "auto") and setting != locked.apt_snapshot):
            found.append(f"apt-snapshot now {setting or 'none'}, locked {locked.apt_snapshot or 'none'}")
        reasons.extend(f"target {plan.name}: {r}" for r in found)
    if reasons:
        raise StaleLock(f"{path} is stale: " + "; ".join(reasons),
                        hint=f"run '{command(given(args))}' and commit the result")
    _check_stacks(args, matrix, lockset, path)
    out(f"{path} is up to date ({len(lockset.targets)} target{'s' if len(lockset.targets) != 1 else ''})")
    from envbuild.commands.built import describe

    for name, target in sorted(lockset.targets.items()):  # what a build recorded beside it
        for line in describe(target, path.absolute().parent, name if len(lockset.targets) > 1 else None):
            out(line)
    return 0


def _check_stacks(args: argparse.Namespace, matrix: Matrix, lockset: LockSet, path: Path) -> None:
    """The build contexts CI builds (``ci github --lock``'s stacks/) are what the lock renders:
    a re-lock without a new ``ci github``, or an edited Dockerfile, is stale too."""
    from pathlib import Path

    from envbuild.render.ci import stale_stacks

    stacks = Path(args.stacks) if args.stacks else path.parent / "stacks"
    if args.stacks is None and not (stacks / "matrix.json").is_file():
        return  # no CI rendered beside this lock
    if not stacks.is_dir():
        raise StaleLock(f"{stacks} is not a directory",
                        hint="name the stacks/ folder 'ci github --lock' wrote")
    reasons = stale_stacks(lockset, matrix, stacks)
    if reasons:
        shown = "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")
        raise StaleLock(f"the build contexts CI builds are stale against {path}: {shown}",
                        hint=f"run 'envbuild ci github --lock {path} ...' again and commit the result")


def _closure_differences(locked: Lock, inputs: str) -> list[str]:
    """What changed since the closure was locked: its inputs (by their fingerprint), or the
    lock's ``packages`` against its own pylock."""
    from envbuild.pylock.files import read_pylock

    assert locked.pylock is not None
    found = []
    if locked.pylock.inputs_sha256 is None:
        found.append("the lock records no fingerprint of its closure's inputs (made by an older "
                     "envbuild), so a change to them cannot be ruled out")
    elif locked.pylock.inputs_sha256 != inputs:
        found.append("the closure's inputs changed (--pip-package, --find-links, the index "
                     "PIP_INDEX_URL or pip's configuration names, the installer, or exclude-newer)")
    pylock = read_pylock(locked.pylock.text)
    if pylock.versions() != dict(sorted(locked.packages.items())):
        found.append(f"its packages disagree with {locked.pylock.file}")
    if locked.pylock.exclude_newer is not None:
        from envbuild.pylock.cutoff import late_files, parse_timestamp

        late = late_files(pylock.uploads(), parse_timestamp(locked.pylock.exclude_newer, "exclude_newer"))
        if late:
            found.append(f"{locked.pylock.file} holds files uploaded after its cut-off "
                         f"{locked.pylock.exclude_newer}: {'; '.join(late[:3])}")
    return found


def _differences(locked: Lock, now: Lock, installer: str) -> list[str]:
    """What today's stack resolution and options would change in a locked target."""
    found: list[str] = []
    if now.stack != locked.stack:
        changed = [f for f in type(now.stack).fields() if getattr(now.stack, f) != getattr(locked.stack, f)]
        found.append(f"the stack changed ({', '.join(changed)})")
    if now.matrices_digest != locked.matrices_digest:
        found.append("the matrices changed since it was locked")
    if now.base_image.split("@", 1)[0] != locked.base_image.split("@", 1)[0]:
        found.append(f"base image now {now.base_image}")
    for field in ("apt_packages", "env", "user", "flavor", "index_url", "companions", "python_standalone",
                  "compile_toolchain"):
        if getattr(now, field) != getattr(locked, field):
            found.append(f"{field} changed")
    assert locked.pylock is not None
    uses = "pip" if locked.pylock.installer is None else locked.pylock.installer.name
    if installer != uses:
        found.append(f"installer now {installer}, locked {uses}")
    return found

