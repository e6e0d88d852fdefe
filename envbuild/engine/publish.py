"""Images to and from a registry: push (``build --push``), pull by digest (``verify``), and
tag a digest in place (``promote``).

``promote`` copies the manifest the registry holds for ``name@sha256:…`` to ``name:TAG`` with
the Registry HTTP API v2 (GET the manifest by digest, PUT the same bytes under the tag): no
layer moves, and the tag then names exactly the digest that was verified. Anonymous access
only; a registry asking for credentials is a DataError naming the status.
"""

from __future__ import annotations

import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from envbuild.errors import BuildFailed, DataError, UsageError
from envbuild.redact import redact, server_text
from envbuild.upstream.registry import (
    ACCEPT,
    DIGEST_RE,
    MAX_MANIFEST_BYTES,
    is_loopback,
    parse_reference,
    registry_url,
)


def split_ref(ref: str) -> tuple[str, str]:
    """``host/name:tag`` → (``host/name``, ``tag``); the tag defaults to latest."""
    parse_reference(ref)
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        return ref, "latest"
    return name, tag


def push_docker(client: Any, image: str, ref: str, progress: Callable[[str], None]) -> str:
    """Tag ``image`` as ``ref`` in the Docker engine and push it; the digest the push reports."""
    import docker.errors

    repository, tag = split_ref(ref)
    digest = None
    try:
        client.tag(image, repository, tag)
        for event in client.push(repository, tag, stream=True, decode=True):
            if "error" in event:
                raise BuildFailed(f"push of {redact(ref)} failed: {server_text(str(event['error']), 200)}")
            digest = (event.get("aux") or {}).get("Digest", digest)
            if event.get("status") and event.get("id"):
                progress(f"{event['id']}: {event['status']}")
    except docker.errors.APIError as exc:
        raise BuildFailed(f"push of {redact(ref)} failed: {server_text(str(exc), 200)}") from None
    if digest is None or not DIGEST_RE.fullmatch(str(digest)):
        raise BuildFailed(f"push of {redact(ref)} reported no digest")
    return str(digest)


def pull_by_digest(client: Any, ref: str, progress: Callable[[str], None]) -> None:
    """``name@sha256:…`` into the Docker engine unless it is there already."""
    import docker.errors

    try:
        client.inspect_image(ref)
        return
    except docker.errors.ImageNotFound:
        pass
    repository, _, digest = ref.partition("@")
    try:
        for event in client.pull(repository, tag=digest, stream=True, decode=True):
            if "error" in event:
                raise DataError(f"cannot pull {redact(ref)}: {server_text(str(event['error']), 200)}")
            if event.get("status") and event.get("id"):
                progress(f"{event['id']}: {event['status']}")
    except docker.errors.APIError as exc:
        said = server_text(str(exc.explanation or exc), 200)
        raise DataError(f"cannot pull {redact(ref)}: {said}") from None


def _open(request: urllib.request.Request, env: Mapping[str, str]) -> Any:
    host = urllib.parse.urlsplit(request.full_url).netloc
    handlers: list[Any] = []
    if is_loopback(host):
        handlers.append(urllib.request.ProxyHandler({}))
    cafile = env.get("SSL_CERT_FILE") or env.get("PIP_CERT")
    if request.full_url.startswith("https:") and cafile:
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)))
    return urllib.request.build_opener(*handlers).open(request, timeout=60)


def tag_digest(ref: str, tag: str, env: Mapping[str, str]) -> str:
    """Make ``name:tag`` name the manifest of ``ref`` (``name@sha256:…``); the digest."""
    parsed = parse_reference(ref)
    if parsed.digest is None:
        raise UsageError(f"{ref!r} names no digest", hint="write REF@sha256:<64 hex>")
    if not _tag_ok(tag):
        raise UsageError(f"invalid tag {tag!r}", hint="letters, digits, _ . -, at most 128")
    base = registry_url(parsed.registry)
    source = f"{base}/{parsed.name}/manifests/{parsed.digest}"
    try:
        with _open(urllib.request.Request(source, headers={"Accept": ACCEPT}), env) as reply:
            body = reply.read(MAX_MANIFEST_BYTES + 1)
            media = reply.headers.get("Content-Type", "")
        if len(body) > MAX_MANIFEST_BYTES:
            raise DataError(f"the manifest of {redact(ref)} is over {MAX_MANIFEST_BYTES} bytes")
        target = f"{base}/{parsed.name}/manifests/{tag}"
        put = urllib.request.Request(target, data=body, method="PUT",
                                     headers={"Content-Type": media})
        with _open(put, env) as reply:
            digest = reply.headers.get("Docker-Content-Digest") or parsed.digest
    except urllib.error.HTTPError as exc:
        raise DataError(f"registry {parsed.registry} answered {exc.code} for {redact(exc.url)}",
                        hint="promote uses anonymous access") from None
    except (urllib.error.URLError, OSError) as exc:
        raise DataError(f"cannot reach registry {parsed.registry}: {server_text(str(exc), 200)}") from None
    if digest != parsed.digest:
        raise DataError(f"registry stored {redact(ref)} under {tag} as {digest}, not {parsed.digest}")
    return digest


def _tag_ok(tag: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag, re.ASCII) is not None
