"""Start-up cost of `envbuild resolve --driver 550 --json` against a bare interpreter.

Both commands run interleaved in one process tree, so machine noise hits both alike;
the figure that matters is the ratio of medians (target: <= 2.0). The first resolve
warms the on-disk matrix cache, as a user's second run would find it.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

RUNS = 21
BARE = [sys.executable, "-c", "pass"]
RESOLVE = [sys.executable, "-m", "envbuild", "resolve", "--driver", "550", "--json"]


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    wall(RESOLVE)  # warm the matrix cache and the page cache
    bare, resolve = [], []
    for _ in range(RUNS):
        bare.append(wall(BARE))
        resolve.append(wall(RESOLVE))
    b, r = statistics.median(bare), statistics.median(resolve)
    print(f"python -c pass             median {b * 1000:7.1f} ms  ({RUNS} runs)")
    print(f"envbuild resolve --json    median {r * 1000:7.1f} ms  ({RUNS} runs)")
    print(f"ratio {r / b:.2f}x (target <= 2.00x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
