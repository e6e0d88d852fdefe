"""The resolver's on-disk index (index.load_index): when it is trusted, when not."""

from __future__ import annotations

import marshal
import os
import shutil
from pathlib import Path

import pytest

from envbuild.data import matrix
from envbuild.resolver import index

REPO_MATRICES = Path(__file__).resolve().parents[1] / "matrices"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    copy = tmp_path / "matrices"
    shutil.copytree(REPO_MATRICES, copy)
    return copy


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Each time the data files are really read (not served from the index)."""
    seen: list[Path] = []
    real = matrix.load

    def spy(directory: Path, **kw: object) -> matrix.Matrix:
        seen.append(directory)
        real.cache_clear()  # each load as a new process would do it
        return real(directory, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(matrix, "load", spy)
    return seen


def _cache_file(cache: Path, data: Path) -> Path:
    return Path(index._cache_file(str(cache), os.path.realpath(data)))


def _gpu_names(ix: index.Index) -> set[str]:
    return {row["name"] for row in ix.rows("gpus")}


def test_a_warm_load_reads_no_data_file(data: Path, tmp_path: Path, loads: list[Path],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "RACY_NS", 0)
    cold = index.load_index(str(data), str(tmp_path / "cache"))
    assert len(loads) == 1 and _cache_file(tmp_path / "cache", data).is_file()
    warm = index.load_index(str(data), str(tmp_path / "cache"))
    assert len(loads) == 1
    assert warm.rows("torch_variants") == cold.rows("torch_variants")
    assert [t.cuda for t in warm.toolkits] == [t.cuda for t in cold.toolkits]


def test_a_changed_data_file_is_read_again(data: Path, tmp_path: Path, loads: list[Path],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "RACY_NS", 0)
    index.load_index(str(data), str(tmp_path / "cache"))
    gpus = data / "gpus.yaml"
    gpus.write_text(gpus.read_text().replace("name: NVIDIA A10\n", "name: NVIDIA A10X\n", 1))
    ix = index.load_index(str(data), str(tmp_path / "cache"))
    assert len(loads) == 2
    assert "NVIDIA A10X" in _gpu_names(ix)


def test_a_same_size_rewrite_in_one_timestamp_tick_is_not_missed(
        data: Path, tmp_path: Path, loads: list[Path]) -> None:
    # The copy was just written: its stat cannot vouch for the next same-size rewrite,
    # so no index is saved until the files have been still for RACY_NS.
    index.load_index(str(data), str(tmp_path / "cache"))
    assert not _cache_file(tmp_path / "cache", data).exists()
    gpus = data / "gpus.yaml"
    before = gpus.stat()
    gpus.write_text(gpus.read_text().replace("name: NVIDIA A10\n", "name: NVIDIA Z10\n", 1))
    os.utime(gpus, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as they were
    ix = index.load_index(str(data), str(tmp_path / "cache"))
    assert len(loads) == 2
    assert "NVIDIA Z10" in _gpu_names(ix)


def test_a_damaged_index_is_rebuilt(data: Path, tmp_path: Path, loads: list[Path],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "RACY_NS", 0)
    index.load_index(str(data), str(tmp_path / "cache"))
    saved = _cache_file(tmp_path / "cache", data)
    saved.write_bytes(saved.read_bytes()[:100])  # truncated, as by a full disk
    index.load_index(str(data), str(tmp_path / "cache"))
    assert len(loads) == 2
    assert marshal.loads(saved.read_bytes())["format"] == index.INDEX_FORMAT


def test_an_unwritable_cache_directory_does_not_fail_a_resolve(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "RACY_NS", 0)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    ix = index.load_index(str(data), str(blocker / "cache"))
    assert "NVIDIA A10" in _gpu_names(ix)


def test_the_gpu_catalogue_is_unpacked_only_when_a_gpu_is_named(data: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # 150+ GPU rows and their folded names must not slow the forms that name no GPU: the
    # index keeps them marshalled apart and unpacks them on the first rows("gpus")/gpu_keys.
    from envbuild.resolver.resolve import resolve
    from envbuild.resolver.selection import Selectors, build_request

    monkeypatch.setattr(index, "RACY_NS", 0)
    index.load_index(str(data), str(tmp_path / "cache"))
    warm = index.load_index(str(data), str(tmp_path / "cache"))
    assert isinstance(warm._gpus_packed, bytes) and warm._gpus is None
    resolve(build_request(Selectors(driver="550.54.15"), warm, {}), warm)
    assert warm._gpus is None
    build_request(Selectors(gpu=["RTX 3080"]), warm, {})
    assert warm._gpus is not None
    assert sum(row is not None for row in warm.gpu_rows()._rows) == 1  # the one row found
    assert len(warm.rows("gpus")) >= 150
    assert warm.rows("gpus")[warm.gpu_keys["rtx3080"]]["name"] == "NVIDIA GeForce RTX 3080"


def test_a_loaded_matrix_keeps_its_index_in_the_cache_directory(data: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``lock`` reads the whole matrix and then its index (index_of): the index is kept beside
    the matrix's own cache, keyed by every data file's content, and read there the next time."""
    cache = tmp_path / "cache"

    def loaded() -> matrix.Matrix:
        matrix.load.cache_clear()  # each load as a new process would do it
        return matrix.load(data, cache_dir=cache)

    first = index.index_of(loaded())
    kept = Path(index._kept_file(str(cache)))
    assert kept.is_file()
    built: list[matrix.Matrix] = []
    real = index.build_index
    monkeypatch.setattr(index, "build_index", lambda m: built.append(m) or real(m))
    second = index.index_of(loaded())
    assert built == []  # read, not built
    assert second.rows("torch_variants") == first.rows("torch_variants")
    assert _gpu_names(second) == _gpu_names(first)
    # other data: another content digest, so the kept index is not this matrix's
    (data / "gpus.yaml").write_text((data / "gpus.yaml").read_text() + "\n# a comment\n")
    index.index_of(loaded())
    assert len(built) == 1
    # a kept file that is not an index of this code's: built again, never an error
    for junk in (b"not marshal", marshal.dumps({"format": -1})):
        kept.write_bytes(junk)
        index.index_of(loaded())
    assert len(built) == 3
    matrix.load.cache_clear()
