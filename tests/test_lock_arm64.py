"""``envbuild lock`` of a fleet with x86 H100 nodes and a GB200 rack (issue 38): one run, two
targets, each closure resolved by uv for its own platform from fixture indexes on 127.0.0.1
(PEP 503 pages with PEP 658 metadata, wheels for manylinux x86_64 and aarch64)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from schemas import check
from test_lock_command import BASE, PURE, UV, env, run, serve_indexes

__all__ = ["env"]  # the fixture, imported for pytest

X86 = "cp311-cp311-manylinux_2_28_x86_64"
ARM = "cp311-cp311-manylinux_2_28_aarch64"
INDEXES = {
    "torch": [("torch", "2.13.0+cu130", X86, ("filelock",)), ("torch", "2.13.0+cu130", ARM, ("filelock",))],
    "default": [("filelock", "3.1.0", PURE, ()), ("six", "1.17.0", PURE, ()),
                # a compiled dependency: each platform must get its own wheel
                ("pyyaml", "6.0.2", X86, ()), ("pyyaml", "6.0.2", ARM, ()),
                ("uv", UV, "py3-none-manylinux_2_17_x86_64", ()),
                ("uv", UV, "py3-none-manylinux_2_17_aarch64", ())],
}
FLEET = '''
[[targets]]
name = "h100"
gpus = ["H100"]

[[targets]]
name = "gb200"
gpus = ["GB200"]
'''


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_indexes(tmp_path_factory.mktemp("arm-indexes"), INDEXES)


def _project(directory: Path, indexes: str, targets: str) -> Path:
    (directory / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cu130"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{BASE}"\ntorch-index-url = "{indexes}/torch/simple"\n'
        f'index-url = "{indexes}/default/simple"\ndependencies = ["six", "pyyaml"]\n{targets}')
    return directory


def test_x86_h100_nodes_and_a_gb200_rack_lock_in_one_run(tmp_path: Path, indexes: str, env: dict[str, str],
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(_project(tmp_path, indexes, FLEET))
    code, out, err = run(capsys, env, "lock", "--json")
    assert code == 0, err
    document = json.loads(out)
    check("lock.schema.json", document)
    # lock --json names each target's platform, the amd64 one's too
    assert {t["name"]: t["platform"] for t in document["targets"]} == {"h100": "linux/amd64",
                                                                      "gb200": "linux/arm64"}
    lock = json.loads((tmp_path / "envbuild.lock").read_text())
    h100, gb200 = lock["targets"]["h100"], lock["targets"]["gb200"]
    # the GB200's platform is inferred from its GPU; an amd64 stack records none (as before)
    assert gb200["stack"]["platform"] == "linux/arm64" and "platform" not in h100["stack"]
    assert h100["pylock"]["platform"].startswith("x86_64-manylinux_2_")
    assert gb200["pylock"]["platform"].startswith("aarch64-manylinux_2_")
    assert "sm_110" in gb200["stack"]["arch_list"] and "sm_75" in h100["stack"]["arch_list"]
    x86 = (tmp_path / "pylock.h100.toml").read_text()
    arm = (tmp_path / "pylock.gb200.toml").read_text()
    # each pylock names its platform's compiled wheels (uv lists the wheels of the platform asked)
    assert re.search(r"pyyaml-6\.0\.2-cp311-cp311-manylinux_2_28_aarch64\.whl", arm)
    assert re.search(r"pyyaml-6\.0\.2-cp311-cp311-manylinux_2_28_x86_64\.whl", x86)
    # the build's installer is the uv wheel of each platform
    assert gb200["pylock"]["installer"]["url"].endswith("manylinux_2_17_aarch64.whl")
    assert h100["pylock"]["installer"]["url"].endswith("manylinux_2_17_x86_64.whl")
    # the project's base image brings its own python3 (tests/test_arm64_resolve.py covers the
    # aarch64 standalone build a stack without one gets)
    assert gb200["python_provision"] == h100["python_provision"] == "base"
    code, _, err = run(capsys, env, "lock", "--check")
    assert (code, err) == (0, ""), err
    # render picks the aarch64 wheels for the arm target's image
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "--target", "gb200",
                       "-o", "ctx")
    assert code == 0, err
    project_txt = (tmp_path / "ctx" / "requirements" / "project.txt").read_text()
    assert "manylinux_2_28_aarch64.whl" in project_txt and "x86_64" not in project_txt


def test_a_target_platform_key_is_checked_and_wins(tmp_path: Path, indexes: str, env: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bad = '\n[[targets]]\nname = "a"\nplatform = "arm64"\n'
    monkeypatch.chdir(_project(tmp_path, indexes, bad))
    code, _, err = run(capsys, env, "lock")
    assert code == 2 and "unknown platform 'arm64'" in err and "linux/arm64" in err
    assert not (tmp_path / "envbuild.lock").exists()
    # an explicit platform for a GPU named by its sm_XY (an H100 in a Grace server is sm_90 too)
    arm = '\n[[targets]]\nname = "arm"\narchs = ["sm_90"]\ndatacenter = true\nplatform = "linux/arm64"\n'
    _project(tmp_path, indexes, arm)
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    lock = json.loads((tmp_path / "envbuild.lock").read_text())
    assert lock["targets"]["arm"]["pylock"]["platform"].startswith("aarch64-")


def test_base_glibc_holds_for_every_target_platform(tmp_path: Path, indexes: str, env: dict[str, str],
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """base-glibc (docs/faults.md I16) names the custom base's glibc: the arm64 target's closure is
    resolved for it as the x86 one's is, each on its own CPU."""
    monkeypatch.chdir(_project(tmp_path, indexes, 'base-glibc = "2.36"\n' + FLEET))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    targets = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]
    assert targets["h100"]["pylock"]["platform"] == "x86_64-manylinux_2_36"
    assert targets["gb200"]["pylock"]["platform"] == "aarch64-manylinux_2_36"
    assert re.search(r"pyyaml-6\.0\.2-cp311-cp311-manylinux_2_28_aarch64\.whl",
                     (tmp_path / "pylock.gb200.toml").read_text())
