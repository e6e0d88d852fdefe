"""A warm rebuild after a change that touches one small wheel: buildah with pip's cache mount
against Docker's classic builder, side by side.

The CPU stack (torch 2.13.0 from the $PIP_FIND_LINKS wheelhouse, on the local Debian base) with a
few small extra packages from pip's configured index is built once with each builder (warming
Docker's layer cache and buildah's pip cache mount). Then one small pin changes (six 1.16.0 →
1.17.0) and each builder builds again:

  seconds     the rebuild's wall time (``envbuild build``)
  downloaded  wheels pip fetched during the rebuild ("Downloading …" lines)
  from cache  wheels pip took from its cache ("Using cached …": only with the cache mount)
  ran         the steps that ran rather than coming from a layer cache (buildah runs without
              --layers: every step, see DEVELOPERS.md)

The stack-only path: ``envbuild lock`` needs the variant's index, which is not reachable where
this was written. Needs dockerd, buildah, the base image (scripts/base-image.sh) and pip's
configured index. Usage: python bench/bench_rebuild_cache.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ["idna", "attrs", "packaging", "tqdm"]
BEFORE, AFTER = "six==1.16.0", "six==1.17.0"


def build(directory: Path, builder: str, six: str) -> dict[str, Any]:
    wheelhouse = os.environ["PIP_FIND_LINKS"]
    args = ["build", "--torch", "==2.13.0", "--variant", "cpu", "--python", "3.11",
            "--no-companions", "--base-image", "envbuild-test/bookworm:base", "--wheelhouse",
            wheelhouse, "--network", "host", "--builder", builder,
            "--tag", f"envbuild-bench/rebuild:{builder}", "--report", str(directory / "report.json"),
            "--verbose", *[a for p in [*EXTRAS, six] for a in ("--pip-package", p)]]
    if os.environ.get("PIP_CERT"):
        args += ["--ca-bundle", os.environ["PIP_CERT"]]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "envbuild", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=3600)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_rebuild_cache: {builder} build failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads((directory / "report.json").read_text())
    lines = done.stderr.splitlines()
    return {"seconds": took, "ran": report["ran"],
            "downloaded": sum(1 for line in lines if line.strip().startswith("Downloading ")),
            "cached": sum(1 for line in lines if line.strip().startswith("Using cached "))}


def main() -> int:
    if not os.environ.get("PIP_FIND_LINKS"):
        sys.exit("bench_rebuild_cache: set PIP_FIND_LINKS to a wheelhouse with the CPU torch wheel")
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-rebuild-") as scratch:
        work = Path(scratch)
        warm = {b: build(work, b, BEFORE) for b in ("classic", "buildah")}
        again = {b: build(work, b, AFTER) for b in ("classic", "buildah")}
    subprocess.run(["buildah", "--storage-driver", "vfs", "rmi", "envbuild-bench/rebuild:buildah"],
                   capture_output=True, check=False)
    print(f"change          --pip-package {BEFORE} -> {AFTER} (with {', '.join(EXTRAS)})")
    print(f"{'':16}{'classic':>12}{'buildah+cache':>16}")
    print(f"{'first build':16}{warm['classic']['seconds']:>10.1f} s{warm['buildah']['seconds']:>14.1f} s")
    print(f"{'rebuild':16}{again['classic']['seconds']:>10.1f} s{again['buildah']['seconds']:>14.1f} s")
    print(f"{'downloaded':16}{again['classic']['downloaded']:>12}{again['buildah']['downloaded']:>16}")
    print(f"{'from cache':16}{again['classic']['cached']:>12}{again['buildah']['cached']:>16}")
    for name in ("classic", "buildah"):
        print(f"ran ({name}):".ljust(16) + "; ".join(s[:60] for s in again[name]["ran"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
