"""A warm rebuild after a lock change that touches one small wheel: buildah with pip's cache
mount against Docker's classic builder, side by side.

A sample project (CPU torch from the $PIP_FIND_LINKS wheelhouse, a few small dependencies) is
locked with ``envbuild lock`` and built once with each builder (warming both layer caches and
buildah's pip cache mount). Then one small pin changes (six 1.16.0 → 1.17.0), the project is
locked again and rebuilt with each builder:

  seconds     the rebuild's wall time (``envbuild build``)
  downloaded  wheels pip fetched during the rebuild ("Downloading …" lines)
  from cache  wheels pip took from its cache ("Using cached …": only with the cache mount)
  ran         the steps that ran rather than coming from the layer cache

The base image is the local Debian one pushed to a docker-registry on 127.0.0.1 (so ``lock``
pins it by digest). Needs dockerd, buildah, docker-registry, the configured package index.
Usage: python bench/bench_rebuild_cache.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_lock_build import envbuild, push_base, start_registry

DEPENDENCIES = ["idna>=3.7", "attrs>=23.1", "packaging>=24", "tqdm>=4.66"]
BEFORE, AFTER = "six==1.16.0", "six==1.17.0"


def project(directory: Path, base: str, six: str) -> None:
    deps = ", ".join(json.dumps(d) for d in [*DEPENDENCIES, six])
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "bench"\nversion = "0"\nrequires-python = ">=3.11"\n'
        f"dependencies = [{deps}]\n\n[tool.envbuild]\ntorch = \"==2.13.0\"\n"
        f'variant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f"base-image = {json.dumps(base)}\n")


def build(directory: Path, builder: str) -> dict[str, Any]:
    args = ["build", "--lock", "envbuild.lock", "--builder", builder, "--network", "host",
            "--tag", f"envbuild-bench/rebuild:{builder}", "--report", "report.json", "--verbose"]
    if os.environ.get("PIP_CERT"):
        args += ["--ca-bundle", os.environ["PIP_CERT"]]
    took, done = envbuild(*args, cwd=directory)
    report = json.loads((directory / "report.json").read_text())
    lines = done.stderr.splitlines()
    return {"seconds": took, "ran": report["ran"],
            "downloaded": sum(1 for line in lines if line.strip().startswith("Downloading ")),
            "cached": sum(1 for line in lines if line.strip().startswith("Using cached "))}


def main() -> int:
    wheelhouse = os.environ.get("PIP_FIND_LINKS")
    if not wheelhouse:
        sys.exit("bench_rebuild_cache: set PIP_FIND_LINKS to a wheelhouse with the CPU torch wheel")
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-rebuild-") as scratch:
        root = Path(scratch)
        registry, address = start_registry(root)
        try:
            base = push_base(address)
            work = root / "project"
            work.mkdir()
            project(work, base, BEFORE)
            envbuild("lock", "--find-links", wheelhouse, cwd=work)
            warm = {b: build(work, b) for b in ("classic", "buildah")}
            project(work, base, AFTER)
            start = time.perf_counter()
            envbuild("lock", "--find-links", wheelhouse, cwd=work)
            relock = time.perf_counter() - start
            again = {b: build(work, b) for b in ("classic", "buildah")}
        finally:
            registry.terminate()
            registry.wait(10)
    print(f"change          {BEFORE} -> {AFTER} (re-lock {relock:.1f} s)")
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
