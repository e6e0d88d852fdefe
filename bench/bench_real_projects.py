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
``--timeout`` seconds.

``--cpu-torch WHEEL`` locks on a CPU torch wheel instead of the index's (CUDA) one: the wheel is
served as a one-file index on 127.0.0.1 (``torch-index-url``), torch pinned to ``==2.13.0``,
``variant = "cpu"``, Python 3.11, ``base-image`` ``--base-image`` (default the test base image);
uv is given the same index first. ``--build`` then builds each lock into an image (``envbuild
build --lock``, ``--network host``, ``--ca-bundle`` ``$PIP_CERT``), runs ``envbuild verify --cpu-ok``
on it, imports the project's modules in it (projects.toml's ``imports``) and prints a second table:
builder, steps run, build and verify seconds, size, the smoke test's checks. ``--engine-lock FILE``
holds FILE (flock) around each engine command; the wait is not timed. The images are removed
unless ``--keep-images``; ``--no-cache`` times a build with no layer cache. Usage:
  python bench/bench_real_projects.py [--tree PATH] [--project NAME]... [--python 3.12]
                                      [--timeout 600] [--project-line TOML]... [--json]
                                      [--cpu-torch WHEEL [--base-image REF]]
                                      [--build [--builder B] [--engine-lock FILE] [--no-cache]]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

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
    imports: tuple[str, ...] = ()  # the project's main modules, imported in its image (--build)


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
    image: Image | None = None


def corpus(names: list[str] | None) -> list[Inputs]:
    """The projects of projects.toml, in its order; ``names`` picks some (unknown: SystemExit)."""
    table = tomllib.loads((CORPUS / "projects.toml").read_text(encoding="utf-8"))
    projects = [Inputs(name=name, requirements=tuple(entry.get("requirements", ())),
                       pyproject=entry.get("pyproject"), extras=tuple(entry.get("extras", ())),
                       imports=tuple(entry.get("imports", ())))
                for name, entry in table.items()]
    if names:
        unknown = sorted(set(names) - {p.name for p in projects})
        if unknown:
            raise SystemExit(f"unknown project(s): {', '.join(unknown)}; known: {', '.join(table)}")
        projects = [p for p in projects if p.name in names]
    return projects


INDEX_STACK = ('variant = "default"', "companions = false")  # the package index's own torch wheel


def project_file(inputs: Inputs, python: str, more: tuple[str, ...] = (),
                 stack: tuple[str, ...] = INDEX_STACK) -> str:
    """The envbuild.toml naming the verbatim files: one target, driver 580, the stack's lines
    (default: the index's torch); ``more``: top-level lines added as given (``build-sdists = true``)."""
    lines = [f"python = {json.dumps(python)}", *stack, *more]
    if inputs.pyproject is not None:
        lines.append(f"pyproject = {json.dumps(inputs.pyproject)}")
    if inputs.extras:
        lines.append(f"extras = {json.dumps(list(inputs.extras))}")
    if inputs.requirements:
        lines.append(f"requirements = {json.dumps(list(inputs.requirements))}")
    lines += ["", "[[targets]]", 'name = "linux-x86_64"', f"driver = {json.dumps(DRIVER)}"]
    return "\n".join(lines) + "\n"


