"""The whole-environment lock on a real engine and a real registry: a sample project →
``init`` → ``lock`` (uv, the base image's digest from a loopback registry) → ``build`` →
the image's installed set equal to the pylock → ``verify --cpu-ok``; one requirement added →
``lock --check`` says stale → re-lock → the rebuild reuses the torch layer, byte for byte, with the
classic builder (two stages: the CA bundle) and with buildah; two no-cache builds of one lock give
the same files (classic) and one image ID (buildah), also when the index moved on between them
(a year later: torch's link gone from its page, a newer release of a dependency there).

torch 2.13.0+cpu comes from the ``$PIP_FIND_LINKS`` wheelhouse, served on 127.0.0.1 as the
variant's index (PyTorch's own index is not reachable here), beside a find-links page offering
``yearprobe``, a tiny wheel the test makes; the project's other small dependencies come from the
configured package index through the proxy whose CA ``--ca-bundle`` trusts.
Needs dockerd, docker-registry and the index (see DEVELOPERS.md); CI runs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tagged
from test_direct_wheels import wheel_bytes  # a real tiny wheel
from test_lock_command import serve_directory  # a static index on 127.0.0.1

pytestmark = [pytest.mark.docker, pytest.mark.network]

ROOT = Path(__file__).resolve().parent.parent
TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
TAG = tagged("envbuild-test/locked:1")
TAG_2 = tagged("envbuild-test/locked:2")
PROBE = "yearprobe"  # offered by the local index's find-links page: 1.0, later 1.1 too
DEPENDENCIES = [PROBE, "six>=1.16", "idna>=3.7"]
ADDED = "attrs>=23.1"
# What the venv has before envbuild installs anything (ensurepip, Python 3.11): not the lock's.
BOOTSTRAP = {"pip", "setuptools"}


def envbuild(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "envbuild", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def client(docker_api: Any) -> Any:
    return docker_api


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    directory = Path(os.environ.get("PIP_FIND_LINKS", "/nonexistent"))
    if not (directory / TORCH_WHEEL).is_file():
        pytest.skip(f"no {TORCH_WHEEL} in $PIP_FIND_LINKS")
    return directory


@pytest.fixture(scope="module")
def pushed_base(client: Any, loopback_registry: str) -> Iterator[str]:
    """The debootstrap base, pushed to the loopback registry: lock must find its digest there.
    The engine's tag for it (the registry's port in its name) is removed afterwards: every
    session's registry has another port, and their tags piled up on the base."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "base-image.sh")], capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    local = done.stdout.strip().splitlines()[-1]
    repository = f"{loopback_registry}/envbuild/bookworm"
    client.tag(local, repository, "base")
    try:
        for line in client.push(repository, "base", stream=True, decode=True):
            assert "error" not in line, line
        yield f"{repository}:base"
    finally:
        with contextlib.suppress(Exception):  # the base itself keeps its own tag
            client.remove_image(f"{repository}:base")


class LocalIndex:
    """A PEP 503 index of one file on 127.0.0.1 standing in for PyTorch's cpu index
    (``simple/torch/``), and a find-links page (``probe/``) offering ``yearprobe``; both are files
    a test rewrites (a link removed, a newer release added) while the server runs."""

    def __init__(self, root: Path, url: str, wheelhouse: Path) -> None:
        self.root, self.url = root, url
        (root / "files").mkdir()
        (root / "files" / TORCH_WHEEL).symlink_to(wheelhouse / TORCH_WHEEL)
        self.torch_digest = hashlib.sha256((wheelhouse / TORCH_WHEEL).read_bytes()).hexdigest()
        (root / "simple" / "torch").mkdir(parents=True)
        (root / "probe").mkdir()
        self.offer_torch(True)
        self.offer_probe("1.0")

    @property
    def torch_url(self) -> str:
        return f"{self.url}/simple"

    @property
    def probe_url(self) -> str:
        return f"{self.url}/probe/"

    def offer_torch(self, linked: bool) -> None:
        """torch's page with its link, or without it (the file stays at its URL)."""
        quoted = TORCH_WHEEL.replace("+", "%2B")
        link = f'<a href="../../files/{quoted}#sha256={self.torch_digest}">{TORCH_WHEEL}</a>'
        (self.root / "simple" / "torch" / "index.html").write_text(
            f"<html><body>{link if linked else ''}</body></html>\n")

    def offer_probe(self, *versions: str) -> None:
        links = []
        for version in versions:
            name = f"{PROBE}-{version}-py3-none-any.whl"
            path = self.root / "probe" / name
            # A published file never changes (as on a real index): made once. wheel_bytes stamps
            # the zip's members with the time, so a second make would be another file, which
            # the lock's hash then refuses.
            if not path.exists():
                path.write_bytes(wheel_bytes(PROBE, version))
            data = path.read_bytes()
            links.append(f'<a href="{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>')
        page = "<html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        (self.root / "probe" / "index.html").write_text(page)


