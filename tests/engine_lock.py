"""The file every test session (and every bench that builds) holds shared while it uses a Docker
engine; a test module's clean-up removes its images only while it can hold the file alone
(tests/conftest.py). One file per engine: the default engine's keeps its old name, another one
($DOCKER_HOST: the second engine scripts/test.sh gives half of the engine tests) has its own, so
sessions on two engines never keep each other from cleaning up."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

_DEFAULT_HOSTS = ("", "unix:///var/run/docker.sock", "unix:///run/docker.sock")


def sessions_lock(env: Mapping[str, str] = os.environ) -> Path:
    host = env.get("DOCKER_HOST", "")
    name = "envbuild-tests-docker" + (
        "" if host in _DEFAULT_HOSTS else "-" + hashlib.sha256(host.encode()).hexdigest()[:12])
    return Path(tempfile.gettempdir()) / f"{name}.lock"
