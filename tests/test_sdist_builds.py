"""Requirements built from their sdist (``build-sdists``) and the record of built extension wheels
(envbuild/extensions/sdists.py, record.py): the project key, uv's lock of the sdist, the hostile
pylock entries refused, the build stage, the record's keys, checks and mismatches."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_extensions import closure, loaded, project, stack_lock, stages
from test_lock_command import env, indexes, run
from test_lock_command import project as lock_project

from envbuild.commands.cli import main
from envbuild.errors import BuildFailed, NoCompatibleStack, UsageError
from envbuild.extensions import record as rec
from envbuild.extensions import sdists
from envbuild.project.config import project_from_text
from envbuild.pylock.files import read_pylock
from envbuild.pylock.uv import ClosureSpec, compile_closure
from envbuild.pylock.uvfailure import uv_failure
from envbuild.render import lock as lockmod
from envbuild.render import lockset

__all__ = ["env", "indexes"]  # fixtures, used by name
SDIST_SHA = "d" * 64
HASHES = f'hashes = {{ sha256 = "{SDIST_SHA}" }}'
STATIC_PKG_INFO = "Metadata-Version: 2.2\nName: mulext\nVersion: 0.1\n"


# --- the project key ---------------------------------------------------------------------------


def keys_of(tmp_path: Path, text: str) -> tuple[str, ...]:
    path = tmp_path / "envbuild.toml"
    path.write_text(text)
    return project_from_text(text, path, shown="envbuild.toml").build_sdists


def test_build_sdists_names_requirements_of_the_project(tmp_path: Path) -> None:
    text = 'dependencies = ["Flash_Attn==2.7.4", "six"]\nbuild-sdists = ["Flash_Attn"]\n'
    assert keys_of(tmp_path, text) == ("flash-attn",)


@pytest.mark.parametrize(("text", "message"), [
    # an indirect requirement may be named (lock checks the closure holds it); not a number
    ('dependencies = ["six"]\nbuild-sdists = 1\n',
     "envbuild.toml:2: build-sdists: expected an array of strings"),
    ('dependencies = ["six"]\nbuild-sdists = ["six; rm -rf /"]\n', "is not a distribution name"),
    ('dependencies = ["six"]\nbuild-sdists = ["six", "SIX"]\n', "is named twice"),
])
def test_a_bad_build_sdists_entry_is_exit_2_naming_file_line_key(tmp_path: Path, text: str,
                                                                  message: str) -> None:
    with pytest.raises(UsageError, match=r"envbuild\.toml:2: build-sdists") as caught:
        keys_of(tmp_path, text)
    assert message in caught.value.message


# --- lock: uv takes the sdist of these packages alone ------------------------------------------


def sdist_bytes(pkg_info: str = STATIC_PKG_INFO) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        files = {"PKG-INFO": pkg_info, "setup.py": "from setuptools import setup\nsetup()\n"}
        for name, text in files.items():
            info = tarfile.TarInfo(f"mulext-0.1/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


class _NotFound(http.server.BaseHTTPRequestHandler):
    """An index that has none of the packages: every page 404."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def empty_index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def served(root: Path) -> Iterator[str]:
    """``root`` as a find-links page (its directory listing) on 127.0.0.1: the URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, bytes]]:
    """A find-links page on 127.0.0.1 holding mulext's sdist alone."""
    root = tmp_path_factory.mktemp("links")
    data = sdist_bytes()
    (root / "mulext-0.1.tar.gz").write_bytes(data)
    with served(root) as url:
        yield url, data


def spec(index: str, link: str, no_binary: tuple[str, ...]) -> ClosureSpec:
    return ClosureSpec(torch_pins={}, python="3.11", glibc="2.35", dependencies=("mulext==0.1",),
                       default_index=index, find_links=(link,), no_binary=no_binary, timeout=60, env={})


def test_lock_records_the_sdists_sha256_as_uv_writes_it(empty_index: str, links: tuple[str, bytes]) -> None:
    """A real uv run: the sdist-only package is locked by its sdist (the index's 404 for it is
    no error: the file came from a find-links page)."""
    link, data = links
    got = compile_closure(spec(empty_index, link, ("mulext",)))
    package = read_pylock(got.pylock_text).package("mulext")
    assert package.wheels == () and package.sdist is not None
    assert package.sdist.url == f"{link}mulext-0.1.tar.gz"
    assert package.sdist.sha256 == hashlib.sha256(data).hexdigest()
    assert sdists.sdist_requirements(read_pylock(got.pylock_text), ["mulext"]) == \
        f"mulext @ {link}mulext-0.1.tar.gz --hash=sha256:{hashlib.sha256(data).hexdigest()}\n"


