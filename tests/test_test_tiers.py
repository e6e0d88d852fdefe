"""The two test commands (scripts/test.sh): the quick tier leaves out every test that needs
something beyond this checkout, and the whole suite, which CI runs, leaves out nothing."""

from __future__ import annotations

import re
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
    runs = [line for line in whole.splitlines() if line.startswith("python -m pytest")]
    # two parts that together select every test: the workers' and its complement, in one process
    assert len(runs) == 2 and all("--durations=25" in run for run in runs)
    assert '-m "$without_engine"' in runs[0] and '"${workers[@]}"' in runs[0]
    assert '-m "docker or slurm or network"' in runs[1] and "-n" not in runs[1].split()
    without = re.search(r"without_engine='([^']+)'", SCRIPT)
    assert without is not None
    assert without.group(1) == " and ".join(f"not {m}" for m in ("docker", "slurm", "network"))
