"""Load and validate the compatibility data in ``matrices/``.

One YAML file per relation; every row carries ``source`` and ``retrieved``. The loader
checks each field's type, parses versions once, checks references across files, and
reports *every* problem with its file and row in one ``DataError``. Results are cached
per directory, and a cache of the parsed rows keyed by the files' sha256 (each file's sha256
kept by its identity) keeps the CLI's start fast.

``envbuild resolve`` imports this module on its start-up path (held to 2x a bare
interpreter's start), so it imports nothing heavy at load: hashlib, json, pathlib and the
errors come in where they are used.
"""

from __future__ import annotations

import os

from envbuild.data.relations import MANIFEST as MANIFEST
from envbuild.data.relations import NOT_RESOLVED
from envbuild.data.relations import RELATIONS as RELATIONS
from envbuild.data.relations import Row as Row

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import Any

CACHE_FORMAT = 1
JOURNAL = ".refresh-journal.json"  # upstream/journal.py's commit point
LOCK_TIMEOUT_S = 30.0
SETTLE_S = 5.0
_HELD: dict[tuple[str, int], int] = {}  # (lock path, thread) -> depth, for re-entry

class Matrix:
    """All relations, as validated rows (plain mappings; see ``matrices/README.md``).

    Rows stay mappings because the resolver reads a handful of fields from each and
    the CLI's start-up must stay cheap; typed views live in ``envbuild.resolve``.
    A frozen value written by hand (no dataclasses import on the start-up path);
    ``derived`` holds what is computed from it once, such as the resolver's index.
    """

    __slots__ = ("derived", "digest", "directory", "relations")
    directory: Path
    relations: Mapping[str, tuple[Row, ...]]
    digest: str
    derived: dict[str, Any]

    def __init__(self, *, directory: Path, relations: Mapping[str, tuple[Row, ...]],
                 digest: str = "") -> None:
        object.__setattr__(self, "directory", directory)
        object.__setattr__(self, "relations", relations)
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "derived", {})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Matrix):
            return NotImplemented
        return (self.directory, self.relations, self.digest) == (
            other.directory, other.relations, other.digest)

    __hash__ = None  # type: ignore[assignment]  # its relations are dicts, as before

    def __repr__(self) -> str:
        return f"Matrix(directory={self.directory!r}, digest={self.digest!r})"

    def rows(self, relation: str) -> tuple[Row, ...]:
        return self.relations.get(relation, ())


def default_directory(env: Mapping[str, str]) -> Path:
    """``ENVBUILD_MATRICES``, else the copy inside the installed package, else the repo's."""
    from pathlib import Path

    return Path(default_directory_name(env))


def default_directory_name(env: Mapping[str, str]) -> str:
    """``default_directory`` as a string, without importing pathlib."""
    if env.get("ENVBUILD_MATRICES"):
        return env["ENVBUILD_MATRICES"]
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the envbuild package
    packaged = os.path.join(here, "matrices")
    if os.path.isdir(packaged):
        return packaged
    return os.path.join(os.path.dirname(here), "matrices")


class _Loader:
    """``load``, memoised per (directory, cache_dir) like ``functools.cache`` did."""

    def __init__(self) -> None:
        self._done: dict[tuple[Path, Path | None], Matrix] = {}

    def __call__(self, directory: Path, *, cache_dir: Path | None = None) -> Matrix:
        """Load and validate ``directory``; cached per process, and on disk by content digest."""
        key = (directory, cache_dir)
        if key not in self._done:
            self._done[key] = _load(directory, cache_dir)
        return self._done[key]

    def cache_clear(self) -> None:
        self._done.clear()


load = _Loader()