def test_without_build_sdists_lock_is_exit_3_naming_the_key(empty_index: str,
                                                            links: tuple[str, bytes]) -> None:
    with pytest.raises(NoCompatibleStack) as caught:
        compile_closure(spec(empty_index, links[0], ()))
    assert "mulext" in caught.value.message and caught.value.exit_code == 3
    assert 'build-sdists = ["mulext"] to the project' in caught.value.hint


def test_uv_words_for_a_package_with_no_wheels_name_it() -> None:
    stderr = ("error: No solution found when resolving dependencies\n"
              "  cause: Because all versions of flash-attn have no usable wheels and you require "
              "flash-attn, we can conclude that your requirements are unsatisfiable.\n")
    found = uv_failure(stderr, ClosureSpec(torch_pins={}, python="3.11", glibc="2.35",
                                           dependencies=("flash-attn",)))
    assert 'build-sdists = ["flash-attn"]' in found.hint


# --- a pylock's sdist entries: hostile input ---------------------------------------------------


def pylock(name: str, version: str, sdist: str) -> Any:
    return read_pylock(f'lock-version = "1.0"\ncreated-by = "t"\n\n[[packages]]\nname = "{name}"\n'
                       f'version = "{version}"\n'
                       f'sdist = {{ {sdist}, hashes = {{ sha256 = "{SDIST_SHA}" }} }}\n')


