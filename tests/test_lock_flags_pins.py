"""``lock`` on a project as its authors wrote it (issue 37): a torch pin in the project narrows
the stack beside every ``--torch`` form and every way out honours it (docs/faults.md H48), the
flags a lock was made with are recorded and ``lock --check`` uses them (H49), and ``lock``
where no project file is says so (H50). uv against the 127.0.0.1 indexes of test_lock_command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from schemas import check
from test_lock_command import BASE, env, indexes, project, run  # noqa: F401 (fixtures)

PIN = ">=2.11.0,<=2.12.0"


def pinned_project(directory: Path, indexes: str, extra: str = "") -> Path:  # noqa: F811
    """A project whose own dependencies pin torch (no 'torch' key: the stack is free)."""
    (directory / "envbuild.toml").write_text(
        f'variant = "cpu"\npython = "3.11"\ncompanions = false\nbase-image = "{BASE}"\n'
        f'torch-index-url = "{indexes}/torch/simple"\nindex-url = "{indexes}/default/simple"\n'
        f'dependencies = ["six", "torch{PIN}"]\n{extra}')
    return directory


@pytest.mark.parametrize("form", ["2.12.0", "2.12", "==2.12.0", None])
def test_every_torch_form_works_with_the_projects_pin(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, form: str | None) -> None:
    """H48: --torch 2.12.0 beside torch>=2.11.0,<=2.12.0 was exit 2 ("invalid torch version
    '2.12.0,<=2.12.0,>=2.11.0'"); every documented form now narrows beside the pin."""
    monkeypatch.chdir(pinned_project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock", *(["--torch", form] if form else []))
    assert code == 0, err
    locked = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert locked["packages"]["torch"] == "2.12.0+cpu" and locked["stack"]["torch"] == "2.12.0"


def _torches(text: str) -> list[Version]:
    return [Version(v) for v in re.findall(r"torch (\d+\.\d+\.\d+)\+", text)]


def test_no_stack_for_the_pin_lists_only_relevant_wheels_and_fixes_that_keep_it(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """H48: a driver too old for every torch the pin allows. The conflicts name only torches
    the pin allows, and every fix, re-solved with the pin, keeps it (no 'use --torch 2.7.1')."""
    monkeypatch.chdir(pinned_project(tmp_path, indexes, extra='driver = "470"\n'))
    (tmp_path / "envbuild.toml").write_text((tmp_path / "envbuild.toml").read_text()
                                            .replace('variant = "cpu"\n', ""))
    code, _, err = run(capsys, env, "lock")
    assert code == 3, err
    pin = SpecifierSet(PIN)
    found = _torches(err)
    assert found and all(v in pin for v in found), err
    assert "--torch" not in err  # relaxing the project's own pin is no way out
    assert "upgrade the driver" in err
    assert not (tmp_path / "envbuild.lock").exists()


def test_a_torch_flag_outside_the_pin_is_one_line_and_the_fix_keeps_the_pin(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(pinned_project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock", "--torch", "2.13.0")
    assert code == 3, err
    assert f"the project's requirement torch{SpecifierSet(PIN)} admit no release in common" in err
    assert "1.13" not in err and "2.0.0" not in err  # no family the pin rules out is listed
    fixes = re.findall(r"use --torch (\S+) instead of 2\.13\.0", err)
    assert fixes and all(Version(v) in SpecifierSet(PIN) for v in fixes), err


def test_a_pin_no_release_meets_is_one_line(tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(pinned_project(tmp_path, indexes))
    (tmp_path / "envbuild.toml").write_text((tmp_path / "envbuild.toml").read_text().replace(PIN, "<1"))
    code, _, err = run(capsys, env, "lock")
    assert code == 3, err
    assert "no torch release the data knows satisfies the project's requirement torch<1" in err
    assert "1.13.0" not in err


def test_flags_are_recorded_and_lock_check_uses_and_names_them(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """H49: lock --base-image X, then a plain lock --check: up to date (was 11, advising a plain
    'envbuild lock' that would switch the base back); stale advice names the flags."""
    other = "mirror.example/library/debian:trixie@sha256:" + "b" * 64
    monkeypatch.chdir(project(tmp_path, indexes))
    code, out, err = run(capsys, env, "lock", "--base-image", other, "--pip-package", "idna", "--json")
    assert code == 0, err
    document = json.loads(out)
    check("lock.schema.json", document)
    assert document["flags"] == [f"--base-image={other}", "--pip-package=idna"]
    data = json.loads((tmp_path / "envbuild.lock").read_text())
    assert data["flags"] == [f"--base-image={other}", "--pip-package=idna"]
    assert data["targets"]["default"]["base_image"] == other
    code, out, err = run(capsys, env, "lock", "--check")
    assert (code, err) == (0, ""), err
    # Given flags replace the record: without --pip-package the closure's inputs differ.
    code, _, err = run(capsys, env, "lock", "--check", "--base-image", other)
    assert code == 11 and "closure's inputs changed" in err
    project(tmp_path, indexes, deps='["six", "filelock"]')
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and f"run 'envbuild lock --base-image={other} --pip-package=idna'" in err
    # A plain lock drops them, and says so.
    code, _, err = run(capsys, env, "lock")
    assert code == 0 and f"was locked with --base-image={other} --pip-package=idna" in err
    assert "flags" not in json.loads((tmp_path / "envbuild.lock").read_text())


def test_a_lock_recording_a_flag_that_is_no_lock_flag_is_refused(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """H49: the record is hostile input: an option lock does not take, or a value flag without
    its value, is exit 2 naming it; a record that is not a list of --options too."""
    monkeypatch.chdir(project(tmp_path, indexes))
    assert run(capsys, env, "lock", "--no-registry")[0] == 0
    path = tmp_path / "envbuild.lock"
    data = json.loads(path.read_text())
    assert data["flags"] == ["--no-registry"]
    for flags, message in ((["--pip-arg=--index-url=http://evil"], "no lock flag"),
                           (["--base-image"], "no lock flag"), (["--no-registry=1"], "no lock flag"),
                           (["--x\nRUN id"], "lock 'flags' must be"), ("--offline", "lock 'flags' must be")):
        path.write_text(json.dumps({**data, "flags": flags}))
        code, _, err = run(capsys, env, "lock", "--check")
        assert code in (2, 11) and message in err, (flags, err)
        assert "\nRUN" not in err.splitlines()[0]


def test_lock_without_a_project_file_says_so(tmp_path: Path, env: dict[str, str],  # noqa: F811
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """H50: a bare 'lock' where there is no project file locked a default stack and failed at
    the index; now exit 2 naming what it looked for, 'envbuild init' and locking from flags."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, env, "lock", "--offline")
    assert code == 2 and "no project file: neither envbuild.toml nor pyproject.toml" in err
    assert "envbuild init" in err and "--no-project" in err
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    code, _, err = run(capsys, env, "lock")
    assert code == 2 and "pyproject.toml has no [tool.envbuild] table" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pyproject.toml"]
