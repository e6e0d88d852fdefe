"""resolve's human output, --explain, --host and detect, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.host import probe as host

FIXTURES = Path(__file__).parent / "fixtures" / "host"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), env={"ENVBUILD_NO_CACHE": "1"})
    out = capsys.readouterr()
    return code, out.out, out.err


def test_header_says_native_minor_and_newer(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "resolve", "--driver", "550", "--gpu", "RTX 4090", "--top", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Driver 550 runs CUDA <= 12.4 natively (newest release 12.4.1)."
    assert "CUDA 12.x also through minor-version compatibility" in lines[1]
    assert lines[2] == "  CUDA 13.x needs driver >= 580.65.06."
    assert lines[3] == "GPU: NVIDIA GeForce RTX 4090 (sm_89, consumer/workstation)"
    table = [line for line in lines if line[:3] in ("1  ", "2  ", "3  ")]
    assert len(table) == 3
    assert "3 of " in out and "(--explain says why)" in out


def test_without_driver_the_output_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "resolve", "--top", "1")
    assert code == 0
    assert out.startswith("No driver given (--driver or --host): no driver constraint")


def test_explain_gives_each_rejection_with_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "resolve", "--driver", "550", "--gpu", "V100", "--explain")
    assert code == 0
    assert "Rejected families, by the constraint that failed:" in out
    arch = out.split("[gpu-arch]", 1)[1]
    assert "sm_70 (NVIDIA" in arch or "sm_70 (Tesla V100)" in arch
    assert "source: https://github.com/pytorch/pytorch" in arch


def test_host_flag_uses_the_probe(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    probed = host.parse_saved((FIXTURES / "rtx4090_table.txt").read_text())
    monkeypatch.setattr(host, "probe_host", lambda env, **_: probed)
    code, out, _ = run(capsys, "resolve", "--host", "--json")
    assert code == 0
    body = json.loads(out)
    assert body["driver"]["version"] == "550.54.15"
    assert body["driver"]["max_cuda_release"] == "12.4.1"
    assert [g["sm"] for g in body["gpus"]] == ["sm_89"]


def test_host_without_gpu_has_no_driver_constraint(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(host, "probe_host", lambda env, **_: host.HostFacts())
    code, out, _ = run(capsys, "resolve", "--host", "--json")
    assert code == 0
    body = json.loads(out)
    assert body["driver"] is None and body["gpus"] == []


def test_detect_from_saved_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "detect", "--json", "--from", str(FIXTURES / "h100x8_table_topo.txt"))
    assert code == 0
    body = json.loads(out)
    assert len(body["gpus"]) == 8
    assert body["topology"]["GPU0"]["GPU1"].startswith("NV")


def test_detect_from_missing_file_is_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "detect", "--from", "/nonexistent/smi.txt")
    assert code == 2
    assert err.startswith("envbuild: error[usage]: cannot read /nonexistent/smi.txt")


def test_json_is_stable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "resolve", "--driver", "550", "--json", "--top", "1")
    assert code == 0
    body = json.loads(out)
    assert set(body) == {"schema", "driver", "gpus", "stacks", "total_stacks", "rejected"}
    assert set(body["driver"]) == {"version", "max_cuda", "max_cuda_release", "minor_compat"}
    assert set(body["stacks"][0]) >= {"torch", "torchvision", "torchaudio", "variant", "index_url",
                                      "cuda", "cudnn", "python", "ubuntu", "base_image", "compat"}
    assert body["stacks"][0]["compat"] in ("native", "minor-version", "forward")


def test_matrix_show_and_unknown_relation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "matrix", "show", "ubuntu_python")
    assert code == 0 and "22.04" in out and "jammy" in out
    code, _, err = run(capsys, "matrix", "show", "gpu")
    assert code == 2 and "Perhaps you meant gpus?" in err


@pytest.mark.parametrize(("argv", "cited"), [
    (("--driver", "535", "--gpu", "H200"), "https://github.com/NVIDIA/open-gpu-kernel-modules/blob/"),
    (("--driver", "550", "--gpu", "K80"),
     "https://docs.nvidia.com/datacenter/tesla/drivers/cuda-toolkit-driver-and-architecture-matrix.html"),
])
def test_a_gpu_driver_rejection_cites_the_driver_fact(capsys: pytest.CaptureFixture[str],
                                                      argv: tuple[str, ...], cited: str) -> None:
    # The GPU's row cites the CUDA GPUs page for its compute capability; the driver-branch
    # floor or ceiling comes from elsewhere (driver_source), and that is what --explain shows.
    code, out, _ = run(capsys, "resolve", *argv, "--json")
    assert code == 3
    body = json.loads(out)
    driver_rows = [r for r in body["rejected"] if r["constraint"] == "gpu-driver"]
    assert driver_rows
    assert all(r["source"].startswith(cited) for r in driver_rows)
