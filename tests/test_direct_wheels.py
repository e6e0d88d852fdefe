"""Direct-URL wheels in a project (#27 items 1 and 4): `name @ https://…whl` is locked by uv with
the file's sha256, checked against the target's platform, installed hash-checked from its URL; an
extension wheel built for one torch narrows the stack to that torch. The wheels are served over
TLS on 127.0.0.1 with a test CA (docs/faults.md section Y)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lock_command import env, indexes, project, run  # noqa: F401  (fixtures)

from envbuild.errors import UsageError
from envbuild.pylock.direct import direct_wheel, stack_constraints
from envbuild.pylock.files import read_pylock
from envbuild.pylock.install import install_requirements
from envbuild.pylock.uv import find_uv

trustme = pytest.importorskip("trustme")
TINY = "tiny-1.0-py3-none-any.whl"
OTHER_PLATFORM = "tiny-1.0-cp311-cp311-macosx_11_0_arm64.whl"


def wheel_bytes(name: str, version: str) -> bytes:
    """A real (tiny) wheel: a module, its METADATA, WHEEL and RECORD."""
    import io

    buffer = io.BytesIO()
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "def hello():\n    return 42\n")
        archive.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{dist}/RECORD", "")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def wheel_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, int]]]:
    """An https file host on 127.0.0.1 serving two wheels; (base URL, CA file, request counts)."""
    root = tmp_path_factory.mktemp("wheels")
    (root / TINY).write_bytes(wheel_bytes("tiny", "1.0"))
    (root / OTHER_PLATFORM).write_bytes(wheel_bytes("tiny", "1.0"))
    ca = trustme.CA()
    ca_file = root.parent / "ca.pem"  # the system's bundle and the test CA: uv and envbuild trust both
    system = Path(os.environ.get("PIP_CERT") or ssl.get_default_verify_paths().cafile or "/dev/null")
    ca_file.write_bytes((system.read_bytes() if system.is_file() else b"") + ca.cert_pem.bytes())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    counts: dict[str, int] = {}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            counts[self.path] = counts.get(self.path, 0) + 1
            super().do_GET()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca_file, counts
    finally:
        server.shutdown()
        server.server_close()


# --- the requirement itself -----------------------------------------------------------------


def test_a_flash_attn_style_wheel_names_its_torch_and_cuda() -> None:
    wheel = direct_wheel("flash-attn @ https://files.example/v2.7.4/flash_attn-2.7.4.post1+cu12torch2.6"
                         "cxx11abiFALSE-cp311-cp311-linux_x86_64.whl", "dependencies")
    assert (wheel.name, wheel.torch, wheel.cuda, wheel.sha256) == ("flash-attn", "2.6", "12", None)
    pyg = direct_wheel("torch-scatter @ https://data.example/whl/torch_scatter-2.1.2%2Bpt21cu121-cp311-"
                       "cp311-linux_x86_64.whl#sha256=" + "ab" * 32, "dependencies")
    assert (pyg.torch, pyg.cuda, pyg.sha256) == ("2.1", "12.1", "ab" * 32)
    assert stack_constraints([wheel]) == (["==2.6.*"], ["12"], [wheel.filename])


@pytest.mark.parametrize(("text", "says"), [
    ("tiny @ http://files.example/tiny-1.0-py3-none-any.whl", "is not https"),
    ("tiny @ https://u:secret@files.example/tiny-1.0-py3-none-any.whl", "carries credentials"),
    ("tiny @ https://files.example/tiny-1.0.tar.gz", "does not name a wheel"),
    ("tiny @ https://files.example/other-1.0-py3-none-any.whl", "is a wheel of other, not of tiny"),
    ("tiny @ https://files.example/tiny-1.0-py3-none-any.whl#md5=abc", "fragment other than"),
    ("tiny @ https://files.example/tiny-1.0-py3-none-any.whl?token=x", "not a plain https URL"),
])
def test_an_unusable_direct_url_is_refused_with_its_reason(text: str, says: str) -> None:
    with pytest.raises(UsageError) as failed:
        direct_wheel(text, "envbuild.toml:3: dependencies")
    assert says in failed.value.message
    assert "secret" not in failed.value.message


def test_a_pylock_archive_is_read_as_the_packages_one_wheel_only_when_an_https_wheel() -> None:
    head = 'lock-version = "1.0"\ncreated-by = "test"\n[[packages]]\nname = "tiny"\nversion = "1.0"\n'
    good = read_pylock(head + f'archive = {{ url = "https://h.example/{TINY}", hashes = {{ sha256 = "'
                       + "0" * 64 + '" } }\n')
    package = good.package("tiny")
    assert package.direct and package.wheels[0].filename == TINY
    lines = install_requirements(good, ["tiny"], python="3.11", glibc="2.35")
    assert lines == f"tiny @ https://h.example/{TINY} --hash=sha256:{'0' * 64}\n"
    # a source archive by URL is read as the package's sdist, built in the image (H56)
    archive = read_pylock(head + 'archive = { url = "https://h.example/tiny-1.0.tar.gz", '
                          'hashes = { sha256 = "' + "0" * 64 + '" } }\n').package("tiny")
    assert archive.by_url and archive.built and not archive.direct and archive.sdist is not None
    for url in (f"http://h.example/{TINY}", "https://h.example/tiny-1.0.whl", f"file:///etc/{TINY}"):
        with pytest.raises(UsageError, match=r"archive"):
            read_pylock(head + f'archive = {{ url = "{url}", hashes = {{ sha256 = "' + "0" * 64 + '" } }\n')


# --- lock, for real ---------------------------------------------------------------------------


def test_a_direct_wheel_is_locked_with_its_sha256_and_installed_from_its_url(
        tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811
        wheel_host: tuple[str, Path, dict[str, int]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    base, ca_file, _ = wheel_host
    digest = hashlib.sha256(wheel_bytes("tiny", "1.0")).hexdigest()
    monkeypatch.chdir(project(tmp_path, indexes, deps=json.dumps(["six", f"tiny @ {base}/{TINY}"])))
    env = {**env, "SSL_CERT_FILE": str(ca_file), "PIP_CERT": str(ca_file)}
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    pylock = read_pylock((tmp_path / "pylock.toml").read_text(encoding="utf-8"))
    tiny = pylock.package("tiny")
    assert tiny.direct and tiny.wheels[0].sha256 == digest and tiny.wheels[0].url == f"{base}/{TINY}"
    lock = json.loads((tmp_path / "envbuild.lock").read_text(encoding="utf-8"))
    assert lock["targets"]["default"]["packages"]["tiny"] == "1.0"
    # installed hash-checked from its URL, like an index file
    lines = install_requirements(pylock, ["tiny"], python="3.11", glibc="2.35")
    assert lines == f"tiny @ {base}/{TINY} --hash=sha256:{digest}\n"
    assert run(capsys, env, "lock", "--check")[0] == 0
    # and installed for real, as the build installs it: no index, no deps, hashes required
    (tmp_path / "req.txt").write_text(lines, encoding="utf-8")
    target = tmp_path / "site"
    done = subprocess.run([find_uv(None), "pip", "install", "--no-config", "--no-deps", "--no-index",
                           "--require-hashes", "--target", str(target), "--python", sys.executable,
                           "-r", str(tmp_path / "req.txt")], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    called = subprocess.run([sys.executable, "-c", "import tiny; print(tiny.hello())"],
                            env={**env, "PYTHONPATH": str(target)}, capture_output=True, text=True,
                            check=False)
    assert called.stdout.strip() == "42", called.stderr


def test_a_wrong_sha256_in_the_url_is_a_data_error_and_nothing_is_written(
        tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811
        wheel_host: tuple[str, Path, dict[str, int]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    base, ca_file, _ = wheel_host
    pinned = f"tiny @ {base}/{TINY}#sha256={'1' * 64}"
    monkeypatch.chdir(project(tmp_path, indexes, deps=json.dumps([pinned])))
    code, _, err = run(capsys, {**env, "SSL_CERT_FILE": str(ca_file), "PIP_CERT": str(ca_file)}, "lock")
    assert code == 4, err
    assert "tiny" in err and "sha256" in err.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


def test_a_wheel_for_another_platform_is_refused_before_uv_runs(
        tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811
        wheel_host: tuple[str, Path, dict[str, int]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    base, ca_file, counts = wheel_host
    before = counts.get(f"/{OTHER_PLATFORM}", 0)
    monkeypatch.chdir(project(tmp_path, indexes, deps=json.dumps([f"tiny @ {base}/{OTHER_PLATFORM}"])))
    code, _, err = run(capsys, {**env, "SSL_CERT_FILE": str(ca_file), "PIP_CERT": str(ca_file)}, "lock")
    assert code == 2
    assert "is for cp311-cp311-macosx_11_0_arm64, not for CPython 3.11 on x86_64-manylinux_2_" in err
    assert counts.get(f"/{OTHER_PLATFORM}", 0) == before  # refused from its name, never fetched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


def test_an_extension_built_for_another_torch_is_a_conflict_naming_the_wheel(
        tmp_path: Path, indexes: str, env: dict[str, str],  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The project asks torch 2.13.0; the extension was built for torch 2.6 with CUDA 12: no
    stack has both, and the error says which wheel pinned what (item 4)."""
    wheel = ("flash-attn @ https://files.example/flash_attn-2.7.4+cu12torch2.6cxx11abiFALSE-"
             "cp311-cp311-linux_x86_64.whl")
    monkeypatch.chdir(project(tmp_path, indexes, deps=json.dumps([wheel])))
    code, _, err = run(capsys, env, "lock")
    assert code == 3, err
    assert "flash_attn-2.7.4+cu12torch2.6cxx11abiFALSE" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


def test_an_extension_picks_the_stack_it_was_built_for(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a torch of its own, the project gets the newest stack the wheel covers."""
    import argparse

    from envbuild.commands.lock import _extension_spec

    args = argparse.Namespace(torch=None, cuda=None)
    wheel = ("flash-attn @ https://files.example/flash_attn-2.7.4+cu12torch2.6cxx11abiFALSE-"
             "cp311-cp311-linux_x86_64.whl")
    narrowed, origins = _extension_spec(args, [wheel, "six"])
    # the wheel's torch narrows as the project's own pin (H48: never relaxed by a way out)
    assert (narrowed.torch, narrowed.project_torch, narrowed.cuda) == (None, "==2.6.*", "12")
    assert origins == ["flash_attn-2.7.4+cu12torch2.6cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"]
    from envbuild.commands.cli import main

    assert main(["resolve", "--torch", narrowed.project_torch, "--cuda", narrowed.cuda, "--json",
                 "--top", "1"],
                env={"ENVBUILD_NO_CACHE": "1"}) == 0
    stack = json.loads(capsys.readouterr().out)["stacks"][0]
    assert stack["torch"].startswith("2.6.") and stack["cuda"].startswith("12.")
