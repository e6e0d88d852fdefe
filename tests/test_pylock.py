"""The uv closure engine and PEP 751 files (envbuild/pylock/).

A local package index on 127.0.0.1 (PEP 503 HTML pages with PEP 658 ``.metadata`` files,
no whole wheels) stands in for the variant's index and the default index: uv locks from
the metadata alone, and the server records every path asked for. Fault cases:
docs/faults.md H20–H29.
"""

from __future__ import annotations

import hashlib
import html
import http.server
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from envbuild.errors import DataError, NoCompatibleStack, UsageError
from envbuild.pylock.files import read_pylock
from envbuild.pylock.hashes import check_index_hashes, page_hashes
from envbuild.pylock.install import install_requirements, local_wheels, supported_tags
from envbuild.pylock.uv import ClosureSpec, compile_closure, find_uv

TORCH = "9.9.9+cu999"
LINUX = "cp311-cp311-manylinux_2_28_x86_64"
PURE = "py3-none-any"
# index -> (name, version, wheel tag, Requires-Dist)
INDEXES: dict[str, list[tuple[str, str, str, tuple[str, ...]]]] = {
    "torch": [
        ("torch", TORCH, LINUX, ("filelock", "sympy>=1.0")),
        ("torch", "9.9.8+cu999", LINUX, ("filelock", "sympy>=1.0")),
    ],
    "default": [
        # A decoy: a newer torch on the default index that must never be chosen.
        ("torch", "10.0.0", LINUX, ("filelock",)),
        ("filelock", "3.0.0", PURE, ()),
        ("filelock", "3.1.0", PURE, ()),
        ("sympy", "1.2", PURE, ("mpmath",)),
        ("mpmath", "1.3.0", PURE, ()),
        ("requests", "2.0.0", PURE, ("idna",)),
        ("idna", "3.0", PURE, ()),
        ("idna", "3.1", PURE, ()),
    ],
    # An index that gives no sha256 for its files (and serves the one wheel it lists).
    "nohash": [("nohashpkg", "1.0", PURE, ())],
}
SERVED_WHEELS = {"nohash"}


def fake_sha256(filename: str) -> str:
    """The fake (but fixed) sha256 the index gives for a wheel it does not serve."""
    return hashlib.sha256(f"fake:{filename}".encode()).hexdigest()


def metadata(name: str, version: str, requires: tuple[str, ...]) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return ("\n".join(lines) + "\n").encode()


def tiny_wheel(name: str, version: str) -> bytes:
    buffer = io.BytesIO()
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", metadata(name, version, ()))
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return buffer.getvalue()


def build_indexes(root: Path) -> None:
    for index, dists in INDEXES.items():
        pages: dict[str, list[str]] = {}
        files = root / index / "files"
        files.mkdir(parents=True)
        for name, version, tag, requires in dists:
            filename = f"{name}-{version}-{tag}.whl"
            meta = metadata(name, version, requires)
            (files / f"{filename}.metadata").write_bytes(meta)
            meta_sha = hashlib.sha256(meta).hexdigest()
            fragment = f"#sha256={fake_sha256(filename)}"
            if index in SERVED_WHEELS:
                (files / filename).write_bytes(tiny_wheel(name, version))
                fragment = ""
            href = html.escape(f"../../files/{filename}{fragment}")
            pages.setdefault(name, []).append(
                f'<a href="{href}" data-dist-info-metadata="sha256={meta_sha}" '
                f'data-core-metadata="sha256={meta_sha}">{filename}</a><br/>')
        for name, links in pages.items():
            page = root / index / "simple" / name
            page.mkdir(parents=True)
            (page / "index.html").write_text("<!DOCTYPE html>\n<html><body>\n" + "\n".join(links)
                                             + "\n</body></html>\n")


class Index:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.paths: list[str] = []

    def url(self, index: str) -> str:
        return f"http://127.0.0.1:{self.port}/{index}/simple"

    def wheels_fetched(self) -> list[str]:
        return [p for p in self.paths if p.endswith(".whl")]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    root = tmp_path_factory.mktemp("index")
    build_indexes(root)
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            seen.append(self.path)
            super().do_GET()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served = Index(root, server.server_address[1])
    served.paths = seen
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def uv_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("uv-cache")
    return {**os.environ, "UV_CACHE_DIR": str(cache), "UV_HTTP_RETRIES": "0"}


