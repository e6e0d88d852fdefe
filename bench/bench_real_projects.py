"""``envbuild lock`` of real projects' dependency files, beside ``uv pip compile`` of the same files.

The corpus is tests/fixtures/real-projects/: popular public PyTorch training projects'
requirements files and pyproject.toml dependency tables, verbatim (SOURCES.md says where each
came from; projects.toml which files each project installs). For each project this copies the
files into a throw-away directory, writes an envbuild.toml beside them that names them
(`requirements`, `pyproject`, `extras`) with one target (driver 580, torch from the package
index's own wheel: ``variant = "default"``, no companions, the chosen Python), then runs

  envbuild   ``python -m envbuild lock --no-registry`` with PYTHONPATH at the tree under test
             (``--tree PATH``, default this checkout)
  uv         ``uv pip compile FILES --python-platform P --python-version X`` of the same files, P
             the platform envbuild's lock records (else x86_64-manylinux_2_28); sdists allowed,
             as pip would install them

and prints one table: envbuild's exit code and first error line, the number of packages on each
side, and every version difference (package, envbuild's version, uv's version; ``-`` where one
side has no such package), with an empty ``reason`` column for the reader's classification.
A project envbuild fails on is a row of the table, not a failure of the bench: it exits 0
whenever the table was printed. ``--json`` prints the same as one JSON document.

Both read the configured package index (``PIP_INDEX_URL`` or pip's configuration; its host is
never printed) and share one persistent uv cache (``--uv-cache``, default
``$XDG_CACHE_HOME/envbuild-bench/uv``) so that a rerun reads metadata already fetched: uv reads
a wheel's metadata by range request, never the whole torch CUDA wheels. Each run is bounded by
``--timeout`` seconds. Usage:
  python bench/bench_real_projects.py [--tree PATH] [--project NAME]... [--python 3.12]
                                      [--timeout 600] [--project-line TOML]... [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "real-projects"
sys.path.insert(0, str(ROOT))

from envbuild.project.toml import tomllib  # noqa: E402
from envbuild.pylock.uv import find_uv, uv_environment  # noqa: E402
from envbuild.upstream.pipconfig import index_url  # noqa: E402

DRIVER = "580"
UV_PLATFORM = "x86_64-manylinux_2_28"  # uv's platform when envbuild wrote no lock to take it from
UV_OUTPUT = "pylock.uv.toml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """One project's dependency files, as projects.toml names them."""

    name: str
    requirements: tuple[str, ...] = ()
    pyproject: str | None = None
    extras: tuple[str, ...] = ()


@dataclass(slots=True, kw_only=True)
class Side:
    """One tool's answer: exit code (None: killed at the timeout), first error line, versions."""

    exit: int | None
    error: str = ""
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    sdist_only: list[str] = field(default_factory=list)  # locked with no wheel: built from source


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    project: str
    platform: str
    envbuild: Side
    uv: Side
    differences: tuple[tuple[str, str, str], ...]


def corpus(names: list[str] | None) -> list[Inputs]:
    """The projects of projects.toml, in its order; ``names`` picks some (unknown: SystemExit)."""
    table = tomllib.loads((CORPUS / "projects.toml").read_text(encoding="utf-8"))
    projects = [Inputs(name=name, requirements=tuple(entry.get("requirements", ())),
                       pyproject=entry.get("pyproject"), extras=tuple(entry.get("extras", ())))
                for name, entry in table.items()]
    if names:
        unknown = sorted(set(names) - {p.name for p in projects})
        if unknown:
            raise SystemExit(f"unknown project(s): {', '.join(unknown)}; known: {', '.join(table)}")
        projects = [p for p in projects if p.name in names]
    return projects


