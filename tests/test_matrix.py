"""The bundled data is valid, and every kind of damage is reported with file and row."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from envbuild.commands.cli import main
from envbuild.data import matrix
from envbuild.data.versions import parse_requirement
from envbuild.errors import DataError
from envbuild.resolver.model import Request
from envbuild.resolver.resolve import resolve

BUNDLED = Path(__file__).resolve().parent.parent / "matrices"


@pytest.fixture
def data_copy(tmp_path: Path) -> Path:
    target = tmp_path / "matrices"
    shutil.copytree(BUNDLED, target)
    return target


def test_bundled_data_is_valid_and_complete() -> None:
    data = matrix.load(BUNDLED)
    assert set(data.relations) == set(matrix.RELATIONS)
    for relation in matrix.RELATIONS:
        for row in data.rows(relation):
            assert row["source"].startswith(("https://", "pip-index:///")), (relation, row)
            assert row["retrieved"][:4] >= "2020"


def test_every_torch_release_from_113_is_present_and_resolves() -> None:
    data = matrix.load(BUNDLED)
    on_index = sorted({r["torch"] for r in data.rows("torch_pypi")}, key=Version)
    assert on_index[0] == "1.13.0" and on_index[-1] == "2.15.0"
    with_variants = {r["torch"] for r in data.rows("torch_variants")}
    for torch in on_index:
        # every release is pinnable: from PyTorch's index variants, or the package index alone
        request = Request(torch=parse_requirement("torch", torch))
        stacks = resolve(request, data).stacks
        assert stacks, torch
        assert all(s.torch == torch for s in stacks)
        if torch not in with_variants:
            assert {s.index_url for s in stacks} == {None}  # the configured package index


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


def _problems(directory: Path) -> list[str]:
    with pytest.raises(DataError) as info:
        matrix.load(directory)
    assert info.value.exit_code == 4
    return list(info.value.details)


def test_wrong_type_is_reported_with_file_and_row(data_copy: Path) -> None:
    path = data_copy / "cuda_toolkits.yaml"
    text = path.read_text()
    first_driver = text.split("min_driver:", 1)[1].split("\n", 1)[0]
    _replace(path, f"min_driver:{first_driver}", "min_driver: 12")
    problems = _problems(data_copy)
    assert any(p.startswith("cuda_toolkits.yaml row 1: min_driver must be a driver version")
               for p in problems), problems


def test_all_problems_are_collected_not_just_the_first(data_copy: Path) -> None:
    for name in ("gpus.yaml", "cuda_ubuntu.yaml"):
        _replace(data_copy / name, "source: ", "source: http://insecure.invalid/ ")
    problems = _problems(data_copy)
    assert any(p.startswith("gpus.yaml row 1: source") for p in problems)
    assert any(p.startswith("cuda_ubuntu.yaml row 1: source") for p in problems)


def test_truncated_yaml_is_a_data_error(data_copy: Path) -> None:
    path = data_copy / "cuda_archs.yaml"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3] + b"\n  - [unclosed")
    problems = _problems(data_copy)
    assert any(p.startswith("cuda_archs.yaml: not valid YAML") for p in problems)


def test_cross_file_reference_is_checked(data_copy: Path) -> None:
    path = data_copy / "cuda_images.yaml"
    text = path.read_text()
    first_cuda = text.split("cuda:", 1)[1].split("\n", 1)[0]
    _replace(path, f"cuda:{first_cuda}", "cuda: '99.9.9'")
    problems = _problems(data_copy)
    assert ("cuda_images.yaml row 1: CUDA 99.9.9 belongs to no CUDA family in cuda_toolkits.yaml"
            in problems)


def test_unknown_field_and_missing_field(data_copy: Path) -> None:
    _replace(data_copy / "ubuntu_python.yaml", "codename:", "code_name:")
    problems = _problems(data_copy)
    assert "ubuntu_python.yaml row 1: unknown field 'code_name'" in problems


def test_manifest_catches_a_corrupted_file(data_copy: Path) -> None:
    matrix.write_manifest(data_copy)
    matrix.load(data_copy)  # intact: loads
    path = data_copy / "gpus.yaml"
    path.write_bytes(path.read_bytes()[:-40])
    matrix.load.cache_clear()
    with pytest.raises(DataError) as info:
        matrix.load(data_copy)
    assert "sha256 mismatch" in info.value.message
    assert info.value.hint.startswith("run 'envbuild matrix refresh'")


def test_cli_reports_corrupt_data_with_exit_4(data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = data_copy / "cudnn.yaml"
    path.write_text("relation: cudnn\nrows: [")
    code = main(["--matrices", str(data_copy), "resolve", "--driver", "550"], env={})
    err = capsys.readouterr().err
    assert code == 4
    assert err.startswith("envbuild: error[data]: ")
    assert "cudnn.yaml: not valid YAML" in err


def test_rows_cache_is_used_and_keyed_by_content(data_copy: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    first = matrix.load(data_copy, cache_dir=cache)
    cached = list(cache.glob("matrices-*.marshal"))
    # Keyed by every file (ci_actions.yaml included), not by Matrix.digest, which leaves it out.
    assert len(cached) == 1 and re.fullmatch(r"matrices-[0-9a-f]{64}\.[a-z0-9-]+\.marshal", cached[0].name)
    matrix.load.cache_clear()
    with monkeypatch.context() as patched:  # a hit parses nothing, and gives the rows JSON gave

        def no_parsing(files: object) -> object:
            raise AssertionError("the data was parsed again")

        patched.setattr("envbuild.data.validate.parse_all", no_parsing)
        hit = matrix.load(data_copy, cache_dir=cache)
    assert hit == first and hit.rows("gpus") == first.rows("gpus")
    assert list(hit.rows("ubuntu_python")) == json.loads(json.dumps(first.rows("ubuntu_python")))
    matrix.load.cache_clear()
    with (data_copy / "ubuntu_python.yaml").open("a") as handle:
        handle.write("# a comment changes the digest, not the data\n")
    matrix.load.cache_clear()
    second = matrix.load(data_copy, cache_dir=cache)
    assert second.digest != first.digest
    assert len(list(cache.glob("matrices-*.marshal"))) == 2


def test_the_files_hashes_are_kept_by_identity_and_a_changed_file_is_read_again(
        data_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading with a cache keeps the data files' digests beside their identities: a later load
    whose files all have the same identities reads and hashes none of them (the same digest); a
    file rewritten (same size, another byte) is read again and checked against the manifest."""
    cache = tmp_path / "cache"
    matrix.write_manifest(data_copy)
    first = matrix.load(data_copy, cache_dir=cache)
    assert Path(matrix._kept_hashes_file(cache)).is_file()
    matrix.load.cache_clear()

    def no_reading(directory: Path) -> dict[str, bytes]:
        raise AssertionError("a data file was read")

    def no_hashing(hashes: object) -> str:
        raise AssertionError("a digest was computed")

    with monkeypatch.context() as patched:
        patched.setattr(matrix, "_settled_files", no_reading)
        patched.setattr(matrix, "_digest", no_hashing)
        again = matrix.load(data_copy, cache_dir=cache)
    assert again.digest == first.digest and again.rows("gpus") == first.rows("gpus")
    matrix.load.cache_clear()
    path = data_copy / "gpus.yaml"
    data = path.read_bytes()
    path.write_bytes(data[:-2] + (b"x" if data[-2:-1] != b"x" else b"y") + data[-1:])  # same size
    with pytest.raises(DataError) as info:
        matrix.load(data_copy, cache_dir=cache)
    assert "sha256 mismatch" in info.value.message and "gpus.yaml" in info.value.message


