"""Load and validate the compatibility data in ``matrices/``.

One YAML file per relation; every row carries ``source`` and ``retrieved``. The loader
checks each field's type, parses versions once, checks references across files, and
reports *every* problem with its file and row in one ``DataError``. Results are cached
per directory, and a JSON cache keyed by the files' sha256 keeps the CLI's start fast.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from envbuild.errors import DataError, UsageError

RELATIONS = (
    "cuda_toolkits",
    "cuda_compat",
    "cuda_archs",
    "cuda_ubuntu",
    "cudnn",
    "gpus",
    "gpu_peaks",
    "torch_variants",
    "torch_pypi",
    "torch_companions",
    "cuda_images",
    "ubuntu_python",
)
Row = dict[str, Any]
MANIFEST = "manifest.json"
CACHE_FORMAT = 1

@dataclass(frozen=True, slots=True, kw_only=True)
class Matrix:
    """All relations, as validated rows (plain mappings; see ``matrices/README.md``).

    Rows stay mappings because the resolver reads a handful of fields from each and
    the CLI's start-up must stay cheap; typed views live in ``envbuild.resolve``.
    """

    directory: Path
    relations: Mapping[str, tuple[Row, ...]]
    digest: str = field(default="")

    def rows(self, relation: str) -> tuple[Row, ...]:
        return self.relations.get(relation, ())


def default_directory(env: Mapping[str, str]) -> Path:
    """``ENVBUILD_MATRICES``, else the copy inside the installed package, else the repo's."""
    if env.get("ENVBUILD_MATRICES"):
        return Path(env["ENVBUILD_MATRICES"])
    packaged = Path(__file__).resolve().parent / "matrices"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "matrices"


@cache
def load(directory: Path, *, cache_dir: Path | None = None) -> Matrix:
    """Load and validate ``directory``; cached per process, and on disk by content digest."""
    directory = directory.resolve()
    if not directory.is_dir():
        raise UsageError(f"matrices directory not found: {directory}",
                         hint="point --matrices or ENVBUILD_MATRICES at a copy of matrices/")
    files = _read_files(directory)
    digest = _digest(files)
    _check_manifest(directory, files)
    relations = _read_json_cache(cache_dir, digest)
    if relations is None:
        from envbuild.validate import parse_all  # only on a cache miss: regexes and yaml

        relations = parse_all(files)
        _write_json_cache(cache_dir, digest, relations)
    return Matrix(directory=directory, relations=relations, digest=digest)


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


def _digest(files: Mapping[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every relation file present, for the manifest."""
    return {
        f"{name}.yaml": hashlib.sha256(data).hexdigest()
        for name, data in _read_files(directory).items()
        if name != MANIFEST
    }


def write_manifest(directory: Path) -> Path:
    """Record each data file's sha256 so corruption is caught at load (atomic write)."""
    body = json.dumps({"files": file_hashes(directory)}, indent=2, sort_keys=True) + "\n"
    target = directory / MANIFEST
    tmp = target.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, target)
    return target


def _check_manifest(directory: Path, files: Mapping[str, bytes]) -> None:
    if MANIFEST not in files:
        return
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


# --- JSON cache: parsed rows keyed by the data's digest ---------------------------------


def cache_directory(env: Mapping[str, str]) -> Path | None:
    if env.get("ENVBUILD_NO_CACHE"):
        return None
    base = env.get("XDG_CACHE_HOME") or (Path(env["HOME"]) / ".cache" if env.get("HOME") else None)
    return Path(base) / "envbuild" if base else None


def _read_json_cache(cache_dir: Path | None, digest: str) -> dict[str, tuple[Row, ...]] | None:
    if cache_dir is None:
        return None
    try:
        data = json.loads((cache_dir / f"matrices-{digest}.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return None
    return {name: tuple(rows) for name, rows in data["relations"].items()}


def _write_json_cache(
    cache_dir: Path | None, digest: str, relations: Mapping[str, tuple[Row, ...]]
) -> None:
    if cache_dir is None:
        return
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        target = cache_dir / f"matrices-{digest}.json"
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "relations": relations}))
        os.replace(tmp, target)
    except OSError:
        pass  # a cache is an optimisation; an unwritable home must not fail a resolve