@pytest.fixture(scope="module")
def local_index(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalIndex]:
    root = tmp_path_factory.mktemp("local-index")
    with serve_directory(root) as url:
        yield LocalIndex(root, url, wheelhouse)


@pytest.fixture(scope="module")
def torch_index(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The torch page alone, for the other e2e modules that import it (each module its own
    server: this module's rewrites of its pages reach no other)."""
    root = tmp_path_factory.mktemp("torch-index")
    with serve_directory(root) as url:
        yield LocalIndex(root, url, wheelhouse).torch_url


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, pushed_base: str, local_index: LocalIndex) -> Path:
    """A sample project: a pyproject with three small dependencies, its [tool.envbuild] block
    written by ``envbuild init --print`` plus the keys this machine needs."""
    directory = tmp_path_factory.mktemp("sample")
    done = envbuild("init", "--print", "--torch", "==2.13.0", "--variant", "cpu", "--python", "3.11",
                    cwd=directory)
    assert done.returncode == 0, done.stderr
    block = done.stdout
    assert "[tool.envbuild]" in block
    extra = (f'base-image = "{pushed_base}"\ntorch-index-url = "{local_index.torch_url}"\n'
             f'find-links = ["{local_index.probe_url}"]\n')
    block = block.replace("[tool.envbuild]\n", "[tool.envbuild]\n" + extra, 1)
    # No CPU build of torchvision/torchaudio is reachable here: torch alone.
    assert "companions = true" in block
    block = block.replace("companions = true", "companions = false", 1)
    deps = ", ".join(f'"{d}"' for d in DEPENDENCIES)
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "sample"\nversion = "0.1"\nrequires-python = ">=3.11"\n'
        f"dependencies = [{deps}]\n\n{block}")
    return directory


@pytest.fixture(scope="module")
def locked(project: Path) -> dict[str, Any]:
    done = envbuild("lock", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((project / "envbuild.lock").read_text())


def installed(client: Any, image: str) -> dict[str, str]:
    """{canonical name: version} of every distribution in the image's venv."""
    code = ("import json, re; from importlib import metadata; print(json.dumps({re.sub(r'[-_.]+', '-', "
            "d.metadata['Name']).lower(): d.version for d in metadata.distributions()}))")
    out = _run(image, code)
    return dict(json.loads(out))


def _run(image: str, code: str) -> bytes:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, "/opt/venv/bin/python",
                           "-c", code], capture_output=True, check=True, timeout=300).stdout


def site_files(image: str) -> dict[str, str]:
    """sha256 of every file under the venv's site-packages."""
    code = ("import hashlib, json, os, sysconfig; root = sysconfig.get_paths()['purelib']; "
            "print(json.dumps({os.path.relpath(os.path.join(d, f), root): "
            "hashlib.sha256(open(os.path.join(d, f), 'rb').read()).hexdigest() "
            "for d, _, fs in os.walk(root) for f in fs}))")
    return dict(json.loads(_run(image, code)))


def layer_dirs(client: Any, image: str) -> list[Path]:
    """The overlay2 directories of the image's layers, oldest first, one per RootFS.Layers entry.
    A layer shared by two images (the same layer on the same layers below) is one directory."""
    inspect = client.inspect_image(image)
    driver = inspect["GraphDriver"]
    if driver["Name"] != "overlay2" or not os.access(driver["Data"]["UpperDir"], os.R_OK):
        message = "the layer check reads the engine's overlay2 directories (as root)"
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail(message)
        pytest.skip(message)
    lower = driver["Data"].get("LowerDir")
    dirs = [Path(d) for d in reversed(lower.split(":"))] if lower else []
    dirs.append(Path(driver["Data"]["UpperDir"]))
    assert len(dirs) == len(inspect["RootFS"]["Layers"])
    return dirs


def assert_torch_layer_kept(client: Any, before: str, after: str) -> None:
    """docs/faults.md U11: the layer that holds torch is one and the same in both images (so are
    those below it), and the added dependency lives in a later layer of its own."""
    site = "opt/venv/lib/python3.11/site-packages"
    old, new = layer_dirs(client, before), layer_dirs(client, after)
    holding = [i for i, d in enumerate(old) if (d / site / "torch" / "__init__.py").is_file()]
    assert len(holding) == 1, holding
    index = holding[0]
    assert new[:index + 1] == old[:index + 1] and len(new) > index + 1
    assert any((d / site / "attrs").is_dir() for d in new[index + 1:])


