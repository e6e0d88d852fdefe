"""Lock time of a whole closure: torch + 20 common small dependencies, with uv.

torch 2.13.0+cpu comes from the ``PIP_FIND_LINKS`` wheelhouse, the 20 dependencies (and
torch's own requirements) from the configured package index (pip's: --index-url,
PIP_INDEX_URL, pip's configuration). Each figure is one call of
:func:`envbuild.pylock.uv.compile_closure`: uv's locking run with hashes, the check of every
file's sha256 against the index's pages, and the second uv run that names the torch layer.

- cold: an empty uv cache (a temporary UV_CACHE_DIR), as on a fresh CI runner;
- warm: the same cache again, median of WARM_RUNS runs (target: <= 5 s).

Needs the network (the configured index) and the wheelhouse; without either it stops with
exit 1 and the reason, never a figure.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from envbuild.errors import EnvbuildError
from envbuild.pylock.uv import Closure, ClosureSpec, compile_closure
from envbuild.upstream.pipconfig import index_url

TORCH = "2.13.0+cpu"
DEPENDENCIES = (
    "requests", "urllib3", "idna", "certifi", "charset-normalizer", "click", "attrs", "pyyaml",
    "packaging", "six", "python-dateutil", "pytz", "tqdm", "rich", "pydantic", "typing-extensions",
    "jinja2", "platformdirs", "tomli", "colorama",
)
WARM_RUNS = 5
TARGET_WARM_S = 5.0


def wheelhouse() -> str:
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    for link in links:
        if any(p.name.startswith(f"torch-{TORCH}-") for p in Path(link).glob("torch-*.whl")):
            return link
    sys.exit(f"bench_lock: no torch {TORCH} wheel in PIP_FIND_LINKS ({' '.join(links) or 'unset'})")


def lock(spec: ClosureSpec) -> tuple[float, Closure]:
    start = time.perf_counter()
    closure = compile_closure(spec)
    return time.perf_counter() - start, closure


def main() -> int:
    links = wheelhouse()
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-lock-") as cache:
        env = {**os.environ, "UV_CACHE_DIR": cache}
        try:
            default_index = index_url(None, env)
            spec = ClosureSpec(torch_pins={"torch": TORCH}, python="3.11", glibc="2.35",
                               dependencies=DEPENDENCIES, default_index=default_index,
                               find_links=(links,), env=env, timeout=600.0)
            cold, closure = lock(spec)
            warm_runs = [lock(spec) for _ in range(WARM_RUNS)]
        except EnvbuildError as exc:
            print(exc.one_line(), file=sys.stderr)
            print("bench_lock: needs the configured package index (network) and the wheelhouse",
                  file=sys.stderr)
            return 1
    if any(c.pylock_text != closure.pylock_text for _, c in warm_runs):
        print("bench_lock: the warm runs gave different pylock bytes", file=sys.stderr)
        return 1
    warm = statistics.median(t for t, _ in warm_runs)
    print(f"closure: {len(closure.packages)} distributions "
          f"(torch layer {len(closure.torch_layer)}, torch {closure.packages.get('torch')})")
    print(f"cold (empty uv cache): {cold:.2f} s")
    print(f"warm (median of {WARM_RUNS}): {warm:.2f} s "
          f"[{', '.join(f'{t:.2f}' for t, _ in warm_runs)}]  target <= {TARGET_WARM_S:g} s: "
          f"{'met' if warm <= TARGET_WARM_S else 'MISSED'}")
    return 0 if warm <= TARGET_WARM_S else 1


if __name__ == "__main__":
    sys.exit(main())