def spec(index: Index, env: dict[str, str], **changes: Any) -> ClosureSpec:
    fields: dict[str, Any] = dict(
        torch_pins={"torch": TORCH}, torch_index=index.url("torch"), python="3.11", glibc="2.35",
        dependencies=("requests",), default_index=index.url("default"), env=env, timeout=60.0)
    fields.update(changes)
    return ClosureSpec(**fields)


# --------------------------------------------------------------------------- closure


def test_closure_from_local_index(index: Index, uv_env: dict[str, str]) -> None:
    """torch comes only from the torch index (the newer decoy torch on the default index is
    never chosen), the rest from the default index, from metadata alone."""
    index.paths.clear()
    closure = compile_closure(spec(index, uv_env))
    assert closure.packages == {"filelock": "3.1.0", "idna": "3.1", "mpmath": "1.3.0",
                                "requests": "2.0.0", "sympy": "1.2", "torch": TORCH}
    assert closure.torch_layer == frozenset({"torch", "filelock", "sympy", "mpmath"})
    pylock = read_pylock(closure.pylock_text)
    torch = pylock.package("torch")
    assert [w.url for w in torch.wheels] == [
        f"http://127.0.0.1:{index.port}/torch/files/torch-{TORCH}-{LINUX}.whl"]
    for package in pylock.packages:
        where = "torch" if package.name == "torch" else "default"
        for wheel in package.wheels:
            assert wheel.url is not None and f"/{where}/files/" in wheel.url
            assert wheel.sha256 == fake_sha256(wheel.filename)
    assert index.wheels_fetched() == []
    assert not any(p.startswith("/default/simple/torch") for p in index.paths)


def test_same_inputs_same_bytes(index: Index, uv_env: dict[str, str], tmp_path: Path) -> None:
    first = compile_closure(spec(index, uv_env))
    second = compile_closure(spec(index, uv_env))
    assert first.pylock_text.encode() == second.pylock_text.encode()
    again = compile_closure(spec(index, uv_env, previous=first.pylock_text))
    assert again.pylock_text.encode() == first.pylock_text.encode()
    cold = compile_closure(spec(index, {**uv_env, "UV_CACHE_DIR": str(tmp_path / "cold")}))
    assert cold.pylock_text.encode() == first.pylock_text.encode()


def test_a_previous_pylock_only_pep_751s_reader_refuses_is_refused_as_before(
        index: Index, uv_env: dict[str, str]) -> None:
    """The previous pylock is read before uv's closure run without PEP 751's reference reader
    (its import and half the time); that reader checks it beside the run. A file only it
    refuses (a wheel named for another version) is the same UsageError, naming the field."""
    first = compile_closure(spec(index, uv_env))
    idna = re.search(r'name = "idna"\nversion = "([^"]+)"', first.pylock_text)
    assert idna is not None
    tampered = first.pylock_text.replace(idna[0], f'name = "idna"\nversion = "{idna[1]}.1"')
    read_pylock(tampered, reference=False)  # the reader's own checks let it through
    with pytest.raises(UsageError) as refused:
        read_pylock(tampered)
    with pytest.raises(UsageError) as raised:
        compile_closure(spec(index, uv_env, previous=tampered))
    assert raised.value.message == refused.value.message and "pylock:" in raised.value.message


def test_previous_pins_kept_unless_upgraded(index: Index, uv_env: dict[str, str]) -> None:
    old = compile_closure(spec(index, uv_env, dependencies=("requests", "filelock==3.0.0", "idna==3.0")))
    assert (old.packages["filelock"], old.packages["idna"]) == ("3.0.0", "3.0")
    kept = compile_closure(spec(index, uv_env, previous=old.pylock_text))
    assert (kept.packages["filelock"], kept.packages["idna"]) == ("3.0.0", "3.0")
    one = compile_closure(spec(index, uv_env, previous=old.pylock_text, upgrade_packages=("filelock",)))
    assert (one.packages["filelock"], one.packages["idna"]) == ("3.1.0", "3.0")
    every = compile_closure(spec(index, uv_env, previous=old.pylock_text, upgrade=True))
    assert (every.packages["filelock"], every.packages["idna"]) == ("3.1.0", "3.1")


