"""The digest a registry holds for an image tag: what ``lock`` pins the base image to.

One manifest HEAD through the Registry HTTP API v2 (``/v2/<name>/manifests/<tag>``) asking
for any of the four manifest kinds, read from its ``Docker-Content-Digest`` header. When a
registry or a proxy leaves that header out, the manifest is fetched and hashed instead.
Registries that want a token get one anonymously (401 with ``WWW-Authenticate: Bearer
realm=…,service=…,scope=…`` → the realm's token → the same request again). Nothing here
logs in: a registry that still says 401 wants credentials, and the error says so.

Names follow Docker's rules: no registry host means Docker Hub (``ubuntu`` is
``library/ubuntu`` there, asked of ``registry-1.docker.io``), and ``mirrors`` maps a
registry host (``docker.io`` for the hub) to the base URL of a mirror that is asked in its
place, with the same repository name. Loopback registries (127.0.0.0/8, localhost, ::1) and
mirrors written with ``http://`` are spoken to over plain HTTP, every other over HTTPS.

    >>> image_digest("nvidia/cuda:12.4.1-runtime-ubuntu22.04", env=os.environ,
    ...              mirrors={"docker.io": "https://mirror.internal:5000"})  # doctest: +SKIP
    'sha256:…'
    >>> pinned("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "sha256:" + "0" * 64)
    'nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:0000000000000000000000000000000000000000000000000000000000000000'

Failures (docs/faults.md H1–H6): a malformed reference or mirror is a UsageError (2);
anything the registry does or fails to do is a DataError (4), whose hint says that
``--offline`` keeps the tag.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import urlencode, urlsplit, urlunsplit

from envbuild.errors import DataError, UsageError
from envbuild.redact import redact, server_text
from envbuild.upstream.http_client import HttpClient, HttpPolicy, Reply

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
OFFLINE_HINT = "--offline keeps the tag"

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


def image_digest(
    reference: str,
    *,
    mirrors: Mapping[str, str] = _NO_MIRRORS,
    env: Mapping[str, str],
    timeout: float = 30.0,
    ca_bundle: str | None = None,
    log: Callable[[str], None] | None = None,
) -> str:
    """The ``sha256:<64 hex>`` digest the registry holds for ``reference``'s tag.

    A reference that already names a digest is answered from itself, without a request.
    ``timeout`` bounds each request (manifest, token, fallback GET), its retries included.
    TLS is checked against ``ca_bundle``, else PIP_CERT / REQUESTS_CA_BUNDLE from ``env``,
    else the system store.

    Example, as ``lock`` would pin a hub image through a mirror::

        digest = image_digest("ubuntu:22.04", env=os.environ,
                              mirrors={"docker.io": "https://mirror.internal:5000"})
        base = pinned("ubuntu:22.04", digest)   # 'ubuntu:22.04@sha256:…'
    """
    ref = parse_reference(reference)
    if ref.digest is not None:
        return ref.digest
    base = registry_url(ref.registry, mirrors)
    url = f"{base}/{ref.name}/manifests/{ref.tag}"
    if ca_bundle is not None:
        env = {**env, "PIP_CERT": ca_bundle}
    policy = HttpPolicy(connect_timeout_s=min(10.0, timeout), read_timeout_s=timeout,
                        total_timeout_s=timeout, attempts=3, backoff_s=0.5,
                        max_body_bytes=MAX_MANIFEST_BYTES)
    session = _Session(HttpClient(env=env, policy=policy, log=log), reference, ref, url)
    reply = session.ask("HEAD")
    digest = reply.headers.get("Docker-Content-Digest")
    if digest is None or reply.status == 405:
        # Some proxies drop the header, and a few refuse HEAD: hash what the registry serves.
        return session.digest_of_body(session.ask("GET"))
    return session.checked_digest(digest)


def registry_url(registry: str, mirrors: Mapping[str, str] = _NO_MIRRORS) -> str:
    """The ``…/v2`` base URL that answers for ``registry`` (a host[:port], ``docker.io`` for
    the hub): its mirror's when ``mirrors`` maps it, else its own."""
    wanted = _registry_key(registry)
    for key, value in mirrors.items():
        if _registry_key(key) == wanted:
            return _mirror_base(key, value)
    host = HUB_API if wanted == HUB else registry
    return f"{'http' if is_loopback(host) else 'https'}://{host}/v2"


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