def uv_command(uv: str, inputs: Inputs, python: str, index: str, platform: str,
               torch_index: str | None = None) -> list[str]:
    """``uv pip compile`` of the same files for the same Python and platform; ``torch_index``:
    an index asked first (uv's first-index rule: torch from there alone, as envbuild's lock)."""
    files = [*([inputs.pyproject] if inputs.pyproject else []), *inputs.requirements]
    command = [uv, "pip", "compile", *files, "--no-config", "--quiet", "--color", "never",
               "--no-header", "--no-annotate", "--python-platform", platform,
               "--python-version", python, "--python", sys.executable,
               "--default-index", index, "--format", "pylock.toml", "-o", UV_OUTPUT]
    for extra in inputs.extras:
        command += ["--extra", extra]
    if torch_index:
        command += ["--index", torch_index]
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
            index: str, uv: str, more: tuple[str, ...] = (), cpu: CpuStack | None = None,
            images: Images | None = None) -> Row:
    """One project locked by envbuild and compiled by uv; ``cpu``: on the CPU torch stack;
    ``images``: the lock then built into an image and verified (a failed lock builds nothing)."""
    env = uv_environment(os.environ)
    env["UV_CACHE_DIR"] = str(cache)
    stack = cpu.lines() if cpu else INDEX_STACK
    image = None
    with tempfile.TemporaryDirectory(prefix=f"real-{inputs.name}-") as tmp:
        work = Path(tmp) / inputs.name
        shutil.copytree(CORPUS / inputs.name, work)
        (work / "envbuild.toml").write_text(project_file(inputs, python, more, stack), encoding="utf-8")
        ours = run([sys.executable, "-m", "envbuild", "lock", "--no-registry"], work,
                   {**env, "PYTHONPATH": str(tree)}, timeout, lambda: envbuild_pylock(work), index)
        platform = locked_platform(work) or UV_PLATFORM
        uv_output = work / UV_OUTPUT
        theirs = run(uv_command(uv, inputs, python, index, platform, cpu.torch_index if cpu else None),
                     work, env, timeout, lambda: uv_output if uv_output.is_file() else None, index)
        if images is not None and ours.exit == 0:
            image = build_and_verify(inputs, work, {**env, "PYTHONPATH": str(tree)}, images)
    return Row(project=inputs.name, envbuild=ours, uv=theirs, platform=platform,
               differences=differences(ours.versions, theirs.versions), image=image)


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuStack:
    """The stack an image is built on here: the CPU torch 2.13.0 wheel of ``$PIP_FIND_LINKS``,
    served as a one-file index (``torch_index``), Python 3.11 on ``base`` (no CUDA torch download)."""

    torch_index: str
    base: str

    def lines(self) -> tuple[str, ...]:
        return ('torch = "==2.13.0"', 'variant = "cpu"', "companions = false",
                f"base-image = {json.dumps(self.base)}", f"torch-index-url = {json.dumps(self.torch_index)}")


@contextlib.contextmanager
def torch_index(wheel: Path) -> Iterator[str]:
    """A PEP 503 index holding ``wheel`` alone, on a free 127.0.0.1 port; yields its /simple URL."""
    with tempfile.TemporaryDirectory(prefix="torch-index-") as tmp:
        root = Path(tmp)
        (root / "files").mkdir()
        (root / "files" / wheel.name).symlink_to(wheel.resolve())
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        page = root / "simple" / wheel.name.split("-")[0]
        page.mkdir(parents=True)
        page.joinpath("index.html").write_text(
            f'<html><body><a href="../../files/{quote(wheel.name)}#sha256={digest}">{wheel.name}</a>'
            "</body></html>\n", encoding="utf-8")

        quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *_: None})
        handler = functools.partial(quiet, directory=tmp)
        with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
            threading.Thread(target=server.serve_forever, daemon=True).start()
            try:
                yield f"http://127.0.0.1:{server.server_address[1]}/simple"
            finally:
                server.shutdown()  # serve_forever returns; leaving the with closes the socket


@dataclass(frozen=True, slots=True, kw_only=True)
class Images:
    """How the locked projects are built and verified: builder, CA bundle, the file held (flock)
    around each engine command, whether the images are kept, and the per-command timeout."""

    builder: str = "auto"
    ca_bundle: str | None = None
    engine_lock: Path | None = None
    keep: bool = False
    no_cache: bool = False
    timeout: float = 3600.0
    token: str = field(default_factory=lambda: f"{os.getpid()}-{int(time.time())}")


@dataclass(slots=True, kw_only=True)
class Image:
    """One project's image: tag, build and verify outcome, size, what the smoke test said."""

    tag: str
    build_exit: int | None = None
    build_seconds: float = 0.0
    build_error: str = ""
    backend: str = ""
    steps: int = 0
    ran: list[str] = field(default_factory=list)  # the build's steps not taken from the layer cache
    size: int = 0
    verify_exit: int | None = None
    verify_seconds: float = 0.0
    checks: list[tuple[str, str, str]] = field(default_factory=list)  # (name, status, message)
    imports: tuple[str, ...] = ()
    import_exit: int | None = None
    import_output: str = ""


