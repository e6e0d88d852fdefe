"""``exclude-newer``: a closure locked up to a cut-off date, recorded in the lock and held by
``lock --check``; and what a lock keeps when its index changes later (issue 41; docs/faults.md
I10–I15).

The indexes are served on 127.0.0.1 as PEP 503 pages whose links carry ``data-upload-time``
(as PyTorch's indexes have since 2026-04 and uv reads), with PEP 658 metadata files and no
wheels: six 1.16.0 uploaded 2026-01-01 and 1.17.0 on 2026-06-01; the torch index gives no
upload time (as many of PyTorch's files), or, as ``torch-dated``, a late one. The pages are
files the tests rewrite: a link removed, a newer version added.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from test_lock_command import run, serve_directory  # the command in-process; a static index

from envbuild.errors import UsageError
from envbuild.pylock.cutoff import format_instant, parse_cutoff
from envbuild.pylock.files import read_pylock
from envbuild.pylock.uv import find_uv, uv_version

BASE = "mirror.example/library/debian:bookworm@sha256:" + "a" * 64
LINUX = "cp311-cp311-manylinux_2_28_x86_64"
PURE = "py3-none-any"
UV = uv_version(find_uv(None))
# index -> (name, version, tag, Requires-Dist, upload time or None)
Dist = tuple[str, str, str, tuple[str, ...], "str | None"]
INDEXES: dict[str, list[Dist]] = {
    "torch": [("torch", "2.13.0+cpu", LINUX, ("filelock",), None)],
    "torch-dated": [("torch", "2.13.0+cpu", LINUX, ("filelock",), "2026-10-01T00:00:00Z")],
    "default": [("filelock", "3.1.0", PURE, (), "2025-01-01T00:00:00Z"),
                ("six", "1.16.0", PURE, (), "2026-01-01T00:00:00Z"),
                ("six", "1.17.0", PURE, (), "2026-06-01T00:00:00Z"),
                ("uv", UV, "py3-none-manylinux_2_17_x86_64", (), "2026-01-01T00:00:00Z")],
}
NEWER_SIX: Dist = ("six", "1.18.0", PURE, (), "2026-11-27T00:00:00Z")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_index(root: Path, index: str, dists: list[Dist]) -> None:
    """The pages and metadata files of ``index`` under ``root`` (pages rewritten whole)."""
    pages: dict[str, list[str]] = {}
    (root / index / "files").mkdir(parents=True, exist_ok=True)
    for name, version, tag, requires, uploaded in dists:
        filename = f"{name}-{version}-{tag}.whl"
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                 *(f"Requires-Dist: {r}" for r in requires)]
        meta = "".join(f"{line}\n" for line in lines)
        (root / index / "files" / f"{filename}.metadata").write_text(meta)
        href = html.escape(f"../../files/{filename}#sha256={_sha('fake:' + filename)}")
        when = "" if uploaded is None else f' data-upload-time="{uploaded}"'
        pages.setdefault(name, []).append(
            f'<a href="{href}" data-dist-info-metadata="sha256={_sha(meta)}"{when}>{filename}</a>')
    for name, links in pages.items():
        (root / index / "simple" / name).mkdir(parents=True, exist_ok=True)
        (root / index / "simple" / name / "index.html").write_text(
            "<html><body>\n" + "\n".join(links) + "\n</body></html>\n")


class Served:
    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url


@pytest.fixture()
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("indexes")
    for index, dists in INDEXES.items():
        write_index(root, index, dists)

    with serve_directory(root) as url:
        yield Served(root, url)


@pytest.fixture()
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {**os.environ, "UV_CACHE_DIR": str(tmp_path_factory.mktemp("uv-cache")), "UV_HTTP_RETRIES": "0",
            "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("envbuild-cache"))}


def project(directory: Path, url: str, *, extra: str = "", deps: str = '["six"]',
            torch: str = "torch") -> Path:
    (directory / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{BASE}"\ntorch-index-url = "{url}/{torch}/simple"\n'
        f'index-url = "{url}/default/simple"\ndependencies = {deps}\n{extra}')
    return directory


def target(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "envbuild.lock").read_text())["targets"]["default"]
    return data


# --- the setting's grammar ----------------------------------------------------------------


@pytest.mark.parametrize("text, days, instant", [
    ("2026-11-01T00:00:00Z", None, "2026-11-01T00:00:00Z"),
    ("2026-11-01T01:30:00+01:00", None, "2026-11-01T00:30:00Z"),
    ("2026-11-01T00:00:00.123456Z", None, "2026-11-01T00:00:00Z"),
    ("30 days", 30, None), ("1 day", 1, None), ("30days", 30, None), ("P30D", 30, None),
    ("P4W", 28, None), ("2 weeks", 14, None),
])
def test_a_cutoff_is_a_timestamp_or_a_span_of_days(text: str, days: int | None, instant: str | None) -> None:
    cutoff = parse_cutoff(text)
    assert cutoff.days == days
    now = datetime(2026, 11, 28, 12, 0, 0, 999, tzinfo=timezone.utc)
    expected = instant or format_instant(now - timedelta(days=days or 0))
    assert format_instant(cutoff.at(now)) == expected
    assert cutoff.at(now).microsecond == 0 or instant is not None


@pytest.mark.parametrize("text", ["yesterday", "2026-11-01", "2026-11-01T00:00:00", "2026-13-01T00:00:00Z",
                                  "2026-02-30T00:00:00Z", "1 year", "6 months", "P1Y", "P1M", "0 days",
                                  "99999 days", "-3 days", "30 days; rm -rf /", "30\ndays",
                                  "1969-12-31T00:00:00Z", "x" * 100])
def test_garbage_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_cutoff(text)
    assert "\n" not in caught.value.one_line()


def test_garbage_on_the_flag_or_in_the_project_is_exit_2_and_writes_nothing(
        tmp_path: Path, served: Served, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md I10."""
    monkeypatch.chdir(project(tmp_path, served.url))
    code, _, err = run(capsys, env, "lock", "--exclude-newer", "a year ago")
    assert code == 2 and err.count("\n") == 1 and "invalid --exclude-newer 'a year ago'" in err
    code, _, err = run(capsys, env, "lock", "--exclude-newer", "1 year")
    assert code == 2 and "months and years vary in length" in err and "365 days" in err
    project(tmp_path, served.url, extra='exclude-newer = "last tuesday"\n')
    code, _, err = run(capsys, env, "lock")
    assert code == 2 and err.count("\n") == 1 and "envbuild.toml:" in err and "exclude-newer" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


