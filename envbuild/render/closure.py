"""A locked closure's install files: the hash-pinned requirements of each layer.

The torch layer holds the distributions the lock's ``torch_layer`` names (torch, its
companions and everything they pull in); the project layer the rest. Each line is
``name @ URL --hash=sha256:…`` for the one wheel the lock's platform installs, so the build
asks no index and resolves nothing (``pip install --no-deps --no-index --require-hashes``).
Wheels the lock names by local path (a find-links directory) are copied into the build
context and named under ``local_dir`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from envbuild.errors import UsageError
from envbuild.pylock.files import read_pylock
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
    rest = sorted(set(lock.packages) - set(torch_layer))
    files = {"torch": install_requirements(pylock, torch_layer, python=lock.stack.python,
                                           glibc=ref.glibc, local_dir=local_dir)}
    if rest:
        files["project"] = install_requirements(pylock, rest, python=lock.stack.python,
                                                glibc=ref.glibc, local_dir=local_dir)
    return files, ([] if local_dir is None else local_wheels(pylock, roots))
