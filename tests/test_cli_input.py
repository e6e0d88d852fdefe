"""docs/faults.md section A for resolve: bad input is one clear line and a documented exit code."""

from __future__ import annotations

import json
import os

import pytest

from envbuild.commands.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    env = {"ENVBUILD_NO_CACHE": "1"}
    if "ENVBUILD_MATRICES" in os.environ:
        env["ENVBUILD_MATRICES"] = os.environ["ENVBUILD_MATRICES"]
    code = main(list(argv), env=env)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def first_line(err: str) -> str:
    return err.splitlines()[0] if err else ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # A1: a shell payload in a version
        (["--torch", "2.3.1; rm -rf /"], "invalid torch version '2.3.1; rm -rf /'"),
        # A2: a trailing newline that packaging.Version would accept
        (["--torch", "2.3.1\n"], "invalid torch version '2.3.1\\n'"),
        # A17: Unicode line separators and CR in any string field
        (["--python", "3.11\u2028"], "invalid python version"),
        (["--cuda", "12.4\x85"], "invalid cuda version"),
        (["--cudnn", "9\r"], "invalid cudnn version"),
        (["--ubuntu", "22.04\n"], "invalid Ubuntu release"),
        (["--variant", "cu124\nRUN id"], "invalid wheel variant"),
        (["--gpu", "RTX 4090\u2028"], "invalid GPU name"),
        # A7: garbage drivers
        (["--driver", "abc"], "invalid driver version 'abc'"),
        (["--driver", "550.54.15.1"], "invalid driver version"),
        (["--driver", "999.99.99"], "unknown driver branch 999"),
        (["--arch", "sm89"], "invalid GPU architecture 'sm89'"),
        (["--top", "0"], "argument --top"),
        (["--flavor", "slim"], "argument --flavor"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                         message: str) -> None:
    code, out, err = run(capsys, "resolve", *argv)
    assert code == 2
    assert out == ""
    assert first_line(err).startswith("envbuild: error[usage]: ")
    assert message in first_line(err)
    assert "Traceback" not in err


def test_unknown_gpu_suggests_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "resolve", "--gpu", "RTX 4909")
    assert code == 2
    assert "Perhaps you meant" in first_line(err)
    assert "NVIDIA GeForce RTX 4090" in first_line(err)


@pytest.mark.parametrize("spec", ["2.3", "2.3.*", ">=2.3,<2.4"])
def test_a3_a_series_resolves_to_one_exact_version(capsys: pytest.CaptureFixture[str],
                                                   spec: str) -> None:
    code, out, _ = run(capsys, "resolve", "--torch", spec, "--json")
    assert code == 0
    stacks = json.loads(out)["stacks"]
    assert stacks and all(s["torch"].startswith("2.3.") for s in stacks)
    assert all("*" not in s["torch"] and s["torch"].count(".") == 2 for s in stacks)
    assert stacks[0]["torch"] == "2.3.1"  # the newest of the series, pinned


def test_a4_unknown_local_tag_names_available_variants(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "resolve", "--torch", "2.3.1+cu999")
    assert code == 3
    assert "no wheel variant cu999 for torch 2.3.1; available: cpu, cu118, cu121" in first_line(err)


def test_a5_python_without_wheels_lists_supported(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "resolve", "--torch", "2.1.2", "--python", "3.12")
    assert code == 3
    assert "torch 2.1.2 has wheels for Python 3.8, 3.9, 3.10, 3.11" in first_line(err)
    code, _, err = run(capsys, "resolve", "--python", "3.99")
    assert code == 3
    assert "no wheel for the Python asked for (--python 3.99)" in first_line(err)


def test_a6_cuda_12_on_a_470_driver(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "resolve", "--cuda", "12.4", "--driver", "470.82")
    assert code == 3
    line = first_line(err)
    assert "needs driver >= 550.54.14 (host: 470.82)" in line
    assert "minor-version compatibility needs >= 525.60.13" in line
    # the ways out were re-solved: a newer driver, or CUDA 11.x on this one
    # the smallest driver that re-solves: 12.4 wheels run on the CUDA 12 floor
    assert "upgrade the driver to >= 525.60.13" in err
    assert "use --cuda 11.8 instead of 12.4" in err


def test_json_failure_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "resolve", "--cuda", "12.4", "--driver", "470.82", "--json")
    assert code == 3
    body = json.loads(out)
    assert set(body) >= {"error", "conflicts", "fixes"}
    assert body["fixes"] and body["conflicts"]


def test_a_lazy_command_after_the_matrices_option(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: os.PathLike[str]) -> None:
    # The value of --matrices is not the command: `lock` must still get its options.
    from pathlib import Path

    data = str(Path(__file__).resolve().parents[1] / "matrices")
    target = Path(tmp_path) / "envbuild.lock"
    code, _, err = run(capsys, "--matrices", data, "lock", "--stack-only", "--driver", "550",
                       "-o", str(target))
    assert (code, err) == (0, "")
    assert target.is_file()


def test_only_matrix_refresh_reads_the_refresh_module() -> None:
    import subprocess
    import sys
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "host" / "rtx4090_table.txt"
    probe = ("import sys; from envbuild.commands.cli import main; code = main(sys.argv[1:]); "
             "print(code, 'envbuild.upstream.refresh' in sys.modules)")
    for argv, loaded in ((["detect", "--from", str(fixture)], "False"),
                         (["matrix", "refresh", "--source", "nowhere"], "True")):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                              check=False)
        assert done.stdout.splitlines()[-1].split()[-1] == loaded, (argv, done.stderr)
