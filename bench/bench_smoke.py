"""How long the smoke test takes, tier by tier, this tree against another, interleaved.

`verify` runs the smoke test in every image and on every node of a fleet, so its wall time is
paid once per node. Each round runs ``python -m envbuild smoke --tier N --json`` (``--cpu-ok``
where no GPU is visible to torch) with this tree and, with ``--baseline DIR``, with that tree
(e.g. a ``git archive`` of an older commit), alternating which goes first. Printed: the medians
of the whole run's wall time and of each tier's seconds (the report's ``tier_seconds``), the
torch.compile check's own seconds and, with a baseline, the ratio of the medians (this tree /
baseline). On a GPU the device checks run; on a CPU only the compile and self-checks do.

PYTHONPATH=. python bench/bench_smoke.py [--tier 1] [--rounds 3] [--baseline OLD_TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def gpu_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def once(tree: Path, tier: int, cpu_ok: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "envbuild", "smoke", "--tier", str(tier), "--json",
               *(["--cpu-ok"] if cpu_ok else [])]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    wall = time.perf_counter() - started
    report = json.loads(done.stdout)
    compiled = next((c["seconds"] for c in report["checks"] if c["name"] == "torch.compile"), None)
    return {"wall": wall, "exit": report["exit_code"], "compile_check": compiled,
            **{f"T{t}": s for t, s in report["tier_seconds"].items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path)
    args = parser.parse_args()
    cpu_ok = not gpu_visible()
    trees = {"this tree": ROOT, **({"baseline": args.baseline} if args.baseline else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    print(f"smoke --tier {args.tier}{' --cpu-ok (no GPU visible)' if cpu_ok else ''}, "
          f"{args.rounds} rounds, load {os.getloadavg()[0]:.2f}", flush=True)
    for k in range(args.rounds):
        order = list(trees) if k % 2 == 0 else list(reversed(trees))
        for name in order:
            found = once(trees[name], args.tier, cpu_ok)
            runs[name].append(found)
            print(f"  round {k + 1} {name:10} " + "  ".join(
                f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}"
                for key, value in found.items()), flush=True)
    keys = [key for key in runs["this tree"][0] if key not in ("exit",)]
    medians = {name: {key: statistics.median(r[key] for r in found if r[key] is not None)
                      for key in keys} for name, found in runs.items()}
    for name, values in medians.items():
        print(f"{name:10} median " + "  ".join(f"{key} {value:.2f} s" for key, value in values.items()))
    if args.baseline:
        mine, theirs = medians["this tree"]["wall"], medians["baseline"]["wall"]
        print(f"ratio      wall {mine / theirs:.3f} (this tree / baseline); load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
