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
        # The file as read, at the commit, with the digest of its bytes; or the uv sdist on the
        # package index it was read from, with the sdist's digest (the note names the member's).
        code_host = (r"https://raw\.githubusercontent\.com/astral-sh/uv/[0-9a-f]{40}/crates/"
                     r"uv-python(-managed)?/download-metadata\.json#sha256=[0-9a-f]{64}")
        assert re.fullmatch(code_host, row["source"]) or (
            re.fullmatch(r"pip-index:///simple/uv/#uv-[0-9.]+\.tar\.gz&sha256=[0-9a-f]{64}", row["source"])
            and re.search(r"read from uv-[0-9.]+/crates/uv-python-managed/download-metadata\.json "
                          r"\(sha256 [0-9a-f]{64}\) in that uv sdist", row["note"]))


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
    # Rows read from uv's list on the code host or the index are the python source's own,
    # wherever it reads now: these cite a mirror, which no refresh of it owns.
    path = data / "python_standalone.yaml"
    document = yaml.safe_load(path.read_text())
    for row in document["rows"]:
        row["source"] = "https://python-mirror.invalid/download-metadata.json#sha256=" + "0" * 64
    path.write_text(yaml.safe_dump(document, sort_keys=False))
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


# --- uv's list from a uv release on the package index -----------------------------------------


def uv_sdist(version: str, listing: bytes) -> bytes:
    """A uv sdist as maturin writes one: sources first, the list deep inside, more after it."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, body in ((f"uv-{version}/Cargo.toml", b"[workspace]\n" * 50),
                           (f"uv-{version}/crates/uv-python/download-metadata.json", b"{}"),  # the old place
                           (f"uv-{version}/crates/uv-python-managed/download-metadata.json", listing),
                           (f"uv-{version}/PKG-INFO", b"Name: uv\n")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return out.getvalue()


def serve_uv(up: Upstream, sdist: bytes, *, listed_sha256: str | None = None,
             size: int | None = None) -> None:
    old = uv_sdist("0.98.0", b"{}")
    files = [
        {"filename": "uv-0.98.0.tar.gz", "url": "/files/uv-0.98.0.tar.gz",
         "hashes": {"sha256": snapshot_bytes(old)}, "size": len(old)},
        {"filename": "uv-0.99.0-py3-none-manylinux_2_17_x86_64.whl", "url": "/files/uv.whl",
         "hashes": {"sha256": "1" * 64}},
        {"filename": "uv-0.99.0.tar.gz", "url": "/files/uv-0.99.0.tar.gz",
         "hashes": {"sha256": listed_sha256 or snapshot_bytes(sdist)}, "size": size or len(sdist)},
        {"filename": "uv-0.100.0rc1.tar.gz", "url": "/files/uv-0.100.0rc1.tar.gz",
         "hashes": {"sha256": "2" * 64}},
        {"filename": "uv-1.0.0.tar.gz", "url": "/files/uv-1.0.0.tar.gz", "hashes": {"sha256": "3" * 64},
         "yanked": "broken"},
    ]
    page = {"meta": {"api-version": "1.1"}, "name": "uv", "files": files}
    up.serve("/simple/uv/", json.dumps(page).encode(),
             {"Content-Type": "application/vnd.pypi.simple.v1+json"})
    up.serve("/files/uv-0.99.0.tar.gz", sdist)
    up.serve("/files/uv-0.98.0.tar.gz", old)


def snapshot_bytes(body: bytes) -> str:
    import hashlib

    return hashlib.sha256(body).hexdigest()


def from_index(up: Upstream, data: Path, release: str = "latest") -> refresh.RefreshOptions:
    return refresh.RefreshOptions(matrices=data, sources=("python",), policy=FAST, uv_release=release,
                                  index_url=f"{up.base}/simple/", retrieved="2026-11-25")


def test_t2_the_list_is_read_from_a_uv_sdist_on_the_index(upstream: Upstream, data: Path,
                                                         env: dict[str, str]) -> None:
    """docs/faults.md T2: the code host may be unreachable, the index is; the sdist holds the list."""
    sdist = uv_sdist("0.99.0", DOWNLOADS.read_bytes())
    serve_uv(upstream, sdist)
    report = refresh.refresh(from_index(upstream, emptied(data)), env, lambda message: None)
    assert report.written == ("python_standalone",)
    got = {(r["python"], r["arch"]): r for r in rows(data)}
    assert set(got) == {("3.11", "x86_64"), ("3.12", "x86_64"), ("3.12", "aarch64"), ("3.13", "x86_64")}
    row = got[("3.12", "x86_64")]
    assert (row["version"], row["sha256"]) == ("3.12.99", "2" * 64)
    assert row["source"] == f"pip-index:///simple/uv/#uv-0.99.0.tar.gz&sha256={snapshot_bytes(sdist)}"
    assert (f"read from uv-0.99.0/crates/uv-python-managed/download-metadata.json (sha256 "
            f"{snapshot_digest(DOWNLOADS)}) in that uv sdist") in row["note"]
    assert upstream.base not in (data / "python_standalone.yaml").read_text()  # the index: relative
    # Read once: the next refresh takes the list from the cache and asks for the page only.
    upstream.seen.clear()
    assert refresh.refresh(from_index(upstream, data), env, lambda message: None).up_to_date
    assert upstream.paths() == ["/simple/uv/"]


def test_t2_rows_from_the_code_host_and_from_the_index_are_one_sources(
        upstream: Upstream, data: Path, env: dict[str, str]) -> None:
    path = data / "python_standalone.yaml"
    document = yaml.safe_load(path.read_text())
    keys = {("3.11", "x86_64"), ("3.12", "x86_64"), ("3.12", "aarch64"), ("3.13", "x86_64")}
    document["rows"] = [{**r, "source": "https://raw.githubusercontent.com/astral-sh/uv/" + "a" * 40
                         + "/crates/uv-python/download-metadata.json#sha256=" + "0" * 64}
                        for r in document["rows"] if (r["python"], r["arch"]) in keys]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    serve_uv(upstream, uv_sdist("0.99.0", DOWNLOADS.read_bytes()))
    report = refresh.refresh(from_index(upstream, data, "0.99.0"), env, lambda message: None)
    assert report.changes["python_standalone"].updated == 4 and len(rows(data)) == 4
    assert all(r["source"].startswith("pip-index:///simple/uv/#uv-0.99.0.tar.gz&") for r in rows(data))


@pytest.mark.parametrize("damage", ["sha256", "size", "no list", "not gzip", "no release"])
def test_t3_a_bad_uv_sdist_exit_4_data_unchanged(
        upstream: Upstream, data: Path, env: dict[str, str], damage: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md T3: the sdist matches the index's sha256, stays within its bounds, holds the list."""
    sdist = uv_sdist("0.99.0", DOWNLOADS.read_bytes())
    if damage == "no list":
        sdist = uv_sdist_without_list()
    elif damage == "not gzip":
        sdist = b"<html>a login page</html>"
    serve_uv(upstream, sdist, listed_sha256="0" * 64 if damage == "sha256" else None,
             size=10**9 if damage == "size" else None)
    before = snapshot(data)
    code = cli.main(["--matrices", str(data), "matrix", "refresh", "--source", "python",
                     "--uv-release", "7.0.0" if damage == "no release" else "0.99.0",
                     "--index-url", f"{upstream.base}/simple/"], env)
    err = capsys.readouterr().err.splitlines()
    assert code == 4 and snapshot(data) == before
    errors = [line for line in err if line.startswith("envbuild: error[")]
    assert len(errors) == 1
    assert {"sha256": "sha256", "size": "more than", "no list": "holds no", "not gzip": "gzip",
            "no release": "no uv 7.0.0"}[damage] in errors[0]


