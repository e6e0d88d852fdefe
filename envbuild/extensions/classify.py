"""Which sdists build without torch: a pure-Python sdist is built in a stage of its own from the
system stage (no torch layer), a native one in the extensions stage (envbuild/extensions/stage.py).

``lock`` fetches each sdist it locks (by the URL the pylock records, checked against its sha256)
and reads the archive without running anything: **pure** when it holds no C/C++/Cython/CUDA/
Fortran/Rust sources or native build files, its ``[build-system] requires`` names neither torch
nor a native build tool, and its ``setup.py`` (read by ``ast``, never run) neither imports torch
nor declares extension modules; **native** otherwise, and wherever it cannot tell (a setup.py
that does not parse, a pyproject.toml that is not TOML).

An sdist is hostile input: it is never unpacked to disk, its decompressed bytes and members are
capped (a tar or zip bomb stops at the cap), and a member named outside the archive (an absolute
path, ``..``), a link leading outside it, or a device or FIFO is refused (UsageError, exit 2)
naming the sdist, never quoting more of it than :func:`envbuild.confine.token` allows.
"""

from __future__ import annotations

import ast
import io
import posixpath
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from envbuild.confine import CANONICAL_NAME, quoted, token
from envbuild.errors import UsageError

MAX_UNPACKED = 1024 ** 3  # decompressed bytes read from one sdist
MAX_MEMBERS = 100_000
MAX_TEXT = 1024 * 1024  # a pyproject.toml or setup.py read for its build requirements
MAX_REQUIRES = 64
# Sources a compiler builds, and the files of native build systems.
NATIVE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cxx", ".c++", ".cu", ".cuh", ".pyx", ".pxd",
                             ".f", ".for", ".f77", ".f90", ".f95", ".f03", ".rs", ".m", ".mm"})
NATIVE_FILES = frozenset({"cargo.toml", "cmakelists.txt", "meson.build"})
# Build requirements that mean a native build (a build backend or a binding generator).
NATIVE_REQUIRES = frozenset({"torch", "cython", "pybind11", "nanobind", "cffi", "maturin",
                             "setuptools-rust", "scikit-build", "scikit-build-core", "meson-python",
                             "cmake", "ninja"})
# setup() keywords and calls that declare compiled modules.
NATIVE_KEYWORDS = frozenset({"ext_modules", "cffi_modules", "rust_extensions", "libraries"})
NATIVE_CALLS = frozenset({"Extension", "CppExtension", "CUDAExtension", "Pybind11Extension",
                          "cythonize", "RustExtension"})
DEFAULT_REQUIRES = ("setuptools",)  # PEP 517's default backend, for an sdist without [build-system]


@dataclass(frozen=True, slots=True, kw_only=True)
class Kind:
    """An sdist's build: ``pure`` (no torch, no compiler), why, and the canonical names of the
    build requirements it declares (what its stage installs from the lock)."""

    pure: bool
    why: str
    requires: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Recorded:
    """An sdist's kind as the lock records it (``sdist_kinds``): the build requirements only for
    a pure one (its stage installs those the lock holds)."""

    name: str
    pure: bool
    requires: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        if self.pure:
            return {"kind": "pure", "requires": list(self.requires)}
        return {"kind": "native"}


def recorded_from_json(raw: Any) -> tuple[Recorded, ...]:
    """A lock's ``sdist_kinds``: {name: {"kind": "native"} | {"kind": "pure", "requires": [...]}}."""
    if not isinstance(raw, dict):
        raise UsageError("lock 'sdist_kinds' must be a mapping of names", hint="re-create the lock")
    found = []
    for name, entry in sorted(raw.items()):
        pure = isinstance(entry, dict) and entry.get("kind") == "pure" and set(entry) == {"kind", "requires"}
        if not (pure or entry == {"kind": "native"}) or not isinstance(name, str):
            raise UsageError("lock 'sdist_kinds' entries are {kind: native} or "
                             "{kind: pure, requires: [names]}", hint="re-create the lock")
        requires = entry["requires"] if pure else []
        if not isinstance(requires, list) or any(not isinstance(r, str) for r in requires):
            raise UsageError("lock 'sdist_kinds' requires must be a list of names", hint="re-create the lock")
        found.append(Recorded(name=name, pure=pure, requires=tuple(requires)))
    return tuple(found)


