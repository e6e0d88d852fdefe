"""How many times a lock reads each index page, and what it remembers between locks.

Uses test_pylock's local index on 127.0.0.1, which records every path asked for. The torch
layer's run answers from the cache the closure's run has just filled (one round of the
index's pages for uv, not two); the check of every file's sha256 reads a page once and, once
a page gave a file's sha256, a later lock of the same file does not read it again
(``$XDG_CACHE_HOME/envbuild/index-hashes/``). ``lock`` asks the image registry for the base's
digest while uv resolves, not before.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from test_lock_command import BASE, indexes, project, run  # noqa: F401  (fixtures)
from test_lock_command import env as lock_env  # noqa: F401  (a fixture: env)
from test_pylock import Index, fake_sha256, index, spec, uv_env  # noqa: F401  (fixtures)

from envbuild.errors import DataError
from envbuild.pylock.files import read_pylock
from envbuild.pylock.hashes import check_index_hashes
from envbuild.pylock.uv import Closure, ClosureSpec, compile_closure, find_uv


def recording_uv(tmp_path: Path) -> tuple[str, Path]:
    """A uv that records each run's arguments (one JSON line) and then runs the real one."""
    log = tmp_path / "uv-runs.jsonl"
    wrapper = tmp_path / "uv"
    wrapper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                       f"with open({str(log)!r}, 'a') as f: f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
                       f"os.execv({find_uv(None)!r}, [{find_uv(None)!r}, *sys.argv[1:]])\n")
    wrapper.chmod(0o755)
    return str(wrapper), log


