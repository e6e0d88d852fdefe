"""``envbuild.lock``: one resolved stack plus the render options, as deterministic JSON.

The lock is the single input of every renderer: re-rendering from a lock gives the same
bytes. It is also read back by the smoke test inside the image (``schema``, ``stack``
and ``packages`` are the keys it compares), so those names are part of its format.
Every string that reaches a rendered file is validated again when a lock is read, so a
hand-edited lock cannot inject an instruction either.

Format (schema 1, JSON object, keys sorted):
  schema            1
  stack             the resolver's Stack fields (see ``envbuild.resolve.Stack``)
  packages          exact pins: {"torch": "2.4.1+cu121", "torchvision": ..., "torchaudio": ...}
  index_url         the wheel index torch is installed from; null = pip's configured index
  base_image        the FROM reference (tag, and ``@sha256:...`` when given)
  base_digest       the digest part of base_image, or null
  flavor            runtime | devel
  python_provision  "distro" (Ubuntu's python3 is the stack's Python) | "standalone"
  python_standalone {"url": ..., "sha256": ...} for standalone, else null
  matrices_digest   sha256 over the compatibility data the stack was resolved from
  apt_packages, pip_packages, env, user   the extra render options
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from envbuild.errors import UsageError
from envbuild.matrix import Matrix
from envbuild.resolve import Stack

SCHEMA = 1
TORCH_PACKAGES = ("torch", "torchvision", "torchaudio")
_VERSION_RE = re.compile(r"[0-9]+(?:\.[0-9]+){0,3}", re.ASCII)
_LOCAL_RE = re.compile(r"cpu|cu[0-9]{3,4}|rocm[0-9.]+", re.ASCII)
_VARIANT_RE = re.compile(r"cpu|default|cu[0-9]{3,4}", re.ASCII)
_UBUNTU_RE = re.compile(r"[0-9]{2}\.[0-9]{2}", re.ASCII)
_PYTHON_RE = re.compile(r"3\.[0-9]{1,2}t?", re.ASCII)
_ARCH_RE = re.compile(r"sm_[0-9]{2,3}[a-z]?|compute_[0-9]{2,3}[a-z]?", re.ASCII)


@dataclass(frozen=True, slots=True, kw_only=True)
class Standalone:
    """A pinned standalone CPython build (an ``install_only`` tarball) and its sha256."""

    url: str
    sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Lock:
    stack: Stack
    packages: Mapping[str, str]
    index_url: str | None
    base_image: str
    base_digest: str | None
    flavor: str
    python_provision: str  # "distro" | "standalone"
    python_standalone: Standalone | None
    matrices_digest: str
    apt_packages: tuple[str, ...] = ()
    pip_packages: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str = "envbuild"

    def to_json(self) -> str:
        data = {
            "schema": SCHEMA,
            "stack": self.stack.to_json(),
            "packages": dict(self.packages),
            "index_url": self.index_url,
            "base_image": self.base_image,
            "base_digest": self.base_digest,
            "flavor": self.flavor,
            "python_provision": self.python_provision,
            "python_standalone": None if self.python_standalone is None else {
                "url": self.python_standalone.url, "sha256": self.python_standalone.sha256},
            "matrices_digest": self.matrices_digest,
            "apt_packages": list(self.apt_packages),
            "pip_packages": list(self.pip_packages),
            "env": [[k, v] for k, v in self.env],
            "user": self.user,
        }
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def distro_python(matrix: Matrix, ubuntu: str) -> str | None:
    """The python3 minor version Ubuntu ``ubuntu`` ships (ubuntu_python.yaml)."""
    for row in matrix.rows("ubuntu_python"):
        if str(row["ubuntu"]) == ubuntu:
            return str(row["python"])
    return None


def pins(stack: Stack) -> dict[str, str]:
    """Exact pins. Wheels from PyTorch's own indexes carry the variant as a local tag
    (2.4.1+cu121); the package index's default wheel (no stack index) carries none."""
    local = "" if stack.index_url is None or stack.variant == "default" else f"+{stack.variant}"
    versions = {"torch": stack.torch, "torchvision": stack.torchvision,
                "torchaudio": stack.torchaudio}
    return {name: f"{v}{local}" for name, v in versions.items() if v is not None}


