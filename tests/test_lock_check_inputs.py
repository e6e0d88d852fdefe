"""``lock --check`` covers every input that changes the lock (docs/faults.md R9): a fingerprint of the
closure's inputs recorded per target, and the lock's packages against its pylock. A wrong index
password is an authentication failure, not a conflict (R8)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lock_command import BASE, env, indexes, project, run  # noqa: F401 (fixtures)


def locked(tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],  # noqa: F811
           monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    code, out, err = run(capsys, env, "lock", "--check")
    assert (code, err) == (0, "") and "up to date" in out
    return dict(json.loads((tmp_path / "envbuild.lock").read_text()))


@pytest.mark.parametrize("flags", [("--pip-package", "idna"), ("--find-links", "wheels")])
def test_a_flag_that_changes_the_closure_makes_the_lock_stale(
        flags: tuple[str, str], tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    locked(tmp_path, indexes, env, capsys, monkeypatch)
    (tmp_path / "wheels").mkdir()
    code, _, err = run(capsys, env, "lock", "--check", *flags)
    assert code == 11 and "the closure's inputs changed" in err, err


def test_another_configured_index_makes_the_lock_stale(tmp_path: Path, indexes: str,  # noqa: F811
                                                       env: dict[str, str],  # noqa: F811
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{BASE}"\ntorch-index-url = "{indexes}/torch/simple"\ndependencies = ["six"]\n')
    monkeypatch.chdir(tmp_path)
    default = {**env, "PIP_INDEX_URL": f"{indexes}/default/simple"}
    assert run(capsys, default, "lock")[0] == 0
    # The same index with credentials is the same input (they are never part of the lock) …
    with_password = {**env, "PIP_INDEX_URL": f"{indexes}/default/simple".replace("://", "://u:pw@")}
    assert run(capsys, with_password, "lock", "--check")[0] == 0
    # … another index is not.
    code, _, err = run(capsys, {**env, "PIP_INDEX_URL": f"{indexes}/no-uv/simple"}, "lock", "--check")
    assert code == 11 and "the closure's inputs changed" in err, err


def test_packages_that_disagree_with_the_pylock_are_stale(tmp_path: Path, indexes: str,  # noqa: F811
                                                          env: dict[str, str],  # noqa: F811
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    data = locked(tmp_path, indexes, env, capsys, monkeypatch)
    data["targets"]["default"]["packages"]["six"] = "1.16.0"
    (tmp_path / "envbuild.lock").write_text(json.dumps(data))
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "its packages disagree with pylock.toml" in err, err


def test_a_lock_without_a_fingerprint_is_stale_and_says_why(tmp_path: Path, indexes: str,  # noqa: F811
                                                            env: dict[str, str],  # noqa: F811
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    data = locked(tmp_path, indexes, env, capsys, monkeypatch)
    del data["targets"]["default"]["pylock"]["inputs_sha256"]
    (tmp_path / "envbuild.lock").write_text(json.dumps(data))
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "records no fingerprint of its closure's inputs (made by an older envbuild)" in err
    assert run(capsys, env, "lock")[0] == 0  # locking again records it
    assert run(capsys, env, "lock", "--check")[0] == 0


# --- R8: the index refuses the credentials ---------------------------------------------------


@pytest.fixture()
def refusing_index() -> Iterator[str]:
    """An index on 127.0.0.1 that answers 401 to every request, whatever credentials it gets."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401, "Unauthorized")
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_a_wrong_index_password_is_exit_4_naming_authentication(
        tmp_path: Path, indexes: str, env: dict[str, str], refusing_index: str,  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{BASE}"\ntorch-index-url = "{indexes}/torch/simple"\ndependencies = ["six"]\n')
    monkeypatch.chdir(tmp_path)
    wrong = {**env, "PIP_INDEX_URL": refusing_index.replace("://", "://u:wrong-pw@")}
    code, _, err = run(capsys, wrong, "lock")
    assert code == 4, err
    # the error line comes after lock's progress lines
    error = next(line for line in err.splitlines() if line.startswith("envbuild: error"))
    assert error.startswith("envbuild: error[data]: the index refused uv's credentials (401 Unauthorized): "
                            "authentication failed")
    assert "wrong-pw" not in err and "cannot be satisfied" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]
