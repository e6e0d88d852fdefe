"""``base-glibc`` (project key) and ``lock --base-glibc``: a closure resolved for a custom base
image's glibc instead of the stack's Ubuntu's (docs/faults.md I16).

Without it, a lock on a Debian 12 base (glibc 2.36) for an Ubuntu 24.04 stack (2.39) may pick a
wheel that needs 2.39, and only the build's check (I9) stops it. uv runs for real against
package indexes served on 127.0.0.1: ``glibcpkg`` 2.0 has only a manylinux_2_39 wheel, 1.0 a
manylinux_2_28 one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_lock_command import BASE, INDEXES, LINUX, env, run, serve_indexes

__all__ = ["env"]  # the fixture, imported for pytest

DISTS = {"torch": INDEXES["torch"],
         "default": [*INDEXES["default"], ("glibcpkg", "2.0", "cp311-cp311-manylinux_2_39_x86_64", ()),
                     ("glibcpkg", "1.0", LINUX, ())]}


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_indexes(tmp_path_factory.mktemp("indexes"), DISTS)


def project(directory: Path, indexes: str, *, extra: str = "", base: bool = True) -> Path:
    (directory / "envbuild.toml").write_text(
        'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\nubuntu = "24.04"\ncompanions = false\n'
        + (f'base-image = "{BASE}"\n' if base else "")
        + f'torch-index-url = "{indexes}/torch/simple"\nindex-url = "{indexes}/default/simple"\n'
        f'dependencies = ["glibcpkg"]\n{extra}')
    return directory


def locked(directory: Path) -> dict[str, object]:
    target: dict[str, object] = json.loads((directory / "envbuild.lock").read_text())["targets"]["default"]
    return target


def test_the_closure_is_resolved_for_the_bases_glibc(tmp_path: Path, indexes: str, env: dict[str, str],
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    plain = locked(tmp_path)
    assert plain["packages"]["glibcpkg"] == "2.0"  # type: ignore[index]
    assert plain["pylock"]["platform"] == "x86_64-manylinux_2_39"  # type: ignore[index]
    assert "Ubuntu 24.04's glibc; the base image is checked against it at build time: set base-glibc" in err

    project(tmp_path, indexes, extra='base-glibc = "2.36"\n')
    code, _, err = run(capsys, env, "lock", "--upgrade")
    assert code == 0, err
    mine = locked(tmp_path)
    assert mine["packages"]["glibcpkg"] == "1.0"  # type: ignore[index]
    assert mine["pylock"]["platform"] == "x86_64-manylinux_2_36"  # type: ignore[index]
    assert "for x86_64-manylinux_2_36 (the base image's glibc, base-glibc)" in err
    code, out, err = run(capsys, env, "lock", "--check")
    assert (code, err) == (0, "") and "up to date" in out


def test_the_flag_is_recorded_and_held_by_check(tmp_path: Path, indexes: str, env: dict[str, str],
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock", "--base-glibc", "2.36")
    assert code == 0, err
    data = json.loads((tmp_path / "envbuild.lock").read_text())
    assert "--base-glibc=2.36" in data["flags"]
    assert locked(tmp_path)["packages"]["glibcpkg"] == "1.0"  # type: ignore[index]
    code, out, err = run(capsys, env, "lock", "--check")  # the recorded flag applies again
    assert (code, err) == (0, "") and "up to date" in out


@pytest.mark.parametrize(("value", "says"), [
    ('"2.5"', "older than glibc 2.17"),
    ('"bookworm"', "is not a glibc version 2.N"),
    ('"2.36\\u001b[31m"', "is not a glibc version 2.N"),
    ("236", "expected a string"),
])
def test_a_bad_value_is_exit_2_naming_the_line(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, value: str, says: str) -> None:
    monkeypatch.chdir(project(tmp_path, indexes, extra=f"base-glibc = {value}\n"))
    code, _, err = run(capsys, env, "lock")
    assert code == 2 and says in err and "envbuild.toml:" in err
    assert "\x1b" not in err and len(err.strip().splitlines()) <= 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


def test_without_a_custom_base_it_is_refused(tmp_path: Path, indexes: str, env: dict[str, str],
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, indexes, extra='base-glibc = "2.36"\n', base=False))
    code, _, err = run(capsys, env, "lock", "--no-registry")
    assert code == 2 and "names the glibc of a custom base image" in err and "base-image" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]
