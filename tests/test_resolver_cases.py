"""Resolver cases as data: host + request → expected stacks or conflict (resolver_cases.yaml).

Expectations are properties derived from the sourced facts (a driver boundary, an arch
list), not snapshots of the output, so newer data cannot silently rewrite them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version

from envbuild.commands.cli import main
from envbuild.data.versions import DriverVersion

CASES = yaml.safe_load((Path(__file__).parent / "resolver_cases.yaml").read_text())
OPERATORS = (">=", "<=", "!=", ">", "<", "^")


def _value(field: str, text: str) -> Any:
    if field in ("min_driver", "version"):
        return DriverVersion.parse(text)
    if field in ("torch", "cuda", "python", "ubuntu", "cudnn", "max_cuda", "max_cuda_release",
                 "base_cuda"):
        return Version(text.rstrip("t"))
    return text


def matches(field: str, actual: Any, expected: Any) -> bool:
    if isinstance(expected, list):
        return actual in expected
    if not isinstance(expected, str) or actual is None:
        return bool(actual == expected)
    for op in OPERATORS:
        if expected.startswith(op):
            want = expected[len(op):]
            if op == "^":
                return str(actual).startswith(want)
            a, w = _value(field, str(actual)), _value(field, want)
            return {">=": a >= w, "<=": a <= w, "!=": a != w, ">": a > w, "<": a < w}[op]
    return bool(str(actual) == expected)


def check_fields(where: str, actual: dict[str, Any], expected: dict[str, Any]) -> None:
    for field, want in expected.items():
        assert matches(field, actual.get(field), want), (
            f"{where}: {field} = {actual.get(field)!r}, expected {want!r}")


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    env = {"ENVBUILD_NO_CACHE": "1", **{k: v for k, v in os.environ.items()
                                         if k == "ENVBUILD_MATRICES"}}
    code = main(["resolve", "--json", "--top", "1000", *args], env=env)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_resolver_case(case: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert case.get("why"), "every case says why it exists"
    expect = case["expect"]
    code, out, err = run([str(a) for a in case["args"]], capsys)
    assert code == expect.get("exit", 0), err
    if code == 2:
        assert expect["error"] in err.splitlines()[0]
        return
    body = json.loads(out)
    if code == 3:
        assert expect.get("error", "") in body["error"]
        for fix in expect.get("fixes", []):
            assert any(fix in f for f in body["fixes"]), body["fixes"]
        return
    stacks = body["stacks"]
    assert stacks, "a success has at least one stack"
    check_fields("driver", body["driver"] or {}, expect.get("driver", {}))
    check_fields("top", stacks[0], expect.get("top", {}))
    for stack in stacks:
        check_fields(f"every ({stack['torch']}+{stack['variant']})", stack, expect.get("every", {}))
    for field, forbidden in expect.get("none", {}).items():
        assert not any(matches(field, s.get(field), forbidden) for s in stacks), (field, forbidden)
    for field, wanted in expect.get("some", {}).items():
        assert any(matches(field, s.get(field), wanted) for s in stacks), (field, wanted)
    assert_forward_last(stacks)


def assert_forward_last(stacks: list[dict[str, Any]]) -> None:
    """docs/faults.md K1: no forward-compatibility stack ranks above a native or
    minor-version one (README, ranking policy)."""
    modes = [s["compat"] for s in stacks]
    if "forward" in modes:
        first = modes.index("forward")
        assert all(mode == "forward" for mode in modes[first:]), modes


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 60
    assert len({c["id"] for c in CASES}) == len(CASES)


def test_output_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md B5: ties break the same way on every run."""
    first = run(["--driver", "550", "--gpu", "A100"], capsys)
    second = run(["--driver", "550", "--gpu", "A100"], capsys)
    assert first == second
