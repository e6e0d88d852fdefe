"""Pure-Python sdists build without the torch layer (#37 item 2; envbuild/extensions/classify.py):
``lock`` reads each locked sdist's archive (never running it) and records its kind; a pure one is
built in the envbuild-sdists stage from the system stage (no torch), a native one in the
extensions stage. Hostile archives are refused (docs/faults.md R18, R19, R20, R21)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from schemas import check
from test_extensions import stack_lock, stages
from test_lock_command import env, indexes, run
from test_lock_command import project as lock_project
from test_sdist_builds import HASHES, SDIST_SHA, links, with_sdist, written

from envbuild.commands.cli import main
from envbuild.errors import DataError, UsageError
from envbuild.extensions import classify as cl
from envbuild.extensions.sdists import classify_locked
from envbuild.pylock.files import read_pylock
from envbuild.render import lock as lockmod
from envbuild.render import lockset

__all__ = ["env", "indexes", "links"]  # fixtures, used by name
SETUP = "from setuptools import setup\nsetup(name='p', version='1.0', py_modules=['p'])\n"


def tar_gz(files: dict[str, str | bytes], top: str = "p-1.0", *,
           extra: list[tarfile.TarInfo] = ()) -> bytes:  # type: ignore[assignment]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode() if isinstance(text, str) else text
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return gzip.compress(buffer.getvalue(), mtime=0)


def kind(files: dict[str, str | bytes]) -> cl.Kind:
    return cl.classify(tar_gz(files), "p-1.0.tar.gz")


# --- the classifier ------------------------------------------------------------------------------


def test_a_setup_py_of_python_modules_is_pure_and_builds_with_setuptools() -> None:
    found = kind({"setup.py": SETUP, "p.py": "X = 1\n", "PKG-INFO": "Name: p\n"})
    assert found.pure and found.requires == ("setuptools",)


def test_a_pyproject_backend_is_what_it_builds_with() -> None:
    pyproject = ('[build-system]\nrequires = ["hatchling>=1.0", "Hatch_VCS"]\n'
                 'build-backend = "hatchling.build"\n')
    found = kind({"pyproject.toml": pyproject, "src/p/__init__.py": ""})
    assert found.pure and found.requires == ("hatch-vcs", "hatchling")


def test_the_same_archive_as_a_zip_is_read_the_same() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("p-1.0/setup.py", SETUP)
        archive.writestr("p-1.0/p.py", "")
    assert cl.classify(buffer.getvalue(), "p-1.0.zip").pure


@pytest.mark.parametrize(("files", "why"), [
    ({"setup.py": SETUP, "src/fast.c": "int x;"}, "src/fast.c: a native source"),
    ({"setup.py": SETUP, "p/_speed.pyx": "def f(): pass"}, "_speed.pyx: a native source"),
    ({"setup.py": SETUP, "csrc/k.cu": ""}, "k.cu: a native source"),
    ({"pyproject.toml": '[build-system]\nrequires = ["maturin"]\n', "Cargo.toml": ""}, "Cargo.toml"),
    ({"setup.py": "from torch.utils.cpp_extension import BuildExtension\nfrom setuptools import setup\n"
                  "setup(name='p')\n"}, "its setup.py imports torch"),
    ({"setup.py": "import setuptools\nimport torch\n"}, "its setup.py imports torch"),
    ({"setup.py": "from setuptools import setup\nsetup(setup_requires=['torch>=2'])\n"},
     "its setup.py requires torch to build"),
    ({"pyproject.toml": '[build-system]\nrequires = ["setuptools", "torch==2.13.0"]\n', "p.py": ""},
     "its build requires torch"),
    ({"pyproject.toml": '[build-system]\nrequires = ["setuptools", "cffi"]\n'}, "its build requires cffi"),
    ({"setup.py": "from setuptools import setup, Extension\n"
                  "setup(ext_modules=[Extension('x', ['gen/x'])])\n"}, "ext_modules"),
    ({"setup.py": "print 'python 2'\n"}, "cannot be read statically"),
    ({"pyproject.toml": "[build-system\n"}, "not readable TOML"),
    ({"pyproject.toml": '[tool.setuptools]\next-modules = [{name = "x", sources = ["gen/x"]}]\n'},
     "ext-modules"),
])
def test_native_sources_or_torch_in_the_build_make_it_native(files: dict[str, str | bytes], why: str) -> None:
    found = kind(files)
    assert not found.pure and why in found.why


def test_a_setup_py_nested_beyond_the_parser_is_native_not_a_crash() -> None:
    assert not kind({"setup.py": "x = " + "(" * 200_000 + ")" * 200_000 + "\n"}).pure


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(("data", "message"), [
    (tar_gz({"../../etc/cron.d/x": "x"}, top=""), "a member is named outside the archive"),
    (tar_gz({"/etc/passwd": "x"}, top=""), "a member is named outside the archive"),
    (tar_gz({"setup.py": SETUP}, extra=[link("p-1.0/evil", "../../../etc/passwd")]), "leads outside"),
    (tar_gz({"setup.py": SETUP}, extra=[link("p-1.0/evil", "/etc/passwd")]), "leads outside"),
    (tar_gz({"setup.py": SETUP}, extra=[link("p-1.0/hard", "etc/passwd", tarfile.LNKTYPE)]), "leads outside"),
    (tar_gz({"setup.py": SETUP}, extra=[link("p-1.0/fifo", "", tarfile.FIFOTYPE)]), "a device or FIFO"),
    (tar_gz({"setup.py": "#" * (cl.MAX_TEXT + 1)}), "over 1024 KiB"),
    (b"\x1f\x8b" + b"not gzip at all", "not a readable .tar.gz"),
])
def test_a_hostile_archive_is_exit_2_naming_the_sdist(data: bytes, message: str) -> None:
    """docs/faults.md R18, R19: traversal, links out of the archive, devices, oversized files."""
    with pytest.raises(UsageError) as caught:
        cl.classify(data, "p-1.0.tar.gz")
    assert message in caught.value.message and "'p-1.0.tar.gz'" in caught.value.message
    assert caught.value.exit_code == 2 and "\n" not in caught.value.message


def test_a_link_within_the_archive_is_no_refusal() -> None:
    data = tar_gz({"setup.py": SETUP, "LICENSE": "x"}, extra=[link("p-1.0/docs/LICENSE", "../LICENSE")])
    assert cl.classify(data, "p-1.0.tar.gz").pure


def test_a_tar_bomb_stops_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md R19: 64 MiB of zeros in 64 KiB; read up to the cap only, then refused."""
    monkeypatch.setattr(cl, "MAX_UNPACKED", 1024 * 1024)
    data = tar_gz({"setup.py": SETUP, "zeros": b"\0" * (64 * 1024 * 1024)})
    assert len(data) < 200 * 1024
    with pytest.raises(UsageError, match="unpacks to more than"):
        cl.classify(data, "p-1.0.tar.gz")


