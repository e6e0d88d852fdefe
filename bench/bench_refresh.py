#!/usr/bin/env python3
"""Benchmark: refresh every torch release's default-wheel facts from the package index.

Cold cache (every METADATA read through HTTP range requests), then warm (ETag and
METADATA caches). Prints wall time and bytes per run; targets: <= 60 s, <= 1 MB per
release. The index is the configured one (PIP_INDEX_URL, then pip's configuration).

    python bench/bench_refresh.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envbuild.upstream import refresh

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as tmp:
        data = Path(tmp) / "matrices"
        shutil.copytree(REPO / "matrices", data)
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        options = refresh.RefreshOptions(matrices=data, sources=("pypi",), only=frozenset({"torch"}),
                                         dry_run=True)
        releases = len(refresh.read_documents(data)["torch_pypi"]["rows"])
        ok = True
        for label in ("cold", "warm"):
            report = refresh.refresh(options, env, lambda message: None)
            per = report.bytes_received / max(1, releases)
            print(f"{label}: {report.seconds:.1f} s, {report.bytes_received} bytes in "
                  f"{report.requests_made} requests ({per / 1e6:.3f} MB per release, "
                  f"{releases} releases)")
            ok = ok and report.seconds <= 60 and per <= 1e6
    print("targets (<= 60 s, <= 1 MB per release):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
