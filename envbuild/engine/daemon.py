"""Reach a Docker engine: one connection, errors that name the address and the way out.

Every container envbuild creates carries ``LABEL``, so that whatever a crash leaves
behind, ``envbuild clean`` finds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envbuild.errors import DockerUnavailable

# On every container envbuild creates; its value says which command made it.
LABEL = "dev.envbuild.managed"
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
# The last lines of a failed build's or smoke test's output an error carries.
LOG_TAIL = 25


def connect(env: Mapping[str, str], *, timeout: float = 60.0) -> Any:
    """A docker.APIClient for $DOCKER_HOST (else the default socket), already answering.

    No daemon, a refused socket or a permission problem is DockerUnavailable (exit 5)
    naming the address tried, with the hint that fits the cause."""
    import docker
    import docker.errors

    url = env.get("DOCKER_HOST") or DEFAULT_SOCKET
    try:
        kwargs = docker.utils.kwargs_from_env(environment=dict(env))
        client = docker.APIClient(timeout=timeout, version="auto", **kwargs)
        client.ping()
    except (docker.errors.DockerException, OSError) as exc:
        raise _unavailable(url, exc) from None
    except Exception as exc:  # requests' connection errors carry no common base here
        raise _unavailable(url, exc) from None
    return client


def _unavailable(url: str, exc: BaseException) -> DockerUnavailable:
    text = str(exc)
    if "Permission denied" in text or isinstance(exc, PermissionError):
        return DockerUnavailable(
            f"permission denied on the Docker socket {url}",
            hint="add your user to the 'docker' group and log in again, or use rootless "
                 "Docker (DOCKER_HOST=unix://$XDG_RUNTIME_DIR/docker.sock)")
    return DockerUnavailable(f"cannot connect to Docker daemon at {url}",
                             hint="is dockerd running? set DOCKER_HOST to reach another one")


def api_message(exc: Any) -> str:
    """What the daemon said, without the SDK's HTTP framing."""
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()