def test_too_many_members_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cl, "MAX_MEMBERS", 10)
    files: dict[str, str | bytes] = {f"m{i}.py": "" for i in range(11)}
    with pytest.raises(UsageError, match="more than 10 members"):
        kind(files)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(11):
            archive.writestr(f"p-1.0/m{i}.py", "")
    with pytest.raises(UsageError, match="more than 10 members"):
        cl.classify(buffer.getvalue(), "p-1.0.zip")


def test_a_zip_member_outside_the_archive_is_refused() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../p-1.0/setup.py", SETUP)
    with pytest.raises(UsageError, match="named outside the archive"):
        cl.classify(buffer.getvalue(), "p-1.0.zip")


# --- lock: each locked sdist fetched, checked, classified ----------------------------------------


def pylock_of(data: bytes, *, git: bool = False) -> str:
    if git:
        return ('lock-version = "1.0"\ncreated-by = "t"\n\n[[packages]]\nname = "p"\nversion = "1.0"\n'
                'vcs = { type = "git", url = "https://h.example/p.git", commit-id = "' + "a" * 40 + '" }\n')
    return ('lock-version = "1.0"\ncreated-by = "t"\n\n[[packages]]\nname = "p"\nversion = "1.0"\n'
            f'sdist = {{ url = "https://h.example/p-1.0.tar.gz", hashes = {{ sha256 = '
            f'"{hashlib.sha256(data).hexdigest()}" }} }}\n')