def test_arch_beyond_the_variants_nvcc_is_reported(data_copy: Path) -> None:
    # cuda_archs.yaml: nvcc 13.x no longer targets Maxwell-Volta, so a cu130 wheel cannot carry sm_70.
    # (2.9.x cu130's arch list, whose sm_120 lost its +PTX on 2026-11-25)
    _replace(data_copy / "torch_variants.yaml", "- sm_120\n  cudnn: \"9.13.0.50\"\n  source: https://github.com/pytorch/pytorch/pull/164471",
             "- sm_70\n  - sm_120\n  cudnn: \"9.13.0.50\"\n  source: https://github.com/pytorch/pytorch/pull/164471")
    problems = _problems(data_copy)
    assert any(p.startswith("torch_variants.yaml row ") and "names sm_70, which nvcc 13.0 cannot target"
               in p for p in problems), problems


def _python_off_index(directory: Path) -> list[str]:
    """Variant rows whose CPython versions are not those of their release's wheels on the index
    (torch_pypi.yaml, read from the index's file list; free-threaded tags aside)."""
    data = matrix.load(directory)
    on_index = {r["torch"]: [p for p in r["python"] if not p.endswith("t")] for r in data.rows("torch_pypi")}
    return [f"{r['torch']} {r['variant']}: {', '.join(r['python'])} vs {', '.join(on_index[r['torch']])}"
            for r in data.rows("torch_variants")
            if r["torch"] in on_index and list(r["python"]) != on_index[r["torch"]]]


def test_variant_python_is_the_index_wheels() -> None:
    """docs/faults.md O1: each release's variants list the CPython versions of its wheels on the
    index; 1.13 once left out the cp311 wheels the index lists."""
    assert _python_off_index(BUNDLED) == []


def test_variant_python_check_sees_a_missing_and_an_extra_version(data_copy: Path) -> None:
    """docs/faults.md O1: the check above can fail, both ways."""
    _replace(data_copy / "torch_variants.yaml", '  - "3.10"\n  - "3.11"\n  arch_list: []',
             '  - "3.10"\n  arch_list: []')
    assert _python_off_index(data_copy) == ["1.13.0 cpu: 3.7, 3.8, 3.9, 3.10 vs 3.7, 3.8, 3.9, 3.10, 3.11"]
    _replace(data_copy / "torch_variants.yaml", '  - "3.10"\n  arch_list: []',
             '  - "3.10"\n  - "3.11"\n  - "3.12"\n  arch_list: []')
    matrix.load.cache_clear()
    assert _python_off_index(data_copy) == [
        "1.13.0 cpu: 3.7, 3.8, 3.9, 3.10, 3.11, 3.12 vs 3.7, 3.8, 3.9, 3.10, 3.11"]


