"""Validators for the values a user, a project file or a lock gives (image references, URLs,
sha256s, Debian and pip package names, environment pairs, user names): each returns the
value it accepts or raises UsageError naming the field. Every rendered file (Dockerfile,
shell script, cloud-init YAML, TOML) carries only values these accepted."""

from __future__ import annotations

import re

from envbuild.confine import quoted
from envbuild.errors import UsageError
from envbuild.redact import has_credentials, redact

TORCH_PACKAGES = ("torch", "torchvision", "torchaudio")  # pinned by the stack, never by --pip-package

# Control characters (C0, DEL and C1), line breaks, lone surrogates (a JSON "\\ud800" escape, or an
# argv byte that is not UTF-8) and Unicode's noncharacters (U+FDD0..U+FDEF and the last two code
# points of every plane, U+FFFF among them): no rendered file can carry them. YAML's printable set
# has none of them (cloud-init rejects the user-data), TOML and a Dockerfile none of the controls.
_NONCHARACTERS = "".join(chr(plane * 0x10000 + low) for plane in range(17) for low in (0xFFFE, 0xFFFF))
_BAD_CHARS = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufdd0-\ufdef{_NONCHARACTERS}]")
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*" \
          r"(?::[0-9]{1,5})?/)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"(?P<name>{_DOMAIN}{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>.*))?", re.ASCII)
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
# name[=version]; a version as Debian policy writes it ([epoch:]upstream[-revision], the
# upstream part starting with a digit), so no '~' ever follows '=' or ':' where bash would
# expand it as a home directory (templates quote the value as well).
_DEBIAN_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+(?:=(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*)?", re.ASCII)
_PIP_RE = re.compile(r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
                     r"(?:==(?P<version>[0-9][0-9A-Za-z.+!_-]*))?", re.ASCII)
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}", re.ASCII)
# Users and groups a base image already has, so 'useradd NAME' (which also makes a group
# NAME) would fail late, in the build: Debian's base-passwd (passwd.master, group.master,
# shared by Ubuntu), apt's '_apt', and the 'ubuntu' user and group of Ubuntu 24.04 images.
RESERVED_USERS = frozenset((
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "gnats", "nobody", "_apt", "ubuntu", "adm", "tty", "disk",
    "kmem", "dialout", "fax", "voice", "cdrom", "floppy", "tape", "sudo", "audio", "dip", "operator",
    "src", "shadow", "utmp", "video", "sasl", "plugdev", "staff", "users", "nogroup",
))
# No quotes, spaces, ';', '&', '$', backticks or '?': an URL lands in a shell command line.
_URL_RE = re.compile(r"https?://[A-Za-z0-9.-]+(?::(?P<port>[0-9]{1,5}))?(?:/[A-Za-z0-9._~%+=,/-]*)?",
                     re.ASCII)


def check_printable(value: str, field: str) -> None:
    if _BAD_CHARS.search(value):
        raise UsageError(f"invalid {field} {quoted(value)}: control characters, line breaks, "
                         "undecodable characters and Unicode noncharacters are not allowed",
                         hint="YAML, TOML, a shell script or a Dockerfile cannot carry them")


def check_image_reference(value: str, field: str) -> str:
    """``[registry[:port]/]name[:tag][@sha256:<64 hex>]`` with a tag or a digest, never latest."""
    check_printable(value, field)
    match = _IMAGE_RE.fullmatch(value)
    if match is None or len(match.group("name")) > 255 or not port_ok(_registry_port(match.group("name"))):
        raise UsageError(f"invalid image reference {quoted(value)} ({field})",
                         hint="write [registry/]name:tag or name@sha256:<64 hex>, lowercase name")
    digest, tag = match.group("digest"), match.group("tag")
    if digest is not None and not _DIGEST_RE.fullmatch(digest):
        raise UsageError(f"invalid image reference {quoted(value)} ({field}): digest must be "
                         "sha256:<64 hex>")
    if digest is None and tag in (None, "latest"):
        raise UsageError(f"image reference {quoted(value)} ({field}) is not pinned",
                         hint="name an exact tag (not latest) or a sha256 digest")
    return value


def _registry_port(name: str) -> str | None:
    """The port of an image name's registry (``host:5000/name``), if it names one."""
    first, slash, _ = name.partition("/")
    return first.rpartition(":")[2] if slash and ":" in first else None


def check_url(value: str, field: str) -> str:
    check_printable(value, field)
    if "@" in value:
        raise UsageError(f"invalid URL {quoted(redact(value))} ({field}): credentials would be baked into "
                         "the image", hint="give pip credentials through pip.conf or netrc")
    match = _URL_RE.fullmatch(value)
    if not match:
        raise UsageError(f"invalid URL {quoted(value)} ({field})",
                         hint="http(s)://host[:port]/path without spaces, quotes or queries")
    if not port_ok(match.group("port")):
        raise UsageError(f"invalid URL {quoted(value)} ({field}): a port from 1 to 65535")
    return value


