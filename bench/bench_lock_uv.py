"""``envbuild lock`` against ``uv pip compile`` of the same closure with hashes, side by side.

A sample project of about 100 distributions: torch 2.13.0 (the package index's wheel and its
nvidia-* libraries) and 19 common dependencies (requests, pandas, scipy, scikit-learn,
matplotlib, aiohttp, fastapi, transformers, …), Python 3.11, no companions. Both sides read
the same index (pip's configured one, or ``--index-url``), share one warm uv cache and write
a fresh output each run (no previous lock to keep pins from; ``--relock``: each run over the
previous one's output, whose pins both keep, as a team locks again):

  envbuild   ``python -m envbuild lock --no-registry`` in the project's directory: the stack,
             uv's locking run and the survey (what wheels-only resolution held back: one run
             allowing sdists where uv's log proves it answered as wheels-only would), the torch
             layer, the build's installer, the check of every file's sha256 against the
             index's pages, the lock written
  uv alone   ``uv pip compile pyproject.toml --format pylock.toml --generate-hashes`` of the
             generated project ``envbuild lock`` gives uv (the same requirements, the torch pin
             from its index, the same platform and Python): what a team without envbuild runs

The runs are interleaved (ABBA…) so that the load of other work on the machine falls on both
sides alike; the medians of the wall-clock seconds and their ratio are printed (target <= 1.25, issue 40),
with the median of each round's ratio and its distribution-free 95% interval (the verdict that a
drifting machine moves least),
and the CPU seconds (user + system, the command and its children) beside them, which the
other work on the machine moves less. ``--also DIR`` times a
second envbuild tree (e.g. an older commit, from ``git archive``) in the same rounds.
``--base-digest`` locks with the base image pinned by digest from a docker-registry started on
127.0.0.1 (the base pushed there first) instead of ``--no-registry``.
Needs the configured package index (network). Usage:
  python bench/bench_lock_uv.py [--rounds 7] [--index-url URL] [--also DIR] [--base-digest] [--relock]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbuild.pylock.uv import ClosureSpec, find_uv, platform_tag, project_text, uv_environment  # noqa: E402
from envbuild.upstream.pipconfig import index_url  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_diagnose import median_interval  # noqa: E402
from bench_resolve import compile_package  # noqa: E402

DEPENDENCIES = ("requests", "pandas", "scipy", "scikit-learn", "matplotlib", "aiohttp", "fastapi",
                "uvicorn", "pydantic", "sqlalchemy", "transformers", "accelerate", "rich", "typer",
                "httpx", "einops", "tqdm", "pyyaml", "click")
TARGET_RATIO = 1.25
# a round this long waited on the name resolver's 5 s retry (docs/reports/tests-whole-and-lock-2026-11-28.md)
STALL_S = 4.0
# A pause before each run: here a name look-up made within about a second of the previous
# run's stalls on the resolver's 5 s retry (3 of 12 back-to-back uv runs; none of 12 with 0.9 s
# between them), which fell on whichever side looked up soonest after its start: uv alone.
PAUSE_S = 1.0


def project(directory: Path, base: str, index: str | None) -> None:
    quoted = ", ".join(json.dumps(d) for d in DEPENDENCIES)
    text = (f'[project]\nname = "bench"\nversion = "0"\nrequires-python = ">=3.11"\n'
            f"dependencies = [{quoted}]\n\n[tool.envbuild]\ntorch = \"==2.13.0\"\n"
            f'variant = "default"\npython = "3.11"\ncompanions = false\nbase-image = {json.dumps(base)}\n')
    if index is not None:
        text += f"index-url = {json.dumps(index)}\n"
    (directory / "pyproject.toml").write_text(text)


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[tuple[float, float],
                                                                       subprocess.CompletedProcess[str]]:
    """(wall seconds, CPU seconds of the command and its children), the finished process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return (took, cpu), done


