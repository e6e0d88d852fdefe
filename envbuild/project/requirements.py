"""The user's Python dependencies, gathered from every place a project keeps them.

Sources: ``[project.dependencies]`` of a pyproject.toml, its chosen extras
(``[project.optional-dependencies]``) and dependency groups (PEP 735
``[dependency-groups]``, ``{include-group = ...}`` followed), requirements files (``-r``
includes relative to the including file, each file read once; ``-c`` constraints files,
handed to uv as constraints; ``--hash=sha256:`` options, checked against the files locked),
and extra PEP 508 strings from the project file. Every requirement names a package on an
index, or is an https wheel (``name @ https://…/name-version-tags.whl``,
envbuild/pylock/direct.py), a git repository (``name @ git+https://…@REV``, locked by commit) or
a source archive by URL (envbuild/pylock/sources.py); editable installs other than local
directories, local paths, other VCS, other direct URLs and pip options other than
``-r``/``-c``/``--hash`` are refused, naming the file and line. torch,
torchvision and torchaudio are set aside as constraints on the stack rather than dependencies
(a constraint on torch narrows the stack too).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from envbuild.confine import confined, quoted, read_regular, token
from envbuild.errors import UsageError
from envbuild.pylock.direct import direct_wheel, is_source

TYPE_CHECKING = False  # for the type checker only: the extension tree's module is read where
if TYPE_CHECKING:      # a project has extensions (it is not on the way to uv's run)
    from envbuild.extensions.tree import Extension

TORCH_NAMES = frozenset({"torch", "torchvision", "torchaudio"})
VCS_SCHEMES = ("git+", "hg+", "svn+", "bzr+")
_COMMENT_RE = re.compile(r"(^|\s+)#.*$")
_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_HINT_INDEX = "name the package (and version) on an index; build a wheel and use find-links for local code"
_HINT_VCS = ("envbuild locks git sources by commit (name @ git+https://host/repo.git@REV); for another VCS, "
             "check it out at the commit into the project and name the directory (-e ./dir)")
_EGG_RE = re.compile(r"git\+\S+#egg=([A-Za-z0-9._-]+)", re.IGNORECASE)
_HINT_OUTSIDE = "requirements files must lie inside the project's directory"
MAX_INCLUDE_DEPTH = 64  # nested -r includes
MAX_FILES = 1000  # requirements files in all
MAX_GROUP_DEPTH = 64  # nested {include-group = ...}

# Where a problem is: "FILE:LINE: KEY" (the caller's words for the place).
Where = str


def usage(where: Where, problem: str, hint: str = "") -> UsageError:
    return UsageError(f"{where}: {problem}", hint=hint)


@dataclass
class Gathered:
    """Requirement strings as written, with where each came from, and the files read."""

    requirements: list[tuple[str, Where]] = field(default_factory=list)
    files: list[tuple[Path, bytes]] = field(default_factory=list)
    constraints: list[tuple[str, Where]] = field(default_factory=list)  # from -c files
    # (canonical name, where, the sha256s a --hash option allows): pip-compile's output
    hashes: list[tuple[str, Where, frozenset[str]]] = field(default_factory=list)
    # local packages (-e ./pkg, ./pkg, -e .): (directory, extras, where), built like extensions
    local: list[tuple[Path, tuple[str, ...], Where]] = field(default_factory=list)

    def split(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(dependencies, torch constraints): exact duplicates dropped, each sorted."""
        deps: set[str] = set()
        torch: set[str] = set()
        for text, _ in self.requirements:
            # checked by check_requirement already: its name is the leading PEP 508 name (not
            # parsed again: 40,000 dependencies would pay packaging's parser twice)
            found = _NAME_RE.match(text)
            name = canonicalize_name(found.group(0) if found else Requirement(text).name)
            (torch if name in TORCH_NAMES else deps).add(text)
        # a constraint on torch is a requirement on the stack's torch: it narrows it
        torch |= {text for text, _ in self.constraints if _name(text) == "torch"}
        return tuple(sorted(deps)), tuple(sorted(torch))

    def constraint_lines(self) -> tuple[str, ...]:
        """The constraints uv gets (torch's narrow the stack instead), sorted, once each."""
        return tuple(sorted({text for text, _ in self.constraints if _name(text) != "torch"}))