def test_lock_fetches_checks_and_classifies_each_sdist() -> None:
    data = tar_gz({"setup.py": SETUP})
    asked: list[str] = []
    kinds, said = classify_locked(read_pylock(pylock_of(data)), ["p"], env={}, offline=False,
                                  fetch=lambda url: asked.append(url) or data)
    assert kinds == (cl.Recorded(name="p", pure=True, requires=("setuptools",)),)
    assert asked == ["https://h.example/p-1.0.tar.gz"]
    assert said == ["p: built without torch (pure Python): no native sources, no torch in its build"]
    # the previous lock's kind for the same sha256: not fetched again
    again, said = classify_locked(read_pylock(pylock_of(data)), ["p"], env={}, offline=False,
                                  previous={"p": (hashlib.sha256(data).hexdigest(), kinds[0])},
                                  fetch=lambda url: pytest.fail("fetched"))
    assert again == kinds and "as the previous lock classified" in said[0]


def test_a_served_sdist_that_is_not_the_locked_one_is_exit_4() -> None:
    """docs/faults.md R20: the file served differs from the pylock's sha256."""
    locked = read_pylock(pylock_of(tar_gz({"setup.py": SETUP})))
    with pytest.raises(DataError) as caught:
        classify_locked(locked, ["p"], env={}, offline=False, fetch=lambda url: tar_gz({"x.c": ""}))
    assert caught.value.exit_code == 4 and "p-1.0.tar.gz: the pylock records sha256" in caught.value.message


def test_offline_and_git_sources_stay_in_the_extensions_stage() -> None:
    never = lambda url: pytest.fail("fetched")  # noqa: E731
    data = tar_gz({"setup.py": SETUP})
    for text, offline in ((pylock_of(data), True), (pylock_of(data, git=True), False)):
        kinds, said = classify_locked(read_pylock(text), ["p"], env={}, offline=offline, fetch=never)
        assert kinds == (cl.Recorded(name="p", pure=False),) and "extensions stage" in said[0]