def _load(directory: Path, cache_dir: Path | None) -> Matrix:
    directory = directory.resolve()
    if not directory.is_dir():
        from envbuild.errors import UsageError

        raise UsageError(f"matrices directory not found: {directory}",
                         hint="point --matrices or ENVBUILD_MATRICES at a copy of matrices/")
    files = None
    remembered = _remembered_digests(directory, cache_dir)
    if remembered is None:
        files, remembered = _read_and_remember(directory, cache_dir)
    key, digest = remembered  # the cache's (every file), the resolved data's
    relations = _read_rows_cache(cache_dir, key)
    if relations is None:
        from envbuild.data.validate import parse_all  # only on a cache miss: regexes and yaml

        if files is None:
            files, (key, digest) = _read_and_remember(directory, cache_dir)
        relations = parse_all(files)
        _write_rows_cache(cache_dir, key, relations)
    loaded = Matrix(directory=directory, relations=relations, digest=digest)
    if cache_dir is not None:  # where the resolver's index of these files may be kept (resolver/index.py)
        loaded.derived["cache"] = (str(cache_dir), key)
    return loaded


def _read_files(directory: Path) -> dict[str, bytes]:
    files = {}
    for name in RELATIONS:
        path = directory / f"{name}.yaml"
        if path.is_file():
            files[name] = path.read_bytes()
    manifest = directory / MANIFEST
    if manifest.is_file():
        files[MANIFEST] = manifest.read_bytes()
    return files


def _digests(hashes: Mapping[str, bytes]) -> tuple[str, str]:
    """(the digest of every data file, the digest of those the resolver reads), from each
    file's sha256."""
    return _digest(hashes), _digest({name: h for name, h in hashes.items() if name not in NOT_RESOLVED})


def _digest(hashes: Mapping[str, bytes]) -> str:
    """One digest of the data files, from each one's sha256 (``_hashes``)."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(hashes):
        h.update(name.encode() + b"\0" + hashes[name])
    return h.hexdigest()


def _hashes(files: Mapping[str, bytes]) -> dict[str, bytes]:
    import hashlib

    return {name: hashlib.sha256(data).digest() for name, data in files.items()}


# --- the files' sha256 remembered by their identity -----------------------------------------
# Reading and hashing 1.2 MB of data files (twice: the manifest's check, the cache's key) was
# ~5 ms of every command that loads the matrices. Each file's sha256 is kept in the cache beside
# its identity (device, inode, size, modification and change times: any write changes one; a
# refresh replaces files by renaming), taken before and after the read that hashed it and
# checked against the manifest: while every identity is the same, the same bytes are there and
# were found whole. resolver/index.py keeps its index by the same identities.


def file_identity(path: str) -> tuple[int, ...] | None:
    """A file's identity (mode, device, inode, size, modification and change times: any write
    changes one); None where it cannot be had. The resolver's kept index is keyed by it too."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _identities(directory: Path) -> dict[str, tuple[int, ...] | None]:
    """Each data file's identity (None: absent, as ``_read_files`` reads it)."""
    return {name: file_identity(os.path.join(directory, name if name == MANIFEST else f"{name}.yaml"))
            for name in (*RELATIONS, MANIFEST)}


def _kept_hashes_file(cache_dir: Path) -> str:
    import sys

    return os.path.join(cache_dir, f"matrix-files.{sys.implementation.cache_tag or 'py'}.marshal")


