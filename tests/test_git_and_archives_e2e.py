"""A git source and a source archive by URL built into an image, for real (docs/faults.md H55,
H56): a pure-Python package in a git repository served on 127.0.0.1 (git's dumb HTTP), locked at
tag v1's commit, and one in a source archive served beside it, locked by its sha256 → ``build``:
the extensions stage clones the repository, checks out the commit, verifies it and builds the
wheel, and builds the archive fetched hash-checked; both wheels are recorded in envbuild.built.json
and imported in the image, whose code is v1's (not the branch's newer commit).

The fixtures (the wheelhouse served as torch's index on 127.0.0.1, the base image in a loopback
registry) are test_lock_e2e's. Needs dockerd, docker-registry, git and the index.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tagged
from test_git_and_archives import _git
from test_lock_command import serve_directory
from test_lock_e2e import client, envbuild, pushed_base, torch_index, wheelhouse

__all__ = ["client", "pushed_base", "torch_index", "wheelhouse"]  # fixtures, used by name

pytestmark = [pytest.mark.docker, pytest.mark.network]

TAG = tagged("envbuild-test/git-sources:h37d")
PYPROJECT = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
             '[project]\nname = "{name}"\nversion = "{version}"\n')


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("git-e2e")
    work = root / "work"
    (work / "gitthing").mkdir(parents=True)
    _git(work, "init", "-q", "-b", "main")
    (work / "gitthing" / "__init__.py").write_text("VALUE = 'v1'\n")
    (work / "pyproject.toml").write_text(PYPROJECT.format(name="gitthing", version="1.0"))
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "one")
    _git(work, "tag", "v1")
    commit = _git(work, "rev-parse", "HEAD")
    (work / "gitthing" / "__init__.py").write_text("VALUE = 'main'\n")
    _git(work, "commit", "-qam", "two")
    _git(root, "clone", "-q", "--bare", str(work), str(root / "www" / "gitthing.git"))
    _git(root / "www" / "gitthing.git", "update-server-info")
    tree = root / "arch-1.0"
    (tree / "arch").mkdir(parents=True)
    (tree / "arch" / "__init__.py").write_text("VALUE = 'archive'\n")
    (tree / "pyproject.toml").write_text(PYPROJECT.format(name="arch", version="1.0"))
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.2\nName: arch\nVersion: 1.0\n")
    sdist = root / "www" / "arch-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(tree, arcname="arch-1.0")
    with serve_directory(root / "www") as base:
        yield {"repo": f"{base}/gitthing.git", "commit": commit, "sdist": f"{base}/arch-1.0.tar.gz",
               "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()}


def test_a_git_source_and_an_archive_are_built_into_the_image(
        client: Any, tmp_path: Path, pushed_base: str, torch_index: str, served: dict[str, str]) -> None:
    deps = ["setuptools>=70.1", f"gitthing @ git+{served['repo']}@v1",
            f"arch @ {served['sdist']}#sha256={served['sha256']}"]
    (tmp_path / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{pushed_base}"\ntorch-index-url = "{torch_index}"\n'
        f'dependencies = {json.dumps(deps)}\ncompile-toolchain = false\n')
    done = envbuild("lock", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["sdists"] == ["arch", "gitthing"]
    args = ["build", "--lock", "envbuild.lock", "--network", "host", "--tag", TAG]
    if os.environ.get("PIP_CERT"):
        args += ["--ca-bundle", os.environ["PIP_CERT"]]
    built = envbuild(*args, cwd=tmp_path)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    try:
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", TAG, "/opt/venv/bin/python", "-c",
                              "import gitthing, arch; print(gitthing.VALUE, arch.VALUE)"],
                             capture_output=True, text=True, check=True, timeout=300).stdout
        assert out.strip() == "v1 archive"  # tag v1's commit, not the branch's newer one
        record = json.loads((tmp_path / "envbuild.built.json").read_text())
        keys = {w["name"]: w["source_sha256"] for w in record["wheels"]}
        assert keys == {"arch": served["sha256"],
                        "gitthing": hashlib.sha256(f"git:{served['commit']}".encode()).hexdigest()}
    finally:
        subprocess.run(["docker", "image", "rm", "-f", TAG], capture_output=True, check=False)
