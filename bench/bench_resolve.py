"""Start-up cost of `envbuild resolve --driver 550 --json` against a bare interpreter.

All commands run interleaved in one loop, so machine noise hits each alike; the figure
that matters is the ratio of medians to `python -c pass` (target: <= 2.0, issue 2).

Measured forms, all with this interpreter (run it with the Python of the environment
envbuild is installed in; a clean venv shows the honest figure, since every `.pth` file
in site-packages slows the bare start too):

- the `envbuild` console script installed next to this interpreter, which is what users
  type. pip's launcher imports `re` before it hands over to envbuild, so its floor is
  printed too: `python -c "import re"`;
- `python -m envbuild`, whose floor is `runpy`'s imports.

The first resolve warms the on-disk index cache, as a user's second run would find it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

RUNS = 31
ARGS = ["resolve", "--driver", "550", "--json"]
TARGET = 2.0


def forms() -> list[tuple[str, list[str]]]:
    found = [("python -c pass", [sys.executable, "-c", "pass"]),
             ("python -c 'import re'", [sys.executable, "-c", "import re"])]
    script = os.path.join(os.path.dirname(sys.executable), "envbuild")
    if os.access(script, os.X_OK):
        found.append(("envbuild " + " ".join(ARGS), [script, *ARGS]))
    else:
        print(f"no console script at {script}: install envbuild into this interpreter's "
              "environment to measure it", file=sys.stderr)
    found.append(("python -m envbuild " + " ".join(ARGS), [sys.executable, "-m", "envbuild", *ARGS]))
    return found


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    measured = forms()
    for _, cmd in measured[2:]:
        wall(cmd)  # warm the index cache and the page cache
    times: list[list[float]] = [[] for _ in measured]
    for _ in range(RUNS):
        for slot, (_, cmd) in zip(times, measured, strict=True):
            slot.append(wall(cmd))
    bare = statistics.median(times[0])
    print(f"{RUNS} interleaved runs each, median wall; ratio to python -c pass (target <= {TARGET:.2f}x)")
    worst = 0.0
    for i, ((label, _), slot) in enumerate(zip(measured, times, strict=True)):
        median = statistics.median(slot)
        ratio = median / bare
        if i >= 2:
            worst = max(worst, ratio)
        print(f"  {median * 1000:7.1f} ms  {ratio:5.2f}x  {label}")
    verdict = "met" if worst <= TARGET else "MISSED"
    print(f"worst envbuild form: {worst:.2f}x — target {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
