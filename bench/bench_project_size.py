"""How reading a project file grows with its size (docs/faults.md Q4).

Loads an envbuild.toml of N dependencies (and a requirements file of N more) for N = 4,000
and 40,000 and prints the seconds of each and their ratio: about 10 means linear work; the
old line lookup, which read the text again for every key it placed, made it about 100 (and
40,000 dependencies took an estimated half hour). Also prints the same for ``line_of`` alone.
No network, no Docker. Usage:
  python bench/bench_project_size.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbuild.project.config import load_project  # noqa: E402
from envbuild.project.toml import line_of  # noqa: E402


def load_seconds(count: int) -> float:
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as tmp:
        root = Path(tmp)
        names = ", ".join(f'"pkg-{i}>=1"' for i in range(count))
        (root / "envbuild.toml").write_text(f'requirements = ["r.txt"]\ndependencies = [{names}]\n')
        (root / "r.txt").write_text("".join(f"req-{i}>=1\n" for i in range(count)))
        started = time.perf_counter()
        project = load_project(None, root)
        elapsed = time.perf_counter() - started
        assert len(project.dependencies) == 2 * count
        return elapsed


def lookup_seconds(count: int) -> float:
    text = "dependencies = [\n" + "".join(f'  "dep{i}",\n' for i in range(count)) + "]\n"
    started = time.perf_counter()
    for i in range(count):
        line_of(text, ["dependencies", i])
    return time.perf_counter() - started


def main() -> None:
    for what, measure in (("load_project", load_seconds), ("line_of", lookup_seconds)):
        small, large = measure(4_000), measure(40_000)
        print(f"{what:13} 4,000: {small:7.3f} s   40,000: {large:7.3f} s   "
              f"ratio {large / small:5.1f} (linear ~10, quadratic ~100)")


if __name__ == "__main__":
    main()
