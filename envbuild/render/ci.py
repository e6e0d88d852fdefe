"""CI for a fleet of resolved stacks: the options, the stacks and their build contexts.

The resolver's top N stacks each become one lock and one build context, rendered by
``render.docker`` exactly as ``render docker`` would, under ``stacks/<id>/``. Around them
``render.github`` writes a GitHub Actions workflow and ``render.bake`` a docker-bake.json.
Every user string is validated here, before anything is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envbuild.errors import UsageError
from envbuild.render.lock import Lock, distro_python, recorded_standalone
from envbuild.render.values import check_image_reference

if TYPE_CHECKING:
    from envbuild.data.matrix import Matrix
    from envbuild.fs import FileData
    from envbuild.render.lockset import LockSet
    from envbuild.resolver.model import Stack

_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_RUNNER_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
_BRANCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}", re.ASCII)
_LABEL_KEY_RE = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*", re.ASCII)
# No quotes, '$', '{', '#', ',' or backslash: a value stays one item in every list it joins.
_LABEL_VALUE_RE = re.compile(r"(?:[A-Za-z0-9._:/+@%~()=-]+(?: [A-Za-z0-9._:/+@%~()=-]+)*)?",
                             re.ASCII)
_RESERVED_LABELS = ("com.docker.", "io.docker.", "org.dockerproject.", "dev.envbuild.")


@dataclass(frozen=True, slots=True, kw_only=True)
class CiOptions:
    registry: str  # image repository, no tag: tags are the stack ids
    runner_labels: tuple[str, ...] = ("gpu",)  # besides self-hosted
    labels: tuple[tuple[str, str], ...] = ()
    branch: str = "main"
    cache: str = "registry"  # the build cache: "registry" (beside the image) or "gha"
    sign: bool = False  # keyless cosign signature of each promoted digest
    # action -> (release tag, commit SHA), from matrices/ci_actions.yaml
    actions: tuple[tuple[str, str, str], ...] = ()
    # From a lock (ci github --lock): its path in the repository, checked by a 'lock --check'
    # job before any build; each target verified on its own runs-on labels.
    lock: str | None = None


CACHES = ("registry", "gha")


def pinned_actions(matrix: Matrix) -> tuple[tuple[str, str, str], ...]:
    """(action, tag, sha) per row of the ci_actions relation, sorted by action."""
    return tuple(sorted((r["action"], r["version"], r["sha"]) for r in matrix.rows("ci_actions")))


@dataclass(frozen=True, slots=True, kw_only=True)
class CiStack:
    id: str
    lock: Lock
    files: Mapping[str, FileData]  # the build context, as render docker writes it
    runs_on: tuple[str, ...] = ()  # the target's runner labels (a lock's fleet runs-on); () = the options'

    @property
    def gpu(self) -> bool:
        return self.lock.stack.variant != "cpu"

    @property
    def group(self) -> str:
        cuda = self.lock.stack.cuda
        if not self.gpu:
            return "cpu"
        return f"cuda{cuda.split('.')[0]}" if cuda else "gpu"  # a CUDA wheel with no recorded CUDA

    @property
    def context(self) -> str:
        return f"stacks/{self.id}"


# --- validation -------------------------------------------------------------------------


def parse_ci_options(*, registry: str, runner_labels: Sequence[str] = (),
                     labels: Sequence[str] = (), branch: str = "main", cache: str = "registry",
                     sign: bool = False,
                     actions: Sequence[tuple[str, str, str]] = ()) -> CiOptions:
    if cache not in CACHES:
        raise UsageError(f"invalid --cache {cache!r}", hint=f"one of {', '.join(CACHES)}")
    return CiOptions(
        cache=cache, sign=sign, actions=tuple(actions),
        registry=check_registry(registry),
        runner_labels=tuple(dict.fromkeys(
            check_runner_label(v) for v in (runner_labels or ["gpu"]) if v != "self-hosted")),
        labels=tuple(sorted(dict(check_label(v) for v in labels).items())),
        branch=check_branch(branch),
    )


def check_registry(value: str) -> str:
    """An image repository without tag or digest: ``<value>:<stack id>`` must be a reference."""
    try:
        check_image_reference(f"{value}:tag", "--registry")
    except UsageError:
        raise UsageError(f"invalid --registry {value!r}",
                         hint="an image repository without tag or digest, lowercase, "
                              "e.g. ghcr.io/acme/envbuild") from None
    return value


def check_runner_label(value: str) -> str:
    if not _RUNNER_LABEL_RE.fullmatch(value):
        raise UsageError(f"invalid --gpu-runner-label {value!r}",
                         hint="letters, digits, '.', '_' and '-', at most 64 characters")
    return value


def check_branch(value: str) -> str:
    if not _BRANCH_RE.fullmatch(value) or ".." in value or "//" in value or value.endswith("/"):
        raise UsageError(f"invalid --branch {value!r}",
                         hint="a branch name: letters, digits, '.', '_', '-' and '/'")
    return value


def check_label(value: str) -> tuple[str, str]:
    key, sep, text = value.partition("=")
    if not sep or len(key) > 128 or not _LABEL_KEY_RE.fullmatch(key):
        raise UsageError(f"invalid --label {value!r}",
                         hint="KEY=VALUE with a lowercase dotted KEY, e.g. org.example.team=ml")
    if key.startswith(_RESERVED_LABELS):
        raise UsageError(f"--label key {key!r} is reserved",
                         hint=f"keys under {', '.join(_RESERVED_LABELS)} belong to Docker or envbuild")
    if len(text) > 256 or not _LABEL_VALUE_RE.fullmatch(text):
        raise UsageError(f"invalid --label value {text!r}",
                         hint="at most 256 of letters, digits, single spaces and . _ : / + @ % ~ ( ) = -")
    return key, text


# --- stacks -----------------------------------------------------------------------------


def stack_id(stack: Stack) -> str:
    """Stable and a valid image tag: torch2.4.1-cu121-py3.11-ubuntu22.04[-devel]."""
    text = f"torch{stack.torch}-{stack.variant}-py{stack.python}-ubuntu{stack.ubuntu}"
    text += "-devel" if stack.flavor == "devel" else ""
    if not _TAG_RE.fullmatch(text):  # the lock validated each part; this guards the shape
        raise UsageError(f"stack id {text!r} is not a valid image tag")
    return text


def target_name(sid: str) -> str:
    """Bake target names allow only [a-zA-Z0-9_-]; dots become underscores, as buildx does."""
    return sid.replace(".", "_")


def family(stack: Stack) -> tuple[str, str]:
    """A torch release line × CUDA wheel variant (2.14 × cu126): the best stack of each family
    stands for it, so the top N are N different builds, not patch releases or Pythons of one."""
    return ".".join(stack.torch.split(".")[:2]), stack.variant


def select_stacks(stacks: Sequence[Stack], matrix: Matrix, *, top: int, index_url: str | None = None,
                  package_index: str | None = None) -> tuple[list[CiStack], list[str]]:
    """The first ``top`` stacks that render with no flag, one per torch × CUDA family, and the
    ids skipped.

    A stack whose Python is not its Ubuntu's python3 installs the python-build-standalone
    build matrices/python_standalone.yaml records for it (sha256 checked); one without such a
    build (the resolver offers none: data edited since) is skipped, since a build by URL and
    sha256 is a single-stack choice ('envbuild render docker --python-url').
    The wheel index, as for render docker: ``index_url`` (--index-url), else the stack's
    own, else ``package_index`` ($PIP_INDEX_URL, for the 'default' variant)."""
    from envbuild.data.peaks import peaks_json
    from envbuild.render.docker import RenderOptions, lock_for, render_docker, wheel_index

    peaks = peaks_json(matrix)
    chosen: list[CiStack] = []
    skipped: list[str] = []
    families: set[tuple[str, str]] = set()
    for stack in stacks:
        if len(chosen) == top:
            break
        sid = stack_id(stack)
        if any(c.id == sid for c in chosen) or family(stack) in families:
            continue
        if distro_python(matrix, stack.ubuntu) != stack.python and \
                recorded_standalone(matrix, stack.python) is None:
            skipped.append(sid)
            continue
        options = RenderOptions(index_url=wheel_index(stack, index_url, package_index))
        lock = lock_for(stack, matrix, options)
        chosen.append(CiStack(id=sid, lock=lock, files=render_docker(lock, options, peaks=peaks)))
        families.add(family(stack))
    if not chosen:
        raise UsageError(f"none of the compatible stacks uses its Ubuntu release's python3 or a "
                         f"recorded standalone build "
                         f"(skipped {', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''})",
                         hint="choose --python to match --ubuntu, or render one stack with "
                              "'envbuild render docker --python-url ... --python-sha256 ...'")
    return chosen, skipped


def lock_stacks(lockset: LockSet, matrix: Matrix) -> list[CiStack]:
    """One stack per target of a lock: its build context installs exactly its pylock on its base
    digest (as 'render docker --lock FILE --target NAME' writes it), verified on its runs-on."""
    from envbuild.data.peaks import peaks_json
    from envbuild.render.docker import RenderOptions, render_docker

    peaks = peaks_json(matrix)
    stacks = []
    for name in sorted(lockset.targets):
        lock = lockset.targets[name]
        carried = lockset.only(name).to_json() if lock.pylock is not None else None
        files = render_docker(lock, RenderOptions(), peaks=peaks, lockset_json=carried)
        runs_on = lock.fleet.runs_on if lock.fleet is not None else ()
        stacks.append(CiStack(id=name, lock=lock, files=files, runs_on=runs_on))
    return stacks


STACK_FILES_LIMIT = 10_000  # files under a stacks/ folder read back by 'lock --check'


def stale_stacks(lockset: LockSet, matrix: Matrix, directory: Path) -> list[str]:
    """Why the build contexts under ``directory`` (the ``stacks/`` folder 'ci github --lock'
    wrote) are not what it renders from this lock now: a target's folder missing or extra, a
    file missing, added or edited. [] when they match, byte for byte."""
    expected = {f"{s.id}/{name}": _sha256(data) for s in lock_stacks(lockset, matrix)
                for name, data in s.files.items()}
    ids = {rel.split("/", 1)[0] for rel in expected}
    found = _tree_sums(directory)
    folders = {rel.split("/", 1)[0] for rel in found if "/" in rel}
    reasons = [f"{directory.name}/{name} is no target of the lock" for name in sorted(folders - ids)]
    reasons += [f"{directory.name}/{name}/ is missing" for name in sorted(ids - folders)]
    for rel in sorted(set(expected) | {r for r in found if r.split("/", 1)[0] in ids & folders}):
        if rel.split("/", 1)[0] not in folders:
            continue
        if rel not in found:
            reasons.append(f"{directory.name}/{rel} is missing")
        elif rel not in expected:
            reasons.append(f"{directory.name}/{rel} is not rendered from the lock")
        elif found[rel] != expected[rel]:
            reasons.append(f"{directory.name}/{rel} differs from what the lock renders")
    return reasons


def _sha256(data: FileData) -> str:
    import hashlib

    digest = hashlib.sha256()
    if isinstance(data, bytes):
        digest.update(data)
        return digest.hexdigest()
    return _file_sha256(data) or ""


def _file_sha256(path: Path) -> str | None:
    """The sha256 of a regular file, opened without blocking or following a link; None else."""
    import hashlib
    import os

    from envbuild.confine import WHEEL_LIMIT, open_regular

    try:
        fd = open_regular(path, str(path), limit=WHEEL_LIMIT)
    except UsageError:
        return None
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _tree_sums(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative path, with its sha256 ('' for a link, FIFO or
    other non-regular file: never equal to a rendered one); at most STACK_FILES_LIMIT."""
    import os

    sums: dict[str, str] = {}
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            if len(sums) >= STACK_FILES_LIMIT:
                raise UsageError(f"{directory} holds more than {STACK_FILES_LIMIT} files",
                                 hint="name the stacks/ folder 'ci github --lock' wrote")
            path = Path(root, name)
            sums[path.relative_to(directory).as_posix()] = _file_sha256(path) or ""
    return sums


def context_files(stacks: Sequence[CiStack]) -> dict[str, FileData]:
    return {f"{s.context}/{name}": data for s in stacks for name, data in s.files.items()}
