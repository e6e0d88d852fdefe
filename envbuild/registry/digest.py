"""The digest a registry holds for an image tag: what ``lock`` pins the base image to.

One manifest HEAD through the registry client (``/v2/<name>/manifests/<tag>``) asking for any
of the four manifest kinds, read from its ``Docker-Content-Digest`` header. When a registry
or a proxy leaves that header out, or refuses HEAD, the manifest is fetched and hashed instead.
Logging in, TLS and the http fallback are the client's (``envbuild.registry.client``).

    >>> image_digest("nvidia/cuda:12.4.1-runtime-ubuntu22.04", env=os.environ,
    ...              mirrors={"docker.io": "https://mirror.internal:5000"})  # doctest: +SKIP
    'sha256:…'

Failures (docs/faults.md H1–H6, U1–U6): a malformed reference or mirror is a UsageError (2);
anything the registry does or fails to do is a DataError (4), whose hint names
``lock --no-registry``, which locks without asking any registry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from envbuild.errors import DataError
from envbuild.redact import server_text
from envbuild.registry.client import RegistryClient
from envbuild.registry.reference import DIGEST_RE, parse_reference
from envbuild.upstream.http_client import Reply

NO_REGISTRY_HINT = "; 'envbuild lock --no-registry' locks without asking any registry (the base stays a tag)"

_NO_MIRRORS: Mapping[str, str] = MappingProxyType({})


def image_digest(
    reference: str,
    *,
    mirrors: Mapping[str, str] = _NO_MIRRORS,
    env: Mapping[str, str],
    timeout: float = 30.0,
    ca_bundle: str | None = None,
    log: Callable[[str], None] | None = None,
    certs_d: Path | None = None,
    daemon_json: Path | None = None,
) -> str:
    """The ``sha256:<64 hex>`` digest the registry holds for ``reference``'s tag.

    A reference that already names a digest is answered from itself, without a request.
    ``timeout`` bounds each request (manifest, token, fallback GET), its retries included.
    ``certs_d`` and ``daemon_json`` stand in for Docker's ``/etc/docker/certs.d`` and
    ``/etc/docker/daemon.json``."""
    ref = parse_reference(reference)
    if ref.digest is not None:
        return ref.digest
    client = RegistryClient(ref.registry, ref.name, env=env, mirrors=mirrors, ca_bundle=ca_bundle,
                            timeout=timeout, log=log, subject=reference, tail=NO_REGISTRY_HINT,
                            certs_d=certs_d, daemon_json=daemon_json)
    reply = client.manifest("HEAD", ref.tag, allow=frozenset({405}))
    digest = reply.headers.get("Docker-Content-Digest")
    if digest is None or reply.status == 405:
        # Some proxies drop the header, and a few refuse HEAD: hash what the registry serves.
        return _digest_of_body(client, reference, client.manifest("GET", ref.tag))
    return _checked(client, reference, digest)


def _checked(client: RegistryClient, reference: str, value: str) -> str:
    digest = value.strip()
    if not DIGEST_RE.fullmatch(digest):
        raise DataError(
            f"{client.origin} answered for {reference} with a malformed digest "
            f"{server_text(digest, 80)!r} (want sha256:<64 hex>)",
            hint="the registry or a proxy in between is broken" + NO_REGISTRY_HINT)
    return digest


def _digest_of_body(client: RegistryClient, reference: str, reply: Reply) -> str:
    """sha256 of the manifest bytes, once they are seen to be a v2 manifest; the header, when
    the GET has one, must agree."""
    try:
        manifest = json.loads(reply.body)
    except (UnicodeDecodeError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
        raise DataError(f"{client.origin} answered for {reference} with something that is "
                        "not an image manifest (no Docker-Content-Digest either)",
                        hint="the registry or a proxy in between is broken" + NO_REGISTRY_HINT)
    digest = f"sha256:{hashlib.sha256(reply.body).hexdigest()}"
    header = reply.headers.get("Docker-Content-Digest")
    if header is not None and _checked(client, reference, header) != digest:
        raise DataError(f"{client.origin} answered for {reference} with a manifest whose "
                        f"sha256 is not its Docker-Content-Digest {server_text(header.strip(), 80)}",
                        hint="the registry or a proxy in between is broken" + NO_REGISTRY_HINT)
    return digest
