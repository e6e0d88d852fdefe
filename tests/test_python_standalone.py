"""Python as part of the stack (docs/faults.md section L): the python_standalone relation, its
refresh from uv's download list (served on 127.0.0.1), the resolver's choice of an interpreter
source, and the renders that install a recorded build with its sha256 checked."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_refresh import FAST, FIXTURES, Upstream, authority, data, env, serving, snapshot, tls_context

from envbuild.commands import cli
from envbuild.data import matrix as matrix_module
from envbuild.data.matrix import Matrix
from envbuild.errors import DataError
from envbuild.upstream import refresh
from envbuild.upstream.sources.python_standalone import candidates

__all__ = ["authority", "data", "env"]  # the fixtures, shared with test_refresh

DOWNLOADS = FIXTURES / "python_downloads.json"
PATH = "/uv/main/crates/uv-python/download-metadata.json"


@pytest.fixture
def upstream(authority: Any) -> Any:
    up = Upstream()
    with serving(up, tls_context(authority)):
        up.serve(PATH, DOWNLOADS.read_bytes(), {"ETag": '"v1"'})
        yield up


def rows(directory: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load((directory / "python_standalone.yaml").read_text())["rows"])


def emptied(directory: Path) -> Path:
    """The data without any python_standalone row (so that every row the refresh writes is its own)."""
    path = directory / "python_standalone.yaml"
    text = path.read_text()
    path.write_text(text[: text.index("rows:")] + "rows: []\n")
    return directory


def run(up: Upstream, data: Path, env: dict[str, str]) -> refresh.RefreshReport:
    options = refresh.RefreshOptions(matrices=data, sources=("python",), policy=FAST,
                                     python_downloads_url=f"{up.base}{PATH}", retrieved="2026-11-24")
    return refresh.refresh(options, env, lambda message: None)


# --- the data file and its refresh -----------------------------------------------------------


def test_recorded_builds_are_one_final_release_per_minor_and_arch_with_source() -> None:
    recorded = rows(Path(__file__).resolve().parents[1] / "matrices")
    keys = [(r["python"], r["arch"]) for r in recorded]
    assert len(keys) == len(set(keys)) and {"3.8", "3.12", "3.14"} <= {p for p, _ in keys}
    for row in recorded:
        assert re.fullmatch(r"[0-9a-f]{64}", row["sha256"])
        assert row["version"].startswith(row["python"] + ".") and "rc" not in row["version"]
        assert row["url"].endswith(f"-{row['arch']}-unknown-linux-gnu-install_only_stripped.tar.gz")
        assert f"cpython-{row['version']}%2B{row['build']}-" in row["url"]
        # The file as read, at the commit, with the digest of its bytes.
        assert re.fullmatch(r"https://raw\.githubusercontent\.com/astral-sh/uv/[0-9a-f]{40}/crates/uv-python/"
                            r"download-metadata\.json#sha256=[0-9a-f]{64}", row["source"])


def test_candidates_keep_the_newest_final_baseline_build() -> None:
    found = candidates("https://up.test/d.json", DOWNLOADS.read_bytes())
    assert {k: v[1]["version"] for k, v in found.items()} == {
        ("3.12", "x86_64"): "3.12.99", ("3.12", "aarch64"): "3.12.99", ("3.13", "x86_64"): "3.13.99",
        ("3.13t", "x86_64"): "3.13.99", ("3.11", "x86_64"): "3.11.99"}
    assert found[("3.12", "x86_64")][1]["sha256"] == "2" * 64  # not the x86_64_v3, musl, debug or pypy one


def test_refresh_writes_rows_with_provenance_then_updates_its_own(
        upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    report = run(upstream, emptied(data), env)
    assert report.written == ("python_standalone",)
    got = {(r["python"], r["arch"]): r for r in rows(data)}
    # 3.13t has a build upstream but no torch wheel in the data: not recorded.
    assert set(got) == {("3.11", "x86_64"), ("3.12", "x86_64"), ("3.12", "aarch64"), ("3.13", "x86_64")}
    row = got[("3.12", "x86_64")]
    digest = snapshot_digest(DOWNLOADS)
    assert row["source"] == f"{upstream.base}{PATH}#sha256={digest}" and row["retrieved"] == "2026-11-24"
    assert (row["version"], row["build"], row["sha256"]) == ("3.12.99", "20990101", "2" * 64)
    newer = json.loads(DOWNLOADS.read_bytes())
    newer["cpython-3.12.100-linux-x86_64-gnu"] = {
        **newer["cpython-3.12.99-linux-x86_64-gnu"], "patch": 100, "sha256": "f" * 64,
        "url": newer["cpython-3.12.99-linux-x86_64-gnu"]["url"].replace("3.12.99", "3.12.100")}
    upstream.serve(PATH, json.dumps(newer).encode(), {"ETag": '"v2"'})
    report = run(upstream, data, env)
    assert report.changes["python_standalone"].updated == 4  # each cites the new document's digest
    assert {(r["python"], r["arch"]): r["sha256"] for r in rows(data)}[("3.12", "x86_64")] == "f" * 64


def snapshot_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_refresh_keeps_rows_read_from_another_upstream(upstream: Upstream, data: Path,
                                                      env: dict[str, str]) -> None:
    before = rows(data)
    report = run(upstream, data, env)
    assert rows(data) == before and report.changes["python_standalone"].kept_hand_sourced == 4


@pytest.mark.parametrize("damage", ["sha256", "url", "not json"])
def test_l1_a_damaged_download_list_exit_4_data_unchanged(
        upstream: Upstream, data: Path, env: dict[str, str], damage: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads(DOWNLOADS.read_bytes())
    build = document["cpython-3.12.99-linux-x86_64-gnu"]
    if damage == "sha256":
        del build["sha256"]
    elif damage == "url":
        build["url"] = "https://127.0.0.1/a b;rm -rf /-install_only_stripped.tar.gz"
    body = b"<html>rate limited</html>" if damage == "not json" else json.dumps(document).encode()
    upstream.serve(PATH, body)
    before = snapshot(data)
    with pytest.raises(DataError):
        run(upstream, data, env)
    code = cli.main(["--matrices", str(data), "matrix", "refresh", "--source", "python",
                     "--python-downloads-url", f"{upstream.base}{PATH}"], env)
    err = capsys.readouterr().err
    assert code == 4 and snapshot(data) == before
    assert len([line for line in err.splitlines() if line.startswith("envbuild: error")]) == 1


def test_l2_plain_http_download_list_is_refused(data: Path, env: dict[str, str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(data)
    code = cli.main(["--matrices", str(data), "matrix", "refresh", "--source", "python",
                     "--python-downloads-url", "http://127.0.0.1:9/d.json"], env)
    assert code == 2 and "--python-downloads-url" in capsys.readouterr().err and snapshot(data) == before


def test_matrix_loads_the_relation() -> None:
    loaded = matrix_module.load(Path(__file__).resolve().parents[1] / "matrices")
    assert isinstance(loaded, Matrix) and loaded.rows("python_standalone")
