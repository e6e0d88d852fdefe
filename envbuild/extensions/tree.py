"""An extension's source directory, read as hostile input and hashed.

A project file may come from a pull request, so the directory it declares must lie inside the
project once links are resolved, and its tree may hold only directories and regular files (a
link is refused, never followed: it could pull any file of the machine into a build context),
with names a build context can carry, at most ``MAX_FILES`` files and ``MAX_BYTES`` bytes.
Build leftovers (``build/``, ``dist/``, ``*.egg-info``, ``__pycache__``, ``.git``) are passed
over: they are not sources. The sha256 covers each file's relative path and bytes, sorted.

``.`` is the project's own package (``-e .`` in a requirements file): the project's directory,
less what at its top is no source of it: hidden entries, envbuild's own files (the lock, its
pylock files, the built-wheel record) and directories holding an ``envbuild.lock`` (a rendered
build context) or a ``pyvenv.cfg`` (a virtual environment).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from envbuild.confine import confined, quoted, read_regular, token
from envbuild.errors import UsageError

MAX_FILES = 2000
MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 32  # directories below the extension's own (a source tree needs a handful)
MAX_ENTRIES = 20_000  # directory entries looked at, empty directories and passed-over ones too
MARKERS = ("pyproject.toml", "setup.py")
CUDA_SOURCES = (".cu", ".cuh")
# A declared directory: relative, '/'-separated, no '.' or '..' part, nothing a shell or a
# Dockerfile reads as syntax.
DIR_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+-]*(?:\.[A-Za-z0-9_+-]+)*"
                    r"(?:/[A-Za-z0-9_][A-Za-z0-9_+-]*(?:\.[A-Za-z0-9_+-]+)*){0,7}", re.ASCII)
_NAME_RE = re.compile(r"[A-Za-z0-9_.+=@-]{1,128}", re.ASCII)
_SKIPPED = frozenset({".git", "__pycache__", "build", "dist", ".eggs"})
_PROJECT_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?", re.ASCII)
HINT = "a directory inside the project holding a pyproject.toml or setup.py"
PROJECT_DIR = "."  # the project's own package
# What envbuild writes beside the lock (the lock pair, the build's records, the bills of materials):
# never a source of the project's own package, or a build would make its lock stale.
_OUTPUTS = re.compile(r"envbuild\.lock|envbuild\.built\.json|envbuild\.debs\.json|sbom\.[^/]+\.cdx\.json"
                      r"|pylock(?:\.[^/]+)?\.toml", re.ASCII)


@dataclass(frozen=True, slots=True, kw_only=True)
class Extension:
    """One extension as the lock records it: its directory (relative to the project file),
    its distribution's canonical name and the sha256 of its source tree."""

    dir: str
    name: str
    sha256: str
    # Its tree holds CUDA sources (.cu, .cuh): on a CUDA stack its build must compile device code,
    # which the image's smoke test reads back from its shared objects (envbuild/smoke/devicecode.py).
    cuda: bool = False

    def to_json(self) -> dict[str, object]:
        found: dict[str, object] = {"dir": self.dir, "name": self.name, "sha256": self.sha256}
        if self.cuda:  # absent when false, so locks written before it read the same
            found["cuda"] = True
        return found


def check_dir(text: str, what: str) -> str:
    """``text`` as a declared extension directory, else UsageError naming ``what``."""
    if text == PROJECT_DIR:
        return text
    if len(text) > 200 or not DIR_RE.fullmatch(text):
        raise UsageError(f"{what}: {quoted(text)} is not a plain relative directory",
                         hint="a path relative to the project file: letters, digits, _ + - . and /, "
                              "no '..', not absolute")
    return text


def source_tree(root: Path, directory: str, what: str) -> dict[str, bytes]:
    """{relative path: bytes} of the extension's sources under ``root / directory``."""
    base = confined(root / directory, [root], what, outside_hint=HINT)
    if not base.is_dir():
        problem = "does not exist" if not base.exists() else "is not a directory"
        raise UsageError(f"{what} {problem}", hint=HINT)
    files: dict[str, bytes] = {}
    _walk(base, "", files, what, [0], top=directory == PROJECT_DIR)
    if not any(isinstance(files.get(m), bytes) for m in MARKERS):
        raise UsageError(f"{what} holds neither pyproject.toml nor setup.py",
                         hint="an extension is a Python project: add its pyproject.toml or setup.py")
    return dict(sorted(files.items()))


def context_dir(directory: str) -> str:
    """Where an extension's sources lie in the build context (under ``extensions/``) and the
    stage: its directory, the project's own package under ``+project`` (no declared directory
    starts with ``+``)."""
    return "+project" if directory == PROJECT_DIR else directory


def _not_source(entry: os.DirEntry[str]) -> bool:
    """At the top of the project's own directory: what is no source of its package."""
    if entry.name.startswith(".") or _OUTPUTS.fullmatch(entry.name):
        return True
    path = Path(entry.path)
    return entry.is_dir(follow_symlinks=False) and any(
        (path / marker).is_file() for marker in ("envbuild.lock", "pyvenv.cfg"))