def check_recorded(kinds: Sequence[Recorded], sdists: Sequence[str]) -> None:
    """Each kind names one of the lock's sdists, once; requires are sorted canonical names."""
    names = [k.name for k in kinds]
    if names != sorted(set(names)) or not set(names) <= set(sdists):
        raise UsageError("lock 'sdist_kinds' must name the lock's sdists, each once",
                         hint="re-create the lock")
    for kind in kinds:
        if len(kind.requires) > MAX_REQUIRES or list(kind.requires) != sorted(set(kind.requires)) \
                or any(not CANONICAL_NAME.fullmatch(r) for r in kind.requires) or "torch" in kind.requires:
            raise UsageError(f"lock 'sdist_kinds': {token(kind.name)}'s requires must be sorted canonical "
                             "names, without torch", hint="re-create the lock")


def classify(data: bytes, filename: str) -> Kind:
    """``filename``'s kind, from the archive's bytes; UsageError for a hostile archive."""
    what = f"sdist {quoted(filename)}"
    lower = filename.lower()
    if lower.endswith(".tar.gz"):
        members = _tar_members(data, what)
    elif lower.endswith(".zip"):
        members = _zip_members(data, what)
    else:
        return Kind(pure=False, why="not a .tar.gz or .zip archive")
    texts: dict[str, bytes] = {}
    native: str | None = None
    for name, read in members:
        parts = name.split("/")
        base = parts[-1].lower()
        if native is None and (posixpath.splitext(base)[1] in NATIVE_SUFFIXES or base in NATIVE_FILES):
            native = name
        if len(parts) == 2 and parts[1] in ("pyproject.toml", "setup.py") and read is not None:
            texts[parts[1]] = read()
    if native is not None:
        return Kind(pure=False, why=f"{token(native)}: a native source or build file")
    return _from_build_files(texts.get("pyproject.toml"), texts.get("setup.py"))


def _from_build_files(pyproject: bytes | None, setup: bytes | None) -> Kind:
    requires: tuple[str, ...] = DEFAULT_REQUIRES
    if pyproject is not None:
        found = _pyproject_requires(pyproject)
        if isinstance(found, str):
            return Kind(pure=False, why=found)
        requires = found
    needing = sorted(set(requires) & NATIVE_REQUIRES)
    if needing:
        return Kind(pure=False, why=f"its build requires {needing[0]}")
    if setup is not None:
        why = _setup_native(setup)
        if why is not None:
            return Kind(pure=False, why=why)
    return Kind(pure=True, why="no native sources, no torch in its build", requires=requires)


def _pyproject_requires(data: bytes) -> tuple[str, ...] | str:
    """The canonical names ``[build-system] requires`` declares, or why they cannot be read."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    from envbuild.project.toml import tomllib

    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return "its pyproject.toml is not readable TOML"
    build = document.get("build-system", {})
    tool = document.get("tool", {})
    setuptools = tool.get("setuptools", {}) if isinstance(tool, dict) else {}
    if isinstance(setuptools, dict) and "ext-modules" in setuptools:
        return "its pyproject.toml declares ext-modules"
    if not isinstance(build, dict) or "requires" not in build:
        return DEFAULT_REQUIRES
    raw = build["requires"]
    if not isinstance(raw, list) or len(raw) > MAX_REQUIRES or any(not isinstance(r, str) for r in raw):
        return "its [build-system] requires is not a short list of strings"
    names = []
    for text in raw:
        try:
            names.append(str(canonicalize_name(Requirement(text).name)))
        except InvalidRequirement:
            return "its [build-system] requires holds an unreadable requirement"
    return tuple(sorted(set(names)))


def _setup_native(data: bytes) -> str | None:
    """Why a setup.py builds natively or needs torch (read by ast, never run), or None."""
    try:
        tree = ast.parse(data.decode("utf-8"), "setup.py")
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return "its setup.py cannot be read statically"
    try:
        nodes = list(ast.walk(tree))
    except RecursionError:
        return "its setup.py cannot be read statically"
    for node in nodes:
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module]
        if any(m.split(".")[0] == "torch" for m in modules):
            return "its setup.py imports torch"
        if isinstance(node, ast.keyword) and node.arg in NATIVE_KEYWORDS:
            return f"its setup.py passes {node.arg}"
        if isinstance(node, ast.keyword) and node.arg == "setup_requires" and _names_torch(node.value):
            return "its setup.py requires torch to build"
        if isinstance(node, ast.Call) and _called(node.func) in NATIVE_CALLS:
            return f"its setup.py calls {_called(node.func)}"
    return None


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _names_torch(value: ast.expr) -> bool:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    for node in ast.walk(value):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if canonicalize_name(Requirement(node.value).name) == "torch":
                    return True
            except InvalidRequirement:
                continue
    return False


# --- reading archives, bounded ------------------------------------------------------------------


Member = tuple[str, Any]  # (the member's name, a function reading its bytes, or None: not a file)


def _checked(name: str, what: str) -> str:
    """A member's name, refused when it leads outside the archive."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\x00" in name or ".." in parts:
        raise UsageError(f"{what}: a member is named outside the archive ({token(name)})",
                         hint="a hostile sdist: lock another release, or build it yourself and "
                              "serve the wheel")
    return posixpath.normpath(name)


