"""Find, read and validate the project file: ``load_project``.

Discovery in the working directory: an explicit path, else ``envbuild.toml``, else
``pyproject.toml`` holding ``[tool.envbuild]``. The keys (kebab-case) are the same in
both, at the top level of envbuild.toml or under ``[tool.envbuild]``; targets are
``[[targets]]`` / ``[[tool.envbuild.targets]]``. Every problem is a UsageError (exit 2)
naming ``FILE:LINE: KEY``. Values are checked by the validators the command-line options
use, so a file accepts exactly what the flags accept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from envbuild.confine import CANONICAL_NAME, confined, quoted, read_confined, token
from envbuild.errors import UsageError
from envbuild.fleet import placement as fleet
from envbuild.project import requirements as reqs
from envbuild.project.model import INSTALLER_CHOICES, Project, Target, check_base_glibc
from envbuild.project.toml import KeyPath, dotted, line_of, parse

TYPE_CHECKING = False  # for the type checker only: the extension tree's module is read where
if TYPE_CHECKING:      # a project has extensions (it is not on the way to uv's run)
    from envbuild.extensions.tree import Extension

PROJECT_FILE = "envbuild.toml"
PYPROJECT = "pyproject.toml"
TARGET_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
MAX_NAMES = 64  # in build-sdists
DEFAULT_TARGET = "default"

FLEET_KEYS = ("nodes", "gpus-per-node", "runs-on", "slurm", "kubernetes")
TARGET_KEYS = ("name", "driver", "gpus", "archs", "datacenter", "platform", *FLEET_KEYS)
STACK_KEYS = ("torch", "python", "cuda", "cudnn", "ubuntu", "variant", "flavor", "companions")
DEPENDENCY_KEYS = ("dependencies", "extras", "groups", "requirements", "pyproject")
IMAGE_KEYS = ("extensions", "build-sdists", "build-env", "apt-packages", "compile-toolchain", "env", "user",
              "base-image", "base-glibc", "index-url", "torch-index-url", "find-links", "registry-mirrors",
              "installer", "exclude-newer", "apt-snapshot")
TOP_KEYS = ("driver", "gpus", "archs", "datacenter", "platform", *FLEET_KEYS, "targets", *STACK_KEYS,
            *DEPENDENCY_KEYS,
            *IMAGE_KEYS)
_GPU_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 ._()/-")


# --- value checks: one per key, the same the command-line options get -----------------------


def _check_driver(text: str) -> str:
    from envbuild.data.versions import DriverVersion

    DriverVersion.parse(text)
    return text


def _check_gpu(text: str) -> str:
    if not (0 < len(text) <= 80 and _GPU_NAME_CHARS.issuperset(text)):
        raise UsageError(f"invalid GPU name {quoted(text)}",
                         hint="letters, digits, spaces and . _ - ( ) / only")
    return text


def _check_platform(text: str) -> str:
    from envbuild.resolver.selection import check_platform

    check_platform(text)
    return text


def _check_arch(text: str) -> str:
    from envbuild.data.gpus import target_from_arch

    target_from_arch(text, datacenter=None)
    return text


def _spec(kind: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        from envbuild.data.versions import parse_requirement

        parse_requirement(kind, text)
        return text
    return check


def _check_python(text: str) -> str:
    from envbuild.smoke.rules import is_python_version

    if not (text.endswith("t") and is_python_version(text)):
        _spec("python")(text)
    return text


def _check_ubuntu(text: str) -> str:
    if not re.fullmatch(r"[0-9]{2}\.[0-9]{2}", text):
        raise UsageError(f"invalid Ubuntu release {quoted(text)}", hint="write it as 22.04 or 24.04")
    return text


def _check_variant(text: str) -> str:
    from envbuild.smoke.rules import is_variant_selector

    if not is_variant_selector(text):
        raise UsageError(f"invalid wheel variant {quoted(text)}", hint="write it as cu124, cpu or default")
    return text


def _check_flavor(text: str) -> str:
    if text not in ("runtime", "devel"):
        raise UsageError(f"invalid flavor {quoted(text)}", hint="runtime or devel")
    return text


def _lock_check(name: str, key: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        from envbuild.render import lock

        checked: str = getattr(lock, name)(text, key)
        return checked
    return check


def _check_target_name(text: str) -> str:
    if not TARGET_NAME_RE.fullmatch(text):
        raise UsageError(f"invalid target name {quoted(text)}",
                         hint="1 to 32 of a-z 0-9 _ -, starting with a letter or digit")
    return text


def _check_mirror_host(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?", text):
        raise UsageError(f"invalid registry host {quoted(text)}", hint="a registry host name, e.g. docker.io")
    return text


def _check_cutoff(text: str) -> str:
    from envbuild.pylock.cutoff import parse_cutoff

    return parse_cutoff(text).given


def _check_apt_snapshot(text: str) -> str:
    from envbuild.render.aptsnapshot import parse_setting

    return parse_setting(text)


# The check of each string-valued key (and of each element of the array-valued ones).
CHECKS: dict[str, Callable[[str], str]] = {
    "name": _check_target_name, "driver": _check_driver, "gpus": _check_gpu, "archs": _check_arch,
    "platform": _check_platform,
    "torch": _spec("torch"), "python": _check_python, "cuda": _spec("cuda"),
    "cudnn": _spec("cudnn"), "ubuntu": _check_ubuntu, "variant": _check_variant,
    "flavor": _check_flavor, "apt-packages": _lock_check("check_debian_package", "apt-packages"),
    "user": _lock_check("check_user_name", "user"),
    "base-image": _lock_check("check_image_reference", "base-image"),
    "index-url": _lock_check("check_url", "index-url"),
    "torch-index-url": _lock_check("check_url", "torch-index-url"),
    "exclude-newer": _check_cutoff,
    "apt-snapshot": _check_apt_snapshot,
}


def check_value(key: str, value: str) -> str:
    """``value`` checked as the key ``key`` takes it (UsageError when it is not)."""
    check = CHECKS.get(key)
    return check(value) if check else value


# --- reading --------------------------------------------------------------------------------


class _Reader:
    """One project file's text and table: typed reads that fail as FILE:LINE: KEY."""

    def __init__(self, text: str, shown: str, prefix: tuple[str, ...], table: Mapping[str, Any]):
        self.text, self.shown, self.prefix, self.table = text, shown, prefix, table

    def where(self, path: KeyPath, *, absolute: bool = False) -> str:
        full = list(path) if absolute else [*self.prefix, *path]
        return f"{self.shown}:{line_of(self.text, full)}: {token(dotted(full), 200)}"

    def fail(self, path: KeyPath, problem: str, hint: str = "") -> UsageError:
        return UsageError(f"{self.where(path)}: {problem}", hint=hint)

    def checked(self, path: KeyPath, key: str, value: str) -> str:
        try:
            return check_value(key, value)
        except UsageError as exc:
            raise self.fail(path, exc.message, exc.hint) from None

    def unknown_keys(self, table: Mapping[str, Any], known: Sequence[str], path: KeyPath) -> None:
        for key in table:
            if key not in known:
                import difflib  # for a misspelt key only

                close = difflib.get_close_matches(key.replace("_", "-"), known, n=1, cutoff=0.6)
                raise self.fail([*path, key], "unknown key", f"did you mean {quoted(close[0])}?"
                                if close else f"known keys: {', '.join(known)}")

    def string(self, table: Mapping[str, Any], key: str, path: KeyPath) -> str | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            hint = f'quote it: {key} = "{value}"' if isinstance(value, (int, float)) else ""
            raise self.fail([*path, key], "expected a string", hint)
        return self.checked([*path, key], key, value)

    def boolean(self, table: Mapping[str, Any], key: str, path: KeyPath, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise self.fail([*path, key], "expected true or false")
        return value

    def strings(self, table: Mapping[str, Any], key: str, path: KeyPath) -> tuple[str, ...]:
        value = table.get(key, [])
        if isinstance(value, str):
            raise self.fail([*path, key], "expected an array of strings", f'write {key} = ["{value}"]')
        if not isinstance(value, list):
            raise self.fail([*path, key], "expected an array of strings")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail([*path, key, i], "expected a string")
            self.checked([*path, key, i], key, item)
        return tuple(value)

    def string_table(self, key: str) -> dict[str, str]:
        value = self.table.get(key, {})
        if not isinstance(value, dict):
            raise self.fail([key], "expected a table of strings")
        for name, item in value.items():
            if not isinstance(item, str):
                raise self.fail([key, name], "expected a string")
        return dict(value)

    def target(self, table: Any, path: KeyPath, name: str | None) -> Target:
        if not isinstance(table, dict):
            raise self.fail(path, "expected a table")
        if name is None:
            self.unknown_keys(table, TARGET_KEYS, path)
            name = self.string(table, "name", path)
            if name is None:
                raise self.fail(path, "a target needs a name", 'add name = "..." to it')
        return Target(name=name, driver=self.string(table, "driver", path),
                      gpus=self.strings(table, "gpus", path), archs=self.strings(table, "archs", path),
                      datacenter=self.boolean(table, "datacenter", path, False),
                      platform=self.string(table, "platform", path),
                      placement=self.placement(table, path))

    # -- the fleet keys (envbuild/fleet/placement.py holds their grammar) --

    def guarded(self, path: KeyPath, check: Callable[..., Any], *args: Any) -> Any:
        try:
            return check(*args)
        except UsageError as exc:
            raise self.fail(path, exc.message, exc.hint) from None

    def count(self, table: Mapping[str, Any], key: str, path: KeyPath, most: int) -> int | None:
        if key not in table:
            return None
        count: int = self.guarded([*path, key], fleet.check_count, table[key], key, most)
        return count

    def subtable(self, table: Mapping[str, Any], key: str, path: KeyPath,
                 known: Sequence[str]) -> Mapping[str, Any] | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail([*path, key], "expected a table", f"write {key} = {{ ... }}")
        self.unknown_keys(value, known, [*path, key])
        return value

    def placement(self, table: Mapping[str, Any], path: KeyPath) -> fleet.Placement:
        runs_on = self.strings(table, "runs-on", path)
        for i, label in enumerate(runs_on):
            self.guarded([*path, "runs-on", i], fleet.check_runner_label, label)
        return fleet.Placement(
            nodes=self.count(table, "nodes", path, fleet.MAX_NODES),
            gpus_per_node=self.count(table, "gpus-per-node", path, fleet.MAX_GPUS_PER_NODE),
            runs_on=runs_on, slurm=self.slurm(table, path), kubernetes=self.kubernetes(table, path))

    def slurm(self, table: Mapping[str, Any], path: KeyPath) -> fleet.SlurmPlacement | None:
        raw = self.subtable(table, "slurm", path, fleet.SLURM_KEYS)
        if raw is None:
            return None
        where = [*path, "slurm"]
        checks: dict[str, Callable[[str], Any]] = {
            "partition": fleet.check_partition, "gres": fleet.check_gres,
            "launcher": fleet.check_launcher, "host-python": fleet.check_host_python}
        values: dict[str, Any] = {}
        for key, check in checks.items():
            text = self.string(raw, key, where)
            if text is not None:
                values[key.replace("-", "_")] = self.guarded([*where, key], check, text)
        if "partition" not in values:
            raise self.fail(where, "needs a partition", 'add partition = "..." (as sinfo names it)')
        return fleet.SlurmPlacement(**values)

    def kubernetes(self, table: Mapping[str, Any], path: KeyPath) -> fleet.KubernetesPlacement | None:
        raw = self.subtable(table, "kubernetes", path, fleet.KUBERNETES_KEYS)
        if raw is None:
            return None
        where = [*path, "kubernetes", "node-selector"]
        selector = raw.get("node-selector")
        if not isinstance(selector, dict) or not selector:
            raise self.fail(where, "expected a table of node labels",
                            'node-selector = { "nvidia.com/gpu.product" = "..." }')
        pairs = []
        for key, value in sorted(selector.items()):
            if not isinstance(value, str):
                raise self.fail([*where, key], "expected a string")
            pairs.append(self.guarded([*where, key], fleet.check_node_label, key, value))
        return fleet.KubernetesPlacement(node_selector=tuple(pairs))


def shown_path(path: Path, cwd: Path) -> str:
    """``path`` as the user knows it: relative to the working directory when under it."""
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def _read_text(path: Path, shown: str) -> tuple[bytes, str]:
    """The project file's bytes and text: a regular file of bounded size inside its own
    directory once links are resolved (a link to /proc/self/environ is refused, unread)."""
    what = f"project file {token(shown)}"
    data = read_confined(path, [path.parent], what,
                         missing_hint="check the path, or run 'envbuild init' to write one")
    try:
        return data, data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{token(shown)}:1: not UTF-8 text") from None


def find_project_file(path: Path | None, cwd: Path) -> Path:
    """The project file to read: ``path``, else envbuild.toml, else pyproject.toml with
    [tool.envbuild]; neither is a UsageError."""
    if path is not None:
        return path if path.is_absolute() else cwd / path
    found = project_file_here(cwd)
    if found is not None:
        return found
    if (cwd / PYPROJECT).is_file():
        raise UsageError(f"no project file: no {PROJECT_FILE} here and {PYPROJECT} has no "
                         "[tool.envbuild] table", hint="run 'envbuild init' (or add the table)")
    raise UsageError(f"no project file: neither {PROJECT_FILE} nor {PYPROJECT} in {cwd}",
                     hint="run 'envbuild init' to write one")


def project_file_here(cwd: Path) -> Path | None:
    """envbuild.toml in ``cwd``, else its pyproject.toml when that has a [tool.envbuild] table
    (read as TOML: a file that does not parse is a UsageError naming its line), else None."""
    own = cwd / PROJECT_FILE
    if own.exists():
        return own
    pyproject = cwd / PYPROJECT
    if pyproject.is_file():
        _, text = _read_text(pyproject, PYPROJECT)
        tool = parse(text, PYPROJECT).get("tool")
        if isinstance(tool, dict) and "envbuild" in tool:
            return pyproject
    return None


def load_project(path: Path | None, cwd: Path) -> Project:
    """The project file (found as ``find_project_file`` finds it), read and validated,
    with every dependency gathered."""
    cwd = Path(os.path.abspath(cwd))
    found = Path(os.path.abspath(find_project_file(path, cwd)))
    shown = shown_path(found, cwd)
    data, text = _read_text(found, shown)
    return project_from_text(text, found, shown=shown, data=data, cwd=cwd)


def project_from_text(text: str, path: Path, *, shown: str, data: bytes | None = None,
                      cwd: Path | None = None) -> Project:
    """The project ``text`` describes as if it were the file ``path`` (pyproject form
    when the name is pyproject.toml); ``shown`` names it in errors."""
    cwd = cwd or path.parent
    document = parse(text, shown)
    is_pyproject = path.name == PYPROJECT
    if is_pyproject:
        tool = document.get("tool", {})
        table = tool.get("envbuild") if isinstance(tool, dict) else None
        if table is None:
            raise UsageError(f"{shown}: no [tool.envbuild] table",
                             hint="add one (envbuild init --print writes it)")
        prefix: tuple[str, ...] = ("tool", "envbuild")
    else:
        table, prefix = document, ()
    reader = _Reader(text, shown, prefix, {} if not isinstance(table, dict) else table)
    if not isinstance(table, dict):
        raise reader.fail([], "expected a table")
    known = tuple(k for k in TOP_KEYS if not (is_pyproject and k == "pyproject"))
    reader.unknown_keys(table, known, [])
    root = path.parent
    sources: list[tuple[Path, bytes]] = [(path, data if data is not None else text.encode())]
    targets = _targets(reader, table)
    gathered = _dependencies(reader, table, document if is_pyproject else None, root, cwd, sources)
    local = reqs.local_packages(gathered, root, lambda p: shown_path(p, cwd))
    dependencies, torch_constraints = gathered.split()
    env_pairs = _env_table(reader, "env")
    build_env = _env_table(reader, "build-env")  # the extensions stage's only, never the image's
    mirrors = reader.string_table("registry-mirrors")
    for host, url in mirrors.items():
        try:
            _check_mirror_host(host)
            from envbuild.render.values import check_url, port_ok

            if not port_ok(host.rpartition(":")[2] if ":" in host else None):
                raise UsageError(f"invalid registry host {host!r}: a port from 1 to 65535")
            check_url(url, "registry-mirrors")
        except UsageError as exc:
            raise reader.fail(["registry-mirrors", host], exc.message, exc.hint) from None
    find_links = _find_links(reader, table, root, cwd)
    extensions = _extensions(reader, table, root)
    extensions += tuple(e for e in local if all(e.dir != d.dir for d in extensions))
    _distinct_names(extensions)
    build_sdists, all_sdists = _build_sdists(reader, table)
    installer = reader.string(table, "installer", [])
    if installer is not None and installer not in INSTALLER_CHOICES:
        raise reader.fail(["installer"], f"unknown installer {quoted(installer)}",
                          "uv (the default: parallel downloads) or pip (the image's own)")
    base_glibc = reader.string(table, "base-glibc", [])
    if base_glibc is not None:
        try:
            base_glibc = check_base_glibc(base_glibc)
        except UsageError as exc:
            raise reader.fail(["base-glibc"], exc.message, exc.hint) from None
    files = sorted({(_relative(p, root), d) for p, d in sources})
    return Project(
        path=path, root=root, targets=targets,
        torch=reader.string(table, "torch", []), python=reader.string(table, "python", []),
        cuda=reader.string(table, "cuda", []), cudnn=reader.string(table, "cudnn", []),
        ubuntu=reader.string(table, "ubuntu", []), variant=reader.string(table, "variant", []),
        flavor=reader.string(table, "flavor", []) or "runtime",
        companions=reader.boolean(table, "companions", [], True),
        compile_toolchain=reader.boolean(table, "compile-toolchain", [], True),
        dependencies=dependencies, torch_constraints=torch_constraints,
        constraints=gathered.constraint_lines(), hashes=tuple(gathered.hashes),
        apt_packages=reader.strings(table, "apt-packages", []), env=tuple(env_pairs),
        user=reader.string(table, "user", []) or "envbuild",
        base_image=reader.string(table, "base-image", []), base_glibc=base_glibc,
        index_url=reader.string(table, "index-url", []),
        torch_index_url=reader.string(table, "torch-index-url", []),
        find_links=find_links, extensions=extensions, build_sdists=build_sdists, all_sdists=all_sdists,
        build_env=tuple(sorted(build_env)),
        registry_mirrors=dict(sorted(mirrors.items())), installer=installer,
        exclude_newer=reader.string(table, "exclude-newer", []),
        apt_snapshot=reader.string(table, "apt-snapshot", []),
        inputs=tuple(files), sources=tuple(name for name, _ in files),
    )


def project_roots(root: Path, cwd: Path) -> list[Path]:
    """Where files the project file names may lie: its own directory, and the working
    directory when that holds the project file (``-o sub/project.toml`` naming ``../r.txt``)
    and is not the file system's root (a container's ``/`` would let everything in)."""
    real_root, real_cwd = Path(os.path.realpath(root)), Path(os.path.realpath(cwd))
    inside = real_root == real_cwd or real_cwd in real_root.parents
    return [root, cwd] if inside and real_cwd != Path(real_cwd.anchor) else [root]


def _relative(path: Path, root: Path) -> str:
    return os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")


def _targets(reader: _Reader, table: Mapping[str, Any]) -> tuple[Target, ...]:
    raw = table.get("targets")
    if raw is None:
        return (reader.target(table, [], DEFAULT_TARGET),)
    if not isinstance(raw, list) or not raw:
        raise reader.fail(["targets"], "expected one or more [[targets]] tables")
    for key in ("driver", "gpus", "archs", "datacenter", "platform", *FLEET_KEYS):
        if key in table:
            raise reader.fail([key], "cannot be combined with targets",
                              "set it in each [[targets]] table instead")
    targets = [reader.target(item, ["targets", i], None) for i, item in enumerate(raw)]
    seen: set[str] = set()
    for i, target in enumerate(targets):
        if target.name in seen:
            raise reader.fail(["targets", i, "name"], f"duplicate target name {target.name!r}")
        seen.add(target.name)
    from envbuild.render.lockset import check_distinct_names

    try:
        check_distinct_names((t.name for t in targets), "the project")
    except UsageError as exc:
        raise reader.fail(["targets"], exc.message, exc.hint) from None
    return tuple(targets)


def _dependencies(reader: _Reader, table: Mapping[str, Any], document: Mapping[str, Any] | None,
                  root: Path, cwd: Path, sources: list[tuple[Path, bytes]]) -> reqs.Gathered:
    """Every requirement the file asks for: its pyproject's (this document, or the file
    ``pyproject`` names), the requirements files, and ``dependencies``."""
    gathered = reqs.Gathered()
    extras = reader.strings(table, "extras", [])
    groups = reader.strings(table, "groups", [])
    pyproject_name = reader.string(table, "pyproject", [])
    pyproject: tuple[Mapping[str, Any], Callable[[KeyPath], str]] | None = None
    if document is not None:
        pyproject = (document, lambda p: reader.where(p, absolute=True))
    elif pyproject_name is not None:
        other = root / pyproject_name
        other_shown = token(shown_path(other, cwd))
        try:
            data = read_confined(other, project_roots(root, cwd), other_shown)
        except UsageError as exc:
            raise reader.fail(["pyproject"], exc.message, exc.hint) from None
        sources.append((other, data))
        try:
            other_text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{other_shown}:1: not UTF-8 text") from None
        other_reader = _Reader(other_text, other_shown, (), {})
        pyproject = (parse(other_text, other_shown), lambda p: other_reader.where(p, absolute=True))
    if pyproject is None and (extras or groups):
        raise reader.fail(["extras" if extras else "groups"], "needs a pyproject.toml",
                          'name it: pyproject = "pyproject.toml"')
    if pyproject is not None:
        doc, where = pyproject
        project = doc.get("project", {})
        if not isinstance(project, dict):
            raise UsageError(f"{where(['project'])}: expected a table")
        gathered.requirements += reqs.project_dependencies(project, extras, reader.where(["extras"]),
                                                           where)
        gathered.requirements += reqs.dependency_groups(doc, groups, reader.where(["groups"]), where)
    seen: set[Path] = set()
    for i, name in enumerate(reader.strings(table, "requirements", [])):
        reqs.read_requirements_file(root / name, lambda p: shown_path(p, cwd), gathered, seen,
                                    reader.where(["requirements", i]), project_roots(root, cwd))
    sources += gathered.files
    for i, text in enumerate(reader.strings(table, "dependencies", [])):
        here = reader.where(["dependencies", i])
        gathered.requirements.append((reqs.check_requirement(text, here), here))
    return gathered


def _find_links(reader: _Reader, table: Mapping[str, Any], root: Path,
                cwd: Path) -> tuple[str, ...]:
    """URLs as written; local directories made absolute (relative to the project file), each
    inside the project (links resolved): a project file from a pull request must not point uv,
    and so the image, at a directory of the machine's own (a CI runner's private wheels)."""
    links = []
    for i, link in enumerate(reader.strings(table, "find-links", [])):
        if "://" in link:
            try:
                from envbuild.render.values import check_url

                links.append(check_url(link, "find-links"))
            except UsageError as exc:
                raise reader.fail(["find-links", i], exc.message, exc.hint) from None
            continue
        directory = root / link
        if not directory.is_dir():
            raise reader.fail(["find-links", i], f"{quoted(link)} is not a directory",
                              "an http(s) URL or a directory of wheels, relative to the project file")
        try:
            confined(directory, project_roots(root, cwd), f"directory {quoted(link)}",
                     outside_hint="a directory inside the project; a wheelhouse elsewhere goes on "
                                  "the command line (lock --find-links DIR)")
        except UsageError as exc:
            raise reader.fail(["find-links", i], exc.message, exc.hint) from None
        links.append(os.path.abspath(directory))
    return tuple(links)


def _extensions(reader: _Reader, table: Mapping[str, Any], root: Path) -> tuple[Extension, ...]:
    """Each declared extension directory, checked (inside the project, a Python project of
    regular files) and hashed as the lock records it."""
    directories = reader.strings(table, "extensions", [])
    if not directories:  # most projects: the extension tree's module is not read
        return ()
    from envbuild.extensions.tree import extension

    found: list[Extension] = []
    for i, directory in enumerate(directories):
        try:
            record = extension(root, directory, f"extension {quoted(directory)}")
        except UsageError as exc:
            raise reader.fail(["extensions", i], exc.message, exc.hint) from None
        if any(record.dir == e.dir or record.name == e.name for e in found):
            raise reader.fail(["extensions", i], f"extension {quoted(directory)} is declared twice "
                                                 "(the same directory or distribution name)")
        found.append(record)
    return tuple(found)


def _distinct_names(extensions: Sequence[Extension]) -> None:
    """Two directories (declared, or local packages of the requirements) that build one
    distribution name would install it twice."""
    seen: dict[str, str] = {}
    for e in extensions:
        if e.name in seen:
            raise UsageError(f"{quoted(seen[e.name])} and {quoted(e.dir)} both build {quoted(e.name)}",
                             hint="keep one of them (extensions, or the -e line of a requirements file)")
        seen[e.name] = e.dir


def _env_table(reader: _Reader, key: str) -> list[tuple[str, str]]:
    """A table of environment variables (``env``, ``build-env``), each checked as ``--env`` is
    (docs/env.md: no credentials, nothing an output cannot carry)."""
    from envbuild.render.values import check_env

    pairs = []
    for name, value in reader.string_table(key).items():
        try:
            pairs.append(check_env(name, value, key))  # the key alone: "A=x y" is no key
        except UsageError as exc:
            raise reader.fail([key, name], exc.message, exc.hint) from None
    return pairs


def _build_sdists(reader: _Reader, table: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    """``build-sdists``: (the packages of the closure locked by their sdist and built against the
    locked torch, as canonical names; whether ``true`` asks for every package only an sdist
    provides). A name may be an indirect requirement: ``lock`` checks that the closure holds it
    (envbuild/extensions/sdists.py)."""
    if table.get("build-sdists") is True:
        return (), True
    if table.get("build-sdists") is False:
        return (), False
    names = reader.strings(table, "build-sdists", [])
    try:
        return _distribution_names(names, "build-sdists"), False
    except UsageError as exc:
        raise reader.fail(["build-sdists"], exc.message, exc.hint) from None


def _distribution_names(names: Sequence[str], what: str) -> tuple[str, ...]:
    """``names`` as canonical distribution names, each once; UsageError naming ``what``."""
    if len(names) > MAX_NAMES:
        raise UsageError(f"{what}: more than {MAX_NAMES} names")
    found: list[str] = []
    for name in names:
        if len(name) > 100 or not CANONICAL_NAME.fullmatch(str(canonicalize_name(name))) \
                or not re.fullmatch(r"[A-Za-z0-9._-]+", name, re.ASCII):
            raise UsageError(f"{what}: {quoted(name)} is not a distribution name",
                             hint="the name of a requirement in dependencies, as 'flash-attn'")
        canonical = str(canonicalize_name(name))
        if canonical in found:
            raise UsageError(f"{what}: {quoted(name)} is named twice")
        found.append(canonical)
    return tuple(sorted(found))
