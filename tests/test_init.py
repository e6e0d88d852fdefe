"""``envbuild init``: the commented project file it writes loads back to the values it was
given, it never overwrites without --force, and it takes a host's driver and GPUs
(docs/faults.md H18)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.commands.cli import main
from envbuild.host import probe as host
from envbuild.host.facts import GpuFacts
from envbuild.project.config import load_project, project_from_text
from envbuild.project.init import InitValues, render_project, toml_string
from envbuild.project.model import Target
from envbuild.project.toml import parse

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "host"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["init", *argv], env={"ENVBUILD_NO_CACHE": "1", "PATH": os.environ.get("PATH", "")})
    out = capsys.readouterr()
    return code, out.out, out.err


def cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ENVBUILD_NO_CACHE": "1"}
    return subprocess.run([sys.executable, "-m", "envbuild", "init", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_init_writes_a_commented_file_that_loads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reqs").mkdir()
    (tmp_path / "reqs" / "base.txt").write_text("requests>=2.31\n")
    code, out, _ = run(capsys, "--driver", "550", "--gpu", "rtx 4090", "--arch", "sm_80", "--torch", "2.4",
                       "--python", "3.11", "--cuda", "12.4", "--cudnn", "9", "--ubuntu", "22.04",
                       "--variant", "cu124", "--flavor", "devel", "--target", "ws",
                       "--requirements", "reqs/base.txt")
    assert code == 0, out
    assert "wrote envbuild.toml: target ws (driver 550" in out
    text = (tmp_path / "envbuild.toml").read_text()
    assert text.count("\n# ") > 20  # commented: what each key means
    project = load_project(None, tmp_path)
    assert project.targets == (Target(name="ws", driver="550", gpus=("rtx 4090",),
                                      archs=("sm_80",)),)
    assert (project.torch, project.python, project.cuda, project.cudnn, project.ubuntu, project.variant,
            project.flavor, project.companions) == ("2.4", "3.11", "12.4", "9", "22.04", "cu124", "devel",
                                                    True)
    assert project.dependencies == ("requests>=2.31",)
    assert project.sources == ("envbuild.toml", "reqs/base.txt")


def test_init_names_a_pyproject_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\n'
                                             'dependencies = ["rich", "torch>=2"]\n')
    assert run(capsys, "--driver", "550")[0] == 0
    project = load_project(None, tmp_path)
    assert project.dependencies == ("rich",) and project.torch_constraints == ("torch>=2",)
    assert 'pyproject = "pyproject.toml"' in (tmp_path / "envbuild.toml").read_text()


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    """docs/faults.md H18"""
    (tmp_path / "envbuild.toml").write_text("# mine\n")
    done = cli(tmp_path, "--driver", "550")
    assert done.returncode == 2
    assert "envbuild.toml already exists" in done.stderr and "--force" in done.stderr
    assert (tmp_path / "envbuild.toml").read_text() == "# mine\n"
    done = cli(tmp_path, "--driver", "550", "--force")
    assert done.returncode == 0, done.stderr
    assert 'driver = "550"' in (tmp_path / "envbuild.toml").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["envbuild.toml"]  # no temporary left


@pytest.mark.parametrize(("argv", "message"), [
    (["--driver", "55x"], "--driver: invalid driver version '55x'"),
    (["--gpu", "RTX 409"], "unknown GPU 'RTX 409'"),
    (["--arch", "sm89"], "--arch: invalid GPU architecture"),
    (["--torch", "two"], "--torch: invalid torch version"),
    (["--ubuntu", "22"], "--ubuntu: invalid Ubuntu release"),
    (["--variant", "cuda"], "--variant: invalid wheel variant"),
    (["--target", "My Target"], "--target: invalid target name"),
    (["--index-url", "ftp://x"], "--index-url: invalid URL"),
    (["--requirements", "missing.txt"], "--requirements missing.txt: no such file"),
    (["--flavor", "big"], "invalid choice"),
    (["-o", "no/such/dir/envbuild.toml"], "no/such/dir is not a directory"),
])
def test_init_bad_flags_exit_2_and_write_nothing(tmp_path: Path, argv: list[str], message: str) -> None:
    """docs/faults.md H18"""
    done = cli(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_init_refuses_a_requirements_file_the_loader_would_refuse(tmp_path: Path) -> None:
    """What init writes must load: a bad requirements file is refused now (exit 2, nothing written)."""
    (tmp_path / "r.txt").write_text("-e git+https://127.0.0.1/r.git#egg=r\n")  # -e . is read since H53
    done = cli(tmp_path, "--requirements", "r.txt")
    assert done.returncode == 2
    assert "r.txt:1: editable requirement" in done.stderr
    assert not (tmp_path / "envbuild.toml").exists()


def test_init_print_gives_a_block_for_pyproject(tmp_path: Path) -> None:
    done = cli(tmp_path, "--driver", "560", "--gpu", "A100", "--datacenter", "--print")
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
    assert done.stdout.count("[tool.envbuild]") == 1
    assert "[[tool.envbuild.targets]]" in done.stdout
    pyproject = '[project]\nname = "demo"\ndependencies = ["rich"]\n\n' + done.stdout
    (tmp_path / "pyproject.toml").write_text(pyproject)
    project = load_project(None, tmp_path)
    assert project.targets == (Target(name="default", driver="560", gpus=("A100",), datacenter=True),)
    assert project.dependencies == ("rich",)


def test_init_output_option(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "r.txt").write_text("idna\n")
    done = cli(tmp_path, "-o", "sub/project.toml", "--requirements", "r.txt")
    assert done.returncode == 0, done.stderr
    project = load_project(Path("sub/project.toml"), tmp_path)
    assert project.dependencies == ("idna",) and project.sources == ("../r.txt", "project.toml")


def test_init_from_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    probed = host.parse_saved((FIXTURES / "rtx4090_table.txt").read_text())
    monkeypatch.setattr(host, "probe_host", lambda env, **_: probed)
    code, out, _ = run(capsys, "--host")
    assert code == 0
    assert "wrote envbuild.toml: target default (driver 550.54.15, GPUs NVIDIA GeForce RTX 4090)" in out
    assert load_project(None, tmp_path).targets == (
        Target(name="default", driver="550.54.15", gpus=("NVIDIA GeForce RTX 4090",)),)
    # a flag wins over the host
    code, _, _ = run(capsys, "--host", "--driver", "560", "--force")
    assert code == 0
    assert load_project(None, tmp_path).targets[0].driver == "560"


def test_init_on_an_arm64_host_records_its_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """issue 38: an H100 in a Grace server implies no platform by its name: the host's is kept."""
    from dataclasses import replace

    monkeypatch.chdir(tmp_path)
    probed = replace(host.parse_saved((FIXTURES / "rtx4090_table.txt").read_text()), platform="linux/arm64")
    monkeypatch.setattr(host, "probe_host", lambda env, **_: probed)
    assert run(capsys, "--host")[0] == 0
    assert load_project(None, tmp_path).targets[0].platform == "linux/arm64"
    code, _, err = run(capsys, "--platform", "arm64", "--force")
    assert code == 2 and "unknown platform 'arm64'" in err


