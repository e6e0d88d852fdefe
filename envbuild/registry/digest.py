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
from typing import Any

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
    platform: str | None = None,
) -> str:
    """The ``sha256:<64 hex>`` digest the registry holds for ``reference``'s tag.

    A reference that already names a digest is answered from itself, without a request.
    ``timeout`` bounds each request (manifest, token, fallback GET), its retries included.
    ``certs_d`` and ``daemon_json`` stand in for Docker's ``/etc/docker/certs.d`` and
    ``/etc/docker/daemon.json``. ``platform`` ("linux/arm64"): the digest of that platform's
    own manifest, from a multi-arch index (a tag of one image must be that platform's), so that
    no builder or engine picks another architecture from the index (docs/faults.md B10)."""
    ref = parse_reference(reference)
    if ref.digest is not None:
        return ref.digest
    client = RegistryClient(ref.registry, ref.name, env=env, mirrors=mirrors, ca_bundle=ca_bundle,
                            timeout=timeout, log=log, subject=reference, tail=NO_REGISTRY_HINT,
                            certs_d=certs_d, daemon_json=daemon_json)
    if platform is not None:
        return _platform_digest(client, reference, platform)
    reply = client.manifest("HEAD", ref.tag, allow=frozenset({405}))
    digest = reply.headers.get("Docker-Content-Digest")
    if digest is None or reply.status == 405:
        # Some proxies drop the header, and a few refuse HEAD: hash what the registry serves.
        return _digest_of_body(client, reference, client.manifest("GET", ref.tag))
    return _checked(client, reference, digest)


INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")


def _platform_digest(client: RegistryClient, reference: str, platform: str) -> str:
    """The digest of ``platform``'s manifest: its entry in the tag's index, or the tag's own
    manifest when its config says that platform."""
    os_name, _, arch = platform.partition("/")
    reply = client.manifest("GET", parse_reference(reference).tag)
    manifest = _json(client, reference, reply.body)
    if manifest.get("mediaType") in INDEX_TYPES or isinstance(manifest.get("manifests"), list):
        offered = []
        for entry in manifest.get("manifests") or ():
            where = entry.get("platform") if isinstance(entry, dict) else None
            if not isinstance(where, dict):
                continue
            offered.append(f"{where.get('os')}/{where.get('architecture')}")
            if (where.get("os"), where.get("architecture")) == (os_name, arch):
                return _checked(client, reference, str(entry.get("digest", "")))
        raise DataError(f"{reference} has no {platform} image (its index lists "
                        f"{server_text(', '.join(offered) or 'none', 120)})",
                        hint="use a base image published for that platform" + NO_REGISTRY_HINT)
    digest = _digest_of_body(client, reference, reply)
    found = config_platform(client, reference, manifest, NO_REGISTRY_HINT)
    if found != platform:
        raise DataError(f"{reference} is a {server_text(found, 60)} image, not {platform}",
                        hint="use a base image published for that platform" + NO_REGISTRY_HINT)
    return digest


def config_platform(client: RegistryClient, reference: str, manifest: Mapping[str, Any],
                    tail: str = "") -> str:
    """``os/architecture`` of one image manifest, read from its config blob (sha256 checked)."""
    image = image_config(client, reference, manifest, tail)
    return f"{image.get('os')}/{image.get('architecture')}"


def image_config(client: RegistryClient, reference: str, manifest: Mapping[str, Any],
                 tail: str = "") -> dict[str, Any]:
    """The config blob of one image manifest as JSON (its sha256 checked): platform, labels."""
    config = manifest.get("config")
    blob = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(blob, str) or not DIGEST_RE.fullmatch(blob):
        raise DataError(f"{client.origin} answered for {reference} with a manifest without a config",
                        hint="the registry or a proxy in between is broken" + tail)
    answer = client.request("GET", f"/{client.name}/blobs/{blob}", {},
                            scope=f"repository:{client.name}:pull")
    if answer.status != 200 or hashlib.sha256(answer.body).hexdigest() != blob.split(":", 1)[1]:
        raise DataError(f"cannot read the config of {reference} ({client.origin} answered {answer.status})",
                        hint="the registry or a proxy in between is broken" + tail)
    return _json(client, reference, answer.body, schema=False, tail=tail)


def _json(client: RegistryClient, reference: str, body: bytes, *, schema: bool = True,
          tail: str = NO_REGISTRY_HINT) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        document = None
    if not isinstance(document, dict) or (schema and document.get("schemaVersion") != 2):
        raise DataError(f"{client.origin} answered for {reference} with something that is not an "
                        "image manifest",
                        hint="the registry or a proxy in between is broken" + tail)
    return document


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