def runs(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_torch_layer_comes_from_the_cache_the_closure_filled(index: Index, uv_env: dict[str, str],  # noqa: F811
                                                                 tmp_path: Path) -> None:
    """One run of uv reads the index, the closure's, which allows sdists and so is the survey's
    too (envbuild/pylock/sourceonly.py's wheels_alone: it selected wheels alone). The torch
    layer's run (constrained to the closure) answers from the cache that run has just brought
    up to date."""
    uv, log = recording_uv(tmp_path)
    closure = compile_closure(spec(index, {**uv_env, "ENVBUILD_NO_CACHE": "1"}, uv=uv))
    assert closure.torch_layer == frozenset({"torch", "filelock", "sympy", "mpmath"})
    assert closure.held_back == () and closure.notes == ()
    online = [r for r in runs(log) if "compile" in r and "--offline" not in r]
    assert len(online) == 1 and "--only-binary" not in online[0] and "--generate-hashes" in online[0]
    assert [r for r in runs(log) if "compile" in r and "--only-binary" not in r] == online  # no other survey
    assert all("--offline" in r for r in runs(log) if "layer.txt" in r)  # the torch layer's runs


def test_the_torch_layer_answered_beside_the_closures_run_is_taken_where_it_holds_its_versions(
        index: Index, uv_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """Locked twice on one uv cache: the second time the pins' closure, answered from that
    cache beside the closure's run, holds exactly the closure's versions, so it is the layer
    and no run after the closure's makes it. Where the closure holds a torch dependency at
    another version (filelock==3.0.0; the cache's answer says 3.1.0), the early answer is not
    taken and the layer's run held to the closure's versions makes it."""
    env = {**uv_env, "ENVBUILD_NO_CACHE": "1"}
    compile_closure(spec(index, env))  # fills uv's cache
    uv, log = recording_uv(tmp_path)
    again = compile_closure(spec(index, env, uv=uv))
    assert again.torch_layer == frozenset({"torch", "filelock", "sympy", "mpmath"})
    assert [r for r in runs(log) if "layer.txt" in r and "--constraints" not in r]  # the early run
    assert not [r for r in runs(log) if "--constraints" in r and "constraints.txt" in r]  # none held
    log.unlink()
    older = compile_closure(spec(index, env, uv=uv, dependencies=("requests", "filelock==3.0.0")))
    assert older.packages["filelock"] == "3.0.0"
    assert older.torch_layer == frozenset({"torch", "filelock", "sympy", "mpmath"})
    assert [r for r in runs(log) if "--constraints" in r and "constraints.txt" in r]  # held to 3.0.0


def test_the_torch_layer_without_a_uv_cache(index: Index, uv_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """UV_NO_CACHE: the cache cannot answer the layer's run, which then asks the index."""
    uv, log = recording_uv(tmp_path)
    closure = compile_closure(spec(index, {**uv_env, "UV_NO_CACHE": "1", "ENVBUILD_NO_CACHE": "1"}, uv=uv))
    assert closure.torch_layer == frozenset({"torch", "filelock", "sympy", "mpmath"})
    assert closure.packages["requests"] == "2.0.0"
    layer = [r for r in runs(log) if "--constraints" in r and "constraints.txt" in r]
    assert ["--offline" in r for r in layer] == [True, False]


def idna_pylock(served: Index, sha256: str) -> str:
    return ('lock-version = "1.0"\ncreated-by = "tests"\n[[packages]]\nname = "idna"\nversion = "3.0"\n'
            f'wheels = [{{ url = "http://127.0.0.1:{served.port}/default/files/idna-3.0-py3-none-any.whl", '
            f'hashes = {{ sha256 = "{sha256}" }} }}]\n')


def test_a_page_that_gave_a_sha256_is_not_read_again(index: Index, uv_env: dict[str, str],  # noqa: F811
                                                    tmp_path: Path) -> None:
    env = {**uv_env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("ENVBUILD_NO_CACHE", None)
    good = read_pylock(idna_pylock(index, fake_sha256("idna-3.0-py3-none-any.whl")))
    url = index.url("default").replace("http://", "http://someone:t0ken@")
    index.paths.clear()
    check_index_hashes(good, lambda _: url, env=env, timeout=30)
    assert index.paths == ["/default/simple/idna/"]
    check_index_hashes(good, lambda _: url, env=env, timeout=30)
    assert index.paths == ["/default/simple/idna/"]  # remembered
    [record] = (tmp_path / "cache" / "envbuild" / "index-hashes").iterdir()
    assert "t0ken" not in record.read_text() and "someone" not in record.read_text()
    assert json.loads(record.read_text())["files"] == {
        "idna-3.0-py3-none-any.whl": fake_sha256("idna-3.0-py3-none-any.whl")}
    # Another sha256 for the same file is never taken from the record: the page is read again.
    with pytest.raises(DataError, match=r"uv recorded sha256 0{64} but the index"):
        check_index_hashes(read_pylock(idna_pylock(index, "0" * 64)), lambda _: url, env=env, timeout=30)
    assert index.paths == ["/default/simple/idna/"] * 2
    # ENVBUILD_NO_CACHE: nothing remembered, every page read.
    check_index_hashes(good, lambda _: url, env={**env, "ENVBUILD_NO_CACHE": "1"}, timeout=30)
    assert index.paths == ["/default/simple/idna/"] * 3


def test_an_unreadable_record_is_no_record(index: Index, uv_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """A damaged or foreign record file (not JSON, another format, a bad sha256) is ignored."""
    env = {**uv_env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("ENVBUILD_NO_CACHE", None)
    good = read_pylock(idna_pylock(index, fake_sha256("idna-3.0-py3-none-any.whl")))
    check_index_hashes(good, lambda _: index.url("default"), env=env, timeout=30)
    [record] = (tmp_path / "cache" / "envbuild" / "index-hashes").iterdir()
    foreign = b'{"format": 1, "files": {"idna-3.0-py3-none-any.whl": "x"}}'
    for damaged in (b"\xff{", b'{"format": 2, "files": {}}', foreign):
        record.write_bytes(damaged)
        index.paths.clear()
        check_index_hashes(good, lambda _: index.url("default"), env=env, timeout=30)
        assert index.paths == ["/default/simple/idna/"]


def test_lock_asks_the_registry_while_uv_resolves(tmp_path: Path, indexes: str,  # noqa: F811
                                                  lock_env: dict[str, str],  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The base image's digest is asked for beside uv's run (the closure needs no digest), once
    that run has started: the registry here answers only after uv's process is running (the
    callback ``compile_closure`` makes after the spawn), which a lock asking it first never sees."""
    import envbuild.pylock.uv as uv
    import envbuild.registry.digest as digest

    running = threading.Event()
    real = uv.compile_closure

    def closure(spec: ClosureSpec, *, started: Any = None) -> Closure:
        def spawned() -> None:
            running.set()
            if started is not None:
                started()
        return real(spec, started=spawned)

    def image_digest(reference: str, **_: object) -> str:
        if not running.wait(20):
            raise DataError(f"asked for {reference} before uv ran")
        return "sha256:" + "b" * 64

    monkeypatch.setattr(uv, "compile_closure", closure)
    monkeypatch.setattr(digest, "image_digest", image_digest)
    monkeypatch.chdir(project(tmp_path, indexes))
    tagged = "127.0.0.1:5000/library/debian:bookworm"
    (tmp_path / "envbuild.toml").write_text((tmp_path / "envbuild.toml").read_text().replace(BASE, tagged))
    code, _, err = run(capsys, lock_env, "lock")
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    digest_b = f"sha256:{'b' * 64}"
    assert (target["base_image"], target["base_digest"]) == (f"{tagged}@{digest_b}", digest_b)
    # Both failing: the registry's error is the one reported, as when it was asked first.
    monkeypatch.setattr(digest, "image_digest", lambda reference, **_: (_ for _ in ()).throw(
        DataError(f"cannot reach the registry for {reference}")))
    project(tmp_path, indexes, deps='["no-such-package"]')
    (tmp_path / "envbuild.toml").write_text((tmp_path / "envbuild.toml").read_text().replace(BASE, tagged))
    code, _, err = run(capsys, lock_env, "lock")
    assert code == 4 and "cannot reach the registry" in err and "no-such-package" not in err


def test_the_installer_is_asked_of_uv_cache_first(tmp_path: Path, indexes: str,  # noqa: F811
                                                  lock_env: dict[str, str],  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The build's installer (uv==VERSION) is locked from uv's cache alone, beside the closure's
    run; only a cache that cannot answer (the first lock here) makes the run online."""
    import envbuild.pylock.uv as uv

    log = tmp_path / "runs.jsonl"
    wrapper = tmp_path / "uv"
    wrapper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                       f"with open({str(log)!r}, 'a') as f: "
                       "f.write(json.dumps([os.path.basename(os.getcwd()), *sys.argv[1:]]) + '\\n')\n"
                       f"os.execv({find_uv(None)!r}, [{find_uv(None)!r}, *sys.argv[1:]])\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(uv, "find_uv", lambda explicit: str(wrapper))
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(project(work, indexes))
    env = {**lock_env, "UV_CACHE_DIR": str(tmp_path / "uv-cache")}  # empty: the first lock fills it

    def installer_runs() -> list[tuple[str, bool]]:
        found = [(r[0], "--offline" in r) for r in runs(log) if r[0].startswith("installer")]
        log.unlink()
        return found

    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    first = json.loads((work / "envbuild.lock").read_text())["targets"]["default"]["pylock"]["installer"]
    assert installer_runs() == [("installer-cached", True), ("installer", False)]
    (work / "envbuild.lock").unlink()
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    assert installer_runs() == [("installer-cached", True)]  # no online run
    again = json.loads((work / "envbuild.lock").read_text())["targets"]["default"]["pylock"]["installer"]
    assert again == first