def _remembered_digests(directory: Path, cache_dir: Path | None) -> tuple[str, str] | None:
    """The data files' digests (:func:`_digests`) as kept when ``directory``'s files were last
    read whole (no hashing, no hashlib: ~4 ms of every command's start); None unless every
    file's identity is still the one kept."""
    if cache_dir is None:
        return None
    import marshal

    try:
        with open(_kept_hashes_file(cache_dir), "rb") as handle:
            kept = marshal.loads(handle.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not (isinstance(kept, dict) and kept.get("format") == CACHE_FORMAT
            and kept.get("directory") == str(directory)):
        return None
    identities, digests = kept.get("identities"), kept.get("digests")
    if identities != _identities(directory) or not (
            isinstance(digests, tuple) and len(digests) == 2 and all(isinstance(d, str) for d in digests)):
        return None
    return digests[0], digests[1]


def _read_and_remember(directory: Path, cache_dir: Path | None) -> tuple[dict[str, bytes], tuple[str, str]]:
    """The data files (checked against the manifest) and their digests (:func:`_digests`), kept
    in the cache where no file changed while they were read."""
    before = _identities(directory)
    files = _settled_files(directory)
    digests = _digests(_hashes(files))
    if cache_dir is not None and _identities(directory) == before:
        import marshal
        from pathlib import Path

        from envbuild.errors import UsageError
        from envbuild.fs import write_file

        body = marshal.dumps({"format": CACHE_FORMAT, "directory": str(directory),
                              "identities": before, "digests": digests})
        try:
            os.makedirs(cache_dir, exist_ok=True)
            write_file(Path(_kept_hashes_file(cache_dir)), body, sync=False)
        except (OSError, UsageError):
            pass  # a cache is an optimisation: an unwritable home must not fail a command
    return files, digests


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every relation file present, for the manifest."""
    import hashlib

    return {
        f"{name}.yaml": hashlib.sha256(data).hexdigest()
        for name, data in _read_files(directory).items()
        if name != MANIFEST
    }


def manifest_body(directory: Path) -> bytes:
    """The manifest for the files in ``directory`` now (the caller holds the lock)."""
    import json

    return (json.dumps({"files": file_hashes(directory)}, indent=2, sort_keys=True) + "\n").encode()


def write_manifest(directory: Path, *, timeout_s: float = LOCK_TIMEOUT_S) -> Path:
    """Record each data file's sha256 so corruption is caught at load (atomic, under the lock).

    Under ``lock`` no refresh can move files between the hashing and the write, which
    would leave a manifest that no longer matches (every later load: "data corrupt").
    """
    from envbuild.fs import write_file

    target = directory / MANIFEST
    with lock(directory, timeout_s, reentrant=True):
        write_file(target, manifest_body(directory))
    return target


# --- one lock for every writer of a data directory --------------------------------------
#
# Writers (``matrix refresh``'s commit, ``matrix validate --write-manifest``) hold an
# exclusive ``flock`` on ``lock_path(directory)``. Readers take no lock: a reader whose
# files do not match the manifest while a commit is in progress (journal present or lock
# held by someone else) waits up to SETTLE_S and reads again; see ``_settled_files``.



def lock_path(directory: Path) -> Path:
    """The lock file for ``directory``: in the temporary directory, named by the data
    directory's real path (inside it, the lock would change the data it guards; under the
    cache directory, writers that know no cache would miss it)."""
    import hashlib
    import tempfile
    from pathlib import Path

    name = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"envbuild-matrices-{name}.lock"


def lock(directory: Path, timeout_s: float = LOCK_TIMEOUT_S,
         progress: Callable[[str], None] | None = None, *,
         reentrant: bool = False) -> AbstractContextManager[None]:
    """Exclusive writer lock on ``directory`` (released at exit). ``reentrant``: a step
    inside a writer (commit inside refresh, the manifest inside validate) passes where this
    thread holds it already; otherwise a second writer waits, even in the same thread."""
    import contextlib

    @contextlib.contextmanager
    def held() -> Iterator[None]:
        import fcntl
        import threading
        import time

        from envbuild.errors import DataError

        if not directory.is_dir():
            from envbuild.errors import UsageError

            raise UsageError(f"matrices directory not found: {directory}",
                             hint="point --matrices or ENVBUILD_MATRICES at a copy of matrices/")
        path = lock_path(directory)
        key = (str(path.resolve()), threading.get_ident())
        if reentrant and key in _HELD:
            _HELD[key] += 1
            try:
                yield
            finally:
                _HELD[key] -= 1
            return
        # Read-only is enough for flock, so another user's lock file can be shared;
        # O_NOFOLLOW: a link planted in the shared temporary directory is not followed.
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "rb") as handle:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DataError(f"refresh in progress: another envbuild holds {path}",
                                        hint="wait for it to finish, then run again") from None
                    if progress is not None:
                        progress("waiting for another refresh to finish")
                    time.sleep(0.05)
            _HELD[key] = 1
            try:
                yield
            finally:
                del _HELD[key]
                fcntl.flock(handle, fcntl.LOCK_UN)

    return held()


def _writer_busy(directory: Path) -> bool:
    """A commit may be under way: a journal exists, or another thread or process holds the lock."""
    import fcntl
    import threading

    if (directory / JOURNAL).exists():
        return True
    path = lock_path(directory)
    if (str(path.resolve()), threading.get_ident()) in _HELD:
        return False  # this thread is the writer: nobody else can be committing
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock, if taken
    return False


def _settled_files(directory: Path) -> dict[str, bytes]:
    """The data files, read again while a commit moves them (files and manifest differ briefly)."""
    import time

    from envbuild.errors import DataError

    deadline = None
    while True:
        files = _read_files(directory)
        try:
            _check_manifest(directory, files)
            return files
        except DataError:
            now = time.monotonic()
            if deadline is None:  # one more read always: a commit may have ended between reads
                deadline = now + SETTLE_S
            elif now >= deadline or not _writer_busy(directory):
                raise
            time.sleep(0.02)


def _check_manifest(directory: Path, files: Mapping[str, bytes]) -> None:
    if MANIFEST not in files:
        return
    import hashlib
    import json

    from envbuild.errors import DataError

    try:
        recorded = json.loads(files[MANIFEST])["files"]
    except (ValueError, KeyError, TypeError):
        raise DataError(
            f"data manifest corrupt: {directory / MANIFEST}",
            hint="run 'envbuild matrix validate --write-manifest' or reinstall envbuild",
        ) from None
    for name, expected in sorted(recorded.items()):
        data = files.get(name.removesuffix(".yaml"))
        actual = hashlib.sha256(data).hexdigest() if data is not None else "missing"
        if actual != expected:
            raise DataError(
                f"data file corrupt (sha256 mismatch): {directory / name}",
                hint="run 'envbuild matrix refresh' or reinstall envbuild",
            )


# --- the rows cache: parsed rows keyed by the data's digest ------------------------------


def cache_directory(env: Mapping[str, str]) -> Path | None:
    from pathlib import Path

    name = cache_directory_name(env)
    return Path(name) if name is not None else None


def cache_directory_name(env: Mapping[str, str]) -> str | None:
    """``cache_directory`` as a string, without importing pathlib."""
    if env.get("ENVBUILD_NO_CACHE"):
        return None
    base = env.get("XDG_CACHE_HOME") or (os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
    return os.path.join(base, "envbuild") if base else None


def _rows_cache_file(cache_dir: Path, digest: str) -> Path:
    import sys

    # marshal: read in a fifth of JSON's time (~1 ms against ~4.5 ms for these rows); its
    # format follows the interpreter, hence the tag, as resolver/index.py's kept index.
    return cache_dir / f"matrices-{digest}.{sys.implementation.cache_tag or 'py'}.marshal"


def _read_rows_cache(cache_dir: Path | None, digest: str) -> dict[str, tuple[Row, ...]] | None:
    """The parsed rows kept for the data whose digest is ``digest`` (as JSON gave them back
    when the cache was JSON: lists, not tuples, inside the rows)."""
    if cache_dir is None:
        return None
    import marshal

    try:
        data = marshal.loads(_rows_cache_file(cache_dir, digest).read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(
            data.get("relations"), dict):
        return None
    return {name: tuple(rows) for name, rows in data["relations"].items()}


def _write_rows_cache(
    cache_dir: Path | None, digest: str, relations: Mapping[str, tuple[Row, ...]]
) -> None:
    if cache_dir is None:
        return
    import json
    import marshal

    from envbuild.errors import UsageError
    from envbuild.fs import write_file

    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Through JSON first: the rows read back are what the JSON cache gave (lists inside).
        plain = json.loads(json.dumps(relations))
        body = marshal.dumps({"format": CACHE_FORMAT, "relations": plain})
        # Not synced: a cache lost in a crash is rebuilt from the data.
        write_file(_rows_cache_file(cache_dir, digest), body, sync=False)
    except (OSError, UsageError):
        pass  # a cache is an optimisation; an unwritable home must not fail a resolve
