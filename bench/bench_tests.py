"""How long the test commands take, and which tests take it.

Runs the quick tier (`bash scripts/test.sh --quick`: ruff, mypy, then every test needing no
engine, Slurm or network over pytest-xdist workers) and, with `--whole`, the whole suite
(`bash scripts/test.sh`, what .ci/run runs), each timed by the wall clock from start to exit,
lint and types included. pytest writes a JUnit XML report (`--junitxml`) whose per-test time
is its set-up, call and tear-down together; the slowest tests are listed from it.

The machine's load average is printed before and after each run: the development machines are
shared, and a figure taken beside other sessions' work says so. The CPU seconds the run's
processes used (user + system) are printed too, and that figure over the core count: what the
wall time would be on cores that run nothing else, were the work spread evenly over them. Run it
from the checkout, with the environment the tests use (`pip install -e '.[test]'`) active:

    python bench/bench_tests.py                  # the quick tier and its 20 slowest tests
    python bench/bench_tests.py --whole --top 30 # both tiers (the whole one needs the engine)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Timing:
    """One test's time as the JUnit report records it (set-up + call + tear-down)."""

    nodeid: str
    seconds: float
    outcome: str  # passed, failed, error or skipped


@dataclass(frozen=True)
class TierRun:
    name: str
    wall_s: float
    cpu_s: float  # user + system seconds of every process the run started
    exit_code: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    tests: list[Timing]


def read_junit(path: Path) -> list[Timing]:
    """Every test case of a pytest JUnit XML report, named as pytest names it (file::test)."""
    found: list[Timing] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        # pytest writes "tests.test_foo" (a module) or "tests.test_foo.TestClass": the file is
        # the longest prefix that exists, the rest a class inside it.
        file, parts = classname, classname.split(".")
        for cut in range(len(parts), 0, -1):
            candidate = "/".join(parts[:cut]) + ".py"
            if (ROOT / candidate).is_file():
                file = "::".join([candidate, *parts[cut:]])
                break
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        found.append(Timing(f"{file}::{name}", float(case.get("time", "0") or 0), outcome))
    return found


def run_tier(name: str, args: list[str], extra: list[str]) -> TierRun:
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-tests-") as tmp:
        # one JUnit report per part of the run (scripts/test.sh's ENVBUILD_TEST_REPORTS)
        command = ["bash", str(ROOT / "scripts" / "test.sh"), *args, *extra]
        print(f"$ ENVBUILD_TEST_REPORTS={tmp} {' '.join(command)}", flush=True)
        before = os.getloadavg()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, check=False,
                              env={**os.environ, "ENVBUILD_TEST_REPORTS": tmp})
        wall = time.perf_counter() - start
        after = os.getloadavg()
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
        tests = [t for report in sorted(Path(tmp).glob("part-*.xml")) for t in read_junit(report)]
    return TierRun(name, wall, cpu, done.returncode, before, after, tests)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s"


def summary(run: TierRun, top: int) -> str:
    cores = os.cpu_count() or 1
    counts: dict[str, int] = {}
    for test in run.tests:
        counts[test.outcome] = counts.get(test.outcome, 0) + 1
    load = "load average {:.2f} {:.2f} {:.2f} before, {:.2f} {:.2f} {:.2f} after".format(
        *run.load_before, *run.load_after)
    lines = [f"{run.name}: {minutes(run.wall_s)} wall, exit {run.exit_code}, "
             + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
             + f" ({cores} cores; {load})",
             f"  CPU: {minutes(run.cpu_s)} (user + system, every process): {minutes(run.cpu_s / cores)} "
             f"on {cores} cores that run nothing else",
             f"  test time summed over workers: {minutes(sum(t.seconds for t in run.tests))}",
             f"  the {top} slowest tests (set-up + call + tear-down):"]
    for test in sorted(run.tests, key=lambda t: t.seconds, reverse=True)[:top]:
        lines.append(f"  {test.seconds:7.2f} s  {test.nodeid}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--whole", action="store_true",
                        help="also time the whole suite (needs the Docker engine, Slurm, the index)")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments for both tiers (after --)")
    options = parser.parse_args(argv)
    runs = [run_tier("quick tier (scripts/test.sh --quick)", ["--quick"], options.pytest_args)]
    if options.whole:
        runs.append(run_tier("whole suite (scripts/test.sh)", [], options.pytest_args))
    print()
    for run in runs:
        print(summary(run, options.top))
        print()
    return max(run.exit_code for run in runs)


if __name__ == "__main__":
    sys.exit(main())