def make_lock(
    stack: Stack,
    matrix: Matrix,
    *,
    base_image: str | None = None,
    index_url: str | None = None,
    python_standalone: Standalone | None = None,
    apt_packages: Sequence[str] = (),
    pip_packages: Sequence[str] = (),
    env: Sequence[tuple[str, str]] = (),
    user: str = "envbuild",
) -> Lock:
    """Validate the options and freeze them with ``stack`` (overrides win over the stack)."""
    image = check_image_reference(base_image if base_image is not None else stack.base_image,
                                   "--base-image")
    provision = "distro" if distro_python(matrix, stack.ubuntu) == stack.python else "standalone"
    if provision == "standalone" and python_standalone is None:
        raise UsageError(
            f"Python {stack.python} is not Ubuntu {stack.ubuntu}'s python3, and no standalone "
            "build was given",
            hint="pass --python-url URL --python-sha256 HEX (a python-build-standalone "
                 "install_only tarball for this Python), or choose the distro's --python")
    lock = Lock(
        stack=stack,
        packages=pins(stack),
        index_url=index_url if index_url is not None else stack.index_url,
        base_image=image,
        base_digest=image.split("@", 1)[1] if "@" in image else None,
        flavor=stack.flavor,
        python_provision=provision,
        python_standalone=python_standalone if provision == "standalone" else None,
        matrices_digest=matrix.digest,
        apt_packages=tuple(sorted(set(apt_packages))),
        pip_packages=tuple(sorted(set(pip_packages))),
        env=tuple(sorted(dict(env).items())),
        user=user,
    )
    check_lock(lock)
    return lock


def check_lock(lock: Lock) -> None:
    """Every string that reaches a rendered file, checked (UsageError names the field)."""
    s = lock.stack
    for name, value in (("torch", s.torch), ("torchvision", s.torchvision),
                        ("torchaudio", s.torchaudio)):
        if value is not None and not _VERSION_RE.fullmatch(value):
            raise UsageError(f"invalid {name} version {value!r} in the lock")
    for name, value in (("cuda", s.cuda), ("cudnn", s.cudnn), ("nccl", s.nccl),
                        ("base_cuda", s.base_cuda), ("min_driver", s.min_driver)):
        if value is not None and not _VERSION_RE.fullmatch(value):
            raise UsageError(f"invalid {name} version {value!r} in the lock")
    _match(_VARIANT_RE, s.variant, "variant")
    _match(_PYTHON_RE, s.python, "python")
    _match(_UBUNTU_RE, s.ubuntu, "ubuntu")
    for arch in s.arch_list:
        _match(_ARCH_RE, arch, "arch_list")
    if lock.flavor not in ("runtime", "devel") or s.flavor != lock.flavor:
        raise UsageError(f"invalid flavor {lock.flavor!r} in the lock")
    if s.compat not in (None, "native", "minor-version", "forward"):
        raise UsageError(f"invalid compat {s.compat!r} in the lock")
    if lock.python_provision not in ("distro", "standalone") or (
            (lock.python_provision == "standalone") != (lock.python_standalone is not None)):
        raise UsageError("invalid python_provision in the lock")
    if lock.python_standalone is not None:
        check_url(lock.python_standalone.url, "--python-url")
        check_sha256(lock.python_standalone.sha256, "--python-sha256")
    if lock.packages != pins(s):
        raise UsageError("lock packages do not match its stack", hint="re-create the lock")
    check_image_reference(lock.base_image, "base_image")
    if lock.base_digest != (lock.base_image.split("@", 1)[1] if "@" in lock.base_image else None):
        raise UsageError("lock base_digest does not match base_image")
    if lock.index_url is not None:
        check_url(lock.index_url, "--index-url")
    if not re.fullmatch(r"[0-9a-f]{64}|", lock.matrices_digest):
        raise UsageError("invalid matrices_digest in the lock")
    for apt in lock.apt_packages:
        check_debian_package(apt, "--apt-package")
    for pip in lock.pip_packages:
        check_pip_requirement(pip, "--pip-package")
    for key, value in lock.env:
        check_env_pair(f"{key}={value}", "--env")
    check_user_name(lock.user, "--user")