def _walk(directory: Path, prefix: str, files: dict[str, bytes], what: str, seen: list[int], *,
          top: bool = False) -> None:
    """Every file under ``directory``; ``seen`` counts the entries looked at, so that neither a
    tree 1,500 directories deep (Python's recursion) nor 300,000 empty ones (minutes) is walked."""
    if prefix.count("/") > MAX_DEPTH:
        raise UsageError(f"{what} nests directories more than {MAX_DEPTH} deep ({token(prefix, 60)})",
                         hint="an extension's sources only: move data and build outputs elsewhere")
    with os.scandir(directory) as scan:
        entries = []
        for entry in scan:
            seen[0] += 1
            if seen[0] > MAX_ENTRIES:
                raise UsageError(f"{what} holds more than {MAX_ENTRIES} files and directories",
                                 hint="an extension's sources only: move data and build outputs "
                                      "elsewhere")
            entries.append(entry)
    ordered = sorted(entries, key=lambda e: e.name)
    for entry in ordered:
        if entry.name in _SKIPPED or entry.name.endswith(".egg-info") or (top and _not_source(entry)):
            continue
        shown = f"{what}: {token(prefix + entry.name)}"
        if not _NAME_RE.fullmatch(entry.name):
            raise UsageError(f"{shown} has characters a build context never carries",
                             hint="rename it: letters, digits and _ . + = @ - only")
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            _walk(Path(entry.path), f"{prefix}{entry.name}/", files, what, seen)
        elif stat.S_ISREG(mode):
            files[prefix + entry.name] = read_regular(Path(entry.path), shown, limit=MAX_BYTES)
            _bounded(files, what)
        else:
            raise UsageError(f"{shown} is a symbolic link or not a regular file",
                             hint="an extension's sources are plain files: copy them in")


def _bounded(files: dict[str, bytes], what: str) -> None:
    if len(files) > MAX_FILES or sum(len(d) for d in files.values()) > MAX_BYTES:
        raise UsageError(f"{what} holds more than {MAX_FILES} files or {MAX_BYTES // 1024 ** 2} MiB",
                         hint="an extension's sources only: move data and build outputs elsewhere")


def tree_sha256(files: dict[str, bytes]) -> str:
    """sha256 over each (relative path, bytes), sorted by path, each length-prefixed."""
    import hashlib  # a project without extensions locks without loading it (OpenSSL, ~4 ms)

    digest = hashlib.sha256()
    for name in sorted(files):
        encoded = name.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
        digest.update(len(files[name]).to_bytes(8, "big") + files[name])
    return digest.hexdigest()


def distribution_name(files: dict[str, bytes], directory: str) -> str:
    """The canonical name of the distribution the directory builds, as its build would name it:
    the pyproject's ``[project] name``, else setup.cfg's ``[metadata] name``, else the string
    literal ``setup(name="…")`` passes in setup.py (read with ``ast``, never run), else the
    directory's own name. The build installs that distribution, so the lock must record it."""
    from packaging.utils import canonicalize_name

    for found in (_pyproject_name(files), _setup_cfg_name(files), _setup_py_name(files)):
        if isinstance(found, str) and _PROJECT_NAME_RE.fullmatch(found):
            return str(canonicalize_name(found))
    return str(canonicalize_name(directory.rsplit("/", 1)[-1]))


def _pyproject_name(files: dict[str, bytes]) -> object:
    if "pyproject.toml" not in files:
        return None
    from envbuild.project.toml import parse

    try:
        table = parse(files["pyproject.toml"].decode("utf-8"), "pyproject.toml").get("project")
    except (UnicodeDecodeError, UsageError):
        return None
    return table.get("name") if isinstance(table, dict) else None


def _setup_cfg_name(files: dict[str, bytes]) -> object:
    if "setup.cfg" not in files:
        return None
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(files["setup.cfg"].decode("utf-8"))
    except (UnicodeDecodeError, configparser.Error):
        return None
    return parser.get("metadata", "name", fallback=None)


def _setup_py_name(files: dict[str, bytes]) -> object:
    """``name=`` of the one ``setup(…)``/``setuptools.setup(…)`` call, when a string literal."""
    if "setup.py" not in files:
        return None
    import ast

    try:
        tree = ast.parse(files["setup.py"].decode("utf-8"))
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names = {keyword.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and (getattr(node.func, "id", None) == "setup" or getattr(node.func, "attr", None) == "setup")
             for keyword in node.keywords if keyword.arg == "name"
             and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str)}
    return names.pop() if len(names) == 1 else None


def extension(root: Path, directory: str, what: str) -> Extension:
    """The lock's record of the extension in ``root / directory``."""
    files = source_tree(root, check_dir(directory, what), what)
    named = directory if directory != PROJECT_DIR else Path(os.path.realpath(root)).name  # "." names nothing
    return Extension(dir=directory, name=distribution_name(files, named), sha256=tree_sha256(files),
                     cuda=any(name.endswith(CUDA_SOURCES) for name in files))