def test_credentials_stay_out_of_the_pylock(index: Index, uv_env: dict[str, str]) -> None:
    """An index URL with a user and token: the pylock records its files without them."""
    closure = compile_closure(spec(index, uv_env, default_index=index.url("default").replace(
        "http://", "http://someone:t0ken@"), torch_index=index.url("torch").replace(
        "http://", "http://someone:t0ken@")))
    assert closure.packages["torch"] == TORCH
    assert "t0ken" not in closure.pylock_text and "someone" not in closure.pylock_text


def test_offline_uses_the_cache_only(index: Index, uv_env: dict[str, str], tmp_path: Path) -> None:
    """--offline: the same bytes from a warm uv cache; from an empty one, exit 4 saying why."""
    online = compile_closure(spec(index, uv_env))
    index.paths.clear()
    offline = compile_closure(spec(index, uv_env, offline=True))
    assert offline.pylock_text == online.pylock_text
    assert offline.torch_layer == online.torch_layer
    assert index.paths == []
    empty = {**uv_env, "UV_CACHE_DIR": str(tmp_path / "empty")}
    with pytest.raises(DataError, match="uv's cache cannot answer offline: Because torch was not found") \
            as caught:
        compile_closure(spec(index, empty, offline=True))
    assert "--offline uses uv's cache only" in caught.value.one_line()


