"""Git sources and source archives by URL (issue 37 item 1, docs/faults.md H55-H58): a git
repository served on 127.0.0.1 over git's "dumb" HTTP (``git update-server-info`` + a static
file server), locked by commit for a branch, a tag, a commit and no revision; a source archive
by URL locked by its sha256, a wrong ``#sha256=`` pin refused. uv against the 127.0.0.1 indexes
of test_lock_command."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lock_command import env, indexes, project, run  # noqa: F401 (fixtures)

from envbuild.errors import UsageError
from envbuild.project.config import load_project

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

PYPROJECT = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
             '[project]\nname = "gitthing"\nversion = "{version}"\ndependencies = ["six"]\n')


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A git repository (branch main at commit 2, tag v1 at commit 1, branch old at commit 1)
    and an sdist, served over http on 127.0.0.1; their URLs, commits and the sdist's sha256."""
    root = tmp_path_factory.mktemp("git-served")
    work = root / "work"
    (work / "gitthing").mkdir(parents=True)
    _git(work, "init", "-q", "-b", "main")
    (work / "gitthing" / "__init__.py").write_text("VALUE = 1\n")
    (work / "pyproject.toml").write_text(PYPROJECT.format(version="1.0"))
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "one")
    first = _git(work, "rev-parse", "HEAD")
    _git(work, "tag", "v1")
    _git(work, "branch", "old")
    (work / "pyproject.toml").write_text(PYPROJECT.format(version="2.0"))
    _git(work, "commit", "-qam", "two")
    second = _git(work, "rev-parse", "HEAD")
    _git(root, "clone", "-q", "--bare", str(work), str(root / "www" / "gitthing.git"))
    _git(root / "www" / "gitthing.git", "update-server-info")
    sdist = root / "www" / "files" / "arch-1.0.tar.gz"
    sdist.parent.mkdir(parents=True)
    tree = root / "arch-1.0"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(PYPROJECT.replace("gitthing", "arch").format(version="1.0"))
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: arch\nVersion: 1.0\nRequires-Dist: six\n")
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(tree, arcname="arch-1.0")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root / "www"), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        yield {"repo": f"{base}/gitthing.git", "first": first, "second": second,
               "sdist": f"{base}/files/arch-1.0.tar.gz",
               "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()}
    finally:
        server.shutdown()
        server.server_close()


def _pylock(directory: Path) -> str:
    return (directory / "pylock.toml").read_text()


@pytest.mark.parametrize(("revision", "commit", "version"), [
    ("@main", "second", "2.0"), ("@v1", "first", "1.0"), ("@old", "first", "1.0"),
    ("@{first}", "first", "1.0"), ("", "second", "2.0")])
def test_a_git_source_is_locked_by_commit_and_built_from_a_verified_checkout(
        tmp_path: Path, indexes: str, env: dict[str, str], served: dict[str, Any],  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        revision: str, commit: str, version: str) -> None:
    """H55: 'name @ git+URL@REV' was refused. A branch, a tag, a commit or no revision at all is
    locked at the commit it names when lock runs (the pylock's vcs table: url, requested-revision,
    commit-id), its own dependencies join the closure, lock --check stays up to date, and the
    rendered stage clones, checks out that commit, verifies it and builds it into a wheel."""
    revision = revision.format(first=served["first"])
    requirement = f"gitthing @ git+{served['repo']}{revision}"
    monkeypatch.chdir(project(tmp_path, indexes, deps=json.dumps([requirement])))
    code, _, err = run(capsys, env, "lock")
    assert code == 0, err
    expected = served[commit]
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["packages"]["gitthing"] == version and "six" in target["packages"]
    assert target["sdists"] == ["gitthing"]
    pylock = _pylock(tmp_path)
    assert f'commit-id = "{expected}"' in pylock and f'url = "{served["repo"]}"' in pylock
    if revision:
        assert f'requested-revision = "{revision[1:]}"' in pylock
    else:  # no revision: the default branch's commit, and lock says so
        assert "requested-revision" not in pylock
        assert f"names no revision: locked at commit {expected}" in err
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 0, err
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "image")
    assert code == 0, err
    dockerfile = (tmp_path / "image" / "Dockerfile").read_text()
    assert f"git clone --quiet --no-checkout -- {served['repo']} /tmp/envbuild-ext-git/gitthing" in dockerfile
    assert f"checkout --quiet --detach {expected}" in dockerfile
    assert f'test "$(git -C /tmp/envbuild-ext-git/gitthing rev-parse HEAD)" = {expected}' in dockerfile
    assert "--wheel-dir /wheels /tmp/envbuild-ext-git/gitthing" in dockerfile
    # behind a TLS-inspecting proxy git trusts the bundle through GIT_SSL_CAINFO (no SSL_CERT_FILE)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n")
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "image-ca",
                       "--ca-bundle", str(tmp_path / "ca.pem"))
    assert code == 0, err
    assert 'GIT_SSL_CAINFO="$SSL_CERT_FILE" git clone' in (tmp_path / "image-ca" / "Dockerfile").read_text()
    # its built wheel is recorded by a build key whose source is its commit (envbuild.built.json)
    from envbuild.render.closure import build_keys
    from envbuild.render.lockset import read_lockset

    (key,) = build_keys(read_lockset(tmp_path / "envbuild.lock").targets["default"])
    source = hashlib.sha256(f"git:{expected}".encode()).hexdigest()
    assert (key.name, key.source_sha256) == ("gitthing", source)
    # the image installs its built wheel, never the git URL
    assert "gitthing" not in (tmp_path / "image" / "requirements" / "project.txt").read_text()
    assert not (tmp_path / "image" / "requirements" / "sdists.txt").exists()
    assert "--no-install-recommends g++ git python3-dev" in dockerfile  # git, in the stage alone
    assert "built there.\nRUN mkdir -p /wheels \\\n && git clone" in dockerfile


