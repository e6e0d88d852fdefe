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
    assert lines[0] == ("Driver 550: read as the newest 550 build, which runs CUDA <= 12.4 "
                        "natively (newest release 12.4.1).")
    assert lines[1].startswith("  The data records no oldest 550 build: 550 builds older than "
                               "550.54.14 run CUDA <= 12.3 natively (newest release 12.3.1);")
    assert "CUDA 12.x also through minor-version compatibility" in lines[2]
    assert lines[3] == "  CUDA 13.x needs driver >= 580.65.06."
    assert lines[4] == "GPU: NVIDIA GeForce RTX 4090 (sm_89, consumer/workstation)"
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
    """docs/faults.md K6: no driver and no GPU found → said plainly, CPU stacks first, exit 0."""
    monkeypatch.setattr(host, "probe_host", lambda env, **_: host.HostFacts())
    code, out, _ = run(capsys, "resolve", "--host", "--json", "--top", "100")
    assert code == 0
    body = json.loads(out)
    assert body["driver"] is None and body["gpus"] == []
    variants = [s["variant"] for s in body["stacks"]]
    assert variants[0] == "cpu" and body["stacks"][0]["compat"] is None
    cpu = [v == "cpu" for v in variants]
    assert cpu == sorted(cpu, reverse=True) and not all(cpu)  # CPU first, CUDA stacks after
    code, out, _ = run(capsys, "resolve", "--host", "--top", "2")
    assert code == 0
    assert out.startswith("No NVIDIA driver or GPU found on this host (--host): CPU stacks first")
    table = [line.split() for line in out.splitlines() if line.startswith("1  ")]
    assert table[0][2] == "cpu"