@pytest.mark.parametrize(("sdist", "message"), [
    # refused by PEP 751's reference reader already, as the pylock is read
    ('url = "https://h.example/other-0.1.tar.gz"', "is not consistent with package name"),
    ('url = "https://h.example/mulext-0.2.tar.gz"', "is not consistent with package version"),
    ('url = "https://h.example/mulext-0.1.whl"', "Invalid sdist filename"),
    ('url = "https://h.example/mulext-0.1.tar.gz", name = "mulext-0.1.tar.gz\\nRUN id"',
     "Invalid sdist filename"),
    # refused by envbuild: what the build stage's pip line would read as an option, or a local file
    ('url = "https://h.example/a --index-url http://evil/mulext-0.1.tar.gz"', "not a plain http(s) URL"),
    ('url = "https://h.example/a<b>/mulext-0.1.tar.gz"', "not a plain http(s) URL"),
    ('path = "../../etc/mulext-0.1.tar.gz"', "is a local file"),
    ('url = "file:///etc/mulext-0.1.tar.gz"', "is a local file"),
])
def test_a_hostile_sdist_entry_is_refused(sdist: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        sdists.sdist_requirements(pylock("mulext", "0.1", sdist), ["mulext"])
    assert message in caught.value.message and "\n" not in caught.value.message
    assert caught.value.exit_code == 2


def test_a_package_with_wheels_is_not_built_from_its_sdist() -> None:
    text = ('lock-version = "1.0"\ncreated-by = "t"\n\n[[packages]]\nname = "mulext"\nversion = "0.1"\n'
            f'sdist = {{ url = "https://h.example/mulext-0.1.tar.gz", {HASHES} }}\n'
            f'wheels = [{{ url = "https://h.example/mulext-0.1-py3-none-any.whl", {HASHES} }}]\n')
    with pytest.raises(UsageError, match="is not locked as an sdist alone"):
        sdists.sdist_requirements(read_pylock(text), ["mulext"])


def test_a_lock_naming_an_sdist_it_does_not_hold_is_refused() -> None:
    with pytest.raises(UsageError, match="which the lock's packages lack"):
        sdists.check_lock_sdists(["mulext"], ["torch"])
    with pytest.raises(UsageError, match="sorted canonical"):
        sdists.check_lock_sdists(["Mul_Ext"], ["Mul_Ext"])


# --- render: the stage builds the sdist, the image installs its wheel ---------------------------


def with_sdist(lock: lockmod.Lock) -> lockmod.Lock:
    """``lock`` with mulext 0.1 in its closure as an sdist at an https URL, named in build-sdists."""
    base = closure(lock)
    assert base.pylock is not None
    text = base.pylock.text + ('\n[[packages]]\nname = "mulext"\nversion = "0.1"\nsdist = { url = '
                               f'"https://h.example/f/mulext-0.1.tar.gz", {HASHES} }}\n')
    ref = replace(base.pylock, text=text, sha256=lockset.sha256_text(text))
    return replace(base, pylock=ref, packages={**base.packages, "mulext": "0.1"}, sdists=("mulext",))


def written(root: Path, lock: lockmod.Lock) -> Path:
    lockmod.check_lock(lock)
    assert lockmod.from_json(lock.to_json()) == lock
    for name, data in lockset.LockSet(targets={"default": lock}, project=None).files().items():
        (root / name).write_bytes(data)
    return root / "envbuild.lock"


def render(path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    code = main(["render", "docker", "--lock", str(path), "-o", str(out)], {})
    err = capsys.readouterr().err
    assert code == 0, err
    return (out / "Dockerfile").read_text(), err


def test_the_stage_builds_the_sdist_and_the_image_installs_only_its_wheel(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = written(tmp_path, with_sdist(stack_lock("cpu")))
    dockerfile, err = render(path, tmp_path / "out", capsys)
    out = tmp_path / "out"
    assert (out / "requirements" / "sdists.txt").read_text() == \
        f"mulext @ https://h.example/f/mulext-0.1.tar.gz --hash=sha256:{SDIST_SHA}\n"
    assert "mulext" not in (out / "requirements" / "torch.txt").read_text()
    assert not (out / "requirements" / "project.txt").exists()  # mulext was its one package
    _system, build, final = stages(dockerfile)
    assert "COPY requirements/sdists.txt /tmp/envbuild-sdists.txt" in build
    assert ("pip download --no-cache-dir --no-deps --no-build-isolation --no-index --require-hashes "
            "\\\n    --dest /tmp/envbuild-sdists -r /tmp/envbuild-sdists.txt") in build
    # built at a fixed path: pip's own build directory is random, and the compiler records it
    assert ("pip wheel --no-cache-dir --no-deps --no-build-isolation --no-index --wheel-dir /wheels "
            "/tmp/envbuild-ext-sdist/*/") in build
    assert "COPY extensions/" not in build and "built.sha256" not in dockerfile
    assert "COPY --from=envbuild-extensions /wheels/ /tmp/envbuild-ext/" in final
    assert "sdists.txt" not in final and "pip wheel" not in final
    assert "extension mulext (source dddddddddddd, torch" in err and "no built wheel recorded yet" in err


def test_a_host_script_refuses_a_lock_with_build_sdists(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = written(tmp_path, with_sdist(stack_lock("cpu")))
    assert main(["render", "script", "--lock", str(path), "-o", str(tmp_path / "out")], {}) == 2
    assert "built in an image build only" in capsys.readouterr().err


# --- the record of built wheels -----------------------------------------------------------------


KEY = rec.BuildKey(name="mulext", source_sha256=SDIST_SHA, torch="2.13.0+cpu", cuda=None, archs="",
                   python="3.11")
WHEEL = "mulext-0.1-cp311-cp311-linux_x86_64.whl"


def test_the_record_keys_each_wheel_by_source_torch_cuda_archs_python(tmp_path: Path) -> None:
    lock = with_sdist(stack_lock("cu121"))
    (ext,) = loaded(project(tmp_path))
    lock = replace(lock, extensions=(ext,))
    from envbuild.render.closure import build_keys

    keys = build_keys(lock)
    assert [k.name for k in keys] == ["add-ext", "mulext"]
    assert {k.source_sha256 for k in keys} == {ext.sha256, SDIST_SHA}
    assert all(k.torch == lock.packages["torch"] and k.cuda == lock.stack.cuda for k in keys)
    assert keys[0].archs and keys[0].archs.startswith(lock.stack.arch_list[0][3] + ".")
    # Another torch, CUDA or arch list is another key: nothing recorded for it is reused.
    assert replace(keys[1], torch="2.12.0+cpu") != keys[1] and replace(keys[1], archs="9.0") != keys[1]


def test_merge_adds_new_keys_matches_recorded_ones_and_refuses_a_different_build() -> None:
    first = rec.merge({}, [KEY], {"mulext": (WHEEL, "a" * 64)})
    assert first == {KEY: rec.Built(key=KEY, wheel=WHEEL, sha256="a" * 64)}
    assert rec.merge(first, [KEY], {"mulext": (WHEEL, "a" * 64)}) == first
    with pytest.raises(BuildFailed) as caught:
        rec.merge(first, [KEY], {"mulext": (WHEEL, "b" * 64)})
    assert caught.value.exit_code == 6
    assert "records aaaaaaaaaaaaaaaa… for the same build key" in caught.value.message
    other = replace(KEY, torch="2.14.0+cpu")  # a new key beside the old one
    assert set(rec.merge(first, [other], {"mulext": (WHEEL, "b" * 64)})) == {KEY, other}


def test_the_record_round_trips_and_its_sums_are_what_the_stage_checks(tmp_path: Path) -> None:
    record = rec.merge({}, [KEY], {"mulext": (WHEEL, "a" * 64)})
    (tmp_path / rec.FILE).write_text(rec.record_text(record))
    assert rec.read_record(tmp_path) == record
    assert rec.stage_sums(record, [KEY, replace(KEY, python="3.12")]) == f"{'a' * 64}  {WHEEL}\n"
    assert rec.read_record(tmp_path / "none") == {}


def entry(**changes: Any) -> str:
    raw = {**rec.Built(key=KEY, wheel=WHEEL, sha256="a" * 64).to_json(), **changes}
    return json.dumps({"schema": rec.SCHEMA, "wheels": [raw]})


@pytest.mark.parametrize(("text", "message"), [
    (entry(sha256="A" * 64), "wheels[0].sha256: missing or not of its form"),
    (entry(wheel="../mulext-0.1-py3-none-any.whl"), "wheels[0].wheel: missing or not of its form"),
    (entry(wheel="mulext-0.1-py3-none-any.whl\nRUN id"), "wheels[0].wheel: missing or not of its form"),
    (entry(wheel="other-0.1-py3-none-any.whl"), "is not a wheel of mulext"),
    (entry(archs="8.0; rm -rf /"), "wheels[0].archs"),
    (entry(extra=1), "needs exactly"),
    ('{"schema": "envbuild.built/1", "wheels": {}}', "not a record of schema"),
    ("[" * 100000, "not valid JSON"),
])
def test_a_hostile_record_is_exit_2_and_never_quoted(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        rec.parse_record(text)
    assert message in caught.value.message and "RUN id" not in caught.value.message
    assert caught.value.exit_code == 2


def test_a_record_twice_for_one_key_is_refused() -> None:
    one = json.loads(entry())["wheels"][0]
    with pytest.raises(UsageError, match="recorded twice"):
        rec.parse_record(json.dumps({"schema": rec.SCHEMA, "wheels": [one, one]}))


def test_the_image_sums_must_be_sha256sum_lines_of_wheels() -> None:
    assert rec.parse_sums(f"{'a' * 64}  {WHEEL}\n") == {"mulext": (WHEEL, "a" * 64)}
    for bad in (f"{'a' * 64}  ../{WHEEL}", f"{'a' * 64}  x.tar.gz", "garbage"):
        with pytest.raises(BuildFailed, match="is not a sha256sum line"):
            rec.parse_sums(bad)


def test_render_hands_the_recorded_wheel_to_the_stage_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = with_sdist(stack_lock("cpu"))
    path = written(tmp_path, lock)
    from envbuild.render.closure import build_keys

    (key,) = build_keys(lock)
    (tmp_path / rec.FILE).write_text(rec.record_text(rec.merge({}, [key], {"mulext": (WHEEL, "a" * 64)})))
    dockerfile, err = render(path, tmp_path / "out", capsys)
    assert (tmp_path / "out" / "requirements" / "built.sha256").read_text() == f"{'a' * 64}  {WHEEL}\n"
    _system, build, _ = stages(dockerfile)
    assert "COPY requirements/built.sha256 /tmp/envbuild-built.sha256" in build
    assert "sha256sum --strict -c /tmp/envbuild-built.sha256" in build
    # The check comes after the build's own step, so a new record leaves that step cached.
    assert build.index("sha256sum -- *.whl") < build.index("COPY requirements/built.sha256")
    assert f"built wheel recorded, {WHEEL} sha256 {'a' * 64}" in err


def test_record_build_writes_new_keys_atomically_and_refuses_a_difference(tmp_path: Path) -> None:
    from envbuild.commands import built
    from envbuild.render.closure import build_keys

    lock = with_sdist(stack_lock("cpu"))
    (key,) = build_keys(lock)
    sums = f"{'a' * 64}  {WHEEL}\n".encode()

    class Image:
        """The engine calls read_image_file makes: a container, the file as a tar, removal."""

        def __init__(self, data: bytes) -> None:
            self.data, self.removed = data, 0

        def create_container(self, image: str, **_: Any) -> dict[str, str]:
            return {"Id": "c1"}

        def get_archive(self, cid: str, path: str) -> tuple[list[bytes], dict[str, int]]:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                info = tarfile.TarInfo("extension-wheels.sha256")
                info.size = len(self.data)
                tar.addfile(info, io.BytesIO(self.data))
            return [buffer.getvalue()], {"size": len(self.data)}

        def remove_container(self, cid: str, force: bool) -> None:
            self.removed += 1

    said: list[str] = []
    image = Image(sums)
    built.record_build(image, "img", lock, tmp_path, said.append)
    assert rec.read_record(tmp_path) == {key: rec.Built(key=key, wheel=WHEEL, sha256="a" * 64)}
    assert said == ["extension wheels: 1 recorded in envbuild.built.json, 0 matched its record"]
    assert image.removed == 1
    before = (tmp_path / rec.FILE).read_bytes()
    with pytest.raises(BuildFailed):
        built.record_build(Image(f"{'b' * 64}  {WHEEL}\n".encode()), "img", lock, tmp_path, said.append)
    assert (tmp_path / rec.FILE).read_bytes() == before


def test_accept_rebuilt_replaces_the_recorded_wheel_and_says_so(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from envbuild.commands import built
    from envbuild.render.closure import build_keys

    lock = with_sdist(stack_lock("cpu"))
    (key,) = build_keys(lock)
    other = replace(key, torch="2.12.0+cpu")
    record = rec.merge({}, [key, other], {"mulext": (WHEEL, "a" * 64)})
    (tmp_path / rec.FILE).write_text(rec.record_text(record))
    said: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("envbuild.engine.imagefile.read_image_file",
                      lambda *a, **k: f"{'b' * 64}  {WHEEL}\n".encode())
        built.record_build(object(), "img", lock, tmp_path, said.append, accept=True)
    now = rec.read_record(tmp_path)
    assert now[key].sha256 == "b" * 64 and now[other] == record[other]  # other keys stay
    assert said == ["extension wheels: 0 recorded in envbuild.built.json, 0 matched its record, "
                    "1 replaced (--accept-rebuilt)"]
    assert f"now records {WHEEL} sha256 {'b' * 64} (was {'a' * 64})" in capsys.readouterr().err
    # build --accept-rebuilt renders the stage without the check; a plain render with it
    from envbuild.render import docker as render_mod

    options = replace(render_mod.parse_options(), extension_root=tmp_path)
    assert "requirements/built.sha256" in render_mod.render_docker(lock, options)
    assert "requirements/built.sha256" not in render_mod.render_docker(
        lock, replace(options, check_recorded=False))


def test_lock_check_says_what_is_recorded(tmp_path: Path) -> None:
    from envbuild.commands import built

    lock = with_sdist(stack_lock("cpu"))
    (line,) = built.describe(lock, tmp_path)
    assert line.endswith("no built wheel recorded yet (the next build records it)")
    assert built.describe(replace(lock, sdists=(), packages={
        k: v for k, v in lock.packages.items() if k != "mulext"}), tmp_path) == []


def test_project_key_is_unknown_to_nothing(tmp_path: Path) -> None:
    """build-sdists travels from the project file through lock's spec (uv's --no-binary)."""
    from envbuild.pylock import uv

    command = uv._command("uv", replace(ClosureSpec(torch_pins={}, python="3.11", glibc="2.35"),
                                        no_binary=("flash-attn",)), "https://i.example/simple", "pylock.toml",
                          hashes=True)
    at = command.index("--no-binary")
    assert command[at + 1] == "flash-attn" and "--only-binary" in command
    assert project_from_text('dependencies = ["six"]\n', tmp_path / "envbuild.toml",
                             shown="envbuild.toml").build_sdists == ()


def test_lock_records_build_sdists_and_check_calls_a_change_stale(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole lock command: the sdist in a find-links directory, the lock's ``sdists``, and
    ``lock --check`` saying what is recorded, then stale once build-sdists changes."""
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "mulext-0.1.tar.gz").write_bytes(sdist_bytes())
    lock_project(tmp_path, indexes, deps='["six", "mulext==0.1"]',
                 targets='find-links = ["links"]\nbuild-sdists = ["mulext"]\n')
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["sdists"] == ["mulext"] and target["packages"]["mulext"] == "0.1"
    assert "mulext" not in target["pylock"]["torch_layer"]
    code, out, _ = run(capsys, env, "lock", "--check")
    assert code == 0 and "extension mulext (source " in out and "no built wheel recorded yet" in out
    text = (tmp_path / "envbuild.toml").read_text()
    (tmp_path / "envbuild.toml").write_text(text.replace('build-sdists = ["mulext"]\n', ""))
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "build-sdists changed" in err