def test_stray_uv_settings_are_ignored(index: Index, uv_env: dict[str, str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md H28: a UV_* variable or a uv.toml that would change the answer is ignored."""
    constraints = tmp_path / "c.txt"
    constraints.write_text("filelock==3.0.0\n")
    (tmp_path / "uv.toml").write_text('constraint-dependencies = ["idna==3.0"]\n')
    monkeypatch.chdir(tmp_path)
    env = {**uv_env, "UV_CONSTRAINT": str(constraints), "UV_CONFIG_FILE": str(tmp_path / "uv.toml")}
    closure = compile_closure(spec(index, env))
    assert (closure.packages["filelock"], closure.packages["idna"]) == ("3.1.0", "3.1")


def test_conflict_names_both_sides(index: Index, uv_env: dict[str, str]) -> None:
    """docs/faults.md H21: the project's torch<2 against the stack's pin: exit 3, both named."""
    with pytest.raises(NoCompatibleStack) as caught:
        compile_closure(spec(index, uv_env, torch_constraints=("torch<2",)))
    error = caught.value
    assert error.exit_code == 3
    line = error.one_line()
    assert f"torch=={TORCH}" in line and "torch<2" in line
    assert "\n" not in line
    assert "envbuild-closure" not in line
    assert any("torch<2" in c for c in error.conflicts)
    assert any(TORCH in c for c in error.conflicts)
    # Through torch's own requirement (sympy>=1.0): both sides still named.
    with pytest.raises(NoCompatibleStack) as caught:
        compile_closure(spec(index, uv_env, dependencies=("requests", "sympy<1")))
    assert f"torch=={TORCH} (the stack)" in caught.value.one_line()
    assert "sympy<1 (the project)" in caught.value.one_line()


def test_stack_pin_missing_from_its_index(index: Index, uv_env: dict[str, str]) -> None:
    """docs/faults.md H29: the variant's index lacks the stack's pin: exit 4, not a conflict."""
    missing = r"the stack's pins cannot be installed from their index: torch==9\.0"
    with pytest.raises(DataError, match=missing):
        compile_closure(spec(index, uv_env, torch_pins={"torch": "9.0"}))


def test_index_without_hashes_is_refused(index: Index, uv_env: dict[str, str]) -> None:
    """docs/faults.md H22: the index gives no sha256 (uv would hash its own download): exit 4."""
    with pytest.raises(DataError) as caught:
        compile_closure(spec(index, uv_env, torch_pins={}, torch_index=None,
                             dependencies=("nohashpkg",), default_index=index.url("nohash")))
    assert caught.value.exit_code == 4
    assert "no sha256 for nohashpkg-1.0-py3-none-any.whl" in caught.value.one_line()


def test_index_hash_check_reads_json_and_html(index: Index, uv_env: dict[str, str]) -> None:
    """The check behind docs/faults.md H22: a sha256 that differs from the index's page is
    refused as well as a missing one; PEP 691 JSON pages are read as the HTML ones."""
    good = fake_sha256("idna-3.0-py3-none-any.whl")
    text = ('lock-version = "1.0"\ncreated-by = "tests"\n[[packages]]\nname = "idna"\nversion = "3.0"\n'
            f'wheels = [{{ url = "http://127.0.0.1:{index.port}/default/files/idna-3.0-py3-none-any.whl", '
            f'hashes = {{ sha256 = "{{}}" }} }}]\n')
    check_index_hashes(read_pylock(text.replace("{}", good)), lambda _: index.url("default"),
                       env=uv_env, timeout=30)
    with pytest.raises(DataError, match=r"uv recorded sha256 0{64} but the index") as caught:
        check_index_hashes(read_pylock(text.replace("{}", "0" * 64)), lambda _: index.url("default"),
                           env=uv_env, timeout=30)
    assert caught.value.exit_code == 4
    page = json.dumps({"meta": {"api-version": "1.1"}, "files": [
        {"filename": "a-1-py3-none-any.whl", "url": "a-1-py3-none-any.whl", "hashes": {"sha256": "AB" * 32}},
        {"filename": "b-1-py3-none-any.whl", "url": "b-1-py3-none-any.whl", "hashes": {}}]}).encode()
    assert page_hashes(page, "application/vnd.pypi.simple.v1+json", "https://x.invalid/simple/a/") == {
        "a-1-py3-none-any.whl": "ab" * 32, "b-1-py3-none-any.whl": None}
    links = b'<a href="../../f/a-1-py3-none-any.whl#sha256=' + b"CD" * 32 + b'">a</a><a href="b-1.whl">b</a>'
    assert page_hashes(links, "text/html", "https://x.invalid/simple/a/") == {
        "a-1-py3-none-any.whl": "cd" * 32, "b-1.whl": None}


def test_uv_missing_is_usage_error(index: Index, uv_env: dict[str, str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md H20: no uv → exit 2 with the install hint."""
    with pytest.raises(UsageError) as caught:
        compile_closure(spec(index, uv_env, uv=str(tmp_path / "no-uv")))
    assert caught.value.exit_code == 2 and "pip install uv" in caught.value.one_line()
    # No uv package, and no uv binary where a virtual environment's scripts go.
    monkeypatch.setitem(sys.modules, "uv", None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(UsageError) as caught:
        compile_closure(spec(index, uv_env))
    assert "pip install uv" in caught.value.one_line()


def test_the_uv_found_in_a_virtual_environment_is_the_uv_packages_own() -> None:
    """find_uv looks first where the uv package's own finder does (<prefix>/bin in a virtual
    environment), without importing sysconfig: both name the same binary here."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtual environment")
    from uv import find_uv_bin

    assert find_uv(None) == str(find_uv_bin())


def test_unreachable_index_is_one_line(index: Index, uv_env: dict[str, str]) -> None:
    """docs/faults.md H23: uv fails for another reason (the index is down): exit 4, one line."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = f"http://user:s3cret@127.0.0.1:{port}/simple"
    with pytest.raises(DataError) as caught:
        compile_closure(spec(index, uv_env, default_index=dead, dependencies=("not-cached-anywhere",)))
    line = caught.value.one_line()
    assert caught.value.exit_code == 4
    assert line.startswith("envbuild: error[data]: uv could not lock the closure: ")
    assert "s3cret" not in line and "\n" not in line
    # item 7 of issue 37: the index it tried is named, its password masked
    assert f"was given: http://***@127.0.0.1:{port}/simple (the project's dependencies)" in line


@pytest.mark.parametrize("requirement", ["requests>=", "pkg @ http://x.invalid/pkg-1.0-py3-none-any.whl",
                                         "pkg @ http://x.invalid/pkg-1.0.tar.gz",  # http, no #sha256=
                                         "pkg @ hg+https://x.invalid/pkg"])
def test_bad_requirement_is_usage_error(index: Index, uv_env: dict[str, str], requirement: str) -> None:
    """An unparsable requirement, or a direct URL that is not an https wheel: exit 2 before uv runs."""
    index.paths.clear()
    with pytest.raises(UsageError, match="dependency: ") as caught:
        compile_closure(spec(index, uv_env, dependencies=(requirement,)))
    assert caught.value.exit_code == 2
    assert index.paths == []


def test_uv_timeout(index: Index, uv_env: dict[str, str], tmp_path: Path) -> None:
    """docs/faults.md H24: uv runs past the time limit: exit 4, uv stopped."""
    stalled = tmp_path / "uv"
    stalled.write_text("#!/bin/sh\nexec sleep 30\n")
    stalled.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(DataError, match=r"uv did not finish resolving the closure within 0\.5 s") as caught:
        compile_closure(spec(index, uv_env, uv=str(stalled), timeout=0.5))
    assert caught.value.exit_code == 4
    assert time.monotonic() - start < 10


# --------------------------------------------------------------------------- pylock files


def pylock_text(wheels: dict[str, list[str]], *, base: str = "https://files.example.invalid/") -> str:
    lines = ['lock-version = "1.0"', 'created-by = "tests"', ""]
    for name, files in wheels.items():
        version = files[0].rsplit("/", 1)[-1].split("-")[1]
        entries = ", ".join(
            f'{{ url = "{f if "://" in f else base + f}", '
            f'hashes = {{ sha256 = "{fake_sha256(f.rsplit("/", 1)[-1])}" }} }}' for f in files)
        lines += ["[[packages]]", f'name = "{name}"', f'version = "{version}"', f"wheels = [{entries}]", ""]
    return "\n".join(lines)


def test_wheel_choice_cp311_then_abi3_then_py3() -> None:
    """Best tag first; docs/faults.md H26: a manylinux_2_36 wheel is refused on glibc 2.35."""
    files = ["pkg-1.0-py3-none-any.whl", "pkg-1.0-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
             "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", "pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    for expected in (2, 1, 0):
        lines = install_requirements(read_pylock(pylock_text({"pkg": files})), ["Pkg"],
                                     python="3.11", glibc="2.35")
        assert lines == (f"pkg @ https://files.example.invalid/{files[expected]} "
                         f"--hash=sha256:{fake_sha256(files[expected])}\n")
        files.pop(expected)
    newer = read_pylock(pylock_text({"new": ["new-1.0-cp311-cp311-manylinux_2_36_x86_64.whl"],
                                     "old": ["old-1.0-cp311-cp311-manylinux1_x86_64.whl"]}))
    with pytest.raises(UsageError, match=r"new 1\.0 has no wheel for CPython 3\.11") as caught:
        install_requirements(newer, ["old", "new"], python="3.11", glibc="2.35")
    assert caught.value.exit_code == 2
    both = install_requirements(newer, ["old", "new"], python="3.11", glibc="2.36")
    assert [line.split(" ")[0] for line in both.splitlines()] == ["new", "old"]
    with pytest.raises(UsageError):
        install_requirements(newer, ["old"], python="3.12", glibc="2.35")
    tags = supported_tags("3.11", "2.35")
    assert str(tags[0]) == "cp311-cp311-manylinux_2_35_x86_64" and str(tags[-1]) == "py30-none-any"


def test_file_urls_rewritten_to_local_dir(tmp_path: Path) -> None:
    """docs/faults.md H27: a file:// wheel needs the build context's wheelhouse."""
    torch = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / torch).write_bytes(b"wheel")
    pylock = read_pylock(pylock_text({"torch": [f"file://{tmp_path}/wheels/{torch}"],
                                      "idna": ["idna-3.0-py3-none-any.whl"]}))
    lines = install_requirements(pylock, ["torch", "idna"], python="3.11", glibc="2.35",
                                 local_dir="/opt/envbuild/wheels")
    assert lines.splitlines() == [
        f"idna @ https://files.example.invalid/idna-3.0-py3-none-any.whl "
        f"--hash=sha256:{fake_sha256('idna-3.0-py3-none-any.whl')}",
        f"torch @ file:///opt/envbuild/wheels/{torch} --hash=sha256:{fake_sha256(torch)}"]
    refused = f"local file {torch} cannot be fetched by the build: use a wheelhouse"
    with pytest.raises(UsageError, match=re.escape(refused)):
        install_requirements(pylock, ["torch"], python="3.11", glibc="2.35")
    assert install_requirements(pylock, ["idna"], python="3.11", glibc="2.35")  # not local: no need
    assert local_wheels(pylock, [tmp_path]) == [tmp_path / "wheels" / torch]
    with pytest.raises(UsageError, match="the pylock has no package 'numpy'"):
        install_requirements(pylock, ["numpy"], python="3.11", glibc="2.35")


def test_install_lines_are_what_pip_installs(tmp_path: Path) -> None:
    """The lines work as the image uses them: pip --no-deps --no-index --require-hashes, with a
    wheel rewritten into the wheelhouse; a wrong hash in the pylock makes pip refuse it."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    filename = "tinypkg-1.0-py3-none-any.whl"
    data = tiny_wheel("tinypkg", "1.0")
    (wheelhouse / filename).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    for digest, ok in ((sha, True), (fake_sha256(filename), False)):
        text = ('lock-version = "1.0"\ncreated-by = "tests"\n'
                '[[packages]]\nname = "tinypkg"\nversion = "1.0"\n'
                f'wheels = [{{ url = "file:///elsewhere/{filename}", '
                f'hashes = {{ sha256 = "{digest}" }} }}]\n')
        requirements = tmp_path / "req.txt"
        requirements.write_text(install_requirements(read_pylock(text), ["tinypkg"], python="3.11",
                                                     glibc="2.35", local_dir=str(wheelhouse)))
        target = tmp_path / f"site-{ok}"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                               "--require-hashes", "--disable-pip-version-check", "--target",
                               str(target), "-r", str(requirements)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert (done.returncode == 0) is ok, done.stderr
        assert (target / "tinypkg-1.0.dist-info" / "METADATA").is_file() is ok


@pytest.mark.parametrize(("text", "field"), [
    ('lock-version = "2.0"\npackages = []\n', "lock-version"),
    ('lock-version = "1.0"\n', "packages"),
    ('lock-version = "1.0"\n[[packages]]\nname = "a"\n'
     'wheels = [{ url = "https://x.invalid/a-1-py3-none-any.whl", hashes = { sha256 = "' + "0" * 64
     + '" } }]\n', "packages[0].version"),
    ('lock-version = "1.0"\n[[packages]]\nname = "a"\nversion = "1"\n'
     'wheels = [{ url = "https://x.invalid/a-1-py3-none-any.whl", hashes = { md5 = "00" } }]\n',
     "packages[0].wheels[0].hashes.sha256"),
    ('lock-version = "1.0"\n[[packages]]\nname = "a"\nversion = "1"\n'
     'wheels = [{ hashes = { sha256 = "' + "0" * 64 + '" } }]\n',
     "packages[0].wheels[0]: neither url nor path"),
    ('lock-version = "1.0"\n[[packages]]\nname = "a"\nversion = "1"\n'
     'vcs = { type = "git", url = "https://x.invalid/a.git", commit-id = "abc" }\n', "packages[0].vcs"),
    ('lock-version = "1.0"\n[[packages]\n', "not valid TOML"),
])
def test_read_pylock_refuses_bad_fields(text: str, field: str) -> None:
    """docs/faults.md H25: a pylock with a missing or bad field: exit 2 naming the field."""
    with pytest.raises(UsageError) as caught:
        read_pylock(text)
    assert caught.value.exit_code == 2
    assert field in caught.value.one_line()


# --------------------------------------------------------------------------- network


@pytest.mark.network
def test_real_torch_closure_hashes_match_the_index(tmp_path: Path) -> None:
    """torch 2.13.0 (variant "default", CPython 3.11) from the configured index: the closure has
    torch and its nvidia-* pins, and every hash is the one the index's JSON simple API gives."""
    from envbuild.upstream.pipconfig import index_url

    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "cache")}
    default_index = index_url(None, env)
    closure = compile_closure(ClosureSpec(torch_pins={"torch": "2.13.0"}, python="3.11", glibc="2.35",
                                          default_index=default_index, env=env, timeout=300.0))
    assert closure.packages["torch"] == "2.13.0"
    nvidia = [n for n in closure.packages if n.startswith("nvidia-")]
    assert len(nvidia) >= 5
    assert set(nvidia) <= closure.torch_layer
    assert closure.torch_layer == frozenset(closure.packages)
    pylock = read_pylock(closure.pylock_text)
    session = requests.Session()
    checked = 0
    for package in pylock.packages:
        page = session.get(f"{default_index.rstrip('/')}/{package.name}/",
                           headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
        page.raise_for_status()
        given = {f["filename"]: f["hashes"].get("sha256") for f in json.loads(page.content)["files"]}
        for wheel in package.wheels:
            assert given[wheel.filename] == wheel.sha256, wheel.filename
            checked += 1
    assert checked >= len(pylock.packages)
