"""The built extension wheels' sha256, recorded beside the lock (``envbuild.built.json``).

An extension's wheel exists only once the image is built, after ``lock`` wrote the lock, so its
sha256 cannot be in the lock (which the image carries). ``build`` records it in a sidecar
instead, keyed by what the wheel was built from (:class:`BuildKey`: the source's sha256, torch,
CUDA, the arch list and the CPython), and written atomically (:mod:`envbuild.fs`). A later
render of the same key hands the recorded sha256 to the build stage, which checks the wheel it
built against it (``sha256sum -c``): a rebuild with other bytes fails the build (exit 6), never
replacing the record silently; ``build --accept-rebuilt`` records the new wheel instead, saying
so. Docker's layer cache is what reuses a build.

The file may come from a pull request: it is read confined, size-capped, every value checked
(names, sha256s, wheel names a build context can carry), and no error quotes its content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from envbuild.confine import CANONICAL_NAME, quoted, read_confined, token
from envbuild.errors import BuildFailed, UsageError

FILE = "envbuild.built.json"
SCHEMA = "envbuild.built/1"
LIMIT = 1024 * 1024
_SHA = re.compile(r"[0-9a-f]{64}", re.ASCII)
_VERSION = re.compile(r"[A-Za-z0-9.+_!-]{1,64}", re.ASCII)
_CUDA = re.compile(r"\d{1,3}\.\d{1,3}", re.ASCII)
_ARCHS = re.compile(r"(?:\d{1,3}\.\d{1,2}[af]?(?:;\d{1,3}\.\d{1,2}[af]?)*)?", re.ASCII)
_PYTHON = re.compile(r"3\.\d{1,3}", re.ASCII)
_WHEEL = re.compile(r"[A-Za-z0-9_.+!-]{1,200}\.whl", re.ASCII)
_SUM_LINE = re.compile(r"([0-9a-f]{64}) [ *]([A-Za-z0-9_.+!-]{1,200}\.whl)", re.ASCII)


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class BuildKey:
    """What a built extension wheel depends on: its distribution, the sha256 of its source (a
    local extension's tree, an sdist's file), the lock's torch version, its CUDA (None: cpu),
    ``TORCH_CUDA_ARCH_LIST`` ("" when unset) and the CPython minor version."""

    name: str
    source_sha256: str
    torch: str
    cuda: str | None
    archs: str
    python: str

    def shown(self) -> str:
        return (f"{self.name} (source {self.source_sha256[:12]}, torch {self.torch}, "
                f"{'CUDA ' + self.cuda if self.cuda else 'cpu'}"
                f"{', archs ' + self.archs if self.archs else ''}, Python {self.python})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    """One recorded wheel: its file name and sha256, for ``key``."""

    key: BuildKey
    wheel: str
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.key), "wheel": self.wheel, "sha256": self.sha256}


Record = dict[BuildKey, Built]


def record_path(lock_dir: Path) -> Path:
    return lock_dir / FILE


def _check(value: Any, pattern: re.Pattern[str], where: str, *, optional: bool = False) -> Any:
    if optional and value is None:
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UsageError(f"{FILE}: {where}: missing or not of its form",
                         hint=f"remove {FILE} (build writes it again) or restore it from version control")
    return value


def _entry(raw: Any, where: str) -> Built:
    fields = {"name", "source_sha256", "torch", "cuda", "archs", "python", "wheel", "sha256"}
    if not isinstance(raw, dict) or set(raw) != fields:
        raise UsageError(f"{FILE}: {where}: needs exactly {', '.join(sorted(fields))}",
                         hint=f"remove {FILE} (build writes it again)")
    key = BuildKey(name=_check(raw["name"], CANONICAL_NAME, f"{where}.name"),
                   source_sha256=_check(raw["source_sha256"], _SHA, f"{where}.source_sha256"),
                   torch=_check(raw["torch"], _VERSION, f"{where}.torch"),
                   cuda=_check(raw["cuda"], _CUDA, f"{where}.cuda", optional=True),
                   archs=_check(raw["archs"], _ARCHS, f"{where}.archs"),
                   python=_check(raw["python"], _PYTHON, f"{where}.python"))
    wheel = _check(raw["wheel"], _WHEEL, f"{where}.wheel")
    if _wheel_name(wheel) != key.name:
        raise UsageError(f"{FILE}: {where}.wheel: {quoted(wheel)} is not a wheel of {key.name}")
    return Built(key=key, wheel=wheel, sha256=_check(raw["sha256"], _SHA, f"{where}.sha256"))


def _wheel_name(wheel: str) -> str | None:
    try:
        return str(parse_wheel_filename(wheel)[0])
    except InvalidWheelFilename:
        return None


def parse_record(text: str) -> Record:
    """The record's entries by key; UsageError (exit 2) naming the first bad field."""
    from envbuild.render.lock import load_json

    try:
        data = load_json(text)  # a key twice in one object is refused, never the last one taken
    except ValueError as exc:
        raise UsageError(f"{FILE}: not valid JSON ({exc})",
                         hint=f"remove {FILE} (build writes it again)") from None
    except RecursionError:
        raise UsageError(f"{FILE}: not valid JSON", hint=f"remove {FILE} (build writes it again)") from None
    if not isinstance(data, dict) or set(data) != {"schema", "wheels"} or data["schema"] != SCHEMA \
            or not isinstance(data["wheels"], list):
        raise UsageError(f"{FILE}: not a record of schema {SCHEMA}",
                         hint=f"remove {FILE} (build writes it again)")
    found: Record = {}
    for i, raw in enumerate(data["wheels"]):
        built = _entry(raw, f"wheels[{i}]")
        if built.key in found:
            raise UsageError(f"{FILE}: wheels[{i}]: {built.key.name} is recorded twice for one build key")
        found[built.key] = built
    return found


