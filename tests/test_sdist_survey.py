"""Every sdist-only requirement named by one lock, and never a silent downgrade
(envbuild/pylock/sourceonly.py, the survey in envbuild/pylock/uv.py): real uv runs against a
find-links page on 127.0.0.1 that holds

- ``directa`` 1.0, an sdist only, required by the project;
- ``parent`` 1.0, a wheel requiring ``indirectb``, itself an sdist only (an indirect one);
- ``held`` 0.1 as a wheel and 0.2 as an sdist only (wheels-only resolution takes 0.1: the
  rouge-score 0.1.2 → 0.0.4 case).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from schemas import check
from test_lock_command import env, indexes, run
from test_lock_command import project as lock_project
from test_sdist_builds import empty_index, served

from envbuild.errors import NoCompatibleStack, UsageError
from envbuild.project.config import project_from_text
from envbuild.pylock.files import read_pylock
from envbuild.pylock.sourceonly import HeldBack, chain, parse_annotated
from envbuild.pylock.uv import ClosureSpec, compile_closure

__all__ = ["empty_index", "env", "indexes"]  # fixtures, used by name


def _metadata(name: str, version: str, requires: tuple[str, ...], version_line: str) -> str:
    return "".join(f"{line}\n" for line in [version_line, f"Name: {name}", f"Version: {version}",
                                            *(f"Requires-Dist: {r}" for r in requires)])


def sdist(name: str, version: str, requires: tuple[str, ...] = (),
          version_line: str = "Metadata-Version: 2.2") -> bytes:
    """An sdist with static metadata (PKG-INFO 2.2): uv reads it without building (2.1: uv
    must build it to know)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        files = {"PKG-INFO": _metadata(name, version, requires, version_line),
                 "setup.py": "from setuptools import setup\nsetup()\n"}
        for member, text in files.items():
            info = tarfile.TarInfo(f"{name}-{version}/{member}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


def wheel(name: str, version: str, requires: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{info}/METADATA", _metadata(name, version, requires, "Metadata-Version: 2.1"))
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("survey-links")
    (root / "directa-1.0.tar.gz").write_bytes(sdist("directa", "1.0"))
    (root / "parent-1.0-py3-none-any.whl").write_bytes(wheel("parent", "1.0", ("indirectb",)))
    (root / "indirectb-3.0.tar.gz").write_bytes(sdist("indirectb", "3.0"))
    (root / "held-0.1-py3-none-any.whl").write_bytes(wheel("held", "0.1"))
    (root / "held-0.2.tar.gz").write_bytes(sdist("held", "0.2"))
    (root / "keep-1.0-py3-none-any.whl").write_bytes(wheel("keep", "1.0"))
    (root / "keep-2.0-py3-none-any.whl").write_bytes(wheel("keep", "2.0"))
    (root / "dynamic-0.1-py3-none-any.whl").write_bytes(wheel("dynamic", "0.1"))
    (root / "dynamic-0.2.tar.gz").write_bytes(sdist("dynamic", "0.2", version_line="Metadata-Version: 2.1"))
    with served(root) as url:
        yield url


@pytest.fixture()
def uv_env(tmp_path: Path) -> dict[str, str]:
    return {"UV_CACHE_DIR": str(tmp_path / "uv-cache"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}


def spec(index: str, link: str, env: dict[str, str], *dependencies: str, **changes: Any) -> ClosureSpec:
    return ClosureSpec(torch_pins={}, python="3.11", glibc="2.35", dependencies=dependencies,
                       default_index=index, find_links=(link,), timeout=120, env=env, **changes)


def test_one_lock_names_every_sdist_only_requirement_with_where_it_comes_from(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    """uv alone stops at the first (one per run); the survey names both, the indirect one with
    its chain, and the hint names build-sdists = true and every name."""
    with pytest.raises(NoCompatibleStack) as caught:
        compile_closure(spec(empty_index, links, uv_env, "directa", "parent"))
    message, hint = caught.value.message, caught.value.hint
    assert caught.value.exit_code == 3
    assert "2 requirements of the closure have no wheel for x86_64-manylinux_2_35, only an sdist" in message
    assert "directa 1.0 (the project)" in message
    assert "indirectb 3.0 (via parent ← the project)" in message
    assert "build-sdists = true" in hint and 'build-sdists = ["directa", "indirectb"]' in hint


def test_a_list_missing_one_sdist_only_package_gets_the_whole_list_in_its_hint(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    with pytest.raises(NoCompatibleStack) as caught:
        compile_closure(spec(empty_index, links, uv_env, "directa", "parent", no_binary=("directa",)))
    assert "1 requirement of the closure has no wheel" in caught.value.message
    assert "indirectb 3.0 (via parent ← the project)" in caught.value.message
    assert 'build-sdists = ["directa", "indirectb"]' in caught.value.hint


def test_an_indirect_sdist_only_package_named_in_build_sdists_is_locked_by_its_sdist(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    got = compile_closure(spec(empty_index, links, uv_env, "directa", "parent",
                               no_binary=("directa", "indirectb")))
    assert got.sdists == ("directa", "indirectb")
    package = read_pylock(got.pylock_text).package("indirectb")
    assert package.wheels == () and package.sdist is not None


def test_build_sdists_naming_a_package_outside_the_closure_is_exit_2(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    with pytest.raises(UsageError, match="build-sdists names directa, which the locked closure does not"):
        compile_closure(spec(empty_index, links, uv_env, "parent", no_binary=("directa", "indirectb")))


def test_a_release_held_back_by_wheels_only_resolution_is_reported(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    """held 0.2 exists only as an sdist: the lock takes 0.1 and says so, never silently."""
    got = compile_closure(spec(empty_index, links, uv_env, "held"))
    assert got.packages == {"held": "0.1"}
    assert got.held_back == (HeldBack(name="held", locked="0.1", newest="0.2", sdist_only=True, via=()),)
    assert got.held_back[0].shown() == "held 0.1 locked, not 0.2 (which is an sdist only; the project)"
    pinned = compile_closure(spec(empty_index, links, uv_env, "held==0.1"))
    assert pinned.held_back == () and pinned.notes == ()  # the requirement allows nothing newer


def test_a_release_the_projects_constraints_exclude_is_not_held_back(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    """keep 2.0 is a wheel the project's -c constraints (keep<2) exclude: the survey is held to
    them as the closure's run is, so keep 1.0 is not reported as held back by an sdist (it was,
    before the survey took the constraints)."""
    got = compile_closure(spec(empty_index, links, uv_env, "keep", "held", constraints=("keep<2",)))
    assert got.packages == {"held": "0.1", "keep": "1.0"}
    assert [(h.name, h.locked, h.newest) for h in got.held_back] == [("held", "0.1", "0.2")]


def test_a_kept_previous_pin_is_no_downgrade_unless_the_newer_release_is_an_sdist_only(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    """A lock made before (keep 1.0, held 0.1) locked again: uv keeps both pins. keep 2.0 has a
    wheel (an --upgrade reaches it): not reported; held 0.2 is an sdist only, which no wheels-only
    lock ever reaches: reported again, so a lock made before this check learns it too."""
    first = compile_closure(spec(empty_index, links, uv_env, "keep==1.0", "held"))
    again = compile_closure(spec(empty_index, links, uv_env, "keep", "held", previous=first.pylock_text))
    assert again.packages == {"held": "0.1", "keep": "1.0"}
    assert [(h.name, h.locked, h.newest) for h in again.held_back] == [("held", "0.1", "0.2")]
    upgraded = compile_closure(spec(empty_index, links, uv_env, "keep", "held", previous=first.pylock_text,
                                    upgrade=True))
    assert upgraded.packages["keep"] == "2.0" and [h.name for h in upgraded.held_back] == ["held"]


def test_build_sdists_true_builds_every_sdist_only_release_and_holds_nothing_back(
        empty_index: str, links: str, uv_env: dict[str, str]) -> None:
    got = compile_closure(spec(empty_index, links, uv_env, "directa", "parent", "held", all_sdists=True))
    assert got.packages == {"directa": "1.0", "held": "0.2", "indirectb": "3.0", "parent": "1.0"}
    assert got.sdists == ("directa", "held", "indirectb") and got.held_back == ()
    assert read_pylock(got.pylock_text).package("parent").wheels  # a wheel where there is one


def test_a_survey_that_fails_is_a_note_never_a_failed_lock(empty_index: str, links: str,
                                                           uv_env: dict[str, str]) -> None:
    """dynamic 0.2's sdist has no static metadata and the index no build backend, so the run
    allowing sdists fails (offline, then online): the wheels-only lock stands, with a note."""
    got = compile_closure(spec(empty_index, links, uv_env, "dynamic"))
    assert got.packages == {"dynamic": "0.1"} and got.held_back == ()
    assert len(got.notes) == 1
    assert got.notes[0].startswith("whether wheels-only resolution held a package back was not checked: "
                                   "the run allowing sdists failed (")
    assert "setuptools" in got.notes[0] and len(got.notes[0]) < 400  # the build backend it lacked


def test_uvs_annotations_give_each_package_its_chain() -> None:
    text = ("absl-py==2.5.1\n    # via rouge-score\n"
            "rouge-score==0.1.2\n    # via envbuild-closure (pyproject.toml)\n"
            "six==1.17.0\n    # via\n    #   envbuild-closure (pyproject.toml)\n    #   rouge-score\n"
            "loop-a==1\n    # via loop-b\nloop-b==1\n    # via loop-a\n")
    found = parse_annotated(text, "envbuild-closure")
    assert found["absl-py"] == ("2.5.1", ("rouge-score",))
    assert found["rouge-score"] == ("0.1.2", ())
    assert found["six"] == ("1.17.0", ("rouge-score",))
    parents = {name: via for name, (_, via) in found.items()}
    assert chain("absl-py", parents) == ("rouge-score",)
    assert chain("loop-a", parents) == ("loop-b",)  # a cycle ends, never loops


def test_build_sdists_true_and_an_indirect_name_are_valid_project_values(tmp_path: Path) -> None:
    path = tmp_path / "envbuild.toml"
    for text, names, every in [
            ('dependencies = ["parent"]\nbuild-sdists = true\n', (), True),
            ('dependencies = ["parent"]\nbuild-sdists = ["IndirectB"]\n', ("indirectb",), False),
            ('dependencies = ["parent"]\nbuild-sdists = false\n', (), False)]:
        path.write_text(text)
        got = project_from_text(text, path, shown="envbuild.toml")
        assert (got.build_sdists, got.all_sdists) == (names, every)
    text = 'dependencies = ["parent"]\nbuild-sdists = "parent"\n'
    path.write_text(text)
    with pytest.raises(UsageError, match=r"envbuild\.toml:2: build-sdists: expected an array of strings"):
        project_from_text(text, path, shown="envbuild.toml")


def lock_json(root: Path, indexes: str, links: str, keys: str, env: dict[str, str],
              capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    """``lock --json`` of a project requiring six and held, with the find-links page and ``keys``:
    (the document, checked against its schema; standard error)."""
    lock_project(root, indexes, deps='["six", "held"]')
    with (root / "envbuild.toml").open("a") as file:
        file.write(f'find-links = ["{links}"]\n{keys}')
    code, out, err = run(capsys, env, "lock", "--json")
    assert code == 0, err
    document = json.loads(out)
    check("lock.schema.json", document)
    return document, err


def test_lock_says_what_it_held_back_and_lock_json_lists_it(
        tmp_path: Path, indexes: str, env: dict[str, str], links: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    document, err = lock_json(tmp_path, indexes, links, "", env, capsys)
    assert document["targets"][0]["held_back"] == [
        {"name": "held", "locked": "0.1", "newest": "0.2", "newest_sdist_only": True, "via": []}]
    assert document["targets"][0]["sdists"] == []
    assert "warning: held 0.1 locked, not 0.2 (which is an sdist only; the project): wheels-only " \
           "resolution held it back" in err


@pytest.mark.network
def test_the_real_rouge_score_case_is_reported_and_every_sdist_named(tmp_path: Path) -> None:
    """The issue's case on the configured index: rouge-score's newest release is an sdist only,
    so wheels-only resolution takes an older one and says so; with two sdist-only requirements
    beside a wheel-only one's, one run names both."""
    from envbuild.upstream.pipconfig import index_url

    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    index = index_url(None, env)
    got = compile_closure(ClosureSpec(torch_pins={}, python="3.11", glibc="2.35",
                                      dependencies=("rouge-score",), default_index=index, env=env,
                                      timeout=300))
    [held] = [h for h in got.held_back if h.name == "rouge-score"]
    assert held.locked == got.packages["rouge-score"] and held.sdist_only and held.via == ()
    assert Version(held.locked) < Version(held.newest)
    with pytest.raises(NoCompatibleStack) as caught:
        compile_closure(ClosureSpec(torch_pins={}, python="3.11", glibc="2.35",
                                    dependencies=("sqlitedict", "word2number", "six"),
                                    default_index=index, env=env, timeout=300))
    assert "sqlitedict" in caught.value.message and "word2number" in caught.value.message
    assert 'build-sdists = ["sqlitedict", "word2number"]' in caught.value.hint


def test_lock_with_build_sdists_true_records_the_sdists_uv_chose_and_check_holds(
        tmp_path: Path, indexes: str, env: dict[str, str], links: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    document, err = lock_json(tmp_path, indexes, links, "build-sdists = true\n", env, capsys)
    assert document["targets"][0]["sdists"] == ["held"] and document["targets"][0]["held_back"] == []
    assert json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["sdists"] == ["held"]
    assert "held it back" not in err
    code, out, err = run(capsys, env, "lock", "--check")
    assert "is up to date" in out
    assert code == 0, err
