"""Every effective setting and where it came from (``envbuild config show``).

Each setting is decided the way the command that uses it decides: the flag, then the project
file, then the environment, then pip's configuration, then the default. Values pass through
``redact`` (an index URL may carry a password); nothing here connects to anything but pip's own
``pip config list``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from envbuild.project.model import Project
from envbuild.redact import redact

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One effective setting: its name, its value (None: not set), and its origin."""

    name: str
    value: str | None
    origin: str

    def as_json(self) -> dict[str, str | None]:
        return {"name": self.name, "value": self.value, "origin": self.origin}


def first_of(name: str, candidates: list[tuple[str, str | None]], default: tuple[str, str | None]
             ) -> Setting:
    """The first candidate with a value, else ``default``: (origin, value) pairs in order."""
    for origin, value in candidates:
        if value:
            return Setting(name=name, value=redact(value), origin=origin)
    return Setting(name=name, value=redact(default[1]) if default[1] else None, origin=default[0])


def environment_settings(env: Mapping[str, str], *, matrices_flag: str | None) -> list[Setting]:
    """What every command reads from the environment: data, cache, TLS, Docker, build dates."""
    from envbuild.data.matrix import cache_directory_name, default_directory_name

    bundled = default_directory_name({k: v for k, v in env.items() if k != "ENVBUILD_MATRICES"})
    home_cache = os.path.join(env["HOME"], ".cache", "envbuild") if env.get("HOME") else None
    cache = cache_directory_name(env)
    docker_config = env.get("DOCKER_CONFIG")
    return [
        first_of("matrices", [("flag --matrices", matrices_flag),
                              ("environment ENVBUILD_MATRICES", env.get("ENVBUILD_MATRICES"))],
                 ("default: bundled with envbuild", bundled)),
        Setting(name="cache", value=cache,
                origin="environment ENVBUILD_NO_CACHE: no cache" if env.get("ENVBUILD_NO_CACHE")
                else "environment XDG_CACHE_HOME" if env.get("XDG_CACHE_HOME")
                else "default: ~/.cache/envbuild" if home_cache else "default: no HOME, no cache"),
        first_of("tls-ca-bundle", [("environment PIP_CERT", env.get("PIP_CERT")),
                                   ("environment REQUESTS_CA_BUNDLE", env.get("REQUESTS_CA_BUNDLE"))],
                 ("default: the system's trust store", None)),
        first_of("docker-host", [("environment DOCKER_HOST", env.get("DOCKER_HOST"))],
                 ("default", DEFAULT_DOCKER_HOST)),
        first_of("docker-config", [("environment DOCKER_CONFIG", docker_config)],
                 ("default", os.path.join(env["HOME"], ".docker") if env.get("HOME") else None)),
        first_of("source-date-epoch", [("environment SOURCE_DATE_EPOCH", env.get("SOURCE_DATE_EPOCH"))],
                 ("default: unset, images get no created label", None)),
    ]


def index_setting(flag: str | None, project: Project | None, env: Mapping[str, str]) -> Setting:
    """The index the project's own dependencies come from, decided as ``lock`` decides it."""
    from envbuild.upstream.pipconfig import pip_config_index_url, pip_default_index_url

    candidates: list[tuple[str, str | None]] = [("flag --index-url", flag)]
    if project is not None:
        candidates.append((f"project file {project.path.name}", project.index_url))
    candidates += [("environment PIP_INDEX_URL", env.get("PIP_INDEX_URL")),
                   ("pip configuration", pip_config_index_url(env))]
    return first_of("index-url", candidates, ("pip's default", pip_default_index_url()))


def project_settings(project: Project | None, shown: str | None, *, from_flag: bool) -> list[Setting]:
    """The project file's keys as the lock reads them; defaults say so."""
    if project is None:
        return [Setting(name="project-file", value=None, origin="none found here; envbuild init writes one")]
    origin = f"project file {shown}"
    out = [Setting(name="project-file", value=shown,
                   origin="flag --project" if from_flag else "found in the current directory")]
    for name in ("torch", "python", "cuda", "cudnn", "ubuntu", "variant", "base-image",
                 "torch-index-url"):
        value = getattr(project, name.replace("-", "_"))
        out.append(Setting(name=name, value=redact(value) if value else None,
                           origin=origin if value else "default: any, the resolver ranks"))
    out.append(Setting(name="flavor", value=project.flavor, origin=origin))
    out.append(Setting(name="installer", value=project.installer or "uv",
                       origin=origin if project.installer else "default"))
    out.append(Setting(name="exclude-newer", value=project.exclude_newer,
                       origin=origin if project.exclude_newer else "default: none, no cut-off"))
    out.append(Setting(name="apt-snapshot", value=project.apt_snapshot,
                       origin=origin if project.apt_snapshot else "default: none, the live archive"))
    out.append(Setting(name="user", value=project.user, origin=origin))
    out.append(Setting(name="companions", value=str(project.companions).lower(), origin=origin))
    out.append(Setting(name="targets", value=", ".join(t.name for t in project.targets) or None,
                       origin=origin))
    for name, values in (("find-links", project.find_links), ("apt-packages", project.apt_packages),
                         ("env", tuple(key for key, _ in project.env)),
                         ("registry-mirrors", tuple(sorted(project.registry_mirrors)))):
        out.append(Setting(name=name, value=", ".join(redact(v) for v in values) or None,
                           origin=origin if values else "default: none"))
    return out


def shown_project(project: Project | None, cwd: Path) -> str | None:
    if project is None:
        return None
    try:
        return str(project.path.relative_to(cwd))
    except ValueError:
        return str(project.path)