def build(project: Path, tag: str, *extra: str) -> dict[str, Any]:
    args = ["build", "--lock", "envbuild.lock", "--network", "host", "--tag", tag,
            "--report", "report.json", *extra]
    cert = os.environ.get("PIP_CERT")
    if cert:  # TLS here goes through an inspecting proxy whose CA the build must trust
        args += ["--ca-bundle", cert]
    done = envbuild(*args, cwd=project)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return dict(json.loads((project / "report.json").read_text()))


def test_lock_pins_the_closure_and_the_base_by_digest(project: Path, locked: dict[str, Any],
                                                      pushed_base: str) -> None:
    assert locked["schema"] == 2 and list(locked["targets"]) == ["default"]
    assert locked["project"]["file"] == "pyproject.toml"
    target = locked["targets"]["default"]
    packages = target["packages"]
    assert packages["torch"] == "2.13.0+cpu"
    assert {"six", "idna", "filelock", "sympy"} <= set(packages)  # the user's and torch's own
    assert target["base_image"].startswith(pushed_base + "@sha256:")
    digest = target["base_digest"]
    inspected = subprocess.run(["docker", "image", "inspect", pushed_base, "--format",
                                "{{json .RepoDigests}}"], capture_output=True, text=True, check=True)
    assert digest in inspected.stdout  # the registry's digest is what the push reported
    pylock = (project / target["pylock"]["file"]).read_text()
    assert hashlib.sha256(pylock.encode()).hexdigest() == target["pylock"]["sha256"]
    assert "torch" in target["pylock"]["torch_layer"] and "six" not in target["pylock"]["torch_layer"]
    # The same inputs give the same bytes, and --check agrees.
    before = {p.name: p.read_bytes() for p in project.iterdir() if p.suffix in (".lock", ".toml")}
    again = envbuild("lock", cwd=project)
    assert again.returncode == 0, again.stderr
    assert {p.name: p.read_bytes() for p in project.iterdir() if p.suffix in (".lock", ".toml")} == before
    check = envbuild("lock", "--check", cwd=project)
    assert check.returncode == 0, check.stderr


def test_the_image_holds_exactly_the_lock_and_verifies(client: Any, project: Path,
                                                       locked: dict[str, Any]) -> None:
    build(project, TAG)
    packages = locked["targets"]["default"]["packages"]
    found = installed(client, TAG)
    assert {k: v for k, v in found.items() if k not in BOOTSTRAP or k in packages} == packages
    done = envbuild("verify", TAG, "--cpu-ok", "--json", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["lock"]["status"] == "pass"
    # W6: the image carries g++ and python3-dev by default: torch.compile compiles inside it
    assert checks["torch.compile"]["status"] == "pass", checks["torch.compile"]
    assert checks["torch.compile"]["message"].startswith("torch.compile (Inductor C++) on cpu matches eager")


def test_adding_a_requirement_is_stale_then_rebuilds_on_the_torch_layer(client: Any, project: Path,
                                                                       locked: dict[str, Any]) -> None:
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace(f'"{DEPENDENCIES[-1]}"]', f'"{DEPENDENCIES[-1]}", "{ADDED}"]', 1))
    try:
        stale = envbuild("lock", "--check", cwd=project)
        assert stale.returncode == 11 and "stale" in stale.stderr, stale.stderr
        done = envbuild("lock", cwd=project)
        assert done.returncode == 0, done.stderr[-3000:]
        relocked = json.loads((project / "envbuild.lock").read_text())["targets"]["default"]
        assert "attrs" in relocked["packages"]
        assert relocked["pylock"]["torch_layer"] == locked["targets"]["default"]["pylock"]["torch_layer"]
        report = build(project, TAG_2)
        ran = " ".join(report["ran"])
        assert "torch.txt" not in ran, report["ran"]  # the torch layer came from the cache
        assert "project.txt" in ran, report["ran"]
        assert "attrs" in installed(client, TAG_2)
        assert_torch_layer_kept(client, TAG, TAG_2)  # with --ca-bundle: classic's 2 stages
    finally:
        pyproject.write_text(text)
        assert envbuild("lock", cwd=project).returncode == 0


