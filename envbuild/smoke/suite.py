"""The whole smoke run: tiers 0..N in order, and the report."""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from .runner import Options, Run
from .t0_environment import tier0
from .t1_correctness import tier1
from .t2_speed import tier2
from .t3_multi_gpu import tier3
from .t4_health import tier4

TIERS = (tier0, tier1, tier2, tier3, tier4)


def run_smoke(options: Options, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run tiers 0..options.tier and return the report (a JSON-ready dict)."""
    run = Run(options, os.environ if env is None else env)
    tier_seconds: dict[int, float] = {}
    for tier in range(options.tier + 1):
        start = time.perf_counter()
        if tier >= 1 and run.torch is None:
            run.gpu_block = run.gpu_block or "torch is not importable"
        TIERS[tier](run)
        tier_seconds[tier] = time.perf_counter() - start
    return run.report(tier_seconds)