def test_lock_records_the_kind_and_lock_json_shows_it(
        tmp_path: Path, indexes: str, env: dict[str, str], links: tuple[str, bytes],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole lock command: mulext (a setup.py of nothing native) served on 127.0.0.1 is
    fetched, checked and recorded pure; --json carries the kinds (docs/schemas/lock.schema.json)."""
    link, _ = links
    lock_project(tmp_path, indexes, deps='["six", "mulext==0.1"]',
                 targets=f'find-links = ["{link}"]\nbuild-sdists = ["mulext"]\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, env, "lock", "--json")
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["sdist_kinds"] == {"mulext": {"kind": "pure", "requires": ["setuptools"]}}
    document = json.loads(out)
    check("lock.schema.json", document)
    assert document["targets"][0]["sdist_kinds"] == target["sdist_kinds"]
    assert "mulext: built without torch (pure Python)" in err
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 0, err
    # a lock written before kinds (none recorded) is not stale for lacking them
    path = tmp_path / "envbuild.lock"
    whole = json.loads(path.read_text())
    del whole["targets"]["default"]["sdist_kinds"]
    path.write_text(json.dumps(whole, indent=2, sort_keys=True) + "\n")
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 0, err


# --- the lock's record of kinds ------------------------------------------------------------------


def pure(lock: lockmod.Lock, *requires: str) -> lockmod.Lock:
    return replace(lock, sdist_kinds=(cl.Recorded(name="mulext", pure=True, requires=requires),))


def test_kinds_round_trip_and_a_lock_without_them_reads_as_before() -> None:
    lock = pure(with_sdist(stack_lock("cpu")), "setuptools")
    assert lockmod.from_json(lock.to_json()) == lock
    recorded = json.loads(lock.to_json())["sdist_kinds"]
    assert recorded == {"mulext": {"kind": "pure", "requires": ["setuptools"]}}
    assert "sdist_kinds" not in json.loads(with_sdist(stack_lock("cpu")).to_json())


@pytest.mark.parametrize(("kinds", "message"), [
    ({"other": {"kind": "native"}}, "must name the lock's sdists"),
    ({"mulext": {"kind": "pure"}}, "entries are"),
    ({"mulext": {"kind": "native", "requires": []}}, "entries are"),
    ({"mulext": {"kind": "pure", "requires": ["torch"]}}, "without torch"),
    ({"mulext": {"kind": "pure", "requires": ["Setup Tools; rm -rf /"]}}, "sorted canonical"),
    ([], "must be a mapping"),
])
def test_a_hostile_kinds_record_is_exit_2(kinds: object, message: str) -> None:
    data = json.loads(with_sdist(stack_lock("cpu")).to_json())
    data["sdist_kinds"] = kinds
    with pytest.raises(UsageError) as caught:
        lockmod.from_json(json.dumps(data))
    assert message in caught.value.message and "rm -rf" not in caught.value.message


# --- render: the envbuild-sdists stage -----------------------------------------------------------


def render(lock: lockmod.Lock, tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    path = written(tmp_path, lock)
    code = main(["render", "docker", "--lock", str(path), "-o", str(tmp_path / "out"), *argv], {})
    assert code == 0, capsys.readouterr().err
    return (tmp_path / "out" / "Dockerfile").read_text()


def stage_named(dockerfile: str, name: str) -> str:
    (found,) = [s for s in re.split(r"\n(?=FROM )", dockerfile) if s.startswith("FROM ") and f" AS {name}" in
                s.splitlines()[0]]
    return found


def test_a_pure_sdist_is_built_in_a_stage_without_torch(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    dockerfile = render(pure(with_sdist(stack_lock("cpu")), "setuptools"), tmp_path, capsys)
    out = tmp_path / "out" / "requirements"
    assert (out / "sdists-pure.txt").read_text() == \
        f"mulext @ https://h.example/f/mulext-0.1.tar.gz --hash=sha256:{SDIST_SHA}\n"
    assert not (out / "sdists.txt").exists() and "envbuild-extensions" not in dockerfile
    stage = stage_named(dockerfile, "envbuild-sdists")
    assert stage.startswith("FROM envbuild-system AS envbuild-sdists\n")
    assert "torch.txt" not in stage and "apt-get" not in stage  # no torch layer, no compiler install
    assert "COPY requirements/sdists-pure.txt /tmp/envbuild-sdists.txt" in stage
    assert "--require-hashes" in stage
    assert "pip wheel --no-cache-dir --no-deps --no-build-isolation --no-index" in stage
    assert "WORKDIR /wheels\n" in stage and "sha256sum -- *.whl | tee SHA256SUMS" in stage
    final = dockerfile.split("\nFROM envbuild-system\n")[1]
    assert "COPY --from=envbuild-sdists /wheels/ /tmp/envbuild-ext-sdists/" in final
    assert "cat /tmp/envbuild-ext*/SHA256SUMS > /opt/envbuild/extension-wheels.sha256" in final
    # the torch layer is installed once, in the image's own stage
    assert dockerfile.count("COPY requirements/torch.txt") == 1


def test_a_native_sdist_stays_in_the_extensions_stage_beside_a_pure_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = with_sdist(stack_lock("cpu"))
    assert lock.pylock is not None
    text = lock.pylock.text + ('\n[[packages]]\nname = "natext"\nversion = "0.2"\nsdist = { url = '
                               f'"https://h.example/f/natext-0.2.tar.gz", {HASHES} }}\n')
    lock = replace(lock, pylock=replace(lock.pylock, text=text, sha256=lockset.sha256_text(text)),
                   packages={**lock.packages, "natext": "0.2"}, sdists=("mulext", "natext"),
                   sdist_kinds=(cl.Recorded(name="mulext", pure=True, requires=("setuptools",)),
                                cl.Recorded(name="natext", pure=False)))
    dockerfile = render(lock, tmp_path, capsys)
    out = tmp_path / "out" / "requirements"
    assert "natext" in (out / "sdists.txt").read_text() and "mulext" not in (out / "sdists.txt").read_text()
    assert "natext" not in (out / "sdists-pure.txt").read_text()
    _system, sdist_stage, extensions, final = stages(dockerfile)
    assert sdist_stage.startswith("FROM envbuild-system AS envbuild-sdists")
    assert "requirements/torch.txt" in extensions and "requirements/sdists.txt" in extensions
    assert "COPY --from=envbuild-extensions /wheels/ /tmp/envbuild-ext/" in final
    assert "COPY --from=envbuild-sdists /wheels/ /tmp/envbuild-ext-sdists/" in final


def test_the_stage_installs_the_project_layer_and_build_requirements_but_never_torch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Python 3.12's venv has no setuptools: torch's own (in the torch layer) is what a pure
    sdist builds with, installed alone, hash-pinned; the project layer too, as in the extensions
    stage."""
    lock = with_sdist(stack_lock("cpu"))
    assert lock.pylock is not None
    extra = "".join(f'\n[[packages]]\nname = "{n}"\nversion = "1.0"\nwheels = [{{ url = '
                    f'"https://h.example/f/{n}-1.0-py3-none-any.whl", {HASHES} }}]\n'
                    for n in ("setuptools", "six"))
    text = lock.pylock.text + extra
    ref = replace(lock.pylock, text=text, sha256=lockset.sha256_text(text),
                  torch_layer=tuple(sorted((*lock.pylock.torch_layer, "setuptools"))))
    lock = pure(replace(lock, pylock=ref, packages={**lock.packages, "setuptools": "1.0", "six": "1.0"}),
                "setuptools", "wheel")
    dockerfile = render(lock, tmp_path, capsys)
    out = tmp_path / "out" / "requirements"
    assert (out / "sdists-pure-build.txt").read_text().startswith("setuptools @ https://h.example/f/setuptools-1.0")
    assert "torch" not in (out / "sdists-pure-build.txt").read_text()
    stage = stage_named(dockerfile, "envbuild-sdists")
    assert stage.index("requirements/project.txt") < stage.index("requirements/sdists-pure-build.txt") \
        < stage.index("requirements/sdists-pure.txt")
    assert "torch.txt" not in stage


def test_with_a_ca_bundle_and_buildkit_the_stage_trusts_it_as_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from envbuild.render import docker as render_mod

    lock = pure(with_sdist(stack_lock("cpu")), "setuptools")
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (tmp_path / "c").mkdir()
    classic = render(lock, tmp_path / "c", capsys, "--ca-bundle", str(bundle))
    assert "COPY ca-bundle.crt /etc/envbuild/ca-bundle.crt" in stage_named(classic, "envbuild-sdists")
    options = replace(render_mod.parse_options(ca_bundle=str(bundle)), buildkit=True)
    files = render_mod.render_docker(lock, options)
    text = bytes(files["Dockerfile"]).decode()  # type: ignore[arg-type]
    stage = stage_named(text, "envbuild-sdists")
    assert "--mount=type=secret,id=ca" in stage and "ca-bundle.crt" not in stage
    for dockerfile in (classic, text):
        assert "torch.txt" not in stage_named(dockerfile, "envbuild-sdists")
        hadolint = shutil.which("hadolint")
        if hadolint is not None:  # C2: the recipe stays clean
            path = tmp_path / "Dockerfile.lint"
            path.write_text(dockerfile)
            done = subprocess.run([hadolint, "--no-color", "--failure-threshold", "warning", str(path)],
                                  capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stdout


def test_recorded_wheels_are_checked_in_the_stage_that_builds_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from envbuild.extensions import record as rec
    from envbuild.render.closure import build_keys

    lock = pure(with_sdist(stack_lock("cpu")), "setuptools")
    (key,) = build_keys(lock)
    wheel = "mulext-0.1-py3-none-any.whl"
    (tmp_path / rec.FILE).write_text(rec.record_text(rec.merge({}, [key], {"mulext": (wheel, "a" * 64)})))
    dockerfile = render(lock, tmp_path, capsys)
    out = tmp_path / "out" / "requirements"
    assert (out / "built-sdists.sha256").read_text() == f"{'a' * 64}  {wheel}\n"
    assert not (out / "built.sha256").exists()
    stage = stage_named(dockerfile, "envbuild-sdists")
    assert "COPY requirements/built-sdists.sha256 /tmp/envbuild-built.sha256" in stage
    assert stage.index("tee SHA256SUMS") < stage.index("sha256sum --strict -c")