@contextlib.contextmanager
def engine(lock: Path | None) -> Iterator[None]:
    """Holds ``lock`` (flock, exclusive) while an engine command runs: one at a time per machine."""
    if lock is None:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _timed(command: list[str], cwd: Path, env: dict[str, str], timeout: float,
           lock: Path | None) -> tuple[int | None, float, str, str]:
    """(exit, seconds, stdout, stderr) of one engine command; the wait for ``lock`` is not timed."""
    with engine(lock):
        start = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return None, time.perf_counter() - start, "", f"killed after {timeout:.0f} s"
        return done.returncode, time.perf_counter() - start, done.stdout, done.stderr


def build_and_verify(inputs: Inputs, work: Path, env: dict[str, str], images: Images) -> Image:
    """``envbuild build --lock`` of the lock in ``work``, ``envbuild verify --cpu-ok`` of the
    image, the project's own packages imported in it, and its size; removed unless ``keep``."""
    image = Image(tag=f"envbuild-bench/real-{inputs.name.lower()}:{images.token}", imports=inputs.imports)
    envbuild = [sys.executable, "-m", "envbuild"]
    build = [*envbuild, "build", "--lock", "envbuild.lock", "--network", "host", "--tag", image.tag,
             "--builder", images.builder, "--report", "build-report.json",
             *(["--ca-bundle", images.ca_bundle] if images.ca_bundle else []),
             *(["--no-cache"] if images.no_cache else [])]
    lock = images.engine_lock
    image.build_exit, image.build_seconds, _, err = _timed(build, work, env, images.timeout, lock)
    if image.build_exit != 0:
        image.build_error = first_error(err, "")
        return image
    try:
        report = json.loads((work / "build-report.json").read_text(encoding="utf-8"))
        image.backend, image.steps = str(report["backend"]), int(report["steps"])
        image.ran = [str(step) for step in report["ran"]]
        done = subprocess.run(["docker", "image", "inspect", image.tag, "--format", "{{.Size}}"],
                              capture_output=True, text=True, check=True)
        image.size = int(done.stdout.strip())
        verify = [*envbuild, "verify", image.tag, "--cpu-ok", "--json"]
        image.verify_exit, image.verify_seconds, out, err = _timed(verify, work, env, images.timeout, lock)
        try:
            image.checks = [(str(c["name"]), str(c["status"]), str(c.get("message", "")))
                            for c in json.loads(out)["checks"]]
        except (ValueError, KeyError, TypeError):
            image.checks = [("verify", "error", first_error(err, ""))]
        if inputs.imports:
            names = json.dumps(list(inputs.imports))
            code = (f"import importlib, json; print(json.dumps({{m: getattr(importlib.import_module(m), "
                    f"'__version__', '?') for m in {names}}}))")
            python = ["docker", "run", "--rm", "--network", "none", image.tag, "/opt/venv/bin/python", "-c"]
            image.import_exit, _, out, err = _timed([*python, code], work, env, images.timeout, lock)
            image.import_output = (out + err).strip()[-600:]
    finally:
        if not images.keep:
            with engine(lock):
                subprocess.run(["docker", "image", "rm", image.tag], capture_output=True, check=False)
    return image


def _cut(text: str, most: int = 240) -> str:
    """A long one-line error, shortened for the table (--json keeps it whole)."""
    return text if len(text) <= most else text[:most - 1] + "…"


def _count(side: Side) -> str:
    return str(len(side.versions)) if side.exit == 0 else "-"


def _code(side: Side) -> str:
    return _code_of(side.exit)


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