def project_file(inputs: Inputs, python: str, more: tuple[str, ...] = ()) -> str:
    """The envbuild.toml naming the verbatim files: one target, driver 580, the index's torch;
    ``more``: top-level lines added as given (``build-sdists = true``)."""
    lines = [f"python = {json.dumps(python)}", 'variant = "default"', "companions = false", *more]
    if inputs.pyproject is not None:
        lines.append(f"pyproject = {json.dumps(inputs.pyproject)}")
    if inputs.extras:
        lines.append(f"extras = {json.dumps(list(inputs.extras))}")
    if inputs.requirements:
        lines.append(f"requirements = {json.dumps(list(inputs.requirements))}")
    lines += ["", "[[targets]]", 'name = "linux-x86_64"', f"driver = {json.dumps(DRIVER)}"]
    return "\n".join(lines) + "\n"


def uv_command(uv: str, inputs: Inputs, python: str, index: str, platform: str) -> list[str]:
    """``uv pip compile`` of the same files for the same Python and platform."""
    files = [*([inputs.pyproject] if inputs.pyproject else []), *inputs.requirements]
    command = [uv, "pip", "compile", *files, "--no-config", "--quiet", "--color", "never",
               "--no-header", "--no-annotate", "--python-platform", platform,
               "--python-version", python, "--python", sys.executable,
               "--default-index", index, "--format", "pylock.toml", "-o", UV_OUTPUT]
    for extra in inputs.extras:
        command += ["--extra", extra]
    return command


def read_pylock(path: Path) -> tuple[dict[str, str], list[str]]:
    """Every package's version in a PEP 751 file (a VCS/URL package without one: its source),
    and the packages it locks with no wheel (an sdist, a VCS checkout: built at install)."""
    document = tomllib.loads(path.read_text(encoding="utf-8"))
    versions, unbuilt = {}, []
    for package in document.get("packages", []):
        name = str(package["name"]).lower().replace("_", "-").replace(".", "-")
        versions[name] = str(package.get("version") or _source(package))
        if not package.get("wheels"):
            unbuilt.append(name)
    return versions, sorted(unbuilt)


def _source(package: dict[str, object]) -> str:
    for key in ("vcs", "archive", "directory"):
        value = package.get(key)
        if isinstance(value, dict):
            return f"{key}:{value.get('commit-id') or value.get('url') or value.get('path')}"
    return "?"


