"""What resolve says when the answer depends on facts the user did not give (issue 23 item 5):
--cuda read as nvidia-smi's 'CUDA Version', a driver branch past its end of life, and a devel
image whose nvcc differs from the wheel's CUDA."""

from __future__ import annotations

import json

import pytest

from envbuild.commands.cli import main
from envbuild.resolver.report import end_of_life_line

ENV = {"ENVBUILD_NO_CACHE": "1"}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["resolve", *args], env=ENV)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cuda_without_a_driver_asks_for_the_driver(capsys: pytest.CaptureFixture[str]) -> None:
    """`--cuda 12.2` as nvidia-smi prints it: no wheel is CUDA 12.2, and `--cuda 13.2` (driver
    595) is no way out for a 535 host. The headline names the constraint, not torch 1.13; the
    first fix is the driver reading, re-solved; a --cuda fix says the driver it needs."""
    code, out, err = run(capsys, "--gpu", "T4", "--cuda", "12.2", "--flavor", "devel")
    assert code == 3 and not out
    first = err.splitlines()[0]
    assert first.startswith("envbuild: error[no-compatible-stack]: no compatible stack: no torch "
                            "wheel is built for --cuda 12.2 (nvidia-smi's 'CUDA Version' is ")
    assert "1.13" not in first
    fixes = err.split("To fix this you could (each re-solved and shown to work):\n")[1].splitlines()
    assert fixes[0].startswith("  - give your driver instead of --cuda 12.2 (--driver as nvidia-smi "
                               "prints it): a driver that runs CUDA 12.2.2 (>= 535.104.05) gets torch ")
    cuda_fixes = [f for f in fixes if f.startswith("  - use --cuda ")]
    assert cuda_fixes and all("it needs driver >= " in f for f in cuda_fixes)


def test_the_driver_reading_fix_is_what_that_driver_gets(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--gpu", "T4", "--cuda", "12.2", "--flavor", "devel")
    offered = err.split("gets ")[1].split("\n")[0]
    code, out, _ = run(capsys, "--gpu", "T4", "--driver", "535.104.05", "--flavor", "devel",
                       "--json", "--top", "1")
    stack = json.loads(out)["stacks"][0]
    assert code == 0
    assert offered == f"torch {stack['torch']}+{stack['variant']}, Python {stack['python']}, " \
                      f"Ubuntu {stack['ubuntu']}"


def test_with_a_driver_the_cuda_headline_does_not_ask_for_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--driver", "535", "--cuda", "12.2")
    assert code == 3
    first = err.splitlines()[0]
    assert "no torch wheel is built for --cuda 12.2 —" in first
    assert "give --driver" not in first


def test_an_ended_driver_branch_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """driver_branches.yaml: R535 (LTS) ended 2026-06; R580 (LTS) runs to 2028-06."""
    code, out, _ = run(capsys, "--driver", "535.104.05", "--top", "1")
    assert code == 0
    [line] = [x for x in out.splitlines() if "end of life" in x]
    assert line.startswith("  Branch 535 (lts) reached its end of life in 2026-06 (NVIDIA's driver "
                           "lifecycle, https://docs.nvidia.com/")
    code, out, _ = run(capsys, "--driver", "580.95.05", "--json", "--top", "1")
    assert json.loads(out)["driver"]["branch"]["end_of_life"] == "2028-06"
    code, out, _ = run(capsys, "--driver", "580.95.05", "--top", "1")
    assert "end of life" not in out


def test_end_of_life_line_compares_months() -> None:
    life = ("lts", "2026-06", "https://example.invalid/branches")
    assert end_of_life_line("535.104.05", life, today="2026-06") is None
    assert end_of_life_line("535", life, today="2026-07") is not None
    assert end_of_life_line("550", None, today="2030-01") is None
    assert end_of_life_line("535", ("lts", None, "https://example.invalid"), today="2030-01") is None


def test_devel_nvcc_different_from_the_wheels_cuda_is_explained(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Driver 550 + a cu126 wheel: the devel image is CUDA 12.4 (a 12.6 image's requirement
    would stop the container on 550); the stack says so instead of silently pairing them."""
    code, out, _ = run(capsys, "--driver", "550", "--flavor", "devel", "--torch", "2.6",
                       "--variant", "cu126", "--json", "--top", "1")
    assert code == 0
    stack = json.loads(out)["stacks"][0]
    assert stack["base_image"].startswith("nvidia/cuda:12.4.")
    assert any(n.startswith("devel image's nvcc is CUDA 12.4, the wheel's CUDA 12.6: ")
               for n in stack["notes"])
    code, out, _ = run(capsys, "--driver", "560.35.03", "--flavor", "devel", "--torch", "2.6",
                       "--variant", "cu126", "--json", "--top", "1")
    stack = json.loads(out)["stacks"][0]  # 560 runs 12.6 natively: nvcc 12.6, no note
    assert stack["base_image"].startswith("nvidia/cuda:12.6.")
    assert not any("nvcc" in n for n in stack["notes"])


def test_families_the_users_own_filter_ruled_out_are_not_listed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--torch 2.1 --python 3.12: the 2.1.x families (no cp312 wheels) are the conflict; the
    ones --torch itself ruled out (torch 1.13.0+cpu ...) are not listed as causes."""
    code, _, err = run(capsys, "--torch", "2.1", "--python", "3.12")
    assert code == 3
    causes = err.split("The conflict is caused by:\n")[1].split("To fix this")[0].splitlines()
    assert causes and all(c.startswith("  - torch 2.1.") for c in causes), causes