class _Capped(io.RawIOBase):
    """A gzip stream that stops after ``limit`` decompressed bytes (a bomb ends here)."""

    def __init__(self, data: bytes, limit: int, what: str) -> None:
        import gzip  # the archive modules are read where an sdist is opened: lock imports this module early

        self._stream = gzip.GzipFile(fileobj=io.BytesIO(data))
        self._left, self._what = limit, what

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        chunk = self._stream.read(min(len(view), self._left + 1))
        if len(chunk) > self._left:
            raise UsageError(f"{self._what}: unpacks to more than {MAX_UNPACKED // 1024 ** 2} MiB",
                             hint="a hostile or oversized sdist: lock another release")
        self._left -= len(chunk)
        view[:len(chunk)] = chunk
        return len(chunk)


def _tar_members(data: bytes, what: str) -> Iterator[Member]:
    import tarfile

    try:
        with tarfile.open(fileobj=io.BufferedReader(_Capped(data, MAX_UNPACKED, what)), mode="r|") as tar:
            for count, info in enumerate(tar):
                if count >= MAX_MEMBERS:
                    raise UsageError(f"{what}: more than {MAX_MEMBERS} members",
                                     hint="a hostile or oversized sdist: lock another release")
                name = _checked(info.name, what)
                if info.issym() or info.islnk():
                    _checked_link(name, info.linkname, what, hard=info.islnk())
                    yield name, None
                elif info.isdir():
                    continue
                elif not info.isfile():
                    raise UsageError(f"{what}: {token(name)} is a device or FIFO, not a file",
                                     hint="a hostile sdist: lock another release")
                else:
                    body = tar.extractfile(info)
                    yield name, (lambda body=body: _bounded(body, what))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise UsageError(f"{what}: not a readable .tar.gz ({type(exc).__name__})",
                         hint="lock again; the file may be damaged") from None


def _checked_link(name: str, target: str, what: str, *, hard: bool = False) -> None:
    """A link inside the archive may point within its top directory only (a hard link's target
    is named from the archive's root, a symbolic link's from its own directory)."""
    top = name.split("/")[0]
    joined = posixpath.normpath(target if hard else posixpath.join(posixpath.dirname(name), target))
    if target.startswith("/") or joined == ".." or joined.startswith("../") \
            or joined.split("/")[0] != top:
        raise UsageError(f"{what}: the link {token(name)} leads outside the archive",
                         hint="a hostile sdist: lock another release")


def _bounded(body: IO[bytes] | None, what: str) -> bytes:
    data = b"" if body is None else body.read(MAX_TEXT + 1)
    if len(data) > MAX_TEXT:
        raise UsageError(f"{what}: its pyproject.toml or setup.py is over {MAX_TEXT // 1024} KiB",
                         hint="a hostile sdist: lock another release")
    return data


def _zip_members(data: bytes, what: str) -> Iterator[Member]:
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                raise UsageError(f"{what}: more than {MAX_MEMBERS} members",
                                 hint="a hostile or oversized sdist: lock another release")
            for info in infos:
                name = _checked(info.filename, what)
                if info.is_dir():
                    continue
                if (info.external_attr >> 16) & 0o170000 == 0o120000:  # a symlink's mode bits
                    with archive.open(info) as link:
                        _checked_link(name, link.read(4096).decode("utf-8", "replace"), what)
                    yield name, None
                    continue
                yield name, (lambda info=info: _bounded(archive.open(info), what))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error) as exc:
        raise UsageError(f"{what}: not a readable .zip ({type(exc).__name__})",
                         hint="lock again; the file may be damaged") from None