def _name(text: str) -> str:
    found = _NAME_RE.match(text)
    return canonicalize_name(found.group(0) if found else Requirement(text).name)


def check_requirement(text: str, where: Where) -> str:
    """``text`` as a PEP 508 requirement on a package index, stripped; else UsageError."""
    text = text.strip()
    if not text:
        raise usage(where, "empty requirement")
    if text.startswith(("-e", "--editable")):
        raise usage(where, f"editable requirement {quoted(text)} is not allowed", _HINT_INDEX)
    lowered = text.lower()
    egg = _EGG_RE.fullmatch(text)
    if egg:  # pip's older form: git+https://host/repo.git@REV#egg=name
        return check_requirement(f"{egg.group(1)} @ {text}", where)
    if lowered.startswith(VCS_SCHEMES):
        raise usage(where, f"VCS requirement {quoted(text)} is not allowed", _HINT_VCS)
    if lowered.startswith("file:") or text.startswith((".", "/", "~")):
        raise usage(where, f"local path requirement {quoted(text)} is not allowed", _HINT_INDEX)
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise usage(where, f"direct URL requirement {quoted(text)} names no project",
                    "write it as name @ https://…/name-version-tags.whl")
    if "@" not in text and lowered.endswith((".whl", ".tar.gz", ".zip")):
        raise usage(where, f"local path requirement {quoted(text)} is not allowed", _HINT_INDEX)
    if text.startswith("-"):
        option = text.split()[0].split("=")[0]
        raise usage(where, f"pip option {token(option)} is not allowed here",
                    "put indexes and find-links in the project file (index-url, find-links)")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        flag = re.search(r"\s(--?[A-Za-z][\w-]*)", text)
        if flag:  # a per-requirement option (--hash, --config-settings …)
            raise usage(where, f"pip option {flag.group(1)} is not allowed here",
                        "envbuild pins hashes itself, in the lock") from None
        # packaging's message quotes the whole line under its first line: only that first line
        reason = token(str(exc).partition("\n")[0])
        raise usage(where, f"invalid requirement {quoted(text)}: {reason}",
                    "write a PEP 508 requirement, e.g. requests>=2.31") from None
    if requirement.url is not None:
        url = requirement.url.lower()
        if is_source(text):  # git by commit, a source archive by sha256: built in the image
            from envbuild.pylock.sources import check_source

            check_source(text, where)
            return text
        if url.startswith(VCS_SCHEMES) or url.startswith("file:"):
            vcs = url.startswith(VCS_SCHEMES)
            raise usage(where, f"{'VCS' if vcs else 'local path'} requirement {quoted(text)} is not allowed",
                        _HINT_VCS if vcs else _HINT_INDEX)
        direct_wheel(text, where)  # an https wheel for this project, or a UsageError saying why
    return text


# --- requirements files -------------------------------------------------------------------


def logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, line) with comments removed and ``\\``-continuations joined."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        line = _COMMENT_RE.sub("", raw).strip()
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        # the pieces of a continued line are joined by one space
        joined = " ".join(p for p in (*pending, line) if p)
        pending = []
        if joined:
            yield start, joined
    if any(pending):
        yield start, " ".join(p for p in pending if p)


_INCLUDE_RE = re.compile(r"(-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+|(?=[^\s=]))(\S+)")
_HASH_RE = re.compile(r"\s+--hash(?:\s*=\s*|\s+)(\S*)")
_SHA256_RE = re.compile(r"sha256:([0-9a-fA-F]{64})")