def test_init_from_a_host_without_gpu_writes_a_cpu_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(host, "probe_host", lambda env, **_: host.HostFacts())
    code, _, err = run(capsys, "--host")
    assert code == 0
    assert "no NVIDIA GPU on this host: the target is CPU-only (variant cpu)" in err
    project = load_project(None, tmp_path)
    assert project.targets == (Target(name="default"),) and project.variant == "cpu"
    assert "No NVIDIA GPU was found" in (tmp_path / "envbuild.toml").read_text()


def test_init_from_a_host_with_an_unknown_gpu_writes_its_arch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    facts = host.HostFacts(driver_version="570.86.15", gpus=(
        GpuFacts(index=0, name="NVIDIA Future 9000", compute_capability="12.0"),))
    monkeypatch.setattr(host, "probe_host", lambda env, **_: facts)
    assert run(capsys, "--host")[0] == 0
    assert load_project(None, tmp_path).targets == (Target(name="default", driver="570.86.15",
                                                           archs=("sm_120",)),)


def test_toml_string_escapes() -> None:
    for text in ['plain', 'a "quoted" \\ back', "tab\tnew\nline\x7f", "ünïcode ☃ 𝄞"]:
        assert parse(f"x = {toml_string(text)}\n", "t.toml")["x"] == text


DRIVERS = st.from_regex(r"[0-9]{3}(\.[0-9]{1,3}){0,2}", fullmatch=True)
GPU_NAMES = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcxyz0123456789 ._()/-", min_size=1, max_size=30)
NAMES = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,31}", fullmatch=True)
VALUES = st.builds(
    InitValues,
    target=NAMES,
    driver=st.none() | DRIVERS,
    gpus=st.lists(GPU_NAMES, max_size=3, unique=True).map(tuple),
    archs=st.lists(st.sampled_from(["sm_70", "sm_80", "sm_89", "sm_90", "sm_120"]), max_size=3,
                   unique=True).map(tuple),
    datacenter=st.booleans(),
    platform=st.none() | st.sampled_from(["linux/amd64", "linux/arm64"]),
    torch=st.none() | st.sampled_from(["2.4", "2.4.1", ">=2.3,<2.6", "2.13.0+cu126"]),
    python=st.none() | st.sampled_from(["3.11", "3.13t", ">=3.10"]),
    cuda=st.none() | st.sampled_from(["12.4", "13"]),
    cudnn=st.none() | st.sampled_from(["9", ">=8.9"]),
    ubuntu=st.none() | st.sampled_from(["22.04", "24.04"]),
    variant=st.none() | st.sampled_from(["cpu", "cu126", "default"]),
    flavor=st.sampled_from(["runtime", "devel"]),
    torch_index_url=st.none() | st.just("https://127.0.0.1:8443/whl/cu126"),
    note=st.none() | st.text(alphabet="abc #\n\"'", max_size=20),
)


@settings(max_examples=60, deadline=None)
@given(values=VALUES, block=st.booleans())
def test_round_trip_property(values: InitValues, block: bool) -> None:
    name = "pyproject.toml" if block else "envbuild.toml"
    text = render_project(values, pyproject_block=block)
    project = project_from_text(text, Path("/nowhere") / name, shown=name)
    assert project.targets == (Target(name=values.target, driver=values.driver, gpus=values.gpus,
                                      archs=values.archs, datacenter=values.datacenter,
                                      platform=values.platform),)
    assert (project.torch, project.python, project.cuda, project.cudnn, project.ubuntu, project.variant,
            project.flavor, project.torch_index_url) == (
        values.torch, values.python, values.cuda, values.cudnn, values.ubuntu, values.variant,
        values.flavor, values.torch_index_url)