def port_ok(port: str | None) -> bool:
    """A TCP port as a URL or an image reference writes it: none, or 1 to 65535."""
    return port is None or 0 < int(port) <= 65535


def check_sha256(value: str, field: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise UsageError(f"invalid sha256 {quoted(value)} ({field})", hint="64 lowercase hex digits")
    return value


def check_debian_package(value: str, field: str) -> str:
    check_printable(value, field)
    if not _DEBIAN_RE.fullmatch(value) or "--" in value:
        raise UsageError(f"invalid Debian package name {quoted(value)} ({field})",
                         hint="lowercase letters, digits, + - . (name, or name=version with the "
                              "version starting with a digit: [epoch:]version[-revision])")
    return value


def check_pip_requirement(value: str, field: str) -> str:
    check_printable(value, field)
    match = _PIP_RE.fullmatch(value)
    if match is None or "--" in value:
        raise UsageError(f"invalid pip requirement {quoted(value)} ({field})",
                         hint="a package name, optionally ==version; options are not allowed")
    name = re.sub(r"[-_.]+", "-", match.group("name")).lower()
    if name in TORCH_PACKAGES:
        raise UsageError(f"{quoted(value)} ({field}) would override the resolved {name} pin",
                         hint="choose torch through the stack selectors (--torch)")
    return value


def check_env_pair(value: str, field: str) -> tuple[str, str]:
    """``--env KEY=VALUE`` split at its first '=' and checked as ``check_env`` checks it."""
    key, sep, val = value.partition("=")
    if not sep:
        check_printable(key, field)
        raise UsageError(f"invalid environment pair {quoted(value)} ({field})", hint=_ENV_HINT)
    return check_env(key, val, field)


_ENV_HINT = "KEY=VALUE with KEY matching [A-Za-z_][A-Za-z0-9_]*"
_ENV_SECRET_HINT = ("credentials come from the environment of the build or the host (pip.conf, "
                    "netrc, a keyring, Docker's own configuration) when it runs, never from the "
                    "lock: an env value is recorded in it and set as ENV in the image")


def check_env(key: str, value: str, field: str) -> tuple[str, str]:
    """One environment variable an image or host script sets. The key follows the strict
    grammar (a project's ``"A=x y"`` must not become ``A``); nothing in the value that YAML,
    TOML, a shell or a Dockerfile cannot carry; and no credentials (docs/env.md): not under a
    name that says it holds a secret (``is_secret_name``), nor as a URL's ``user:password@``
    or a token in its query. Neither the value nor the key is quoted in that refusal."""
    check_printable(key, f"{field} key")
    if not _ENV_KEY_RE.fullmatch(key):
        raise UsageError(f"invalid environment pair ({field}): the name {quoted(key)} is not a variable name",
                         hint=_ENV_HINT)
    if is_secret_name(key):
        raise UsageError(f"{field} {key}: the name says it holds a secret, which would be "
                         "recorded in the lock and the image", hint=_ENV_SECRET_HINT)
    if has_credentials(value):
        raise UsageError(f"{field} {key}: the value carries credentials (a URL's user:password@ "
                         "or a token in its query), which would be recorded in the lock and the "
                         "image", hint=_ENV_SECRET_HINT)
    check_printable(value, f"{field} {key}")
    return key, value


# Words of a variable name (split at '_', any case) that say its value is a secret; a last word
# KEY after another (API_KEY, ACCESS_KEY, SSH_KEY; not KEY alone) and words ending in TOKEN,
# SECRET or PASSWORD (AUTHTOKEN, CLIENTSECRET) say so too. TOKENIZERS_PARALLELISM does not.
SECRET_WORDS = frozenset({"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD",
                          "PASS", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH",
                          "APIKEY", "COOKIE", "NETRC"})


def is_secret_name(key: str) -> bool:
    """Whether an environment variable named ``key`` holds a secret by its name (docs/env.md)."""
    words = [w for w in key.upper().split("_") if w]
    return bool(words) and ((len(words) > 1 and words[-1] in ("KEY", "KEYS")) or any(
        w in SECRET_WORDS or w.endswith(("TOKEN", "SECRET", "PASSWORD")) for w in words))


def check_user_name(value: str, field: str) -> str:
    check_printable(value, field)
    if not _USER_RE.fullmatch(value) or value == "root":
        raise UsageError(f"invalid user name {quoted(value)} ({field})",
                         hint="a non-root name matching [a-z_][a-z0-9_-]{0,31}")
    if value in RESERVED_USERS:
        raise UsageError(f"user name {quoted(value)} ({field}) already exists in common base images",
                         hint="choose a new name (the default is envbuild); useradd would fail in the build")
    return value
