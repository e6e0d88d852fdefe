"""The peak-throughput table the standalone smoke test reads (``smoke_peaks.json``).

smoke.py cannot read YAML or import envbuild, so the table travels as JSON: each GPU's
peaks from ``gpu_peaks.yaml`` plus its names from ``gpus.yaml``, because torch reports
the driver's device name ("NVIDIA H100 80GB HBM3"), not the name a user types.
"""

from __future__ import annotations

import json
from typing import Any

from envbuild.data.matrix import Matrix

PEAK_FIELDS = ("fp32_tflops", "fp16_tflops", "bf16_tflops", "memory_bandwidth_gbs")


def peaks_table(matrix: Matrix) -> dict[str, dict[str, Any]]:
    aliases = {r["name"]: list(r.get("aliases", ())) for r in matrix.rows("gpus")}
    table: dict[str, dict[str, Any]] = {}
    for row in matrix.rows("gpu_peaks"):
        entry: dict[str, Any] = {k: row[k] for k in PEAK_FIELDS if k in row}
        entry["aliases"] = aliases.get(row["name"], [])
        entry["source"] = row["source"]
        table[row["name"]] = entry
    return table


def peaks_json(matrix: Matrix) -> bytes:
    """Deterministic bytes: the same data renders the same file."""
    return (json.dumps(peaks_table(matrix), indent=2, sort_keys=True) + "\n").encode()
