"""Image references and where a registry answers, read as Docker reads them.

Names follow Docker's rules: no registry host means Docker Hub (``ubuntu`` is
``library/ubuntu`` there, asked of ``registry-1.docker.io``), and ``mirrors`` maps a
registry host (``docker.io`` for the hub) to the base URL of a mirror that is asked in its
place, with the same repository name.

A registry is reached as Docker reaches it: over https first; plain http only as the fallback
for a loopback registry (127.0.0.0/8, localhost, ::1), one listed in ``insecure-registries``
of Docker's daemon configuration, or a mirror written with ``http://`` (then http only).

    >>> pinned("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "sha256:" + "0" * 64)
    'nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:0000000000000000000000000000000000000000000000000000000000000000'
    >>> endpoint("127.0.0.1:5000").bases
    ('https://127.0.0.1:5000/v2', 'http://127.0.0.1:5000/v2')

A malformed reference or mirror is a UsageError (2), before any request.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import urlsplit

from envbuild.errors import UsageError
from envbuild.redact import redact

# Docker Hub: the name users write, the other names it goes by, and where its API answers.
HUB = "docker.io"
HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
HUB_API = "registry-1.docker.io"

# Newest first; a registry answers with the kind it stores, and its digest is the one Docker
# records for a pull (an index's for a multi-platform image).
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
ACCEPT = ", ".join(MANIFEST_TYPES)
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
# Manifests are small; a registry refuses those over 4 MiB itself.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024

_NO_MIRRORS: Mapping[str, str] = MappingProxyType({})

_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:\[[0-9A-Fa-f:.]+\]|{_HOST_LABEL}(?:\.{_HOST_LABEL})*)(?::[0-9]{{1,5}})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?",
    re.ASCII)
_CHALLENGE_PARAM = re.compile(r'([A-Za-z_][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


@dataclass(frozen=True, slots=True)
class ImageReference:
    """``reference`` taken apart: ``registry`` is a host[:port] (``docker.io`` for the hub),
    ``name`` the repository as the registry knows it (``library/ubuntu``)."""

    registry: str
    name: str
    tag: str
    digest: str | None


def parse_reference(reference: str) -> ImageReference:
    """Docker's reading of ``[registry/]name[:tag][@sha256:…]``; UsageError when it is not one."""
    match = _REFERENCE.fullmatch(reference)
    if match is None or len(reference) > 512:
        raise UsageError(f"invalid image reference {reference!r}",
                         hint="write [registry/]name:tag or name@sha256:<64 hex>, lowercase name")
    domain, path = match["domain"], match["path"]
    # The first part names a registry only when it looks like a host: a dot, a port, or
    # localhost (Docker's rule). Otherwise it is the first path component on the hub.
    if domain is not None and not (
            "." in domain or ":" in domain or domain == "localhost" or domain != domain.lower()):
        if not re.fullmatch(_COMPONENT, domain, re.ASCII):
            raise UsageError(f"invalid image reference {reference!r}",
                             hint="write [registry/]name:tag, lowercase name")
        domain, path = None, f"{domain}/{path}"
    registry = HUB if domain is None or domain.lower() in HUB_ALIASES else domain
    if registry == HUB and "/" not in path:
        path = f"library/{path}"
    if len(path) > 255:
        raise UsageError(f"invalid image reference {reference!r}: the name is over 255 characters")
    return ImageReference(registry=registry, name=path, tag=match["tag"] or "latest",
                          digest=match["digest"])


def pinned(reference: str, digest: str) -> str:
    """``reference`` with ``digest`` appended, its tag kept readable: ``name:tag@sha256:…``.
    Docker pulls by the digest and ignores the tag. A digest the reference already carries
    is replaced."""
    if not DIGEST_RE.fullmatch(digest):
        raise UsageError(f"invalid image digest {digest!r}", hint="sha256:<64 lowercase hex>")
    parse_reference(reference)
    return f"{reference.partition('@')[0]}@{digest}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where ``registry`` answers: ``host`` (host[:port], whose credentials and CA apply;
    ``docker.io`` for the hub) and the ``…/v2`` base URLs to try, in order."""

    host: str
    bases: tuple[str, ...]


def endpoint(registry: str, mirrors: Mapping[str, str] = _NO_MIRRORS,
             insecure: Collection[str] = ()) -> Endpoint:
    """The endpoint for ``registry`` (a host[:port], ``docker.io`` for the hub): its mirror's
    when ``mirrors`` maps it, else its own. ``insecure``: Docker's ``insecure-registries``
    (host[:port] or CIDR), which may fall back to plain http as loopback registries may."""
    wanted = _registry_key(registry)
    for key, value in mirrors.items():
        if _registry_key(key) == wanted:
            return _mirror_endpoint(key, value, insecure)
    if wanted == HUB:
        return Endpoint(host=HUB, bases=(f"https://{HUB_API}/v2",))
    return Endpoint(host=registry, bases=_bases(registry, "", insecure))


def registry_url(registry: str, mirrors: Mapping[str, str] = _NO_MIRRORS) -> str:
    """The first ``…/v2`` base URL tried for ``registry``: https unless a mirror says http."""
    return endpoint(registry, mirrors).bases[0]


def _bases(host: str, path: str, insecure: Collection[str]) -> tuple[str, ...]:
    https = f"https://{host}{path}/v2"
    if is_loopback(host.rpartition("@")[2]) or _listed(host.rpartition("@")[2], insecure):
        return https, f"http://{host}{path}/v2"
    return (https,)


def _listed(host: str, insecure: Collection[str]) -> bool:
    """``host`` is among Docker's insecure registries, by name[:port] or by an IP network."""
    name = host.lower()
    bare = name[1:].partition("]")[0] if name.startswith("[") else name.rpartition(":")[0] or name
    for entry in insecure:
        if entry.strip().lower() in (name, bare):
            return True
        try:
            if ipaddress.ip_address(bare) in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


def is_loopback(host: str) -> bool:
    """``host`` (``name[:port]``, ``[v6]:port``) is this machine: 127.0.0.0/8, localhost, ::1."""
    name = host.lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _registry_key(registry: str) -> str:
    host = registry.strip().lower()
    if "://" in host:
        host = urlsplit(host).netloc
    host = host.rstrip("/").partition("/")[0]
    return HUB if host in HUB_ALIASES else host


def _mirror_endpoint(key: str, value: str, insecure: Collection[str]) -> Endpoint:
    text = value.strip()
    written = "://" in text
    if not written and re.fullmatch(_DOMAIN, text.partition("/")[0].rpartition("@")[2]):
        text = f"https://{text}"
    parts = urlsplit(text)
    bad = parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
        or parts.fragment or any(c.isspace() for c in text)
    if not bad:
        try:
            parts.port  # noqa: B018  (raises on a port that is not a number)
        except ValueError:
            bad = True
    if bad:
        raise UsageError(f"invalid registry mirror {redact(value)!r} for {key}",
                         hint="write http(s)://host[:port][/path]")
    path = parts.path.rstrip("/").removesuffix("/v2")
    host = parts.netloc.rpartition("@")[2]
    if written:  # the scheme the user wrote, and only it
        return Endpoint(host=host, bases=(f"{parts.scheme}://{parts.netloc}{path}/v2",))
    return Endpoint(host=host, bases=_bases(parts.netloc, path, insecure))


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="…",service="…",scope="…"`` → ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m[1].lower(): (m[2] if m[2] is not None else m[3]).replace('\\"', '"')
              for m in _CHALLENGE_PARAM.finditer(rest)}
    return scheme.lower(), params