_EDITABLE_RE = re.compile(r"(?:-e|--editable)(?:\s*=\s*|\s+)(\S+)")
_EXTRAS_RE = re.compile(r"(?P<path>[^\[\]]+?)(?:\[(?P<extras>[A-Za-z0-9._,\s-]*)\])?")
_ARCHIVES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")


def local_package(line: str, where: Where) -> tuple[str, tuple[str, ...]] | None:
    """``-e ./pkg``, ``-e .[gpu]``, ``./pkg``, ``.``: (the directory as written, its extras),
    or None for anything else. A local package is built from its source tree like an
    extension; an editable VCS or URL requirement, or an absolute path, is refused here."""
    editable = _EDITABLE_RE.fullmatch(line)
    value = editable.group(1) if editable else line
    lowered = value.lower()
    if "://" in value or lowered.startswith((*VCS_SCHEMES, "file:")):
        if editable:
            raise usage(where, f"editable requirement {quoted(line)} is not a local directory",
                        "an editable install is a directory of the project (-e ./pkg); for a VCS "
                        "or URL source, build its wheel (pip wheel) into a find-links directory")
        return None
    if not editable and not (value.startswith(".") or ("/" in value and "@" not in value
                                                       and " " not in value)):
        return None
    if lowered.endswith(_ARCHIVES):
        return None  # a local file: check_requirement refuses it with its way out
    if value.startswith(("/", "~")):
        raise usage(where, f"local package {quoted(value)} is not relative to the requirements file",
                    "name a directory inside the project, relative to the file (-e ./pkg)")
    found = _EXTRAS_RE.fullmatch(value)
    if found is None:
        raise usage(where, f"invalid local package {quoted(value)}", "write -e ./pkg or -e ./pkg[extra]")
    extras = tuple(e.strip() for e in (found.group("extras") or "").split(",") if e.strip())
    return found.group("path"), extras


def split_hashes(line: str, where: Where) -> tuple[str, frozenset[str]]:
    """``name==1.0 --hash=sha256:… --hash=sha256:…`` (pip-compile's output, continuation
    lines joined): the requirement and the sha256s it allows. Another algorithm, or a
    malformed digest, is refused: only sha256 is what a lock records."""
    found = _HASH_RE.findall(line)
    if not found:
        return line, frozenset()
    shas = set()
    for value in found:
        match = _SHA256_RE.fullmatch(value)
        if match is None:
            raise usage(where, f"--hash {quoted(value[:80])} is not sha256:<64 hex digits>",
                        "envbuild checks sha256 only: regenerate with pip-compile --generate-hashes")
        shas.add(match.group(1).lower())
    return _HASH_RE.sub("", line).strip(), frozenset(shas)


def read_requirements_file(path: Path, shown: Callable[[Path], str], out: Gathered,
                           seen: set[Path], where: Where, roots: Sequence[Path], depth: int = 0,
                           *, constraints: bool = False) -> None:
    """Add ``path``'s requirements (and its ``-r`` includes) to ``out``; ``where`` names
    the line that asked for the file, for a missing one; ``constraints``: a ``-c`` file, whose
    lines (and ``-r`` includes) constrain and require nothing. The file must lie inside ``roots``
    (links resolved) and be a regular file of bounded size. A file already read is skipped,
    so include cycles end; includes nest at most ``MAX_INCLUDE_DEPTH`` deep, and at most
    ``MAX_FILES`` files are read."""
    what = f"requirements file {token(shown(path))}"
    try:
        real = confined(path, roots, what, outside_hint=_HINT_OUTSIDE)
        if real in seen:
            return
        if depth > MAX_INCLUDE_DEPTH or len(seen) >= MAX_FILES:
            raise UsageError(f"too many requirements files ({what}: more than {MAX_INCLUDE_DEPTH} "
                             f"nested -r includes or {MAX_FILES} files)", hint="flatten the includes")
        data = read_regular(real, what, missing_hint="check the path (relative to the file naming it)")
    except UsageError as exc:
        raise usage(where, exc.message, exc.hint) from None
    seen.add(real)
    out.files.append((path, data))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise usage(f"{token(shown(path))}:1", "not UTF-8 text") from None
    for number, line in logical_lines(text):
        here = f"{token(shown(path))}:{number}"
        include = _INCLUDE_RE.fullmatch(line)
        if include:
            constraint = constraints or include.group(1) in ("-c", "--constraint")
            read_requirements_file(path.parent / include.group(2), shown, out, seen, here, roots,
                                   depth + 1, constraints=constraint)
            continue
        if line.startswith(("-r", "--requirement", "-c", "--constraint")):
            raise usage(here, f"malformed include {quoted(line)}",
                        "write -r other.txt or -c constraints.txt")
        local = None if constraints else local_package(line, here)
        if local is not None:
            out.local.append((path.parent / local[0], local[1], here))
            continue
        line, hashes = split_hashes(line, here)
        text = check_requirement(line, here)
        (out.constraints if constraints else out.requirements).append((text, here))
        if hashes:
            out.hashes.append((_name(text), here, hashes))


