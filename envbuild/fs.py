"""Atomic writes: every file and directory envbuild writes is complete or untouched.

A file is written to a temporary name beside its target, flushed to disk, given its
final mode and renamed over the target; a directory is assembled beside its target and
swapped in whole. Regular files are 0644 and directories 0755 unless a caller asks for
another mode: what envbuild writes (locks, Dockerfiles, data) holds no secret, and a
build or a CI job run as another user must be able to read it.

Only regular files and directories are ever replaced. A symbolic link, device, FIFO or
socket at the target is refused (exit 2), never followed or replaced: as root, renaming
over ``/dev/null`` or through a link would change the system. A directory is replaced
only when it is empty or holds ``MARKER`` (envbuild wrote it), and never when it is the
current directory or one of its ancestors.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from envbuild.errors import UsageError

FILE_MODE = 0o644
DIR_MODE = 0o755

# Written into every directory write_tree makes (beside the caller's files, not one of
# them): its presence is what lets --force replace the directory later.
MARKER = ".envbuild-output"
MARKER_TEXT = b"Written by envbuild. `--force` replaces this directory as a whole.\n"

_SPECIAL = (
    (stat.S_ISLNK, "a symbolic link (not followed)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)

# A file's contents: bytes, or a path whose bytes are copied (large wheels are not read
# into memory).
FileData = bytes | Path


class RefusedTarget(UsageError, OSError):
    """Something is at the target that envbuild must not replace (a link, device, FIFO,
    socket, a directory it did not write, the current directory): exit 2. It is also an
    OSError, so a best-effort writer (a cache) that skips an unwritable path skips a
    refused one too instead of failing the command."""


class UnwritableDirectory(OSError):
    """The directory that would hold a new file or tree refuses to (read-only, no space,
    no permission): nothing was written, which callers report as bad output paths."""


def check_not_special(path: Path) -> os.stat_result | None:
    """``path``'s own status (``None`` when nothing is there); a symbolic link, device,
    FIFO or socket is a UsageError naming it."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    for test, what in _SPECIAL:
        if test(st.st_mode):
            raise RefusedTarget(f"refusing to replace {path}: it is {what}",
                             hint="name a new path or a regular file/directory envbuild may replace")
    return st


