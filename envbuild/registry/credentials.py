"""Registry credentials, from Docker's client configuration and nowhere else.

The file is ``$DOCKER_CONFIG/config.json``, else ``$HOME/.docker/config.json``; what it says is
read through the docker SDK's auth helpers, as ``docker login`` left it: ``auths`` (the
base64 ``user:password``, or an ``identitytoken``), ``credHelpers`` (one
``docker-credential-<name>`` per registry) and ``credsStore`` (one helper for the rest).

A credential is a value that never shows itself: ``repr`` leaves the secret out, and nothing
in envbuild prints, logs, labels or records one (tests/test_registry_auth.py looks for the
secret in everything a run leaves). A configuration that cannot be read, or a helper that
fails, is a DataError (4) naming ``docker login``, never quoting the file or the helper.

    >>> credentials_for("docker.io", {"DOCKER_CONFIG": "/nonexistent"}) is None
    True
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.errors import DataError

# Docker Hub's key in a client configuration, as ``docker login`` writes it.
HUB_KEY = "https://index.docker.io/v1/"
# A config file is small; a larger one is not read.
MAX_CONFIG_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    """A user name and password, or an identity (refresh) token; ``source`` says where from
    (``auths``, or the helper's name), for messages."""

    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    source: str = "auths"

    def basic(self) -> str:
        """The ``Authorization: Basic …`` value."""
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")

    def auth_config(self) -> dict[str, str]:
        """The docker SDK's ``auth_config`` for a push through the engine."""
        if self.identity_token:
            return {"identitytoken": self.identity_token}
        return {"username": self.username, "password": self.password}

    def authfile(self, registry: str) -> bytes:
        """A containers-auth.json (``buildah --authfile``) holding only this registry's entry."""
        entry = ({"identitytoken": self.identity_token} if self.identity_token
                 else {"auth": base64.b64encode(f"{self.username}:{self.password}".encode()).decode()})
        return json.dumps({"auths": {registry: entry}}).encode()


def config_path(env: Mapping[str, str]) -> Path | None:
    """Docker's client configuration file: ``$DOCKER_CONFIG/config.json``, else
    ``$HOME/.docker/config.json``; None without either variable."""
    if env.get("DOCKER_CONFIG"):
        return Path(env["DOCKER_CONFIG"]) / "config.json"
    if env.get("HOME"):
        return Path(env["HOME"]) / ".docker" / "config.json"
    return None


def login_hint(registry: str) -> str:
    """The way out of a missing or refused credential."""
    name = "" if registry == "docker.io" else f" {registry}"
    return f"run 'docker login{name}' (envbuild reads Docker's client configuration)"


def credentials_for(registry: str, env: Mapping[str, str]) -> Credentials | None:
    """What Docker's client configuration holds for ``registry`` (host[:port], ``docker.io``
    for the hub), else None."""
    data = _load(registry, env)
    if data is None:
        return None
    found = _resolve(registry, data, env)
    if not found:
        return None
    values = {str(k).lower(): v for k, v in found.items() if isinstance(v, str)}
    credentials = Credentials(username=values.get("username", ""), password=values.get("password", ""),
                              identity_token=values.get("identitytoken", ""),
                              source=_source(registry, data))
    if not credentials.identity_token and not (credentials.username and credentials.password):
        return None
    return credentials


def _load(registry: str, env: Mapping[str, str]) -> dict[str, Any] | None:
    path = config_path(env)
    if path is None or not path.is_file():
        return None
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_CONFIG_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_CONFIG_BYTES else None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise DataError(f"Docker's client configuration {path} is not a readable JSON object",
                        hint=login_hint(registry))
    return data


def _resolve(registry: str, data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any] | None:
    import warnings

    import docker.auth
    import docker.errors

    try:
        with warnings.catch_warnings():  # a missing helper: said below, once, as an error
            warnings.simplefilter("ignore")
            config = docker.auth.AuthConfig.load_config(None, dict(data), credstore_env=dict(env))
            found = config.resolve_authconfig(registry)
    except docker.errors.DockerException:
        raise DataError(f"the credentials for {registry} in Docker's client configuration cannot "
                        f"be read ({_source(registry, data)} failed)",
                        hint=login_hint(registry)) from None
    except (ValueError, TypeError, KeyError, UnicodeError):  # a malformed auth entry
        raise DataError(f"the credentials for {registry} in Docker's client configuration are "
                        "malformed", hint=login_hint(registry)) from None
    return found if isinstance(found, dict) else None


def _source(registry: str, data: dict[str, Any]) -> str:
    key = HUB_KEY if registry == "docker.io" else registry
    helpers = data.get("credHelpers") if isinstance(data.get("credHelpers"), dict) else {}
    helper = helpers.get(key) or data.get("credsStore")  # type: ignore[union-attr]
    return f"docker-credential-{helper}" if isinstance(helper, str) and helper else "auths"