def uv_sdist_without_list() -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        info = tarfile.TarInfo("uv-0.99.0/crates/uv-python/download-metadata.json")
        archive.addfile(info, io.BytesIO(b""))
    return out.getvalue()


def test_t2_the_default_url_is_where_uv_keeps_the_list_now() -> None:
    from envbuild.upstream.sources.python_standalone import DEFAULT_URL

    assert DEFAULT_URL.endswith("/crates/uv-python-managed/download-metadata.json")


def test_t2_uv_release_and_a_downloads_url_cannot_be_combined(data: Path, env: dict[str, str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--matrices", str(data), "matrix", "refresh", "--source", "python", "--uv-release",
                     "0.13.9", "--python-downloads-url", "https://127.0.0.1:9/d.json"], env)
    assert code == 2 and "cannot be combined" in capsys.readouterr().err


def test_t3_reading_the_sdist_stops_at_the_unpacked_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md T3: a gzip bomb before the list is cut off at MAX_UNPACKED_BYTES, not inflated whole."""
    import io
    import tarfile

    from envbuild.upstream.sources import uv_sdist as sdist_module

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, body in (("uv-0.99.0/zeros", bytes(4 * 1024 * 1024)),
                           ("uv-0.99.0/crates/uv-python-managed/download-metadata.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    monkeypatch.setattr(sdist_module, "MAX_UNPACKED_BYTES", 1024 * 1024)
    with pytest.raises(DataError, match="unpacks to more than"):
        sdist_module.read_member("uv-0.99.0.tar.gz", out.getvalue())
    monkeypatch.setattr(sdist_module, "MAX_UNPACKED_BYTES", 8 * 1024 * 1024)
    assert sdist_module.read_member("uv-0.99.0.tar.gz", out.getvalue()) == (
        "uv-0.99.0/crates/uv-python-managed/download-metadata.json", b"{}")