# --- pyproject.toml: dependencies, extras, groups -------------------------------------------


def _strings(value: Any, where: Where) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise usage(where, "expected an array of strings")
    return list(value)


def _pick(name: str, table: Mapping[str, Any], where: Where, what: str) -> str:
    """The key of ``table`` that ``name`` means (names compared normalized), else UsageError."""
    if name in table:  # as written: no need to normalize every key (a long include chain)
        return name
    wanted = canonicalize_name(name)
    for key in table:
        if canonicalize_name(key) == wanted:
            return key
    import difflib  # for a misspelt name only

    close = difflib.get_close_matches(name, list(table), n=1)
    hint = f"did you mean {quoted(close[0])}?" if close else (
        f"known: {token(', '.join(sorted(table)))}" if table else f"the pyproject defines no {what}s")
    raise usage(where, f"unknown {what} {quoted(name)}", hint)


def project_dependencies(project: Mapping[str, Any], extras: Sequence[str], asked: Where,
                         where: Callable[[Sequence[str | int]], Where]) -> list[tuple[str, Where]]:
    """``[project.dependencies]`` and the chosen extras (a self-reference such as
    ``name[a,b]`` inside an extra pulls those extras in); ``where(path)`` names a place."""
    if "dependencies" in project.get("dynamic", ()):
        raise usage(where(["project", "dynamic"]), "dynamic dependencies cannot be read",
                    "list them in [project.dependencies], or use a requirements file")
    here = where(["project", "dependencies"])  # once: not once per dependency
    found = [(check_requirement(t, here), here) for t in _strings(project.get("dependencies", []), here)]
    optional = project.get("optional-dependencies", {})
    if not isinstance(optional, dict):
        raise usage(where(["project", "optional-dependencies"]), "expected a table")
    own = canonicalize_name(str(project.get("name", ""))) if project.get("name") else None
    todo = list(extras)
    done: set[str] = set()
    while todo:
        extra = _pick(todo.pop(0), optional, asked, "extra")
        if extra in done:
            continue
        done.add(extra)
        here = where(["project", "optional-dependencies", extra])
        for text in _strings(optional[extra], here):
            text = check_requirement(text, here)
            requirement = Requirement(text)
            if own is not None and canonicalize_name(requirement.name) == own:
                todo.extend(sorted(requirement.extras))
            else:
                found.append((text, here))
    return found