def test_the_rendered_checkout_refuses_another_commit(tmp_path: Path, served: dict[str, Any]) -> None:
    """H57: the stage's own commands, run here: a checkout of the recorded commit passes the
    check; a repository whose HEAD is elsewhere fails it (the step exits non-zero)."""
    checkout = tmp_path / "c"
    _git(tmp_path, "clone", "-q", "--no-checkout", "--", served["repo"], str(checkout))
    _git(checkout, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", served["first"])
    check = 'test "$(git -C "$1" rev-parse HEAD)" = "$2"'
    assert subprocess.run(["sh", "-c", check, "sh", str(checkout), served["first"]]).returncode == 0
    assert subprocess.run(["sh", "-c", check, "sh", str(checkout), served["second"]]).returncode != 0


@pytest.mark.parametrize("pin", [True, False])
def test_a_source_archive_by_url_is_locked_by_its_sha256(
        tmp_path: Path, indexes: str, env: dict[str, str], served: dict[str, Any],  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pin: bool) -> None:
    """H56: 'name @ https://…/name-1.0.tar.gz' was refused. Now it is locked with the file's
    sha256 (an http URL needs a #sha256= pin), built like a build-sdists sdist: fetched by pip,
    hash-checked, built in the extensions stage."""
    url = served["sdist"] + (f"#sha256={served['sha256']}" if pin else "")
    monkeypatch.chdir(project(tmp_path, indexes, deps=json.dumps([f"arch @ {url}"])))
    code, _, err = run(capsys, env, "lock")
    if not pin:  # plain http with nothing pinned: refused where it is read
        assert code == 2 and "fetched over plain http with no #sha256=" in err
        return
    assert code == 0, err
    target = json.loads((tmp_path / "envbuild.lock").read_text())["targets"]["default"]
    assert target["packages"]["arch"] == "1.0" and target["sdists"] == ["arch"]
    assert served["sha256"] in _pylock(tmp_path)
    code, _, err = run(capsys, env, "lock", "--check")
    assert code == 0, err
    code, _, err = run(capsys, env, "render", "docker", "--lock", "envbuild.lock", "-o", "image")
    assert code == 0, err
    # The archive is pure Python (lock read it): it builds in the stage without torch.
    assert target["sdist_kinds"]["arch"]["kind"] == "pure"
    assert not (tmp_path / "image" / "requirements" / "sdists.txt").exists()
    sdists = (tmp_path / "image" / "requirements" / "sdists-pure.txt").read_text()
    assert sdists == f"arch @ {served['sdist']} --hash=sha256:{served['sha256']}\n"


def test_a_wrong_archive_pin_is_refused(
        tmp_path: Path, indexes: str, env: dict[str, str], served: dict[str, Any],  # noqa: F811
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """H56: a #sha256= the file served does not have: exit 4, nothing written (uv checks the
    archive it downloads; envbuild checks again what uv recorded, below)."""
    url = f"{served['sdist']}#sha256={'0' * 64}"
    monkeypatch.chdir(project(tmp_path, indexes, deps=json.dumps([f"arch @ {url}"])))
    code, _, err = run(capsys, env, "lock")
    assert code == 4 and "Hash mismatch" in err, err[-900:]
    assert not (tmp_path / "envbuild.lock").exists()


def test_envbuild_checks_the_archive_against_the_pin_and_what_uv_recorded() -> None:
    """uv takes a #sha256= as the hash of a file it has cached: envbuild fetches the file itself
    and refuses a pin, or a recorded sha256, that the file served does not have."""
    from envbuild.errors import DataError
    from envbuild.pylock.direct import check_hashes as check_archive_hashes
    from envbuild.pylock.sources import archive_requirement

    good, bad = "1" * 64, "2" * 64
    pinned = archive_requirement(f"arch @ https://127.0.0.1/arch-1.0.tar.gz#sha256={bad}", "r.txt:1")
    with pytest.raises(DataError, match=f"the project pins sha256 {bad} but the file served"):
        check_archive_hashes([pinned], {}, lambda url: good)
    unpinned = archive_requirement("arch @ https://127.0.0.1/arch-1.0.tar.gz", "r.txt:1")
    with pytest.raises(DataError, match=f"uv recorded sha256 {bad}"):
        check_archive_hashes([unpinned], {"arch": bad}, lambda url: good)
    check_archive_hashes([unpinned], {"arch": good}, lambda url: good)


CREDENTIALS = "the URL of a direct requirement carries credentials"


@pytest.mark.parametrize(("line", "problem"), [
    ("gitthing @ git+https://user:s3cret@127.0.0.1/r.git@v1", CREDENTIALS),
    ("arch @ https://tok3n@127.0.0.1/arch-1.0.tar.gz", CREDENTIALS),
    ("gitthing @ git+https://127.0.0.1/r.git@v1#subdirectory=x", "has a fragment other than #egg=name"),
    ("gitthing @ git+https://127.0.0.1/r.git@--upload-pack=x", "names an unusable revision"),
    ("gitthing @ git+https://127.0.0.1/r.git?x=1", "is not a plain URL"),
    ("gitthing==1 @ git+https://127.0.0.1/r.git", "invalid requirement"),
])
def test_a_git_or_archive_requirement_envbuild_cannot_lock_is_one_line(tmp_path: Path, line: str,
                                                                       problem: str) -> None:
    """H58: credentials never reach the lock or any output (the URL is not echoed); a subdirectory,
    an option posing as a revision, a query: one line naming the file and line."""
    (tmp_path / "envbuild.toml").write_text('requirements = ["r.txt"]\n')
    (tmp_path / "r.txt").write_text(f"six\n{line}\n")
    with pytest.raises(UsageError) as caught:
        load_project(None, tmp_path)
    message = caught.value.one_line()
    assert "r.txt:2: " in message and problem in message, message
    assert "s3cret" not in message and "tok3n" not in message


def test_pips_egg_form_is_read_as_name_at_url(tmp_path: Path) -> None:
    """git+https://…@REV#egg=name (pip's older form) is the requirement 'name @ git+…'."""
    (tmp_path / "envbuild.toml").write_text('requirements = ["r.txt"]\n')
    (tmp_path / "r.txt").write_text("git+https://127.0.0.1/r.git@v1#egg=gitthing\n")
    assert load_project(None, tmp_path).dependencies == (
        "gitthing @ git+https://127.0.0.1/r.git@v1#egg=gitthing",)


@pytest.mark.parametrize(("vcs", "says"), [
    ('{ type = "hg", url = "https://127.0.0.1/r", commit-id = "' + "a" * 40 + '" }', "is not a git source"),
    ('{ type = "git", url = "https://127.0.0.1/r.git", commit-id = "main" }', "40-hex commit-id"),
    ('{ type = "git", url = "https://u:s3cret@127.0.0.1/r.git", commit-id = "' + "a" * 40 + '" }',
     CREDENTIALS),
    ('{ type = "git", url = "ext::sh -c touch% /tmp/x", commit-id = "' + "a" * 40 + '" }',
     "is not https or http"),
])
def test_a_pylocks_vcs_table_is_checked_before_anything_is_rendered(vcs: str, says: str) -> None:
    """H58: a pylock from a pull request: its vcs table becomes a git clone in the Dockerfile,
    so only git, a plain http(s) URL without credentials and a 40-hex commit id are read."""
    from envbuild.pylock.files import read_pylock

    head = 'lock-version = "1.0"\ncreated-by = "test"\n[[packages]]\nname = "g"\nversion = "1.0"\n'
    good = read_pylock(head + 'vcs = { type = "git", url = "https://127.0.0.1/r.git", commit-id = "'
                       + "a" * 40 + '" }\n').package("g")
    assert good.vcs is not None and good.vcs.commit == "a" * 40 and good.built
    with pytest.raises(UsageError) as caught:
        read_pylock(head + f"vcs = {vcs}\n")
    message = caught.value.one_line()
    assert "packages[0].vcs" in message and says in message and "s3cret" not in message
