"""Output paths (docs/faults.md A18, A21-A25): envbuild replaces only regular files and
directories it wrote. A device, FIFO, socket or symbolic link at an output path is exit 2
and left as it was (links are refused, not followed); ``--force`` replaces only a
directory holding envbuild's marker, and never the current directory or an ancestor."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.commands.cli import main
from envbuild.errors import UsageError
from envbuild.fs import MARKER, write_file, write_tree

# DOCKER_HOST points nowhere: reaching the daemon would be exit 5, so 2 proves the order.
ENV = {"DOCKER_HOST": "unix:///nonexistent/envbuild-test.sock"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv), env=ENV)
    return code, capsys.readouterr().err


def refused(code: int, err: str, path: Path, why: str) -> bool:
    """Exit 2 with one usage line naming ``path`` and ``why``."""
    lines = err.strip().splitlines()
    return (code == 2 and len(lines) == 1 and lines[0].startswith("envbuild: error[usage]: ")
            and str(path) in lines[0] and why in lines[0])


@pytest.fixture
def device(tmp_path: Path) -> Iterator[Path]:
    """A character device like /dev/null, made where the test may lose it (root only)."""
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("cannot make a device node here; /dev/null itself is not risked")
    yield node
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def special_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """A FIFO, a socket and links to a file and to a directory, with the word that names each."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    sock.close()
    (tmp_path / "real.txt").write_bytes(b"precious")
    (tmp_path / "realdir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real.txt")
    (tmp_path / "dirlink").symlink_to(tmp_path / "realdir")
    return {"fifo": (fifo, "a FIFO"), "socket": (sock_path, "a socket"),
            "link": (tmp_path / "link", "symbolic link"),
            "dirlink": (tmp_path / "dirlink", "symbolic link")}


def untouched(tmp_path: Path) -> bool:
    return (stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
            and stat.S_ISSOCK(os.lstat(tmp_path / "sock").st_mode)
            and os.readlink(tmp_path / "link") == str(tmp_path / "real.txt")
            and os.readlink(tmp_path / "dirlink") == str(tmp_path / "realdir")
            and (tmp_path / "real.txt").read_bytes() == b"precious"
            and list((tmp_path / "realdir").iterdir()) == [])


# --- lock -o FILE, --report FILE ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "socket", "link", "dirlink"])
def test_lock_refuses_special_targets(kind: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path, why = special_paths(tmp_path)[kind]
    code, err = run(capsys, "lock", "--stack-only", "--driver", "550", "-o", str(path))
    assert refused(code, err, path, why), err
    assert untouched(tmp_path)


def test_lock_refuses_a_device(device: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "lock", "--stack-only", "--driver", "550", "-o", str(device))
    assert refused(code, err, device, "a character device"), err


def test_lock_into_a_directory_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep").write_bytes(b"x")
    code, err = run(capsys, "lock", "--stack-only", "--driver", "550", "-o", str(tmp_path))
    assert refused(code, err, tmp_path, "is a directory"), err
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]


def test_lock_still_replaces_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "envbuild.lock"
    path.write_bytes(b"old")
    assert run(capsys, "lock", "--stack-only", "--driver", "550", "-o", str(path))[0] == 0
    assert path.read_bytes().startswith(b"{")