def dependency_groups(document: Mapping[str, Any], groups: Sequence[str], asked: Where,
                      where: Callable[[Sequence[str | int]], Where]) -> list[tuple[str, Where]]:
    """The requirements of the chosen PEP 735 groups, includes followed; a cycle is an error."""
    table = document.get("dependency-groups", {})
    if not isinstance(table, dict):
        raise usage(where(["dependency-groups"]), "expected a table")
    found: list[tuple[str, Where]] = []
    done: set[str] = set()

    def visit(name: str, chain: tuple[str, ...], by: Where) -> None:
        key = _pick(name, table, by, "dependency group")
        if key in chain:
            raise usage(where(["dependency-groups", key]),
                        f"dependency group cycle: {token(' -> '.join([*chain, key]))}")
        if len(chain) >= MAX_GROUP_DEPTH:
            raise usage(where(["dependency-groups", key]),
                        f"dependency groups include each other more than {MAX_GROUP_DEPTH} deep",
                        "flatten the includes")
        if key in done:
            return
        here = where(["dependency-groups", key])
        entries = table[key]
        if not isinstance(entries, list):
            raise usage(here, "expected an array")
        for entry in entries:
            if isinstance(entry, str):
                found.append((check_requirement(entry, here), here))
            elif isinstance(entry, dict) and set(entry) == {"include-group"} and \
                    isinstance(entry["include-group"], str):
                visit(entry["include-group"], (*chain, key), here)
            else:
                raise usage(here, f"unexpected entry (a {type(entry).__name__})",
                            "a requirement string or {include-group = \"name\"}")
        done.add(key)

    for group in groups:
        visit(group, (), asked)
    return found


# --- local packages (-e ./pkg, -e .) ---------------------------------------------------------


def local_packages(out: Gathered, root: Path, shown: Callable[[Path], str]) -> list[Extension]:
    """The local packages the requirements files name, each recorded like an extension (its
    directory relative to ``root``, its name, its source tree's sha256) and built from its
    sources in the image build; their own requirements join ``out``: the chosen extras and
    ``[project] dependencies`` of their pyproject.toml, and its ``[build-system] requires``
    (the stage builds without isolation; setuptools for a setup.py without one)."""
    if not out.local:  # most projects: the extension tree's module is not read
        return []
    import os

    from envbuild.extensions.tree import PROJECT_DIR, extension

    found: list[Extension] = []
    for directory, extras, where in out.local:
        relative = os.path.relpath(os.path.normpath(directory), root).replace(os.sep, "/")
        if relative == ".." or relative.startswith("../"):
            raise usage(where, f"local package {token(shown(directory))} lies outside the project",
                        "a local package is a directory inside the project (its sources are hashed "
                        "and built into the image)")
        what = f"local package {quoted(relative)}"
        try:
            record = extension(root, relative, what)
        except UsageError as exc:
            raise usage(where, exc.message, exc.hint) from None
        if any(e.dir == record.dir for e in found):
            continue
        found.append(record)
        out.requirements += _own_requirements(root / relative if relative != PROJECT_DIR else root,
                                              extras, where, relative)
    return found


def _own_requirements(directory: Path, extras: Sequence[str], where: Where,
                      relative: str) -> list[tuple[str, Where]]:
    from envbuild.project.toml import parse

    pyproject = directory / "pyproject.toml"
    shown = "pyproject.toml" if relative == "." else f"{relative}/pyproject.toml"
    if not pyproject.is_file():  # setup.py alone: pip builds it with setuptools
        return [("setuptools", where)]
    try:
        document = parse(read_regular(pyproject, shown).decode("utf-8"), shown)
    except UnicodeDecodeError:
        raise usage(f"{shown}:1", "not UTF-8 text") from None
    project = document.get("project", {})
    build = document.get("build-system", {})
    if not isinstance(project, dict) or not isinstance(build, dict):
        raise usage(shown, "[project] and [build-system] must be tables")
    here = f"{shown}: build-system.requires"
    found = [(check_requirement(t, here), here)
             for t in _strings(build.get("requires", ["setuptools"]), here)]
    if project:
        found += project_dependencies(project, extras, where, lambda p: f"{shown}: {'.'.join(map(str, p))}")
    return found