def envbuild_lock(directory: Path, tree: Path, extra: list[str],
                  relock: bool = False) -> Callable[[], tuple[float, float]]:
    def once() -> tuple[float, float]:
        for name in ("envbuild.lock", "pylock.toml"):
            if not relock:
                (directory / name).unlink(missing_ok=True)
        # Each tree its own envbuild cache (the resolver's kept index is valid for the code
        # that wrote it: two trees sharing one would each rebuild it every run).
        took, done = timed([sys.executable, "-m", "envbuild", "lock", *extra], directory,
                           {**os.environ, "PYTHONPATH": str(tree),
                            "XDG_CACHE_HOME": str(directory.parent / f"{directory.name}-cache")})
        if done.returncode != 0:
            sys.exit(f"bench_lock_uv: envbuild lock ({tree}) failed ({done.returncode}): "
                     f"{done.stderr[-2000:]}")
        return took
    return once


def uv_compile(directory: Path, lock: dict[str, object], index: str,
               relock: bool = False) -> Callable[[], tuple[float, float]]:
    """uv pip compile of the project envbuild generates for the locked target's pins
    (``relock``: its previous output kept, whose pins uv prefers)."""
    stack = lock["stack"]
    assert isinstance(stack, dict)
    pylock = lock["pylock"]
    assert isinstance(pylock, dict)
    torch_index = lock["index_url"]  # None: torch comes from the default index
    spec = ClosureSpec(torch_pins={"torch": str(stack["torch"])},
                       torch_index=None if torch_index is None else str(torch_index),
                       python=str(stack["python"]), glibc="2." + str(pylock["platform"]).rsplit("_", 1)[-1],
                       dependencies=DEPENDENCIES, default_index=index)
    (directory / "pyproject.toml").write_text(project_text(spec))
    command = [find_uv(None), "pip", "compile", "pyproject.toml", "--no-config", "--quiet",
               "--only-binary", ":all:", "--python-platform", platform_tag(spec.glibc),
               "--python-version", spec.python, "--python", sys.executable, "--default-index", index,
               "--format", "pylock.toml", "--generate-hashes", "-o", "pylock.toml"]
    env = uv_environment(os.environ)

    def once() -> tuple[float, float]:
        if not relock:
            (directory / "pylock.toml").unlink(missing_ok=True)
        took, done = timed(command, directory, env)
        if done.returncode != 0:
            sys.exit(f"bench_lock_uv: uv pip compile failed: {done.stderr[-2000:]}")
        return took
    return once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--index-url", help="the default index (default: pip's configuration)")
    parser.add_argument("--also", type=Path, help="another envbuild tree to time in the same rounds")
    parser.add_argument("--base-digest", action="store_true",
                        help="pin the base by digest from a loopback docker-registry (else --no-registry)")
    parser.add_argument("--relock", action="store_true",
                        help="lock again over the previous output (its pins kept), on both sides")
    args = parser.parse_args()
    index = args.index_url or index_url(None, os.environ)
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-lockuv-") as scratch:
        root = Path(scratch)
        # Both caches start empty here and are warm after the first run: uv's (shared by both
        # sides) and envbuild's own (the matrices, the index pages' sha256s it has seen; one
        # per envbuild tree, beside its project directory).
        os.environ["UV_CACHE_DIR"] = str(root / "uv-cache")
        os.environ["XDG_CACHE_HOME"] = str(root / "cache")
        extra, registry = ["--no-registry"], None
        base = "envbuild-test/bookworm:base"
        if args.base_digest:
            from bench_lock_build import push_base, start_registry

            registry, address = start_registry(root)
            base, extra = push_base(address), []
        try:
            return measure(args, root, base, index, extra)
        finally:
            if registry is not None:
                subprocess.run(["docker", "rmi", base], capture_output=True, check=False)
                registry.terminate()
                registry.wait(10)


def measure(args: argparse.Namespace, root: Path, base: str, index: str, extra: list[str]) -> int:
    sides: dict[str, Callable[[], tuple[float, float]]] = {}
    for name, tree in (("envbuild", ROOT), ("also", args.also)):
        if tree is None:
            continue
        work = root / name
        work.mkdir()
        compile_package(tree.resolve() / "envbuild")  # as installed: no module compiled per run
        project(work, base, args.index_url)
        sides[name] = envbuild_lock(work, tree.resolve(), extra, args.relock)
    sides["envbuild"]()  # fills the uv cache: every run below is warm
    lock = json.loads((root / "envbuild" / "envbuild.lock").read_text())["targets"]["default"]
    (root / "uv").mkdir()
    sides["uv alone"] = uv_compile(root / "uv", lock, index, args.relock)
    for once in sides.values():
        once()  # a warm-up of each side
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            time.sleep(PAUSE_S)
            times[name].append(sides[name]())
        loads.append(os.getloadavg()[0])
    uv_distributions = (root / "uv" / "pylock.toml").read_text().count("[[packages]]")
    layer = len(lock["pylock"]["torch_layer"])
    print(f"closure         {len(lock['packages'])} distributions in envbuild's lock ({layer} "
          f"in the torch layer); uv alone: {uv_distributions}; base "
          f"{'by digest (loopback registry)' if not extra else 'a tag (--no-registry)'}"
          f"{'; each run over the previous output (--relock)' if args.relock else ''}")
    print(f"load average    {min(loads):.2f} to {max(loads):.2f} (1 min) over {args.rounds} "
          f"interleaved rounds, {os.cpu_count()} cores")
    # Medians of the runs that did not wait on the name resolver's retry (all, where every one did).
    kept = {name: [r for r in t if r[0] <= STALL_S] or t for name, t in times.items()}
    medians = {name: statistics.median(w for w, _ in t) for name, t in kept.items()}
    cpu = {name: statistics.median(c for _, c in t) for name, t in kept.items()}
    for name, runs in times.items():
        print(f"{name:<15} median {medians[name]:5.2f} s wall, {cpu[name]:5.2f} s CPU  "
              f"[{', '.join(f'{w:.2f}' for w, _ in runs)}]")
    stalled = {name: sum(w > STALL_S for w, _ in runs) for name, runs in times.items()}
    if any(stalled.values()):
        print(f"stalled         rounds over {STALL_S:g} s (the name resolver's retry; not in the medians): "
              + ", ".join(f"{name} {count} of {len(times[name])}" for name, count in stalled.items()))
    ratio = medians["envbuild"] / medians["uv alone"]
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(f"ratio           envbuild / uv alone {ratio:.2f}x wall (target <= {TARGET_RATIO}): {verdict}; "
          f"{cpu['envbuild'] / cpu['uv alone']:.2f}x CPU")
    # A round where either side waited on the name resolver's retry measures that wait, not the
    # tools: its ratio is left out (it was always uv alone's, which made envbuild look faster).
    rounds = list(zip(times["envbuild"], times["uv alone"], strict=True))
    paired = [e / u for (e, _), (u, _) in rounds if e <= STALL_S and u <= STALL_S]
    left_out = f" ({len(rounds) - len(paired)} stalled rounds left out)" if len(paired) < len(rounds) else ""
    middle, interval = statistics.median(paired), median_interval(paired)
    if interval is None:
        print(f"paired          median {middle:.2f}x over {len(paired)} rounds{left_out}: too few for an "
              "interval (6 at least)")
    else:
        low, high = interval
        judged = ("met" if high <= TARGET_RATIO else "MISSED" if low > TARGET_RATIO
                  else "inconclusive (the interval straddles the target: more rounds)")
        print(f"paired          each round's envbuild / its uv alone: median {middle:.2f}x, 95% interval "
              f"{low:.2f}-{high:.2f}x over {len(paired)} rounds{left_out} (target <= {TARGET_RATIO}): "
              f"{judged}")
    if "also" in medians:
        print(f"ratio (--also)  {medians['also'] / medians['uv alone']:.2f}x wall, "
              f"{cpu['also'] / cpu['uv alone']:.2f}x CPU")
    if shutil.which("uptime"):
        print(f"uptime          {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
