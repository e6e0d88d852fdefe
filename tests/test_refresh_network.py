"""The package-index source against the real, configured index (marked ``network``; CI runs it).

It must reproduce the default-wheel facts recorded in matrices/torch_pypi.yaml for every
torch release from 1.13.0 to 2.15.0, reading METADATA by range requests only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from envbuild.upstream import refresh

REPO = Path(__file__).resolve().parents[1]
FACTS = ("default_variant", "python", "requires_python", "platform_tag", "cuda_runtime", "cudnn", "nccl")


def _rows(path: Path) -> dict[str, dict[str, object]]:
    return {str(r["torch"]): r for r in yaml.safe_load(path.read_text())["rows"]}


@pytest.mark.network
def test_pypi_source_reproduces_every_default_wheel_fact(tmp_path: Path) -> None:
    data = tmp_path / "matrices"
    shutil.copytree(REPO / "matrices", data)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # cold cache: real reads
    options = refresh.RefreshOptions(matrices=data, sources=("pypi",), only=frozenset({"torch"}),
                                     dry_run=False)
    report = refresh.refresh(options, env, lambda message: None)

    recorded, refreshed = _rows(REPO / "matrices/torch_pypi.yaml"), _rows(data / "torch_pypi.yaml")
    wanted = [v for v in recorded if (1, 13) <= tuple(map(int, v.split(".")[:2])) <= (2, 15)]
    assert "1.13.0" in wanted and "2.15.0" in wanted
    for version in wanted:
        for fact in FACTS:
            assert refreshed[version].get(fact) == recorded[version].get(fact), (version, fact)
        assert "sha256=" in str(refreshed[version]["source"])
    assert report.bytes_received < 1_000_000 * len(refreshed)