def first_error(stderr: str, index: str) -> str:
    """envbuild's one-line error (else the last line said), the index's host masked."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    picked = next((line for line in lines if line.startswith("envbuild: error")),
                  next((line for line in lines if line.startswith("error:")), lines[-1] if lines else ""))
    host = urlsplit(index).netloc
    return picked.replace(host, "<index>") if host else picked


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float,
        output: Callable[[], Path | None], index: str) -> Side:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Side(exit=None, error=f"killed after {timeout:.0f} s", seconds=time.perf_counter() - start)
    side = Side(exit=done.returncode, seconds=time.perf_counter() - start)
    if done.returncode != 0:
        side.error = first_error(done.stderr, index)
    elif (written := output()) is not None:
        side.versions, side.sdist_only = read_pylock(written)
    return side


def envbuild_pylock(work: Path) -> Path | None:
    """The one pylock ``lock`` wrote (pylock.toml, or pylock.TARGET.toml), if any."""
    return next((p for p in sorted(work.glob("pylock*.toml")) if p.name != UV_OUTPUT), None)


def locked_platform(work: Path) -> str | None:
    """The platform envbuild resolved for (the lock's target), so that uv resolves for the same."""
    try:
        targets = json.loads((work / "envbuild.lock").read_text(encoding="utf-8"))["targets"]
        return str(next(iter(targets.values()))["pylock"]["platform"])
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


def differences(ours: dict[str, str], theirs: dict[str, str]) -> tuple[tuple[str, str, str], ...]:
    """(package, envbuild's version, uv's version) wherever the two differ; ``-``: absent."""
    if not ours or not theirs:
        return ()
    return tuple((name, ours.get(name, "-"), theirs.get(name, "-"))
                 for name in sorted(set(ours) | set(theirs)) if ours.get(name) != theirs.get(name))


def measure(inputs: Inputs, *, tree: Path, python: str, timeout: float, cache: Path,
            index: str, uv: str, more: tuple[str, ...] = ()) -> Row:
    env = uv_environment(os.environ)
    env["UV_CACHE_DIR"] = str(cache)
    with tempfile.TemporaryDirectory(prefix=f"real-{inputs.name}-") as tmp:
        work = Path(tmp) / inputs.name
        shutil.copytree(CORPUS / inputs.name, work)
        (work / "envbuild.toml").write_text(project_file(inputs, python, more), encoding="utf-8")
        ours = run([sys.executable, "-m", "envbuild", "lock", "--no-registry"], work,
                   {**env, "PYTHONPATH": str(tree)}, timeout, lambda: envbuild_pylock(work), index)
        platform = locked_platform(work) or UV_PLATFORM
        uv_output = work / UV_OUTPUT
        theirs = run(uv_command(uv, inputs, python, index, platform), work, env, timeout,
                     lambda: uv_output if uv_output.is_file() else None, index)
    return Row(project=inputs.name, envbuild=ours, uv=theirs, platform=platform,
               differences=differences(ours.versions, theirs.versions))


def _cut(text: str, most: int = 240) -> str:
    """A long one-line error, shortened for the table (--json keeps it whole)."""
    return text if len(text) <= most else text[:most - 1] + "…"


def _count(side: Side) -> str:
    return str(len(side.versions)) if side.exit == 0 else "-"


def _code(side: Side) -> str:
    return "timeout" if side.exit is None else str(side.exit)


def table(rows: list[Row]) -> str:
    """The Markdown table: one line per project, then one per version difference."""
    out = ["| project | envbuild exit | envbuild first error | envbuild pkgs | uv exit | uv pkgs "
           "| package | envbuild version | uv version | reason |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        error = _cut(row.envbuild.error or (row.uv.error and f"(uv: {row.uv.error})")).replace("|", "\\|")
        out.append(f"| {row.project} | {_code(row.envbuild)} | {error} | {_count(row.envbuild)} "
                   f"| {_code(row.uv)} | {_count(row.uv)} |  |  |  |  |")
        out += [f"|  |  |  |  |  |  | {name} | {mine} | {theirs} |  |"
                for name, mine, theirs in row.differences]
    out += ["", "Built from source (no wheel locked): "
            + "; ".join(f"{r.project}: uv {', '.join(r.uv.sdist_only) or 'none'}, envbuild "
                        f"{', '.join(r.envbuild.sdist_only) or 'none'}"
                        for r in rows if r.uv.sdist_only or r.envbuild.sdist_only)]
    return "\n".join(out)


def document(rows: list[Row], python: str) -> dict[str, object]:
    def side(s: Side) -> dict[str, object]:
        return {**asdict(s), "seconds": round(s.seconds, 1), "packages": len(s.versions)}
    return {"driver": DRIVER, "python": python,
            "projects": [{"project": r.project, "platform": r.platform,
                          "envbuild": side(r.envbuild), "uv": side(r.uv),
                          "differences": [{"package": n, "envbuild": a, "uv": b}
                                          for n, a, b in r.differences]} for r in rows]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="envbuild tree to test (PYTHONPATH)")
    parser.add_argument("--project", action="append", help="only this project (repeatable)")
    parser.add_argument("--python", default="3.12", choices=("3.11", "3.12"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--uv-cache", type=Path, default=Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild-bench" / "uv")
    parser.add_argument("--project-line", action="append", default=[], metavar="TOML",
                        help="a top-level line added to every envbuild.toml, e.g. "
                             "'build-sdists = true' (repeatable; the table then measures that setting)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    index = index_url(None, os.environ)
    uv = find_uv(None)
    rows = []
    for inputs in corpus(args.project):
        print(f"{inputs.name}: locking", file=sys.stderr, flush=True)
        rows.append(measure(inputs, tree=args.tree.resolve(), python=args.python,
                            timeout=args.timeout, cache=args.uv_cache, index=index, uv=uv,
                            more=tuple(args.project_line)))
    print(json.dumps(document(rows, args.python), indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
