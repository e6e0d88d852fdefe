"""Which Python package index to read, as pip would: flag, environment, pip's configuration,
pip's default; and what to verify its TLS against."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

from envbuild.errors import DataError

PIP_CONFIG_TIMEOUT_S = 15.0


def index_url(flag: str | None, env: Mapping[str, str]) -> str:
    """The index to read: ``flag``, then PIP_INDEX_URL, then pip's config, then pip's default."""
    candidates: Sequence[tuple[str, Callable[[], str | None]]] = (
        ("--index-url", lambda: flag),
        ("PIP_INDEX_URL", lambda: env.get("PIP_INDEX_URL")),
        ("pip configuration", lambda: pip_config_index_url(env)),
        ("pip's default", pip_default_index_url),
    )
    for origin, candidate in candidates:
        url = (candidate() or "").strip()
        if url:
            return _checked_index_url(url, origin)
    raise DataError(
        "no Python package index configured",
        hint="pass --index-url or set PIP_INDEX_URL",
    )


def _checked_index_url(url: str, origin: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DataError(
            f"index URL {url!r} from {origin} is not an http(s) URL",
            hint="the JSON simple API needs an http(s) index",
        )
    return url


def pip_config_index_url(env: Mapping[str, str]) -> str | None:
    """``index-url`` from pip's configuration files, as pip itself merges them; None if unknown.

    pip is asked (``pip config list``: a second Python importing pip, ~0.3 s of every ``lock``)
    unless no file pip reads could set the key: see :func:`no_file_sets_index_url`."""
    if no_file_sets_index_url(env):
        return None
    command = [sys.executable, "-m", "pip", "config", "list"]
    try:
        done = subprocess.run(
            command,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=PIP_CONFIG_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    values = parse_pip_config_list(done.stdout)
    # pip install reads the [install] section over [global]; do the same.
    return values.get("install.index-url") or values.get("global.index-url")


def pip_config_files(env: Mapping[str, str]) -> list[str] | None:
    """Every file pip's documentation says ``pip config`` reads on Linux and macOS, whether or
    not it exists: PIP_CONFIG_FILE; global (``pip/pip.conf`` in each XDG_CONFIG_DIRS entry,
    /etc/xdg by default, then /etc/pip.conf, and macOS's /Library/Application Support/pip);
    user (~/.pip/pip.conf, $XDG_CONFIG_HOME/pip/pip.conf, macOS's ~/Library/Application
    Support/pip); site (pip.conf in the environment's prefix). None on Windows, whose list is
    not kept here (pip is asked there)."""
    if os.name == "nt":
        return None
    home = env.get("HOME") or os.path.expanduser("~")
    config_home = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    config_dirs = [d for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
    files = [env["PIP_CONFIG_FILE"]] if env.get("PIP_CONFIG_FILE") else []
    files += [os.path.join(d, "pip", "pip.conf") for d in config_dirs]
    files += ["/etc/pip.conf", "/Library/Application Support/pip/pip.conf",
              os.path.join(home, ".pip", "pip.conf"), os.path.join(config_home, "pip", "pip.conf"),
              os.path.join(home, "Library", "Application Support", "pip", "pip.conf"),
              os.path.join(sys.prefix, "pip.conf")]
    return files


# An ``index-url`` key as an INI line starts it (``extra-index-url`` is another key).
_INDEX_KEY = re.compile(rb"^[ \t]*index[-_]url[ \t]*[=:]", re.IGNORECASE | re.MULTILINE)
CONFIG_FILE_LIMIT = 1024 * 1024


def no_file_sets_index_url(env: Mapping[str, str]) -> bool:
    """True when none of :func:`pip_config_files` that exists names an ``index-url`` key in
    any spelling pip accepts (``index_url``, any case): then pip's configuration cannot set
    one and pip need not be asked. False whenever unsure (a file unreadable or over 1 MiB,
    PIP_CONFIG_FILE naming os.devnull is fine: it reads as empty)."""
    files = pip_config_files(env)
    if files is None:
        return False
    for path in files:
        try:
            with open(path, "rb") as handle:
                data = handle.read(CONFIG_FILE_LIMIT + 1)
        except FileNotFoundError:
            continue
        except OSError:  # unreadable (a directory, no permission): pip may see more than we do
            return False
        if len(data) > CONFIG_FILE_LIMIT or _INDEX_KEY.search(data):
            return False
    return True


def parse_pip_config_list(text: str) -> dict[str, str]:
    """Parse ``pip config list`` output: one ``key='value'`` per line (value is a repr)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str):
            values[key.strip()] = value
    return values


def pip_default_index_url() -> str | None:
    """The index pip uses when nothing is configured, read from pip itself (not an API): from
    its source where it is written as pip 20 to 26 write it, else from a second Python that
    imports pip (~0.3 s; pip imported here would be found through the meta-path finders,
    which :func:`_pip_directory` explains this thread must not run). None where unknown."""
    written = _written_default_index_url()
    if written is not None:
        return written
    command = [sys.executable, "-I", "-c",
               "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"]
    try:  # -I: the interpreter's own sys.path, no directory of the caller's, no PYTHON* variable
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_CONFIG_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    url = done.stdout.strip() if done.returncode == 0 else ""
    return url if re.fullmatch(r"https?://\S+", url) else None


# pip's models/index.py: ``PyPI = PackageIndex("https://…/", file_storage_domain=…)``, whose
# ``simple_url`` is ``urljoin(url, "simple")`` (PackageIndex._url_for_path).
_PIP_DEFAULT = re.compile(r'^PyPI = PackageIndex\(\s*"(https://[A-Za-z0-9.-]+/)"', re.MULTILINE)


def _written_default_index_url() -> str | None:
    """pip's default index as its models/index.py writes it, read without importing pip;
    None where the file is not found or not written that way."""
    directory = _pip_directory()
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, "_internal", "models", "index.py"), encoding="utf-8") as handle:
            found = _PIP_DEFAULT.search(handle.read(64 * 1024))
    except (OSError, ValueError):
        return None
    if found is None:
        return None
    from urllib.parse import urljoin

    return urljoin(found[1], "simple")


def _pip_directory() -> str | None:
    """pip's package directory: the first ``sys.path`` directory holding ``pip/__init__.py``,
    as the path finder finds a package, but without the import system. ``lock`` asks this on a
    thread while its main thread imports, and ``importlib.util.find_spec("pip")`` runs every
    meta-path finder under the global import lock; setuptools' ``_distutils_hack`` (installed
    with setuptools) then imports ``traceback`` there on Python 3.11, which deadlocks against
    a main thread importing ``traceback`` (seen here: a lock that hung for good). The working
    directory is not searched: a project's own ``pip/`` must not name the default index."""
    here = os.path.realpath(os.getcwd())
    for entry in sys.path:
        if not entry or not os.path.isabs(entry) or os.path.realpath(entry) == here:
            continue
        directory = os.path.join(entry, "pip")
        if os.path.isfile(os.path.join(directory, "__init__.py")):
            return directory
    return None


def tls_verify(env: Mapping[str, str]) -> str | bool:
    """What to verify TLS against: PIP_CERT, then REQUESTS_CA_BUNDLE, else the default store."""
    return env.get("PIP_CERT") or env.get("REQUESTS_CA_BUNDLE") or True
