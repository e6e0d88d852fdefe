"""The two test commands (scripts/test.sh): the quick tier leaves out every test that needs
something beyond this checkout, and the whole suite, which CI runs, leaves out nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from envbuild.project.toml import parse

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")


def registered_markers() -> set[str]:
    project = parse((ROOT / "pyproject.toml").read_text(encoding="utf-8"), "pyproject.toml")
    return {line.partition(":")[0].strip() for line in project["tool"]["pytest"]["ini_options"]["markers"]}


def test_the_quick_tier_deselects_every_registered_marker() -> None:
    # Every marker registered names a need (an engine, Slurm, the index): a new one must be left
    # out of the quick tier too, or `--quick` would need it.
    expression = re.search(r"without_engine='([^']+)'", SCRIPT)
    assert expression is not None
    left_out = set(re.findall(r"not (\w+)", expression.group(1)))
    assert registered_markers() == left_out == {"docker", "slurm", "network"}
    quick = SCRIPT[SCRIPT.index('if [ "$quick" -eq 1 ]; then\n  #'):SCRIPT.index("\nfi\n# The whole")]
    assert '-m "$without_engine"' in quick and '"${workers[@]}"' in quick


def test_ci_runs_the_whole_suite_and_it_shows_the_slowest() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.rstrip().endswith("bash scripts/test.sh")  # no --quick, no -m: everything
    whole = SCRIPT[SCRIPT.index("\nfi\n# The whole"):]  # after the quick tier's block
    runs = [line.strip() for line in whole.splitlines() if line.strip().startswith("python -m pytest")]
    # two parts that together select every test: the workers' and its complement (in one process,
    # or in two halves: test_with_a_second_engine_the_engine_tests_run_in_two_halves)
    assert len(runs) == 3 and all("--durations=25" in run for run in runs)
    assert '-m "$without_engine"' in runs[0] and '"${workers[@]}"' in runs[0]
    assert all('-m "$with_engine"' in run and "-n" not in run.split() for run in runs[1:])
    assert "with_engine='docker or slurm or network'" in whole
    without = re.search(r"without_engine='([^']+)'", SCRIPT)
    assert without is not None
    assert without.group(1) == " and ".join(f"not {m}" for m in ("docker", "slurm", "network"))


def first_engine_modules() -> list[str]:
    listed = re.search(r"on_first_engine=\(([^)]*)\)", SCRIPT)
    assert listed is not None
    return listed.group(1).split()


def test_the_modules_using_buildahs_store_run_on_the_default_engine() -> None:
    # buildah keeps one image store per machine: a module that counts or removes what its builds
    # left there must not run beside another such module, so all of them go to the default engine.
    modules = first_engine_modules()
    assert all((ROOT / m).is_file() for m in modules), modules
    users = sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
                   if re.search(r"buildah_images\(|BuildahBuilder\(docker=", p.read_text(encoding="utf-8")))
    assert users and set(users) <= set(modules), users


def fake_tools(tmp_path: Path, engine2_answers: bool) -> tuple[dict[str, str], Path]:
    """PATH stubs for ruff, mypy, docker and python: each pytest run is written to calls.jsonl
    with the DOCKER_HOST it got; the second engine answers `docker info` or not."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir(parents=True)
    for tool in ("ruff", "mypy"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    down = 0 if engine2_answers else 1
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = info ]; then\n'
        f'  case "${{DOCKER_HOST:-}}" in unix:///fake/engine-2.sock) exit {down};; esac\n'
        "  exit 0\nfi\n"
        "exit 0\n")
    (bin_dir / "python").write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if sys.argv[1:3] == ['-c', 'import xdist']: sys.exit(0)\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'host': os.environ.get('DOCKER_HOST')}) + '\\n')\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "ENVBUILD_TEST_ENGINE_2": "unix:///fake/engine-2.sock", "TMPDIR": str(tmp_path)}
    env.pop("DOCKER_HOST", None)
    return env, calls


def pytest_runs(calls: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_with_a_second_engine_the_engine_tests_run_in_two_halves(tmp_path: Path) -> None:
    env, calls = fake_tools(tmp_path, engine2_answers=True)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    first, *halves = pytest_runs(calls)
    assert "not docker and not slurm and not network" in first["argv"] and first["host"] is None
    modules = first_engine_modules()
    by_host = {run["host"]: run["argv"] for run in halves}
    assert set(by_host) == {None, "unix:///fake/engine-2.sock"}, halves
    default, second = by_host[None], by_host["unix:///fake/engine-2.sock"]
    assert isinstance(default, list) and isinstance(second, list)
    # Every engine test in exactly one half: the listed modules on the default engine, the rest
    # (the same marker expression, those modules ignored) on the second.
    for argv in (default, second):
        assert argv[:2] == ["-m", "pytest"] and "--durations=25" in argv
        assert argv[argv.index("-m", 2) + 1] == "docker or slurm or network"
    assert [a for a in default if a.startswith("tests/")] == modules
    assert [a for a in second if a.startswith("--ignore=")] == [f"--ignore={m}" for m in modules]
    assert not [a for a in second if a.startswith("tests/")]


def test_arguments_or_no_second_engine_mean_one_process(tmp_path: Path) -> None:
    env, calls = fake_tools(tmp_path, engine2_answers=True)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), "-k", "x"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = pytest_runs(calls)
    assert len(runs) == 2 and all(run["host"] is None for run in runs)
    assert runs[1]["argv"][-2:] == ["-k", "x"] and "tests/test_lock_e2e.py" not in runs[1]["argv"]
    # A second engine named but not answering: exit 2 before any engine test, with a hint.
    env, calls = fake_tools(tmp_path / "down", engine2_answers=False)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "no Docker engine answers at ENVBUILD_TEST_ENGINE_2=unix:///fake/engine-2.sock" in done.stderr
    assert "hint:" in done.stderr and len(pytest_runs(calls)) == 1  # part 1 only
    env["ENVBUILD_TEST_ENGINE_2"] = "none"
    calls.unlink()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and len(pytest_runs(calls)) == 2