def image_table(rows: list[Row]) -> str:
    """The Markdown table of the images (``--build``): one line per project whose lock was built."""
    out = ["| project | build exit | builder | steps run | build s | size MB | verify exit | verify s "
           "| checks (pass/skip/other) | imports | first failure |", "|---" * 11 + "|"]
    for row in rows:
        if (image := row.image) is None:
            continue
        statuses = [status for _, status, _ in image.checks]
        counted = (f"{statuses.count('pass')}/{statuses.count('skip')}/"
                   f"{len(statuses) - statuses.count('pass') - statuses.count('skip')}")
        failed = next((f"{name}: {message}" for name, status, message in image.checks
                       if status not in ("pass", "skip")), image.build_error)
        imports = "-" if image.import_exit is None else ("ok" if image.import_exit == 0 else
                                                         f"exit {image.import_exit}")
        out.append(f"| {row.project} | {_code_of(image.build_exit)} | {image.backend} "
                   f"| {len(image.ran)}/{image.steps} | {image.build_seconds:.0f} "
                   f"| {image.size / 1e6:.0f} | {_code_of(image.verify_exit)} | {image.verify_seconds:.0f} "
                   f"| {counted} | {imports} | {_cut(failed).replace('|', chr(92) + '|')} |")
    return "\n".join(out)


def _code_of(code: int | None) -> str:
    return "timeout" if code is None else str(code)


def document(rows: list[Row], python: str) -> dict[str, object]:
    def side(s: Side) -> dict[str, object]:
        return {**asdict(s), "seconds": round(s.seconds, 1), "packages": len(s.versions)}
    return {"driver": DRIVER, "python": python,
            "projects": [{"project": r.project, "platform": r.platform,
                          "envbuild": side(r.envbuild), "uv": side(r.uv),
                          "differences": [{"package": n, "envbuild": a, "uv": b}
                                          for n, a, b in r.differences],
                          **({"image": asdict(r.image)} if r.image else {})} for r in rows]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="envbuild tree to test (PYTHONPATH)")
    parser.add_argument("--project", action="append", help="only this project (repeatable)")
    parser.add_argument("--python", choices=("3.11", "3.12"),
                        help="default 3.12; 3.11 with --cpu-torch (its wheel is cp311)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--uv-cache", type=Path, default=Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild-bench" / "uv")
    parser.add_argument("--project-line", action="append", default=[], metavar="TOML",
                        help="a top-level line added to every envbuild.toml, e.g. "
                             "'build-sdists = true' (repeatable; the table then measures that setting)")
    parser.add_argument("--cpu-torch", type=Path, metavar="WHEEL",
                        help="lock (and build) on this CPU torch wheel, served as a one-file index "
                             "on 127.0.0.1 (torch pinned to 2.13.0, variant cpu, no companions)")
    parser.add_argument("--base-image", default="envbuild-test/bookworm:base",
                        help="with --cpu-torch: the image FROM (default %(default)s)")
    parser.add_argument("--build", action="store_true",
                        help="also build each lock into an image (envbuild build --lock), verify it "
                             "(--cpu-ok), import the project's modules in it and measure it")
    parser.add_argument("--builder", default="auto", choices=("auto", "buildah", "classic", "buildx"))
    parser.add_argument("--ca-bundle", default=os.environ.get("PIP_CERT"),
                        help="PEM bundle the build trusts (default $PIP_CERT)")
    parser.add_argument("--engine-lock", type=Path,
                        help="a file held (flock) around each engine command, e.g. /tmp/helpers-docker.lock")
    parser.add_argument("--keep-images", action="store_true", help="keep the images built")
    parser.add_argument("--no-cache", action="store_true", help="build with no layer cache (a cold build)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    python = args.python or ("3.11" if args.cpu_torch else "3.12")
    index = index_url(None, os.environ)
    uv = find_uv(None)
    images = Images(builder=args.builder, ca_bundle=args.ca_bundle, engine_lock=args.engine_lock,
                    keep=args.keep_images, no_cache=args.no_cache) if args.build else None
    rows = []
    with contextlib.ExitStack() as stack:
        cpu = CpuStack(torch_index=stack.enter_context(torch_index(args.cpu_torch)),
                       base=args.base_image) if args.cpu_torch else None
        for inputs in corpus(args.project):
            print(f"{inputs.name}: locking{' and building' if images else ''}", file=sys.stderr, flush=True)
            rows.append(measure(inputs, tree=args.tree.resolve(), python=python,
                                timeout=args.timeout, cache=args.uv_cache, index=index, uv=uv,
                                more=tuple(args.project_line), cpu=cpu, images=images))
    if args.json:
        print(json.dumps(document(rows, python), indent=2))
    else:
        print(table(rows) + ("\n\n" + image_table(rows) if images else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