@pytest.mark.parametrize("command", [["verify", "img"], ["build", "--variant", "cpu"]])
@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_report_refuses_special_targets_before_docker(command: list[str], kind: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path, why = special_paths(tmp_path)[kind]
    code, err = run(capsys, *command, "--report", str(path))
    assert refused(code, err, path, why), err
    assert untouched(tmp_path)


# --- -o DIR [--force] ------------------------------------------------------------------------------


RENDERS = {
    "docker": ["render", "docker", "--driver", "550"],
    "script": ["render", "script", "--driver", "550"],
    "ci": ["ci", "bake", "--variant", "cpu", "--registry", "registry.example/team/torch"],
}


@pytest.mark.parametrize("render", sorted(RENDERS))
@pytest.mark.parametrize("kind", ["fifo", "socket", "link", "dirlink"])
def test_output_dir_refuses_special_targets(render: str, kind: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path, why = special_paths(tmp_path)[kind]
    code, err = run(capsys, *RENDERS[render], "-o", str(path), "--force")
    assert refused(code, err, path, why), err
    assert untouched(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_force_through_a_symlink_leaves_the_target(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "real"
    assert run(capsys, *RENDERS["docker"], "-o", str(real))[0] == 0  # envbuild wrote it, even so
    before = sorted(p.name for p in real.iterdir())
    link = tmp_path / "link"
    link.symlink_to(real)
    code, err = run(capsys, *RENDERS["docker"], "-o", str(link), "--force")
    assert refused(code, err, link, "symbolic link"), err
    assert link.is_symlink() and sorted(p.name for p in real.iterdir()) == before


@pytest.mark.parametrize("render", sorted(RENDERS))
def test_force_refuses_a_directory_envbuild_did_not_write(render: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_bytes(b"mine")
    code, err = run(capsys, *RENDERS[render], "-o", str(out), "--force")
    assert refused(code, err, out, MARKER), err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no temporary left


def test_force_replaces_what_envbuild_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(capsys, *RENDERS["docker"], "-o", str(out))[0] == 0
    assert (out / MARKER).is_file()
    (out / "stale").write_bytes(b"x")
    assert run(capsys, *RENDERS["docker"], "-o", str(out), "--force")[0] == 0
    assert not (out / "stale").exists() and (out / MARKER).is_file()


@pytest.mark.parametrize("spelling", [".", "..", "{cwd}"])
def test_force_never_replaces_the_current_directory_or_an_ancestor(
        spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cwd = tmp_path / "project"
    (cwd / ".git").mkdir(parents=True)
    (cwd / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    (cwd / MARKER).write_bytes(b"")  # even a directory envbuild once wrote into
    monkeypatch.chdir(cwd)
    code, err = run(capsys, *RENDERS["docker"], "-o", spelling.format(cwd=cwd), "--force")
    assert code == 2 and "current directory" in err and len(err.strip().splitlines()) == 1, err
    assert (cwd / ".git" / "HEAD").read_bytes() == b"ref: refs/heads/main\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_empty_current_directory_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, *RENDERS["docker"], "-o", ".")
    assert code == 2 and "current directory" in err, err
    assert list(tmp_path.iterdir()) == [] and Path.cwd() == tmp_path.resolve()


def test_output_dir_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"mine")
    code, err = run(capsys, *RENDERS["docker"], "-o", str(path), "--force")
    assert refused(code, err, path, "not a directory"), err
    assert path.read_bytes() == b"mine"


# --- matrix refresh --out DIR ---------------------------------------------------------------------


def test_refresh_out_refuses_a_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = special_paths(tmp_path)
    link, why = paths["dirlink"]
    code, err = run(capsys, "matrix", "refresh", "--offline", "--out", str(link))
    assert refused(code, err, link, why), err
    assert untouched(tmp_path)


# --- the writer itself ----------------------------------------------------------------------------


def test_write_file_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    for path, _ in special_paths(tmp_path).values():
        with pytest.raises(UsageError):
            write_file(path, b"new")
    with pytest.raises(UsageError, match="is a directory"):
        write_file(tmp_path / "realdir", b"new")
    assert untouched(tmp_path)


def test_write_file_refuses_a_link_that_appears_during_the_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.json"
    (tmp_path / "victim").write_bytes(b"precious")
    real_fsync = os.fsync

    def swap_in_a_link(fd: int) -> None:
        real_fsync(fd)
        target.symlink_to(tmp_path / "victim")

    monkeypatch.setattr(os, "fsync", swap_in_a_link)
    with pytest.raises(UsageError, match="symbolic link"):
        write_file(target, b"new")
    assert target.is_symlink() and (tmp_path / "victim").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim"]


def test_write_tree_refuses_links_and_foreign_directories(tmp_path: Path) -> None:
    paths = special_paths(tmp_path)
    with pytest.raises(UsageError, match="symbolic link"):
        write_tree({"a": b"1"}, paths["dirlink"][0])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_bytes(b"1")
    with pytest.raises(UsageError, match=MARKER):
        write_tree({"a": b"1"}, foreign)
    with pytest.raises(ValueError, match=MARKER):
        write_tree({MARKER: b"mine"}, tmp_path / "new")
    assert untouched(tmp_path) and [p.name for p in foreign.iterdir()] == ["x"]
    assert not (tmp_path / "new").exists()


# --- unwritable directories (A19) and best-effort writers -----------------------------------------


def refuse_temporaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only filesystem beside the target (root ignores modes, so it is simulated)."""
    import tempfile

    def read_only(*args: object, **kwargs: object) -> str:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)


@pytest.mark.parametrize("command", [["lock", "--stack-only", "--driver", "550"],
                                     ["render", "docker", "--driver", "550"]])
def test_an_unwritable_directory_is_exit_2(command: list[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    refuse_temporaries(monkeypatch)
    code, err = run(capsys, *command, "-o", str(tmp_path / "out"))
    assert refused(code, err, tmp_path, "Read-only file system"), err
    assert list(tmp_path.iterdir()) == []


def test_a_refused_cache_path_is_skipped_not_fatal(tmp_path: Path) -> None:
    from envbuild.data.matrix import _rows_cache_file, _write_rows_cache

    cache = tmp_path / "cache"
    cache.mkdir()
    (tmp_path / "elsewhere").write_bytes(b"precious")
    _rows_cache_file(cache, "abc").symlink_to(tmp_path / "elsewhere")
    _write_rows_cache(cache, "abc", {})  # a cache is an optimisation: no error
    assert (tmp_path / "elsewhere").read_bytes() == b"precious"
