"""The arm64 data (issue 38): aarch64 torch wheels per release and variant, the Grace/Spark GPUs'
host architecture, and the checks that catch a damaged row."""

from __future__ import annotations

from pathlib import Path

from test_matrix import BUNDLED, _problems, _replace, data_copy

from envbuild.data import matrix

__all__ = ["data_copy"]  # the fixture, imported for pytest


def test_aarch64_lists_start_at_sm_80_and_cuda_13_adds_thor() -> None:
    """FACTS 1.2: filter_aarch64_archs drops 5.0-7.5 and 8.6; 13.x adds 11.0 on aarch64 only."""
    data = matrix.load(BUNDLED)
    cudas = {(r["torch"], r["variant"]): r["cuda"] for r in data.rows("torch_variants")}
    lists = [(cudas.get((r["torch"], r["variant"])), r["arch_list"]) for r in data.rows("torch_aarch64")
             if r.get("arch_list")]
    assert lists
    for cuda, arch_list in lists:
        assert not {"sm_50", "sm_60", "sm_70", "sm_75", "sm_86", "sm_87", "sm_89"} & set(arch_list), arch_list
        assert ("sm_110" in arch_list) == cuda.startswith("13."), (cuda, arch_list)


def test_package_index_default_on_aarch64_is_cpu_to_210_then_cuda_13() -> None:
    data = matrix.load(BUNDLED)
    defaults = {r["torch"]: r["variant"] for r in data.rows("torch_aarch64") if r["pypi_default"]}
    assert defaults["2.10.0"] == "cpu" and defaults["2.7.0"] == "cpu"
    assert {defaults[t] for t in ("2.11.0", "2.12.0", "2.13.0", "2.14.1")} == {"cu130"}
    assert defaults["2.15.0"] == "cu132"


def test_grace_and_spark_gpus_name_their_host() -> None:
    rows = {r["name"]: r for r in matrix.load(BUNDLED).rows("gpus")}
    for name in ("NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA GB300", "NVIDIA GB10"):
        assert rows[name]["host_arch"] == "aarch64" and rows[name]["host_source"].startswith("https://")
    assert rows["NVIDIA GB10"]["min_cuda"] == "13.0"
    assert "host_arch" not in rows["NVIDIA H100 80GB HBM3"]


def test_aarch64_row_without_an_x86_variant_is_reported(data_copy: Path) -> None:
    """docs/faults.md S16: an aarch64 variant takes its CUDA and Pythons from the
    x86_64 row of its release, so a row naming a variant that has none is a misread."""
    _replace(data_copy / "torch_aarch64.yaml", '- torch: "2.15.0"\n  variant: cu132',
             '- torch: "2.15.0"\n  variant: cu130')
    problems = _problems(data_copy)
    assert any("torch_aarch64.yaml row " in p and "2.15.0 cu130 is not in torch_variants.yaml" in p
               for p in problems), problems


def test_aarch64_arch_beyond_nvcc_is_reported(data_copy: Path) -> None:
    # nvcc 12.6 cannot target Thor's 11.0: an aarch64 cu126 list naming it is misread
    text = (data_copy / "torch_aarch64.yaml").read_text()
    marker = '- torch: "2.13.0"\n  variant: cu126\n  arch_list:\n  - sm_80\n'
    assert marker in text
    (data_copy / "torch_aarch64.yaml").write_text(text.replace(marker, marker + "  - sm_110\n", 1))
    problems = _problems(data_copy)
    assert any("torch_aarch64.yaml row " in p and "sm_110, which nvcc 12.6 cannot target" in p
               for p in problems), problems


def test_host_arch_without_its_source_is_reported(data_copy: Path) -> None:
    _replace(data_copy / "gpus.yaml",
             "  host_source: https://github.com/pytorch/pytorch/issues/159779\n", "")
    problems = _problems(data_copy)
    assert any(p.startswith("gpus.yaml row ") and "host_arch and host_source go together" in p
               for p in problems), problems


def test_two_package_index_defaults_for_one_release_are_reported(data_copy: Path) -> None:
    text = (data_copy / "torch_aarch64.yaml").read_text()
    old = ('- torch: "2.13.0"\n  variant: cu132\n  arch_list:\n  - sm_80\n  - sm_90\n  - sm_100\n'
           '  - sm_110\n  - sm_120\n  pytorch_index: true\n  pypi_default: false')
    assert old in text
    (data_copy / "torch_aarch64.yaml").write_text(text.replace(old, old.replace(
        "pypi_default: false", "pypi_default: true"), 1))
    assert "torch_aarch64.yaml: torch 2.13.0 has more than one pypi_default row" in _problems(data_copy)