def check_file_target(path: Path) -> None:
    """Refuse a target ``write_file`` must not replace: anything but a regular file."""
    st = check_not_special(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise RefusedTarget(f"refusing to write {path}: it is a directory", hint="name a file to write")


def check_tree_target(target: Path) -> None:
    """Refuse a target ``write_tree`` must not replace whatever the caller allows: a
    non-directory, a link or special file, the current directory or an ancestor of it."""
    st = check_not_special(target)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise RefusedTarget(f"output {target} exists and is not a directory",
                         hint="name a new or an empty directory")
    real = Path(os.path.realpath(target))
    cwd = Path(os.path.realpath(os.getcwd()))
    if real == cwd or real in cwd.parents:
        what = "the current directory" if real == cwd else "an ancestor of the current directory"
        raise RefusedTarget(f"refusing to replace {target}: it is {what}",
                         hint="name a new subdirectory, e.g. -o out")


def written_by_envbuild(target: Path) -> bool:
    """Whether ``target`` is a directory envbuild wrote (it holds a regular ``MARKER``)."""
    try:
        return stat.S_ISREG(os.lstat(Path(target) / MARKER).st_mode)
    except OSError:
        return False


def write_file(path: Path, data: bytes, *, mode: int = FILE_MODE, sync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it: complete or untouched.
    Anything at ``path`` but a regular file is refused (UsageError), never replaced."""
    path = Path(path)
    check_file_target(path)
    tmp = _temporary_beside(path, data, mode=mode, sync=sync)
    try:
        check_file_target(path)  # again: the slow write left time for the path to change
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _naming(exc, path) from None


def write_tree(files: Mapping[str, FileData], target: Path) -> None:
    """Make ``target`` a directory holding exactly ``files`` (relative names) and
    ``MARKER``, atomically: the new tree is assembled beside it and swapped in; an existing
    ``target`` is replaced as a whole (moved aside, the new one renamed in, the old one
    removed). Callers decide whether replacing is allowed at all; whatever they decide, only
    an empty directory or one envbuild wrote is replaced (see ``check_tree_target``)."""
    target = Path(os.path.abspath(target))  # not resolved: a link at the end is refused, not followed
    check_tree_target(target)
    if target.is_dir() and any(target.iterdir()) and not written_by_envbuild(target):
        raise RefusedTarget(f"refusing to replace {target}: envbuild did not write it (no {MARKER} in it)",
                         hint="--force replaces only directories envbuild wrote; "
                              "choose a new directory or empty this one yourself")
    if MARKER in files:
        raise ValueError(f"{MARKER} is written by write_tree, not by its callers")
    try:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    except OSError as exc:
        raise UnwritableDirectory(exc.errno, exc.strerror, str(target.parent)) from None
    current = target
    try:
        for name, data in files.items():
            current = target / name
            dest = tmp / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, Path):
                _copy_regular(data, dest)
            else:
                dest.write_bytes(data)
            os.chmod(dest, FILE_MODE)
        (tmp / MARKER).write_bytes(MARKER_TEXT)
        os.chmod(tmp / MARKER, FILE_MODE)
        os.chmod(tmp, DIR_MODE)  # mkdtemp's 0700 would surprise whoever builds from it
        current = target
        _swap_in(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _naming(exc, current) from None


def _copy_regular(source: Path, dest: Path) -> None:
    """Copy ``source`` only if it is itself a regular file (see confine.open_regular): a link
    swapped in after render checked it could pull any file into the output, a FIFO hang it,
    /dev/zero fill the disk."""
    from envbuild.confine import WHEEL_LIMIT, open_regular

    fd = open_regular(source, str(source), limit=WHEEL_LIMIT)
    with os.fdopen(fd, "rb") as handle, open(dest, "wb") as out:
        shutil.copyfileobj(handle, out, 1024 * 1024)


def _swap_in(tmp: Path, target: Path) -> None:
    check_tree_target(target)  # again, just before the swap
    if not os.path.lexists(target):
        os.replace(tmp, target)
        return
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
    os.rmdir(old)
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def replace_files(files: Mapping[Path, bytes]) -> None:
    """Replace every file of ``files`` as one: afterwards all hold their new bytes, or (on any
    failure: a full disk, a refused target, Ctrl-C, SIGTERM) all are as they were before,
    files that did not exist gone again. What ``lock`` writes (the pylock files and the lock
    that records their sha256) is such a set: a new pylock beside the old lock would break it.

    Each new file is written and synced under a temporary name first, and each existing one
    kept by a hard link (a copy where links are not possible); only then are the new files
    renamed in, in the order given (callers put the file that names the others last). A
    failure between two renames puts every kept file back, with the signals that end a
    command (SIGINT, SIGTERM, SIGHUP) held until that is done. Only a SIGKILL or a crash
    between the renames can leave a mix, which the lock's recorded sha256 then reveals."""
    remove_leftovers(Path(p) for p in files)
    staged: list[_Staged] = []
    current = Path()
    try:
        for path, data in files.items():
            staged.append(_stage(Path(path), data))
        for item in staged:
            current = item.target
            check_file_target(item.target)  # again: the slow writes left time for a path to change
            os.replace(item.tmp, item.target)
    except BaseException as exc:
        with _signals_held():
            for item in reversed(staged):
                item.roll_back()
        raise _naming(exc, current) from None
    with _signals_held():
        for item in staged:
            item.discard_backup()


def remove_leftovers(paths: Iterable[Path]) -> None:
    """Remove what a SIGKILL during an earlier ``replace_files`` of ``paths`` left beside them:
    its hidden temporary files (``.NAME.XXXXXXXX.tmp``, mkstemp's eight characters) and their
    kept old bytes (``….tmp.old``). Regular files of exactly those names only."""
    import re

    for path in paths:
        pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp(?:\.old)?", re.ASCII)
        with contextlib.suppress(OSError):
            for entry in os.scandir(path.parent):
                if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


class _Staged:
    """One file of ``replace_files``: its new bytes under ``tmp``, its old ones (if any)
    under ``backup``."""

    def __init__(self, target: Path, tmp: Path) -> None:
        self.target, self.tmp = target, tmp
        self.tmp_inode = os.lstat(tmp).st_ino
        self.backup: Path | None = None

    def keep_old(self) -> None:
        if not os.path.lexists(self.target):
            return
        backup = Path(f"{self.tmp}.old")
        try:
            os.link(self.target, backup)
        except OSError:  # no hard links here: a copy keeps the old bytes as well
            shutil.copy2(self.target, backup)
        self.backup = backup

    def roll_back(self) -> None:
        """The target as it was: its kept bytes renamed back, or the new file removed."""
        with contextlib.suppress(OSError):
            if self.backup is not None:
                os.replace(self.backup, self.target)  # a no-op (links to one file) if not yet renamed
            elif os.lstat(self.target).st_ino == self.tmp_inode:
                os.unlink(self.target)
        self.discard_backup()
        self.tmp.unlink(missing_ok=True)

    def discard_backup(self) -> None:
        if self.backup is not None:
            self.backup.unlink(missing_ok=True)


def _temporary_beside(path: Path, data: bytes, *, mode: int, sync: bool) -> str:
    """``data`` in a new temporary file beside ``path`` (its name hidden, ``.NAME.*.tmp``), chmod
    ``mode`` (mkstemp's 0600 is not what a reader of the output expects), synced when ``sync``;
    its name. Nothing is left behind when the write fails."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UnwritableDirectory(exc.errno, exc.strerror, str(path.parent)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _naming(exc, path) from None
    return tmp


def _stage(path: Path, data: bytes) -> _Staged:
    """``data`` written and synced beside ``path`` under a temporary name, 0644; the old file kept."""
    check_file_target(path)
    tmp = _temporary_beside(path, data, mode=FILE_MODE, sync=True)
    try:
        item = _Staged(path, Path(tmp))
        item.keep_old()
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        Path(f"{tmp}.old").unlink(missing_ok=True)
        raise _naming(exc, path) from None
    return item


def _naming(exc: BaseException, path: Path) -> BaseException:
    """``exc``, an OSError that names no file (a full disk while writing) given ``path`` as
    its file name, so that the one-line error says which file could not be written."""
    if type(exc).__module__ != "builtins" or not isinstance(exc, OSError) or exc.filename is not None \
            or exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror, str(path))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP (delivered once the block ends) in the main thread."""
    import signal
    import threading

    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