def read_record(lock_dir: Path) -> Record:
    """The record beside the lock in ``lock_dir``; empty when there is none."""
    text = read_beside(lock_dir, FILE, LIMIT, hint=f"remove {FILE} (build writes it again)")
    return {} if text is None else parse_record(text)


def read_beside(lock_dir: Path, name: str, limit: int, *, hint: str) -> str | None:
    """The text of the record ``name`` a build keeps beside the lock (this one, and
    envbuild/sbom/debs.py's): confined to ``lock_dir``, size-capped, UTF-8; None when absent."""
    path = lock_dir / name
    if not path.exists() and not path.is_symlink():
        return None
    data = read_confined(path, [lock_dir], name, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{name}: not UTF-8 text", hint=hint) from None


def record_text(record: Mapping[BuildKey, Built]) -> str:
    wheels = [record[key].to_json() for key in sorted(record)]
    return json.dumps({"schema": SCHEMA, "wheels": wheels}, indent=2, sort_keys=True) + "\n"


def stage_sums(record: Mapping[BuildKey, Built], keys: Iterable[BuildKey]) -> str:
    """``sha256sum -c`` lines (``HEX  WHEEL``) of the wheels recorded for ``keys``: what the
    build stage checks its newly built wheels against."""
    lines = [f"{record[k].sha256}  {record[k].wheel}\n" for k in sorted(keys) if k in record]
    return "".join(lines)


def parse_sums(text: str) -> dict[str, tuple[str, str]]:
    """{canonical distribution name: (wheel, sha256)} from the image's SHA256SUMS (the stage's
    ``sha256sum`` output); a line of any other form is refused, never quoted."""
    found: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _SUM_LINE.fullmatch(line)
        name = None if match is None else _wheel_name(match[2])
        if match is None or name is None:
            raise BuildFailed(f"the image's extension-wheels.sha256, line {number}, is not a "
                              "sha256sum line of a wheel", hint="build again with --no-cache")
        found[name] = (match[2], match[1])
    return found


def merge(record: Mapping[BuildKey, Built], keys: Iterable[BuildKey],
          sums: Mapping[str, tuple[str, str]]) -> Record:
    """``record`` with each of ``keys`` built as ``sums`` says. A key recorded with another
    sha256 is a BuildFailed (exit 6): the rebuild differs from the recorded build."""
    updated = dict(record)
    for key in sorted(keys):
        entry = sums.get(key.name)
        if entry is None:
            raise BuildFailed(f"the image holds no built wheel of {token(key.name)}",
                              hint="build again with --no-cache")
        wheel, sha256 = entry
        built = Built(key=key, wheel=wheel, sha256=sha256)
        old = updated.get(key)
        if old is not None and (old.sha256, old.wheel) != (sha256, wheel):
            raise mismatch(key, old.sha256, sha256)
        updated[key] = built
    return updated


def mismatch(key: BuildKey, recorded: str, built: str) -> BuildFailed:
    return BuildFailed(f"the wheel built for {key.shown()} has sha256 {built[:16]}…, but {FILE} "
                       f"records {recorded[:16]}… for the same build key",
                       hint="compilers are not always bit-reproducible (another g++ or base layer): to "
                            "record the new wheel, build again with --accept-rebuilt")
