"""Images to and from a registry: push (``build --push``), pull by digest (``verify``), and
tag a digest in place (``promote``), or tag an OCI image index of one image per platform
(``promote --multiarch``).

``promote`` copies the manifest the registry holds for ``name@sha256:…`` to ``name:TAG`` with
the Registry HTTP API v2 (GET the manifest by digest, PUT the same bytes under the tag) through
the one registry client (``envbuild.registry.client``: Docker's credentials, https first): no
layer moves, and the tag then names exactly the digest that was verified.

A push through the engine carries the credentials Docker's client configuration holds for the
registry (``DOCKER_CONFIG`` or ``~/.docker/config.json``, helpers included) to the daemon; a
registry that refuses them is a DataError (4) naming ``docker login``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from envbuild.errors import BuildFailed, DataError, UsageError
from envbuild.redact import redact, server_text
from envbuild.registry.credentials import credentials_for, login_hint
from envbuild.registry.reference import DIGEST_RE, parse_reference

# What a registry (through dockerd or buildah) says when it wants or refuses credentials.
AUTH_REFUSALS = ("unauthorized", "authentication required", "denied", "no basic auth credentials",
                 "401 unauthorized", "invalid username/password")


def split_ref(ref: str) -> tuple[str, str]:
    """``host/name:tag`` → (``host/name``, ``tag``); the tag defaults to latest."""
    parse_reference(ref)
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        return ref, "latest"
    return name, tag


def push_docker(client: Any, image: str, ref: str, progress: Callable[[str], None],
                env: Mapping[str, str]) -> str:
    """Tag ``image`` as ``ref`` in the Docker engine and push it, with the credentials Docker's
    client configuration holds for its registry; the digest the push reports."""
    import docker.errors

    repository, tag = split_ref(ref)
    registry = parse_reference(ref).registry
    credentials = credentials_for(registry, env)
    auth = {"auth_config": credentials.auth_config()} if credentials is not None else {}
    digest = None
    try:
        client.tag(image, repository, tag)
        for event in client.push(repository, tag, stream=True, decode=True, **auth):
            if "error" in event:
                raise push_failed(ref, registry, str(event["error"]).strip())
            digest = (event.get("aux") or {}).get("Digest", digest)
            if event.get("status") and event.get("id"):
                progress(f"{event['id']}: {event['status']}")
    except docker.errors.APIError as exc:
        raise push_failed(ref, registry, str(exc.explanation or exc)) from None
    if digest is None or not DIGEST_RE.fullmatch(str(digest)):
        raise BuildFailed(f"push of {redact(ref)} reported no digest")
    return str(digest)


def push_failed(ref: str, registry: str, said: str, *, via: str = "push") -> BuildFailed | DataError:
    """A failed push: the registry's refusal of credentials is a DataError naming docker login."""
    text = server_text(said.splitlines()[0] if said else "no reason given", 200)
    if any(word in said.lower() for word in AUTH_REFUSALS):
        return DataError(f"{via} of {redact(ref)}: the registry refused it: {text}",
                         hint=login_hint(registry))
    return BuildFailed(f"{via} of {redact(ref)} failed: {text}")


def pull_by_digest(client: Any, ref: str, progress: Callable[[str], None],
                   platform: str | None = None) -> None:
    """``name@sha256:…`` into the Docker engine unless it is there already; of a multi-arch
    digest, ``platform``'s image (linux/arm64), else the engine's own."""
    import docker.errors

    try:
        client.inspect_image(ref)
        return
    except docker.errors.ImageNotFound:
        pass
    repository, _, digest = ref.partition("@")
    try:
        for event in client.pull(repository, tag=digest, stream=True, decode=True, platform=platform):
            if "error" in event:
                raise DataError(f"cannot pull {redact(ref)}: {str(event['error']).strip()}")
            if event.get("status") and event.get("id"):
                progress(f"{event['id']}: {event['status']}")
    except docker.errors.APIError as exc:
        said = server_text(str(exc.explanation or exc), 200)
        raise DataError(f"cannot pull {redact(ref)}: {said}") from None


