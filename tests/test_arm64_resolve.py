"""linux/arm64 stacks (issue 38): --platform, a Grace GPU's implied platform, the host's, and
the JSON each stack carries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from schemas import check

from envbuild.commands.cli import main
from envbuild.data import matrix
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve
from envbuild.resolver.selection import Selectors, build_request

BUNDLED = Path(__file__).resolve().parent.parent / "matrices"


def _resolve_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main(["resolve", "--json", "--top", "1000", *args], env={"ENVBUILD_NO_CACHE": "1"})
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_each_stack_says_its_platform_and_the_schema_holds(capsys: pytest.CaptureFixture[str]) -> None:
    code, body = _resolve_json(capsys, "--gpu", "GB200", "--driver", "580.95.05")
    assert code == 0
    check("resolve.schema.json", body)
    assert {s["platform"] for s in body["stacks"]} == {"linux/arm64"}
    # the aarch64 lists, not the x86_64 ones: no sm_75 in any, sm_110 in the CUDA 13 ones
    assert all("sm_75" not in s["arch_list"] for s in body["stacks"])
    assert any("sm_110" in s["arch_list"] for s in body["stacks"])
    code, body = _resolve_json(capsys, "--gpu", "H100", "--driver", "580.95.05")
    check("resolve.schema.json", body)
    assert {s["platform"] for s in body["stacks"]} == {"linux/amd64"}


def test_exit_3_for_a_gpu_no_aarch64_wheel_covers_is_one_line_with_a_working_fix(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, body = _resolve_json(capsys, "--gpu", "T4", "--platform", "linux/arm64")
    assert code == 3
    check("resolve.schema.json", body)
    assert body["error"].startswith("no compatible stack: no linux/arm64 torch wheel runs on sm_75")
    fix = body["fixes"][-1]
    assert fix.startswith("use --platform linux/amd64 instead of linux/arm64")
    # the fix is re-solved: the same request on linux/amd64 resolves
    code, moved = _resolve_json(capsys, "--gpu", "T4", "--platform", "linux/amd64")
    assert code == 0 and moved["stacks"]


def test_the_hosts_platform_is_the_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    from envbuild.host import probe
    from envbuild.host.facts import HostFacts

    monkeypatch.setattr(probe, "probe_host", lambda env: HostFacts(platform="linux/arm64"))
    data = matrix.load(BUNDLED)
    request = build_request(Selectors(host=True, arch=["sm_90"], datacenter=True), data, {})
    assert request.platform == "linux/arm64" and request.platform_given
    # --platform wins over the host's
    request = build_request(Selectors(host=True, platform="linux/amd64"), data, {})
    assert request.platform == "linux/amd64"


def test_arm64_stacks_install_the_aarch64_standalone_python() -> None:
    """A Python no Ubuntu ships comes from python-build-standalone's aarch64 build on arm64."""
    data = matrix.load(BUNDLED)
    from envbuild.data.versions import parse_requirement
    from envbuild.render.lock import make_lock

    request = Request(platform="linux/arm64", torch=parse_requirement("torch", "2.14.1"),
                      python=parse_requirement("python", "3.13"), ubuntu="24.04")
    stacks = resolve(request, data).stacks
    assert stacks and all(s.platform == "linux/arm64" for s in stacks)
    lock = make_lock(stacks[0], data)
    assert lock.python_standalone is not None and "aarch64-unknown-linux-gnu" in lock.python_standalone.url
