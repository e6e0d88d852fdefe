"""Real projects' dependency files (tests/fixtures/real-projects/, #37 item 8).

Offline: every fixture is still the byte-exact file SOURCES.md says it is (its git blob id),
and projects.toml names only files that are there. Marked ``network``: two projects that lock
today are locked by envbuild and compiled by ``uv pip compile`` from the same files for the same
Python and platform (bench/bench_real_projects.py's ``measure``), and every version must agree.
Marked ``docker`` too: one project (transformers' summarization example, with its sdist-only
rouge-score) locked on the CPU torch wheel, built into an image, verified and imported (the
bench's ``--build``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "real-projects"
OWN_FILES = {"SOURCES.md", "README.md", "projects.toml"}


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_real_projects",
                                                  ROOT / "bench" / "bench_real_projects.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _sources() -> dict[str, str]:
    """fixture path -> git blob id, from SOURCES.md's table."""
    rows = {}
    for line in (CORPUS / "SOURCES.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and (CORPUS / cells[0]).is_file():
            rows[cells[0]] = cells[4]
    return rows


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def test_every_fixture_is_the_byte_exact_file_its_source_names() -> None:
    sources = _sources()
    present = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*")
                     if p.is_file() and p.name not in OWN_FILES)
    assert sorted(sources) == present  # every file has its row, every row its file
    assert len({p.split("/")[0] for p in present}) >= 8
    for path, blob in sources.items():
        assert _git_blob((CORPUS / path).read_bytes()) == blob, path


def test_projects_toml_names_files_that_are_there() -> None:
    bench = _bench()
    projects = bench.corpus(None)
    assert len(projects) >= 8
    for inputs in projects:
        for name in (*inputs.requirements, *([inputs.pyproject] if inputs.pyproject else [])):
            assert (CORPUS / inputs.name / name).is_file(), (inputs.name, name)


def test_differences_list_every_mismatch_and_one_sided_package(tmp_path: Path) -> None:
    bench = _bench()
    lock = tmp_path / "pylock.toml"
    lock.write_text('lock-version = "1.0"\ncreated-by = "t"\n'
                    '[[packages]]\nname = "Rouge_Score"\nversion = "0.0.4"\n'
                    'wheels = [{ url = "https://x.invalid/r.whl", hashes = { sha256 = "00" } }]\n'
                    '[[packages]]\nname = "sqlitedict"\nversion = "2.1.0"\n'
                    'sdist = { url = "https://x.invalid/s.tar.gz", hashes = { sha256 = "00" } }\n',
                    encoding="utf-8")
    versions, unbuilt = bench.read_pylock(lock)
    assert versions == {"rouge-score": "0.0.4", "sqlitedict": "2.1.0"}
    assert unbuilt == ["sqlitedict"]
    assert bench.differences(versions, {"rouge-score": "0.1.2", "nltk": "3.9"}) == (
        ("nltk", "-", "3.9"), ("rouge-score", "0.0.4", "0.1.2"), ("sqlitedict", "2.1.0", "-"))
    assert bench.differences({}, {"nltk": "3.9"}) == ()  # a side that failed compares nothing


def _index_or_skip() -> str:
    import requests

    from envbuild.upstream.pipconfig import index_url, tls_verify

    index = index_url(None, os.environ)
    try:
        requests.get(f"{index.rstrip('/')}/pip/", timeout=20, verify=tls_verify(os.environ))
    except requests.RequestException as exc:
        pytest.skip(f"the configured package index is unreachable ({type(exc).__name__})")
    return index


@pytest.mark.network
@pytest.mark.parametrize("project", ["pytorch-image-models", "open_clip"])
def test_lock_equals_uv_pip_compile_of_the_same_files(project: str) -> None:
    """pytorch-image-models (a pyproject and a requirements file naming the same packages) and
    open_clip (two requirements files, extras): envbuild's pylock holds exactly the versions uv
    pip compile gives for the same files, Python 3.12 and the platform the lock records."""
    index = _index_or_skip()
    bench = _bench()
    (inputs,) = bench.corpus([project])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild-bench" / "uv"
    from envbuild.pylock.uv import find_uv

    row = bench.measure(inputs, tree=ROOT, python="3.12", timeout=600.0, cache=cache, index=index,
                        uv=find_uv(None))
    assert row.envbuild.exit == 0, row.envbuild.error
    assert row.uv.exit == 0, row.uv.error
    assert row.platform.startswith("x86_64-manylinux_2_")
    assert "torch" in row.envbuild.versions and "torchvision" in row.envbuild.versions
    assert row.envbuild.versions == row.uv.versions, row.differences


TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.docker
@pytest.mark.network
def test_a_real_project_with_an_sdist_locks_builds_and_verifies(docker_api: object) -> None:
    """transformers' summarization example, its requirements.txt as written, plus the one line
    its sdist-only rouge-score needs (``build-sdists = true``), on the CPU torch 2.13.0 of the
    ``$PIP_FIND_LINKS`` wheelhouse (served on 127.0.0.1) and the test base image: the lock equals
    uv pip compile's, rouge-score is built from its sdist, the image builds, ``verify
    --cpu-ok`` passes and the project's modules import in it (bench --build; the image is removed)."""
    index = _index_or_skip()
    wheel = Path(os.environ.get("PIP_FIND_LINKS", "/nonexistent")) / TORCH_WHEEL
    if not wheel.is_file():
        pytest.skip(f"no {TORCH_WHEEL} in $PIP_FIND_LINKS")
    import subprocess

    base = subprocess.run(["bash", str(ROOT / "scripts" / "base-image.sh")], capture_output=True,
                          text=True, timeout=1200)
    assert base.returncode == 0, base.stderr[-2000:]
    bench = _bench()
    (inputs,) = bench.corpus(["transformers-summarization"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild-bench" / "uv"
    from envbuild.pylock.uv import find_uv

    with bench.torch_index(wheel) as url:
        row = bench.measure(inputs, tree=ROOT, python="3.11", timeout=600.0, cache=cache, index=index,
                            uv=find_uv(None), more=("build-sdists = true",),
                            cpu=bench.CpuStack(torch_index=url, base=base.stdout.strip().splitlines()[-1]),
                            images=bench.Images(ca_bundle=os.environ.get("PIP_CERT"), timeout=1800.0))
    assert row.envbuild.exit == 0, row.envbuild.error
    assert row.envbuild.versions == row.uv.versions, row.differences
    assert row.envbuild.versions["torch"] == "2.13.0+cpu"
    # rouge-score's newest release (0.1.2 on 2026-11-28) is an sdist only: built in the image
    assert row.envbuild.sdist_only == ["rouge-score"], row.envbuild.sdist_only
    image = row.image
    assert image is not None and image.build_exit == 0, image and image.build_error
    failed = [check for check in image.checks if check[1] not in ("pass", "skip")]
    assert image.verify_exit == 0 and not failed, failed or image.checks
    assert ("lock", "pass") in [(name, status) for name, status, _ in image.checks]
    assert image.import_exit == 0, image.import_output
    imported = json.loads(image.import_output.splitlines()[-1])
    assert set(imported) == set(inputs.imports) and imported["torch"] == "2.13.0+cpu"