def test_host_without_gpu_keeps_what_the_user_named(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # --gpu or --driver named by hand: the user wants a GPU stack; nothing is reordered.
    monkeypatch.setattr(host, "probe_host", lambda env, **_: host.HostFacts())
    for extra in (("--gpu", "A100"), ("--driver", "550")):
        code, out, _ = run(capsys, "resolve", "--host", *extra, "--json")
        assert code == 0
        assert json.loads(out)["stacks"][0]["variant"] != "cpu"


def test_host_driver_text_is_kept(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md K2: the host's driver as nvidia-smi prints it, zero-padded."""
    probed = host.HostFacts(driver_version="535.104.05")
    monkeypatch.setattr(host, "probe_host", lambda env, **_: probed)
    code, out, _ = run(capsys, "resolve", "--host")
    assert code == 0
    assert out.startswith("Driver 535.104.05 runs CUDA <= 12.2 natively")


@pytest.mark.parametrize("driver", ["535.104.05", "550.144.03", "450.36.06"])
def test_driver_text_as_nvidia_writes_it(driver: str, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md K2: never 535.104.5, in the header, the JSON and the conflicts."""
    code, out, _ = run(capsys, "resolve", "--driver", driver, "--top", "1")
    assert out.startswith(f"Driver {driver} runs ") or code == 3
    code, out, _ = run(capsys, "resolve", "--driver", driver, "--json", "--top", "1")
    body = json.loads(out)
    assert body["driver"]["version"] == driver
    assert body["driver"]["partial"] is False and body["driver"]["older_builds"] is None
    code, out, _ = run(capsys, "resolve", "--driver", driver, "--cuda", "13.0", "--json")
    assert code == 3
    assert f"(host: {driver})" in json.loads(out)["error"]


@pytest.mark.parametrize("driver", ["", "550.", "5500", "550.54.15.1", "\u0665\u0665\u0660"])
def test_empty_or_malformed_driver_is_usage(driver: str, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md K3: --driver "" is not "no driver"; exit 2, one line."""
    code, out, err = run(capsys, "resolve", "--driver", driver)
    assert code == 2 and out == ""
    assert err.startswith("envbuild: error[usage]: invalid driver version")
    assert len(err.splitlines()) == 1


def test_partial_driver_states_the_assumption(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md K4: a branch is read as its newest build, and the header says what
    the older builds run, from the data (which records no oldest build)."""
    code, out, _ = run(capsys, "resolve", "--driver", "525", "--json", "--top", "1")
    body = json.loads(out)["driver"]
    assert body["partial"] is True
    assert body["older_builds"] == {"below": "525.60.13", "max_cuda": "11.8",
                                    "max_cuda_release": "11.8.0", "minor_compat": "11.x"}
    code, out, _ = run(capsys, "resolve", "--driver", "525", "--top", "1")
    assert ", CUDA 11.x through minor-version compatibility;" in out.splitlines()[1]
    code, out, _ = run(capsys, "resolve", "--driver", "565", "--top", "1")
    assert code == 0 and out.splitlines()[1].startswith("  Every 565 build runs the same")
    _, out, _ = run(capsys, "resolve", "--driver", "550.54.15", "--top", "1")
    assert "read as" not in out and "builds older" not in out


def test_one_minimum_driver_per_cuda_release(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md K5: CUDA 13.0's minimum is its GA driver 580.65.06 in the table, the
    JSON, the rejection, the header and the fix (13.0 Update 2's 580.95.05 is not it)."""
    code, out, _ = run(capsys, "resolve", "--cuda", "13.0", "--top", "3")
    rows = [line.split() for line in out.splitlines() if line[:3] in ("1  ", "2  ", "3  ")]
    assert len(rows) == 3 and {r[8] for r in rows} == {"580.65.06"}
    code, out, _ = run(capsys, "resolve", "--cuda", "13.0", "--json", "--top", "100")
    assert {s["min_driver"] for s in json.loads(out)["stacks"]} == {"580.65.06"}
    code, out, _ = run(capsys, "resolve", "--driver", "575", "--cuda", "13.0", "--json")
    body = json.loads(out)
    assert code == 3 and "needs driver >= 580.65.06" in body["error"]
    assert body["fixes"][0].startswith("upgrade the driver to >= 580.65.06")
    code, out, _ = run(capsys, "resolve", "--driver", "575", "--top", "1")
    assert "  CUDA 13.x needs driver >= 580.65.06." in out.splitlines()
    # With a 13.0 Update 2 driver the base image is 13.0.2's, the minimum still 13.0's.
    code, out, _ = run(capsys, "resolve", "--driver", "580.95.05", "--cuda", "13.0", "--json")
    top = json.loads(out)["stacks"][0]
    assert (top["min_driver"], top["base_cuda"]) == ("580.65.06", "13.0.2")


def test_detect_from_saved_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "detect", "--json", "--from", str(FIXTURES / "h100x8_table_topo.txt"))
    assert code == 0
    body = json.loads(out)
    assert len(body["gpus"]) == 8
    assert body["topology"]["GPU0"]["GPU1"].startswith("NV")


def test_detect_from_missing_file_is_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "detect", "--from", "/nonexistent/smi.txt")
    assert code == 2
    assert err.startswith("envbuild: error[usage]: --from /nonexistent/smi.txt does not exist — ")


def test_json_is_stable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "resolve", "--driver", "550", "--json", "--top", "1")
    assert code == 0
    body = json.loads(out)
    assert set(body) == {"schema", "driver", "gpus", "stacks", "total_stacks", "rejected"}
    assert set(body["driver"]) == {"version", "max_cuda", "max_cuda_release", "minor_compat",
                                   "partial", "older_builds", "branch"}  # branch: issue 23
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


@pytest.mark.parametrize("flavor", ["runtime", "devel"])
def test_forward_stacks_sit_on_a_cuda_image_whose_cuda_compat_runs_them(
        flavor: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Forward compatibility is the image's cuda-compat libraries: plain Ubuntu has none, so a
    forward stack's base is an nvidia/cuda image of the wheel's CUDA major, never newer than it."""
    assert main(["resolve", "--driver", "570.124.06", "--gpu", "B200", "--flavor", flavor, "--json",
                 "--top", "200"]) == 0
    stacks = json.loads(capsys.readouterr().out)["stacks"]
    forward = [s for s in stacks if s["compat"] == "forward"]
    assert forward  # 13.x wheels on a 570 driver, a datacenter GPU
    for stack in forward:
        assert stack["base_image"].startswith("nvidia/cuda:"), stack
        kind = "base" if flavor == "runtime" else "devel"
        assert stack["base_image"].endswith(f"-{kind}-ubuntu{stack['ubuntu']}"), stack
        base = tuple(int(p) for p in stack["base_cuda"].split(".")[:2])
        wheel = tuple(int(p) for p in stack["cuda"].split(".")[:2])
        assert base[0] == wheel[0] and base <= wheel, stack
        if base < wheel:
            assert any("minor-version compatibility" in note for note in stack["notes"]), stack


def test_forward_stack_without_a_cuda_image_is_rejected_with_the_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ubuntu 20.04 has no nvidia/cuda 13.x image: 13.x on a 570 driver is refused, not put on
    plain Ubuntu (which has no cuda-compat), and the fix offered is a driver that runs it."""
    code = main(["resolve", "--driver", "570.124.06", "--gpu", "B200", "--ubuntu", "20.04",
                 "--cuda", "13.0"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert ("no nvidia/cuda 13.x base image for Ubuntu 20.04 in cuda_images.yaml: forward "
            "compatibility needs the cuda-compat libraries such an image carries") in err
    assert "upgrade the driver to >= 580.65.06" in err