def test_buildah_keeps_the_torch_layer_when_a_dependency_is_added(client: Any, project: Path,
                                                                  locked: dict[str, Any],
                                                                  local_index: LocalIndex,
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md U11 with buildah (BuildKit syntax, one stage, its layer cache): the image
    built after adding a dependency holds the first image's torch layer, byte for byte. U12:
    with SOURCE_DATE_EPOCH set, two builds of that lock with ``--no-cache`` (and ``--no-load``:
    nothing copied into the Docker engine) have one image ID, and the layers of the cached one.
    I15, a year later: between those two builds the index moved on (torch's link gone from its
    page, the file still at its URL; yearprobe 1.1 offered beside the locked 1.0), and the
    second is still the first image, while a lock made now would take yearprobe 1.1."""
    if shutil.which("buildah") is None:
        if os.environ.get("ENVBUILD_REQUIRE_DOCKER"):
            pytest.fail("ENVBUILD_REQUIRE_DOCKER is set but there is no buildah")
        pytest.skip("no buildah")
    before = _buildah_images()
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    tags = [tagged(f"envbuild-test/locked-buildah:{t}") for t in ("1", "2", "fresh-a", "fresh-b")]
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    try:
        build(project, tags[0], "--builder", "buildah")
        pyproject.write_text(text.replace(f'"{DEPENDENCIES[-1]}"]', f'"{DEPENDENCIES[-1]}", "{ADDED}"]', 1))
        assert envbuild("lock", cwd=project).returncode == 0
        report = build(project, tags[1], "--builder", "buildah")
        assert not any("torch.txt" in step for step in report["ran"]), report["ran"]
        assert_torch_layer_kept(client, tags[0], tags[1])
        # U12: two --no-cache builds of that lock give one image ID; their layers are the cached
        # build's too (its history may name older intermediate images: compared by layers).
        def lock_files() -> tuple[bytes, bytes]:
            return (project / "envbuild.lock").read_bytes(), (project / "pylock.toml").read_bytes()

        lock_bytes = lock_files()
        assert json.loads(lock_bytes[0])["targets"]["default"]["packages"][PROBE] == "1.0"
        first = build(project, tags[2], "--builder", "buildah", "--no-cache", "--no-load")
        # I15: the index moves on under the lock (pytorch/pytorch#193491's August 2026 case and
        # a newer release), and the same lock is built again from nothing.
        local_index.offer_torch(False)
        local_index.offer_probe("1.0", "1.1")
        second = build(project, tags[3], "--builder", "buildah", "--no-cache", "--no-load")
        assert lock_files() == lock_bytes  # the same lock, not touched by the build
        assert all(any("torch.txt" in step for step in r["ran"]) for r in (first, second))  # built anew
        assert first["image_id"] == second["image_id"], "one lock, two --no-cache builds, two image IDs"
        layers = _buildah_layers(tags[2])
        assert _buildah_layers(tags[3]) == layers  # every diff ID, the Python environment's among them
        assert layers == _buildah_layers(tags[1])
        assert not client.images(name=tags[2])  # --no-load: not copied into the Docker engine
        # What the index offers now is another closure: a lock made afresh takes yearprobe 1.1
        # (with torch's link back: without it no lock can be made, only the old one built).
        # --upgrade: a plain lock may answer from uv's cache of the find-links page, which kept 1.0.
        local_index.offer_torch(True)
        shutil.copy(pyproject, tmp_path / "pyproject.toml")
        done = envbuild("lock", "--upgrade", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        now = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["packages"]
        assert now[PROBE] == "1.1" and now["torch"] == "2.13.0+cpu"
    finally:
        local_index.offer_torch(True)
        local_index.offer_probe("1.0")
        pyproject.write_text(text)
        assert envbuild("lock", cwd=project).returncode == 0
        for tag in tags:
            subprocess.run(["buildah", "rmi", tag], capture_output=True, check=False)
        made = _buildah_images() - before
        if made:
            subprocess.run(["buildah", "rmi", "--force", *made], capture_output=True, check=False)


def _buildah_layers(tag: str) -> list[str]:
    """The image's layer digests (uncompressed), from buildah's storage."""
    done = subprocess.run(["buildah", "inspect", "--type", "image", tag], capture_output=True, text=True,
                          check=True)
    return list(json.loads(done.stdout)["OCIv1"]["rootfs"]["diff_ids"])


def _buildah_images() -> set[str]:
    done = subprocess.run(["buildah", "images", "--all", "--quiet", "--no-trunc"], capture_output=True,
                          text=True, check=False)
    return set(done.stdout.split())


def test_two_no_cache_builds_give_the_same_files(client: Any, project: Path,
                                                  locked: dict[str, Any]) -> None:
    # The module's first image (built before this test, or here when run alone) against one
    # built with no cache: two installs of one lock, one fewer build than two --no-cache ones.
    if subprocess.run(["docker", "image", "inspect", TAG], capture_output=True).returncode != 0:
        build(project, TAG)
    build(project, tagged("envbuild-test/locked:b"), "--no-cache")
    a, b = site_files(TAG), site_files(tagged("envbuild-test/locked:b"))
    differing = sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))
    assert differing == [], differing[:20]