def tag_digest(ref: str, tag: str, env: Mapping[str, str]) -> str:
    """Make ``name:tag`` name the manifest of ``ref`` (``name@sha256:…``); the digest."""
    from envbuild.registry.client import RegistryClient

    parsed = parse_reference(ref)
    if parsed.digest is None:
        raise UsageError(f"{ref!r} names no digest", hint="write REF@sha256:<64 hex>")
    if not _tag_ok(tag):
        raise UsageError(f"invalid tag {tag!r}", hint="letters, digits, _ . -, at most 128")
    registry = RegistryClient(parsed.registry, parsed.name, env=env, timeout=60.0,
                              subject=redact(ref))
    source = registry.manifest("GET", parsed.digest)
    media = source.headers.get("Content-Type", "")
    stored = registry.manifest("PUT", tag, data=source.body, content_type=media)
    digest = stored.headers.get("Docker-Content-Digest") or parsed.digest
    if digest != parsed.digest:
        raise DataError(f"registry stored {redact(ref)} under {tag} as {digest}, not {parsed.digest}")
    return digest


def _tag_ok(tag: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag, re.ASCII) is not None


OCI_INDEX = "application/vnd.oci.image.index.v1+json"
_IMAGE_MANIFESTS = ("application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json")


def tag_index(refs: list[str], tag: str, env: Mapping[str, str]) -> tuple[str, list[dict[str, Any]]]:
    """Make ``name:tag`` name an OCI image index listing each of ``refs`` (``name@sha256:…`` of
    one repository, one image each) by digest with its platform, read from its config; the
    index's digest and its entries. Two images of one platform, or an index among ``refs``, are
    refused before anything is written."""
    import hashlib
    import json

    from envbuild.registry.client import RegistryClient
    from envbuild.registry.digest import config_platform

    parsed = [parse_reference(ref) for ref in refs]
    first = parsed[0]
    if any(p.digest is None for p in parsed):
        raise UsageError("a multi-arch tag lists images by digest", hint="write REF@sha256:<64 hex> for each")
    if any((p.registry, p.name) != (first.registry, first.name) for p in parsed):
        raise UsageError(f"the images of one multi-arch tag must be in one repository, not "
                         f"{', '.join(sorted({redact(r.partition('@')[0]) for r in refs}))}",
                         hint="push every target to the same REF (build --lock --push REF)")
    if not _tag_ok(tag):
        raise UsageError(f"invalid tag {tag!r}", hint="letters, digits, _ . -, at most 128")
    registry = RegistryClient(first.registry, first.name, env=env, timeout=60.0, subject=redact(refs[0]))
    entries: list[dict[str, Any]] = []
    for ref, p in zip(refs, parsed, strict=True):
        wanted = p.digest or ""  # every one named a digest (checked above)
        reply = registry.manifest("GET", wanted)
        media = reply.headers.get("Content-Type", "").split(";")[0].strip()
        if f"sha256:{hashlib.sha256(reply.body).hexdigest()}" != wanted:
            raise DataError(f"registry served {redact(ref)} with other bytes than its digest",
                            hint="the registry or a proxy in between is broken")
        try:
            manifest = json.loads(reply.body)
        except (UnicodeDecodeError, ValueError):
            manifest = None
        if media not in _IMAGE_MANIFESTS or not isinstance(manifest, dict):
            raise UsageError(f"{redact(ref)} is no single image ({server_text(media, 80) or 'no type'})",
                             hint="list each platform's own image, as build --push printed it")
        platform = config_platform(registry, redact(ref), manifest)
        if any(e["platform"] == platform for e in entries):
            raise UsageError(f"two images for {server_text(platform, 60)} in one multi-arch tag",
                             hint="give one image per platform")
        entries.append({"mediaType": media, "digest": wanted, "size": len(reply.body),
                        "platform": platform})
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": e["mediaType"], "digest": e["digest"], "size": e["size"],
         "platform": {"architecture": e["platform"].partition("/")[2],
                      "os": e["platform"].partition("/")[0]}}
        for e in entries]}
    body = json.dumps(index, indent=2).encode("utf-8")
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    stored = registry.manifest("PUT", tag, data=body, content_type=OCI_INDEX)
    if stored.headers.get("Docker-Content-Digest", digest) != digest:
        raise DataError(f"registry stored the index for {tag} as "
                        f"{server_text(stored.headers['Docker-Content-Digest'], 80)}, not {digest}")
    return digest, entries