def _match(pattern: re.Pattern[str], value: str, name: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UsageError(f"invalid {name} {value!r} in the lock")


def from_json(text: str) -> Lock:
    """Parse and validate a lock; any problem is a UsageError (exit 2)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise UsageError(f"not an envbuild lock of schema {SCHEMA}")
        lock = _from_mapping(data)
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"invalid lock: {type(exc).__name__}: {exc}",
                         hint="re-create it with 'envbuild lock'") from None
    check_lock(lock)
    return lock


def _from_mapping(data: Mapping[str, Any]) -> Lock:
    raw = data["stack"]
    names = {f.name for f in fields(Stack)}
    if not isinstance(raw, dict) or set(raw) != names:
        raise UsageError("lock 'stack' has missing or unknown fields")
    stack = Stack(**{**raw, "arch_list": tuple(_strings(raw["arch_list"])),
                     "notes": tuple(_strings(raw["notes"]))})
    standalone = data["python_standalone"]
    env = data["env"]
    if not isinstance(env, list) or any(not isinstance(p, list) or len(p) != 2 for p in env):
        raise UsageError("lock 'env' must be a list of [KEY, VALUE] pairs")
    lock = Lock(
        stack=stack,
        packages=dict(data["packages"]),
        index_url=_optional_str(data["index_url"]),
        base_image=str(data["base_image"]),
        base_digest=_optional_str(data["base_digest"]),
        flavor=str(data["flavor"]),
        python_provision=str(data["python_provision"]),
        python_standalone=None if standalone is None else Standalone(
            url=str(standalone["url"]), sha256=str(standalone["sha256"])),
        matrices_digest=str(data["matrices_digest"]),
        apt_packages=tuple(_strings(data["apt_packages"])),
        pip_packages=tuple(_strings(data["pip_packages"])),
        env=tuple((str(k), str(v)) for k, v in env),
        user=str(data["user"]),
    )
    for name, value in (("torch", stack.torch), ("variant", stack.variant),
                        ("python", stack.python), ("ubuntu", stack.ubuntu)):
        if not isinstance(value, str):
            raise UsageError(f"lock stack {name} must be a string")
    return lock


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError("expected a list of strings in the lock")
    return value


def _optional_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise UsageError("expected a string or null in the lock")
    return value


def read_lock(path: Path) -> Lock:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read lock {path}: {exc}") from None
    return from_json(text)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it: complete or untouched."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- validators for user values: each raises UsageError naming the field ---------------

_BAD_CHARS = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*" \
          r"(?::[0-9]{1,5})?/)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"(?P<name>{_DOMAIN}{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>.*))?", re.ASCII)
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
_DEBIAN_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+(?:=[0-9A-Za-z.+~:-]+)?", re.ASCII)
_PIP_RE = re.compile(r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
                     r"(?:==(?P<version>[0-9][0-9A-Za-z.+!_-]*))?", re.ASCII)
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}", re.ASCII)
# No quotes, spaces, ';', '&', '$', backticks or '?': an URL lands in a shell command line.
_URL_RE = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%+=,/-]*)?", re.ASCII)


def _printable(value: str, field: str) -> None:
    if _BAD_CHARS.search(value):
        raise UsageError(f"invalid {field} {value!r}: control characters and line breaks are "
                         "not allowed")


def check_image_reference(value: str, field: str) -> str:
    """``[registry[:port]/]name[:tag][@sha256:<64 hex>]`` with a tag or a digest, never latest."""
    _printable(value, field)
    match = _IMAGE_RE.fullmatch(value)
    if match is None or len(match.group("name")) > 255:
        raise UsageError(f"invalid image reference {value!r} ({field})",
                         hint="write [registry/]name:tag or name@sha256:<64 hex>, lowercase name")
    digest, tag = match.group("digest"), match.group("tag")
    if digest is not None and not _DIGEST_RE.fullmatch(digest):
        raise UsageError(f"invalid image reference {value!r} ({field}): digest must be "
                         "sha256:<64 hex>")
    if digest is None and tag in (None, "latest"):
        raise UsageError(f"image reference {value!r} ({field}) is not pinned",
                         hint="name an exact tag (not latest) or a sha256 digest")
    return value


def check_url(value: str, field: str) -> str:
    _printable(value, field)
    if "@" in value:
        raise UsageError(f"invalid URL {value!r} ({field}): credentials would be baked into "
                         "the image", hint="give pip credentials through pip.conf or netrc")
    if not _URL_RE.fullmatch(value):
        raise UsageError(f"invalid URL {value!r} ({field})",
                         hint="http(s)://host[:port]/path without spaces, quotes or queries")
    return value


def check_sha256(value: str, field: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise UsageError(f"invalid sha256 {value!r} ({field})", hint="64 lowercase hex digits")
    return value


def check_debian_package(value: str, field: str) -> str:
    _printable(value, field)
    if not _DEBIAN_RE.fullmatch(value) or "--" in value:
        raise UsageError(f"invalid Debian package name {value!r} ({field})",
                         hint="lowercase letters, digits, + - . (name or name=version)")
    return value


def check_pip_requirement(value: str, field: str) -> str:
    _printable(value, field)
    match = _PIP_RE.fullmatch(value)
    if match is None or "--" in value:
        raise UsageError(f"invalid pip requirement {value!r} ({field})",
                         hint="a package name, optionally ==version; options are not allowed")
    name = re.sub(r"[-_.]+", "-", match.group("name")).lower()
    if name in TORCH_PACKAGES:
        raise UsageError(f"{value!r} ({field}) would override the resolved {name} pin",
                         hint="choose torch through the stack selectors (--torch)")
    return value


def check_env_pair(value: str, field: str) -> tuple[str, str]:
    _printable(value, field)
    key, sep, val = value.partition("=")
    if not sep or not _ENV_KEY_RE.fullmatch(key):
        raise UsageError(f"invalid environment pair {value!r} ({field})",
                         hint="KEY=VALUE with KEY matching [A-Za-z_][A-Za-z0-9_]*")
    return key, val


def check_user_name(value: str, field: str) -> str:
    _printable(value, field)
    if not _USER_RE.fullmatch(value) or value == "root":
        raise UsageError(f"invalid user name {value!r} ({field})",
                         hint="a non-root name matching [a-z_][a-z0-9_-]{0,31}")
    return value