def test_image_for_an_unsupported_ubuntu_is_reported(data_copy: Path) -> None:
    # cuda_ubuntu.yaml: NVIDIA ships CUDA 11.0 for Ubuntu 16.04-20.04 only.
    _replace(data_copy / "cuda_images.yaml", "- cuda: 11.0.3\n  ubuntu: '20.04'",
             "- cuda: 11.0.3\n  ubuntu: '24.04'")
    problems = _problems(data_copy)
    assert any("CUDA 11.0 is not supported on Ubuntu 24.04" in p for p in problems), problems


@pytest.mark.parametrize("depth", [100, 990, 30_000])
def test_deeply_nested_yaml_is_refused_with_its_line(data_copy: Path, depth: int) -> None:
    # Nesting is refused at 64 levels, naming file and line, before anything is composed:
    # below libyaml's own cap (~1,000) a deep document loads and its recursion is ours to bear,
    # and a libyaml without that cap recurses in C (a segfault). A child process runs it,
    # so that a regression kills the child, not the test run.
    import subprocess
    import sys

    path = data_copy / "gpus.yaml"
    path.write_text(path.read_text() + "deep:\n  " + "- " * depth + "1\n")
    done = subprocess.run([sys.executable, "-m", "envbuild", "--matrices", str(data_copy), "matrix",
                           "validate"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 4, done.stderr[-500:]
    line = path.read_text().count("\n")
    assert f"gpus.yaml line {line}: nested deeper than 64 levels" in done.stdout + done.stderr


def test_duplicate_key_is_refused_with_both_lines(data_copy: Path) -> None:
    path = data_copy / "cuda_toolkits.yaml"
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("min_driver:"))
    lines.insert(at + 1, lines[at])  # the same key again in the same row: the last one would win
    path.write_text("\n".join(lines) + "\n")
    problems = _problems(data_copy)
    assert f"cuda_toolkits.yaml line {at + 2}: duplicate key 'min_driver' (first at line {at + 1})" \
        in problems, problems


def test_writers_share_one_lock_and_readers_wait_out_a_commit(
        data_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/faults.md B9: commits race ``validate --write-manifest`` and loads for ~2 s.

    Without the shared lock the validator hashed files a commit then replaced (a stale
    manifest: every later load "data corrupt"); without the re-read, loads during a commit's
    moves reported exit 4 for data that was never corrupt.
    """
    import threading
    import time

    from envbuild.upstream import journal

    matrix.write_manifest(data_copy)
    names = ["cuda_archs.yaml", "gpus.yaml", "cudnn.yaml"]
    originals = {name: (data_copy / name).read_bytes() for name in names}
    variants = [originals, {name: data + b"# variant\n" for name, data in originals.items()}]
    stop = time.monotonic() + 2.0
    failures: list[str] = []

    def commits() -> None:
        turn = 0
        while time.monotonic() < stop:
            turn += 1
            journal.commit(data_copy, variants[turn % 2])

    def validations() -> None:
        while time.monotonic() < stop:
            code = main(["--matrices", str(data_copy), "matrix", "validate", "--write-manifest"], env={})
            if code != 0:
                failures.append(f"validate exit {code}")

    def loads() -> None:
        while time.monotonic() < stop:
            try:
                matrix._load(data_copy, None)
            except DataError as exc:
                failures.append(f"load: {exc.message}")

    workers = (commits, commits, validations, validations, loads, loads)
    threads = [threading.Thread(target=work) for work in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    capsys.readouterr()
    assert not any(thread.is_alive() for thread in threads)
    assert failures[:3] == []
    matrix._load(data_copy, None)  # the manifest left behind matches the files


def test_manifest_writer_waits_for_a_refresh_whatever_its_cache(data_copy: Path, tmp_path: Path) -> None:
    """docs/faults.md B9: refresh's lock lived under the cache directory, which validate never saw."""
    import threading

    from envbuild.upstream import journal

    outcome: list[str] = []

    def write() -> None:
        try:
            matrix.write_manifest(data_copy, timeout_s=0.3)
            outcome.append("wrote")
        except DataError as exc:
            outcome.append(exc.message)

    with journal.refresh_lock(data_copy, 0, lambda m: None):
        thread = threading.Thread(target=write)
        thread.start()
        thread.join(timeout=10)
    assert outcome and outcome[0].startswith("refresh in progress")
    assert not (data_copy / matrix.MANIFEST).exists() or matrix._load(data_copy, None)
    write()
    assert outcome[-1] == "wrote"