# --- the cut-off in a lock ------------------------------------------------------------------


def test_a_cutoff_locks_the_older_upload_records_it_and_check_holds_it(
        tmp_path: Path, served: Served, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md I11: six 1.17.0 was uploaded after the cut-off, so 1.16.0 is locked; the
    pylock records each file's upload time, the lock the cut-off; torch, whose index gives no
    upload time, is held by the stack's exact pin."""
    monkeypatch.chdir(project(tmp_path, served.url, extra='exclude-newer = "2026-03-01T00:00:00Z"\n'))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    locked = target(tmp_path)
    assert locked["packages"]["six"] == "1.16.0"
    assert locked["pylock"]["exclude_newer"] == "2026-03-01T00:00:00Z"
    pylock = read_pylock((tmp_path / "pylock.toml").read_text())
    uploads = {k: [t for _, t in v] for k, v in pylock.uploads().items()}
    assert uploads == {"six 1.16.0": [datetime(2026, 1, 1, tzinfo=timezone.utc)],
                       "filelock 3.1.0": [datetime(2025, 1, 1, tzinfo=timezone.utc)]}
    assert pylock.package("torch").wheels[0].upload_time is None
    code, out, err = run(capsys, env, "lock", "--check")
    assert code == 0 and "up to date" in out, err
    # Without the cut-off the newer upload is the answer, and the lock made with one is stale.
    project(tmp_path, served.url)
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "exclude-newer" in err
    # The setting on the flag overrides the file's.
    project(tmp_path, served.url, extra='exclude-newer = "2026-01-15T00:00:00Z"\n')
    code, _, err = run(capsys, env, "lock", "--exclude-newer", "2026-07-01T00:00:00Z", "--upgrade")
    assert code == 0, err
    assert target(tmp_path)["packages"]["six"] == "1.17.0"
    assert target(tmp_path)["pylock"]["exclude_newer"] == "2026-07-01T00:00:00Z"


def test_check_calls_a_pylock_with_a_file_newer_than_its_cutoff_stale(
        tmp_path: Path, served: Served, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md I12: a lock whose recorded cut-off its own pylock's upload times break
    (a hand-edited cut-off) is stale, naming the file."""
    monkeypatch.chdir(project(tmp_path, served.url, extra='exclude-newer = "2026-07-01T00:00:00Z"\n'))
    assert run(capsys, env, "lock")[0] == 0
    lock = tmp_path / "envbuild.lock"
    lock.write_text(lock.read_text().replace('"2026-07-01T00:00:00Z"', '"2026-05-01T00:00:00Z"'))
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "uploaded after its cut-off 2026-05-01T00:00:00Z" in err
    assert "six 1.17.0 (six-1.17.0-py3-none-any.whl, uploaded 2026-06-01T00:00:00Z)" in err
    lock.write_text(lock.read_text().replace('"2026-05-01T00:00:00Z"', '"2026-05-01"'))
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "exclude_newer" in err


def test_a_span_is_recorded_as_the_day_it_stood_for_and_kept(
        tmp_path: Path, served: Served, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A span is turned into one instant when locked, recorded, and kept by the next lock of
    the same inputs (the same bytes); --upgrade moves it to now."""
    days = (datetime.now(timezone.utc) - datetime(2026, 3, 1, tzinfo=timezone.utc)).days
    monkeypatch.chdir(project(tmp_path, served.url, extra=f'exclude-newer = "{days} days"\n'))
    before = datetime.now(timezone.utc).replace(microsecond=0)
    assert run(capsys, env, "lock")[0] == 0
    recorded = datetime.fromisoformat(target(tmp_path)["pylock"]["exclude_newer"].replace("Z", "+00:00"))
    assert before - timedelta(days=days) <= recorded <= datetime.now(timezone.utc) - timedelta(days=days)
    assert target(tmp_path)["packages"]["six"] == "1.16.0"
    first = (tmp_path / "envbuild.lock").read_bytes(), (tmp_path / "pylock.toml").read_bytes()
    assert run(capsys, env, "lock")[0] == 0
    assert ((tmp_path / "envbuild.lock").read_bytes(), (tmp_path / "pylock.toml").read_bytes()) == first
    assert run(capsys, env, "lock", "--check")[0] == 0


def test_a_stack_pin_uploaded_after_the_cutoff_is_exit_3(
        tmp_path: Path, served: Served, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md I13: the torch index gives torch's upload time, later than the cut-off."""
    monkeypatch.chdir(project(tmp_path, served.url, torch="torch-dated",
                              extra='exclude-newer = "2026-03-01T00:00:00Z"\n'))
    code, _, err = run(capsys, env, "lock")
    assert code == 3 and err.count("envbuild: error[no-compatible-stack]: ") == 1, err
    assert "uploaded after the cut-off exclude-newer 2026-03-01T00:00:00Z" in err
    assert "torch 2.13.0+cpu" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


def test_a_requirement_the_cutoff_leaves_nothing_for_says_so(
        tmp_path: Path, served: Served, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md I14: every six >= 1.17 was uploaded after the cut-off."""
    monkeypatch.chdir(project(tmp_path, served.url, deps='["six>=1.17"]',
                              extra='exclude-newer = "2026-03-01T00:00:00Z"\n'))
    code, _, err = run(capsys, env, "lock")
    assert code == 3 and err.count("envbuild: error[no-compatible-stack]: ") == 1, err
    assert "the cut-off exclude-newer 2026-03-01T00:00:00Z left these out" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


# --- a year later: the index changes under the lock -----------------------------------------


def test_a_lock_outlives_the_index_losing_its_torch_link_and_gaining_newer_versions(
        tmp_path: Path, served: Served, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """pytorch/pytorch#193491: a file left its index's page while its URL still served it.
    The build installs the recorded URLs with their sha256 (no index is read), so a lock made
    before still renders the same install; and a lock made again after the index gained a newer
    six keeps every pin: the same pylock bytes. docs/faults.md I15."""
    monkeypatch.chdir(project(tmp_path, served.url))
    assert run(capsys, env, "lock")[0] == 0
    pylock_before = (tmp_path / "pylock.toml").read_bytes()
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "before")
    assert code == 0, err
    # The index changes: torch's link goes (its file stays), a newer six arrives.
    (served.root / "torch" / "simple" / "torch" / "index.html").write_text("<html><body>\n</body></html>\n")
    write_index(served.root, "default", [*INDEXES["default"], NEWER_SIX])
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "after")
    assert code == 0, err
    for name in sorted(p.name for p in (tmp_path / "before" / "requirements").iterdir()):
        assert (tmp_path / "after" / "requirements" / name).read_bytes() == \
            (tmp_path / "before" / "requirements" / name).read_bytes()
    torch_wheel = f"torch-2.13.0+cpu-{LINUX}.whl"
    lines = "".join(p.read_text() for p in (tmp_path / "after" / "requirements").iterdir())
    pinned = f"{served.url}/torch/files/{torch_wheel} --hash=sha256:{_sha('fake:' + torch_wheel)}"
    assert pinned in lines.replace("%2B", "+")
    dockerfile = (tmp_path / "after" / "Dockerfile").read_text()
    assert "--index-url" not in dockerfile and "--extra-index-url" not in dockerfile
    assert "--no-deps" in dockerfile or "--no-index" in dockerfile
    assert run(capsys, env, "lock", "--check")[0] == 0  # offline: asks no index
    # Locked again (torch's link back, six 1.18.0 there): every pin kept, the same bytes.
    write_index(served.root, "torch", INDEXES["torch"])
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    assert (tmp_path / "pylock.toml").read_bytes() == pylock_before
    assert target(tmp_path)["packages"]["six"] == "1.17.0"