def _mirror_base(key: str, value: str) -> str:
    text = value.strip()
    if "://" not in text and re.fullmatch(_DOMAIN, text.partition("/")[0].rpartition("@")[2]):
        host = text.partition("/")[0].rpartition("@")[2]
        text = f"{'http' if is_loopback(host) else 'https'}://{text}"
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
    path = parts.path.rstrip("/")
    if not path.endswith("/v2"):
        path += "/v2"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class _Session:
    """The requests for one reference: the manifest, and the token when one is asked for."""

    def __init__(self, client: HttpClient, reference: str, ref: ImageReference, url: str) -> None:
        self.client = client
        self.reference = reference
        self.ref = ref
        self.url = url
        self.origin = urlunsplit((*urlsplit(url)[:2], "", "", ""))
        self.token: str | None = None

    def ask(self, method: str) -> Reply:
        """HEAD or GET the manifest, fetching an anonymous token on the first 401."""
        reply = self._send(method)
        if reply.status == 401 and self.token is None:
            self.token = self._token(reply.headers.get("WWW-Authenticate", ""))
            reply = self._send(method)
        if reply.status == 401:
            raise DataError(
                f"the registry wants credentials for {self.reference} ({self.origin} answered 401"
                f"{' to an anonymous token' if self.token is not None else ''})",
                hint="envbuild asks anonymously (Docker Hub also answers so for an image that does "
                     f"not exist): check the name, or use a mirror that serves it; {OFFLINE_HINT}")
        if reply.status == 403:
            raise DataError(f"the registry refused {self.reference} ({self.origin} answered 403)",
                            hint=f"check the name and the registry's access rules; {OFFLINE_HINT}")
        if reply.status == 404:
            raise DataError(
                f"no such image or tag: {self.reference} ({self.ref.name}:{self.ref.tag} "
                f"not found at {self.origin})",
                hint=f"check the name and tag (a deleted tag needs another base image); "
                     f"{OFFLINE_HINT}")
        return reply

    def _send(self, method: str) -> Reply:
        headers = {"Accept": ACCEPT}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        allow = frozenset({401, 403, 404, 405} if method == "HEAD" else {401, 403, 404})
        try:
            if method == "HEAD":
                return self.client.head(self.url, headers, allow=allow)
            return self.client.get(self.url, headers, allow=allow)
        except DataError as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: DataError) -> DataError:
        if "TLS verification failed" in exc.message:
            hint = f"give the registry's CA bundle (REQUESTS_CA_BUNDLE); {OFFLINE_HINT}"
        else:
            hint = f"check the registry or mirror address and the network; {OFFLINE_HINT}"
        return DataError(redact(f"cannot get the digest of {self.reference} from {self.origin}: "
                                f"{exc.message}"), hint=hint)

    def _token(self, challenge: str) -> str:
        scheme, params = parse_challenge(challenge)
        if scheme != "bearer" or not params.get("realm"):
            raise DataError(
                f"the registry wants credentials for {self.reference} ({self.origin} answered 401 "
                f"with {scheme or 'no'} authentication)",
                hint=f"envbuild only asks for anonymous bearer tokens; {OFFLINE_HINT}")
        realm = params["realm"]
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.hostname or (
                parts.scheme == "http" and self.origin.startswith("https:")
                and not is_loopback(parts.netloc.rpartition("@")[2])):
            raise DataError(f"refusing the token realm {realm!r} of {self.origin}",
                            hint=f"a registry over https must hand out tokens over https; "
                                 f"{OFFLINE_HINT}")
        query = [(k, v) for k, v in (("service", params.get("service")),
                                     ("scope", params.get("scope")
                                      or f"repository:{self.ref.name}:pull")) if v]
        url = urlunsplit((parts.scheme, parts.netloc, parts.path,
                          "&".join(q for q in (parts.query, urlencode(query)) if q), ""))
        try:
            reply = self.client.get(url, allow=frozenset({401, 403}))
        except DataError as exc:
            raise self._unreachable(exc) from exc
        if reply.status in (401, 403):
            raise DataError(
                f"the registry wants credentials for {self.reference} (its token server "
                f"answered {reply.status} to an anonymous request)",
                hint=f"envbuild asks anonymously: use a mirror that serves it; {OFFLINE_HINT}")
        try:
            answer = json.loads(reply.body)
        except (UnicodeDecodeError, ValueError):
            answer = None
        token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) \
            else None
        if not isinstance(token, str) or not token or any(c.isspace() for c in token):
            raise DataError(f"the token server of {self.origin} answered without a token",
                            hint=f"check the registry or mirror; {OFFLINE_HINT}")
        return token

    def checked_digest(self, value: str) -> str:
        digest = value.strip()
        if not DIGEST_RE.fullmatch(digest):
            raise DataError(
                f"{self.origin} answered for {self.reference} with a malformed digest "
                f"{server_text(digest, 80)!r} (want sha256:<64 hex>)",
                hint=f"the registry or a proxy in between is broken; {OFFLINE_HINT}")
        return digest

    def digest_of_body(self, reply: Reply) -> str:
        """sha256 of the manifest bytes, once they are seen to be a v2 manifest; the header, when
        the GET has one, must agree."""
        try:
            manifest = json.loads(reply.body)
        except (UnicodeDecodeError, ValueError):
            manifest = None
        if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
            raise DataError(f"{self.origin} answered for {self.reference} with something that is "
                            "not an image manifest (no Docker-Content-Digest either)",
                            hint=f"the registry or a proxy in between is broken; {OFFLINE_HINT}")
        digest = f"sha256:{hashlib.sha256(reply.body).hexdigest()}"
        header = reply.headers.get("Docker-Content-Digest")
        if header is not None and self.checked_digest(header) != digest:
            raise DataError(f"{self.origin} answered for {self.reference} with a manifest whose "
                            f"sha256 is not its Docker-Content-Digest {header.strip()}",
                            hint=f"the registry or a proxy in between is broken; {OFFLINE_HINT}")
        return digest


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="…",service="…",scope="…"`` → ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m[1].lower(): (m[2] if m[2] is not None else m[3]).replace('\\"', '"')
              for m in _CHALLENGE_PARAM.finditer(rest)}
    return scheme.lower(), params
