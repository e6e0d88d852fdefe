"""``fleet verify`` of two node types: side by side (what it does) against one after the other.

Starts the tests' real Slurm (tests/slurm_cluster.py: munged, slurmctld, two slurmd on 127.0.0.1,
two partitions) and runs each node's smoke test with the ``host`` launcher (this interpreter,
``--cpu-ok``), then prints, measured in this one run:

  each alone        seconds of a fleet verify of one node type (its node's smoke test + scheduling)
  one after other   the two node types verified in turn (the sum)
  side by side      both submitted at once, as ``fleet verify`` does        target ~ the slowest + scheduling
  ratio             one after other / side by side                           target ~ 2 with two free CPUs

The nodes share this machine's CPUs: with fewer free cores than nodes, side by side cannot beat
the sum by much, and the ratio says so. Needs root, slurm-wlm, munge and torch. Usage:
  python bench/bench_fleet.py [--tier 1] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from envbuild.fleet.placement import Placement, SlurmPlacement  # noqa: E402
from envbuild.fleet.plan import FleetTarget, RunOptions  # noqa: E402
from envbuild.fleet.slurm import SlurmEngine, clear_reports  # noqa: E402
from envbuild.fleet.verify import render_fleet, run_fleet  # noqa: E402
from envbuild.render.lockset import LockSet  # noqa: E402
from envbuild.render.output import write_output  # noqa: E402

TYPES = ("typea", "typeb")


def targets() -> list[FleetTarget]:
    found = []
    for name in TYPES:
        slurm = SlurmPlacement(partition=name, gres=f"gpu:{name}", launcher="host",
                               host_python=sys.executable)
        placement = Placement(nodes=1, gpus_per_node=1, slurm=slurm)
        found.append(FleetTarget(name=name, placement=placement, nodes=1, gpus_per_node=1, image=None))
    return found


def timed(engine: SlurmEngine, directory: Path, chosen: list[FleetTarget]) -> float:
    clear_reports(directory, [t.name for t in chosen])
    start = time.perf_counter()
    report = run_fleet(engine, chosen, deadline=600)
    seconds = time.perf_counter() - start
    if not report.passed:
        raise SystemExit(f"fleet failed: {[t.why() for t in report.targets]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", type=int, default=1, help="smoke tiers on each node (default 1)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each way; the best is kept")
    args = parser.parse_args()
    from fleet_lock import matching_lock  # type: ignore[import-not-found]
    from slurm_cluster import missing_binaries, slurm_cluster  # type: ignore[import-not-found]

    if missing_binaries() or os.geteuid() != 0:
        raise SystemExit("needs root and slurm-wlm + munge (apt-get install slurm-wlm munge)")
    fleet = targets()
    options = RunOptions(cpu_ok=True, tier=args.tier, deadline=600)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, \
            slurm_cluster(Path(tmp) / "slurm") as cluster:
        directory = Path(tmp) / "fleet"
        lock = LockSet(targets={t.name: replace(matching_lock(), fleet=t.placement) for t in fleet})
        files = render_fleet("slurm", fleet, options, lock_bytes=lock.to_json().encode())
        write_output(files, directory, force=False)
        engine = SlurmEngine(cluster.env, directory)
        alone = {t.name: min(timed(engine, directory, [t]) for _ in range(args.repeat)) for t in fleet}
        sequential = min(sum(timed(engine, directory, [t]) for t in fleet) for _ in range(args.repeat))
        parallel = min(timed(engine, directory, fleet) for _ in range(args.repeat))
    print(f"cpus on this machine: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}")
    for name, seconds in alone.items():
        print(f"each alone       {name}: {seconds:6.1f} s")
    print(f"one after other        {sequential:6.1f} s")
    print(f"side by side           {parallel:6.1f} s   (slowest alone {max(alone.values()):.1f} s)")
    print(f"ratio                  {sequential / parallel:6.2f}   (target ~2 with two free CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
