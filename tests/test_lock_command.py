"""``envbuild lock`` on a project, end to end but offline: uv against package indexes served on
127.0.0.1 (PEP 503 pages with PEP 658 metadata files, no wheels), the base image already
pinned by digest, then ``lock --check``, several targets, conflicts and bad combinations
(docs/faults.md H37–H43)."""

from __future__ import annotations

import contextlib
import hashlib
import html
import http.server
import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuild.commands.cli import main
from envbuild.pylock.uv import find_uv, uv_version

ROOT = Path(__file__).resolve().parent.parent

BASE = "mirror.example/library/debian:bookworm@sha256:" + "a" * 64
LINUX = "cp311-cp311-manylinux_2_28_x86_64"
PURE = "py3-none-any"
UV = uv_version(find_uv(None))  # the build's installer: the version that locks
INDEXES: dict[str, list[tuple[str, str, str, tuple[str, ...]]]] = {
    "torch": [("torch", "2.13.0+cpu", LINUX, ("filelock",)),
              ("torch", "2.13.0+cpu", "cp310-cp310-manylinux_2_28_x86_64", ("filelock",)),
              ("torch", "2.12.0+cpu", LINUX, ("filelock",))],
    "default": [("filelock", "3.1.0", PURE, ()), ("six", "1.17.0", PURE, ()), ("six", "1.16.0", PURE, ()),
                ("idna", "3.10", PURE, ()), ("uv", UV, "py3-none-manylinux_2_17_x86_64", ())],
    "no-uv": [("filelock", "3.1.0", PURE, ()), ("six", "1.17.0", PURE, ())],
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_indexes(tmp_path_factory.mktemp("indexes"), INDEXES)


Dists = dict[str, list[tuple[str, str, str, tuple[str, ...]]]]


def serve_indexes(root: Path, indexes: Dists) -> Iterator[str]:
    """PEP 503 pages with PEP 658 metadata for ``indexes`` (index → (name, version, tag,
    requires)), served on 127.0.0.1 while the generator is suspended."""
    for index, dists in indexes.items():
        pages: dict[str, list[str]] = {}
        (root / index / "files").mkdir(parents=True)
        for name, version, tag, requires in dists:
            filename = f"{name}-{version}-{tag}.whl"
            meta = "".join(f"{line}\n" for line in ["Metadata-Version: 2.1", f"Name: {name}",
                                                    f"Version: {version}",
                                                    *(f"Requires-Dist: {r}" for r in requires)])
            (root / index / "files" / f"{filename}.metadata").write_text(meta)
            href = html.escape(f"../../files/{filename}#sha256={_sha('fake:' + filename)}")
            pages.setdefault(name, []).append(
                f'<a href="{href}" data-dist-info-metadata="sha256={_sha(meta)}">{filename}</a>')
        for name, links in pages.items():
            (root / index / "simple" / name).mkdir(parents=True)
            (root / index / "simple" / name / "index.html").write_text(
                "<html><body>\n" + "\n".join(links) + "\n</body></html>\n")

    with serve_directory(root) as url:
        yield url


@contextlib.contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """``root`` served as static files on a free 127.0.0.1 port; yields its base URL."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("uv-cache")
    # envbuild's own cache (the index pages' remembered sha256s) is the test's too, so that no
    # test finds what another left there
    mine = tmp_path_factory.mktemp("envbuild-cache")
    return {**os.environ, "UV_CACHE_DIR": str(cache), "UV_HTTP_RETRIES": "0", "XDG_CACHE_HOME": str(mine)}


def project(directory: Path, indexes: str, *, deps: str = '["six"]', targets: str = "") -> Path:
    (directory / "envbuild.toml").write_text(
        f'torch = "==2.13.0"\nvariant = "cpu"\npython = "3.11"\ncompanions = false\n'
        f'base-image = "{BASE}"\ntorch-index-url = "{indexes}/torch/simple"\n'
        f'index-url = "{indexes}/default/simple"\ndependencies = {deps}\n{targets}')
    return directory


def run(capsys: pytest.CaptureFixture[str], env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), env=env)
    out, err = capsys.readouterr()
    return code, out, err


def test_lock_a_project_then_check_it(tmp_path: Path, indexes: str, env: dict[str, str],
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, out, err = run(capsys, env, "lock")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.lock", "envbuild.toml", "pylock.toml"]
    data = json.loads((tmp_path / "envbuild.lock").read_text())
    target = data["targets"]["default"]
    assert target["packages"] == {"filelock": "3.1.0", "six": "1.17.0", "torch": "2.13.0+cpu"}
    assert target["pylock"]["torch_layer"] == ["filelock", "torch"]
    assert target["base_image"] == BASE and data["project"]["file"] == "envbuild.toml"
    assert "3 distributions in pylock.toml" in out
    first = (tmp_path / "envbuild.lock").read_bytes(), (tmp_path / "pylock.toml").read_bytes()
    assert run(capsys, env, "lock")[0] == 0  # the same inputs give the same bytes
    assert ((tmp_path / "envbuild.lock").read_bytes(), (tmp_path / "pylock.toml").read_bytes()) == first
    code, out, err = run(capsys, env, "lock", "--check")
    assert (code, err) == (0, "") and "up to date" in out
    # H37: the project changes (a dependency added) → stale, exit 11, nothing written.
    project(tmp_path, indexes, deps='["six", "idna"]')
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "project file or a requirements file changed" in err
    assert ((tmp_path / "envbuild.lock").read_bytes(), (tmp_path / "pylock.toml").read_bytes()) == first
    # A flag overrides the file and changes the stack: stale as well.
    project(tmp_path, indexes)
    code, _, err = run(capsys, env, "lock", "--check", "--torch", "==2.12.0")
    assert code == 11 and "the stack changed (torch" in err
    # H38: a pylock edited by hand.
    (tmp_path / "pylock.toml").write_text(first[1].decode() + "# edited\n")
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "changed since" in err


def test_the_command_ends_at_once_with_its_output_said_and_its_files_whole(
        tmp_path: Path, indexes: str, env: dict[str, str]) -> None:
    """`envbuild lock` ends its process with os._exit once the files are written (an orderly
    shutdown was ~15 ms of a lock): what it printed to a pipe arrives, the files are whole,
    and a failing lock still exits through the interpreter's own shutdown."""
    import subprocess

    project(tmp_path, indexes)
    command = [sys.executable, "-m", "envbuild", "lock"]
    done = subprocess.run(command, cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "wrote envbuild.lock" in done.stdout and "3 distributions in pylock.toml" in done.stdout
    assert done.stderr.splitlines()[-1] == "lock: writing envbuild.lock and 1 pylock file"
    lock = json.loads((tmp_path / "envbuild.lock").read_text())
    assert lock["targets"]["default"]["pylock"]["sha256"] == hashlib.sha256(
        (tmp_path / "pylock.toml").read_bytes()).hexdigest()
    written = (tmp_path / "envbuild.lock").read_bytes(), (tmp_path / "pylock.toml").read_bytes()
    project(tmp_path, indexes, deps='["no-such-package-anywhere"]')
    failed = subprocess.run(command, cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=300, check=False)
    assert failed.returncode == 3 and "envbuild: error[no-compatible-stack]" in failed.stderr, failed.stderr
    assert ((tmp_path / "envbuild.lock").read_bytes(), (tmp_path / "pylock.toml").read_bytes()) == written


def test_the_build_installer_is_pinned_like_the_closure(tmp_path: Path, indexes: str, env: dict[str, str],
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    data = json.loads((tmp_path / "envbuild.lock").read_text())
    filename = f"uv-{UV}-py3-none-manylinux_2_17_x86_64.whl"
    assert data["targets"]["default"]["pylock"]["installer"] == {
        "name": "uv", "version": UV, "url": f"{indexes}/default/files/{filename}",
        "sha256": _sha("fake:" + filename)}
    assert "uv" not in data["targets"]["default"]["packages"]  # the build's tool, not the environment's
    # The Dockerfile installs the layers with that wheel, hash-checked, and keeps it in no layer.
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "ctx")
    assert code == 0, err
    assert (tmp_path / "ctx" / "requirements" / "installer.txt").read_text() == \
        f"uv @ {indexes}/default/files/{filename} --hash=sha256:{_sha('fake:' + filename)}\n"
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert "--target /tmp/envbuild/uv -r /tmp/envbuild/installer.txt" in dockerfile
    assert "/tmp/envbuild/uv/bin/uv pip install --no-config --no-cache" in dockerfile
    # The project says pip: the lock --check calls the uv lock stale, and a new lock names none.
    (tmp_path / "envbuild.toml").write_text((tmp_path / "envbuild.toml").read_text() + 'installer = "pip"\n')
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "installer now pip, locked uv" in err
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    relocked = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert "installer" not in relocked["pylock"]
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "ctx2")
    assert code == 0, err
    assert not (tmp_path / "ctx2" / "requirements" / "installer.txt").exists()
    assert "/opt/venv/bin/pip install --no-cache-dir --no-deps" in \
        (tmp_path / "ctx2" / "Dockerfile").read_text()


def test_an_index_without_uv_is_a_clear_error(tmp_path: Path, indexes: str, env: dict[str, str],
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """H45: the build's installer cannot be pinned → exit 4 naming it and the way out; nothing written."""
    monkeypatch.chdir(project(tmp_path, indexes))
    (tmp_path / "envbuild.toml").write_text((tmp_path / "envbuild.toml").read_text().replace(
        "/default/simple", "/no-uv/simple"))
    code, _, err = run(capsys, env, "lock")
    assert code == 4 and f"no wheel of uv {UV} (the build's installer)" in err and "--installer pip" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]
    code, _, err = run(capsys, env, "lock", "--installer", "pip")
    assert code == 0, err
    # A bad value in the project file: exit 2 naming the key.
    toml = tmp_path / "envbuild.toml"
    toml.write_text(toml.read_text() + 'installer = "conda"\n')
    code, _, err = run(capsys, env, "lock")
    assert code == 2 and "installer" in err and "unknown installer 'conda'" in err


@pytest.mark.parametrize("url", ["https://files.example/uv.whl --index-url http://evil.example/simple",
                                 "https://files.example/uv.whl\nsix", "file:///tmp/uv.whl",
                                 "https://files.example/uv.tar.gz"])
def test_a_hostile_installer_entry_is_refused(tmp_path: Path, indexes: str, env: dict[str, str],
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """H46: the installer's URL becomes a requirements line: anything but a plain wheel URL → 2."""
    monkeypatch.chdir(project(tmp_path, indexes))
    assert run(capsys, env, "lock")[0] == 0
    data = json.loads((tmp_path / "envbuild.lock").read_text())
    data["targets"]["default"]["pylock"]["installer"]["url"] = url
    (tmp_path / "envbuild.lock").write_text(json.dumps(data))
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "ctx")
    assert code == 2 and "installer url" in err
    assert not (tmp_path / "ctx").exists()


def test_a_flag_overrides_the_project_file(tmp_path: Path, indexes: str, env: dict[str, str],
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock", "--torch", "==2.12.0")
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["packages"]["torch"] == "2.12.0+cpu"


def test_no_lock_is_stale(tmp_path: Path, indexes: str, env: dict[str, str],
                          capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "does not exist" in err


def test_two_targets_two_pylocks_and_render_picks_one(tmp_path: Path, indexes: str, env: dict[str, str],
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    targets = '\n[[targets]]\nname = "a100"\ndriver = "550"\n\n[[targets]]\nname = "cpu"\n'
    monkeypatch.chdir(project(tmp_path, indexes, targets=targets))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    assert {"pylock.a100.toml", "pylock.cpu.toml"} <= {p.name for p in tmp_path.iterdir()}
    # H39: several targets and no --target.
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "ctx")
    assert code == 2 and "holds 2 targets (a100, cpu)" in err and not (tmp_path / "ctx").exists()
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "--target", "cpu",
                       "-o", "ctx")
    assert code == 0, err
    carried = json.loads((tmp_path / "ctx" / "envbuild.lock").read_text())
    assert list(carried["targets"]) == ["cpu"]
    torch_txt = (tmp_path / "ctx" / "requirements" / "torch.txt").read_text()
    assert torch_txt.startswith(f"filelock @ {indexes}/default/files/filelock-3.1.0-py3-none-any.whl --hash=")
    # torch only from the variant's index (its '+' percent-encoded or not, as uv wrote it)
    assert re.search(rf"^torch @ {re.escape(indexes)}/torch/files/torch-2\.13\.0(?:%2B|\+)cpu-{LINUX}\.whl ",
                     torch_txt, re.M), torch_txt
    assert (tmp_path / "ctx" / "requirements" / "project.txt").read_text().startswith("six @ ")
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert "--no-deps --no-index --require-hashes" in dockerfile
    assert "smoke.py --installed-only" in dockerfile and f"FROM {BASE}" in dockerfile


def test_a_project_torch_requirement_that_conflicts_is_exit_3_naming_both(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """H40: the project requires torch<2, the file's stack constraint wants 2.13.0."""
    monkeypatch.chdir(project(tmp_path, indexes, deps='["six", "torch<2"]'))
    code, _, err = run(capsys, env, "lock")
    assert code == 3, err
    assert "torch<2" in err and "==2.13.0" in err
    assert not (tmp_path / "envbuild.lock").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--stack-only"], "cannot lock a project's dependencies"),           # H41
    (["--upgrade", "--upgrade-package", "six"], "cannot be combined"),    # H42
    (["--project", "envbuild.toml", "--no-project"], "cannot be combined"),
])
def test_bad_combinations_are_exit_2_and_write_nothing(tmp_path: Path, indexes: str, env: dict[str, str],
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                       message: str) -> None:
    monkeypatch.chdir(project(tmp_path, indexes))
    code, _, err = run(capsys, env, "lock", *argv)
    assert code == 2 and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envbuild.toml"]


def test_a_lock_whose_packages_and_pylock_disagree_is_refused(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """H43: envbuild.lock edited to name another version than its pylock (digest kept)."""
    monkeypatch.chdir(project(tmp_path, indexes))
    assert run(capsys, env, "lock")[0] == 0
    path = tmp_path / "envbuild.lock"
    path.write_text(path.read_text().replace('"six": "1.17.0"', '"six": "1.16.0"'))
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "ctx")
    assert code == 2 and "disagree" in err and not (tmp_path / "ctx").exists()


def test_the_host_script_installs_the_same_files(tmp_path: Path, indexes: str, env: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """render script / cloud-init from a closure: the layers' hash-pinned requirements beside
    install.sh (and inside the user-data), installed with --no-deps --no-index --require-hashes,
    then the installed-set check; shellcheck finds nothing at warning level."""
    import gzip
    import shutil
    import subprocess

    import yaml

    # Ubuntu 22.04's own python3 (3.10), as a host has it. Locked once with a pinned base (uv's
    # cache filled), then --offline: the stack's own base stays a tag, uv answers from its cache.
    monkeypatch.chdir(project(tmp_path, indexes))
    text = (tmp_path / "envbuild.toml").read_text().replace(
        'python = "3.11"', 'python = "3.10"\nubuntu = "22.04"')
    (tmp_path / "envbuild.toml").write_text(text)
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    (tmp_path / "envbuild.toml").write_text(text.replace(f'base-image = "{BASE}"\n', ""))
    code, _, err = run(capsys, env, "lock", "--offline")
    assert code == 0, err
    assert json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["base_offline"] is True
    code, _, err = run(capsys, env, "render", "script", "--lock", "envbuild.lock", "-o", "host")
    assert code == 0, err
    host = tmp_path / "host"
    assert sorted(p.relative_to(host).as_posix() for p in host.rglob("*") if p.is_file()) == [
        ".envbuild-output", "envbuild.lock", "install.sh", "pylock.toml", "requirements/project.txt",
        "requirements/torch.txt", "smoke.py"]
    script = (host / "install.sh").read_text()
    assert "for layer in torch project; do" in script
    assert "--no-deps --no-index --require-hashes --only-binary :all:" in script
    assert '--installed-only --lock "$SOURCE_DIR/envbuild.lock"' in script
    assert "six @ " in (host / "requirements" / "project.txt").read_text()
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        done = subprocess.run([shellcheck, "-S", "warning", str(host / "install.sh")], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout
    code, _, err = run(capsys, env, "render", "cloud-init", "--lock", "envbuild.lock", "-o", "cloud")
    assert code == 2 and "--smoke-url" in err  # docs/faults.md N6: the installed-set check is smoke.py's
    code, _, err = run(capsys, env, "render", "cloud-init", "--lock", "envbuild.lock", "-o", "cloud",
                       "--smoke-url", "https://files.example/smoke.py")
    assert code == 0, err
    user_data = gzip.decompress((tmp_path / "cloud" / "user-data").read_bytes())
    assert user_data == (tmp_path / "cloud" / "user-data.yaml").read_bytes()
    written = {f["path"]: f["content"] for f in yaml.safe_load(user_data)["write_files"]}
    torch_txt = written["/opt/envbuild/requirements/torch.txt"].encode()
    assert torch_txt == (host / "requirements" / "torch.txt").read_bytes()


def test_previous_pins_are_kept_until_upgraded(tmp_path: Path, indexes: str, env: dict[str, str],
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """uv keeps the lock's pins: loosening a requirement moves nothing until --upgrade-package."""
    monkeypatch.chdir(project(tmp_path, indexes, deps='["six==1.16.0"]'))
    assert run(capsys, env, "lock")[0] == 0
    project(tmp_path, indexes, deps='["six"]')
    assert run(capsys, env, "lock")[0] == 0
    packages = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["packages"]
    assert packages["six"] == "1.16.0"
    code, _, err = run(capsys, env, "lock", "--upgrade-package", "six")
    assert code == 0, err
    packages = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["packages"]
    assert packages["six"] == "1.17.0" and packages["filelock"] == "3.1.0"


@pytest.mark.parametrize("flags, flavor", [([], "devel"), (["--flavor", "runtime"], "runtime")])
def test_flavor_flag_overrides_the_projects_devel(tmp_path: Path, indexes: str, env: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                  flavor: str) -> None:
    """`--flavor runtime` is a choice, not argparse's default: it beats the file's devel."""
    directory = project(tmp_path, indexes)
    file = directory / "envbuild.toml"
    file.write_text(file.read_text().replace('variant = "cpu"\n', 'variant = "cpu"\nflavor = "devel"\n'))
    monkeypatch.chdir(directory)
    code, _, err = run(capsys, env, "lock", *flags)
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["stack"]["flavor"] == flavor


@pytest.mark.parametrize(("pyproject", "code", "message"), [
    # [tool.envbuild] written as an inline table is a project too (read as TOML, not searched for)
    ('[project]\nname = "x"\nversion = "0"\n\n[tool]\nenvbuild = { variant = "cpu" }\n', 2,
     "cannot lock a project's dependencies"),
    # the table's name in a comment is not a table
    ('# see [tool.envbuild] in the docs\n[project]\nname = "x"\nversion = "0"\n', 0, ""),
    # a pyproject that does not parse is named with its line
    ('[project]\nname = "x\n', 2, "pyproject.toml"),
])
def test_a_pyproject_is_a_project_when_toml_says_it_has_the_table(
        tmp_path: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, pyproject: str, code: int, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(pyproject)
    monkeypatch.chdir(tmp_path)
    got, _, err = run(capsys, env, "lock", "--stack-only", "--variant", "cpu", "--torch", "==2.13.0",
                      "--python", "3.11", "--offline")
    assert got == code, err
    assert message in err
    assert (tmp_path / "envbuild.lock").exists() is (code == 0)


def test_no_registry_locks_the_whole_closure_and_says_the_base_is_unpinned(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/faults.md U9: where the package index answers and no image registry does, the digest
    error names --no-registry; that locks the closure (uv reaching the index, unlike --offline,
    whose empty uv cache cannot), records the base as unpinned, and render and --check say so."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unreachable = f"127.0.0.1:{closed}/library/debian:bookworm"
    monkeypatch.chdir(project(tmp_path, indexes))
    text = (tmp_path / "envbuild.toml").read_text().replace(BASE, unreachable)
    (tmp_path / "envbuild.toml").write_text(text)
    code, _, err = run(capsys, env, "lock")
    assert code == 4 and "lock --no-registry" in err and not (tmp_path / "envbuild.lock").exists()
    # An empty uv cache (the failed lock above resolved the closure while the registry was asked,
    # which filled the fixture's cache):
    code, _, err = run(capsys, {**env, "UV_CACHE_DIR": str(tmp_path / "empty-uv-cache")}, "lock", "--offline")
    assert code != 0 and not (tmp_path / "envbuild.lock").exists()  # uv's cache holds nothing yet
    code, out, err = run(capsys, env, "lock", "--no-registry")
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["base_offline"] is True and target["base_image"] == unreachable
    assert target["packages"]["six"] == "1.17.0" and "(a tag: unpinned)" in out
    code, out, err = run(capsys, env, "lock", "--check")
    assert code == 0 and "up to date" in out and "the base image" in err and "is unpinned" in err
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "image")
    assert code == 0 and "is unpinned" in err


def test_lock_says_each_step_of_each_target_on_stderr_and_nothing_with_quiet(
        tmp_path: Path, indexes: str, env: dict[str, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    targets = '\n[[targets]]\nname = "a100"\ndriver = "550"\n\n[[targets]]\nname = "cpu"\n'
    monkeypatch.chdir(project(tmp_path, indexes, targets=targets))
    code, out, err = run(capsys, env, "lock")
    assert code == 0, err
    lines = err.splitlines()
    for name in ("a100", "cpu"):
        mine = [line for line in lines if line.startswith(f"lock {name}: ")]
        assert [line.split(": ", 1)[1].split(";")[0].split(" ")[0] for line in mine] == [
            "resolving", "stack", "resolving", "3", "base", "3"], mine  # the base pinned while uv resolves
        assert mine[1].startswith(f"lock {name}: stack torch 2.13.0 (cpu), Python 3.11; pinning the base")
        assert mine[2].startswith(f"lock {name}: resolving the closure with uv for x86_64-manylinux_2_")
        assert mine[2].endswith("; the base image is checked against it at build time: set base-glibc "
                                "where its glibc is older)")  # a Debian base
        assert mine[3].endswith("3 distributions resolved; checking hashes")
    assert lines[-1] == "lock: writing envbuild.lock and 2 pylock files"
    assert "lock " not in out and "wrote envbuild.lock" in out  # results stay on stdout
    code, out, err = run(capsys, env, "-q", "lock")
    assert (code, err) == (0, "") and "wrote envbuild.lock" in out


def test_lock_overwrites_its_step_line_on_a_terminal(tmp_path: Path, indexes: str, env: dict[str, str],
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.chdir(project(tmp_path, indexes))
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["lock"], env=env) == 0
    shown = terminal.getvalue()
    # every step rewrites the line; only the target's last step and the writing end one
    assert shown.count("\r\x1b[K") == 6 and shown.count("\n") == 2, shown
    assert shown.split("\n")[0].endswith("lock default: 3 distributions, hashes checked")
    # a failure mid-line (uv finds no such package): the error starts a line of its own
    project(tmp_path, indexes, deps='["no-such-package"]')
    terminal.seek(0)
    terminal.truncate()
    assert main(["lock"], env=env) != 0
    shown = terminal.getvalue()
    assert "resolving the closure with uv" in shown and "\nenvbuild: error" in shown, shown


def test_lock_json_matches_its_schema_and_says_what_changed(tmp_path: Path, indexes: str, env: dict[str, str],
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).resolve().parent.parent / "docs" / "schemas" /
                         "lock.schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    monkeypatch.chdir(project(tmp_path, indexes))
    code, out, err = run(capsys, env, "lock", "--json")
    assert code == 0, err
    first = json.loads(out)
    validator.validate(first)
    assert first["changed"] is True and all(f["changed"] for f in first["files"])
    assert first["targets"] == [{"name": "default", "torch": "2.13.0", "variant": "cpu",
                                 "python": "3.11", "platform": "linux/amd64",
                                 "base_image": BASE.split("@")[0],
                                 "base_digest": BASE.split("@")[1], "base_pinned": True,
                                 "distributions": 3, "pylock": "pylock.toml", "sdists": [], "held_back": [],
                                 "sdist_kinds": {}}]
    assert {f["path"]: f["sha256"] for f in first["files"]} == {
        name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        for name in ("envbuild.lock", "pylock.toml")}
    code, out, _ = run(capsys, env, "lock", "--json")
    again = json.loads(out)
    validator.validate(again)
    assert again["changed"] is False and again["files"] == [{**f, "changed": False} for f in first["files"]]
    with pytest.raises(jsonschema.ValidationError):  # the schema is not vacuous
        validator.validate({**first, "targets": [{**first["targets"][0], "base_digest": "latest"}]})
    code, _, err = run(capsys, env, "lock", "--json", "--check")
    assert code == 2 and "--json" in err


def test_a_changed_extension_source_makes_the_lock_stale(tmp_path: Path, indexes: str, env: dict[str, str],
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    project(tmp_path, indexes, targets='extensions = ["ext"]\n')
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    (ext,) = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]["extensions"]
    assert ext["dir"] == "ext" and ext["name"] == "ext" and len(ext["sha256"]) == 64
    assert run(capsys, env, "lock", "--check")[0] == 0
    (tmp_path / "ext" / "setup.py").write_text("from setuptools import setup\nsetup(name='ext')\n")
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 11 and "the extensions or their sources changed" in err
