"""`envbuild smoke` through the CLI: the standalone test, with the peaks table handed over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.data import matrix
from envbuild.data.peaks import peaks_json, peaks_table

BUNDLED = Path(__file__).resolve().parent.parent / "matrices"
pytest.importorskip("torch")


def test_cli_smoke_cpu_ok_passes_and_plain_run_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["smoke", "--cpu-ok", "--tier", "0", "--json"], env={}) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 0
    assert all(c["status"] != "pass" for c in report["checks"] if c["name"] == "torch.cuda_build")
    # without --cpu-ok a CPU-only torch is a failure with its own message (exit 7)
    assert main(["smoke", "--tier", "0"], env={}) == 7
    assert "torch is CPU-only (torch.version.cuda=None)" in capsys.readouterr().out


def test_peaks_table_carries_aliases_and_source(tmp_path: Path) -> None:
    data = tmp_path / "m"
    shutil.copytree(BUNDLED, data)
    # test data, not a fact: one invented row to show the table's shape
    (data / "gpu_peaks.yaml").write_text(
        "relation: gpu_peaks\ndescription: test\nrows:\n"
        "- {name: NVIDIA L4, fp32_tflops: 1.5, source: 'https://example.invalid/l4', "
        "retrieved: '2026-11-21'}\n")
    table = peaks_table(matrix.load(data))
    assert table["NVIDIA L4"]["fp32_tflops"] == 1.5
    assert "L4" in table["NVIDIA L4"]["aliases"]
    assert peaks_json(matrix.load(data)) == peaks_json(matrix.load(data))


def test_bundled_peaks_reach_the_smoke_test_under_driver_names() -> None:
    """Every bundled peaks row is found by the name torch reports, and cites a source."""
    from envbuild.smoke.numeric import match_peak

    table = peaks_table(matrix.load(BUNDLED))
    assert table, "gpu_peaks.yaml has rows"
    for name, row in table.items():
        assert row["source"].startswith("https://"), name
        assert match_peak(name, table) == (name, row)
    found = match_peak("Tesla V100-SXM2-16GB", table)
    assert found is not None and found[0] == "Tesla V100" and found[1]["fp16_tflops"] == 125
