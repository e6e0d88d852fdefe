"""Artifacts that refer to an image (OCI distribution-spec 1.1, "subject"): push one, list them.

An artifact here is an OCI image manifest with an ``artifactType``, the empty config (the 2-byte
``{}`` blob, ``application/vnd.oci.empty.v1+json``), its content as its one layer, and ``subject``:
the descriptor (media type, digest, size) of the image manifest it belongs to, as the registry
serves it.

A registry with the referrers API answers the manifest's PUT with ``OCI-Subject: <digest>`` and
lists the artifact under ``GET /v2/<name>/referrers/<digest>`` by itself. One without it (the
distribution project's registry 2.8 answers that GET with 404 and sets no ``OCI-Subject``) is kept
findable the way the specification makes clients do it, the referrers tag schema: the subject's
tag ``sha256-<hex>`` holds an image index of its referrers, which the pusher reads (a 404: an
empty one), extends by the new descriptor unless it is listed already (with the artifact's
``artifactType`` and annotations), and puts back. A tag that holds something other than an image
index is reported, never overwritten. Two pushers at once can lose one's entry: the
specification's own caveat for the tag schema (a registry with the referrers API has no such race).

Everything goes through the one registry client (credentials, TLS, the http fallback); every
failure is a DataError (4).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from envbuild.errors import DataError
from envbuild.redact import server_text
from envbuild.registry.client import RegistryClient

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE_MANIFESTS = (OCI_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json")
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
_BROKEN = "the registry or a proxy in between is broken"


@dataclass(frozen=True, slots=True, kw_only=True)
class Descriptor:
    """What an OCI descriptor says of one blob or manifest."""

    media_type: str
    digest: str
    size: int

    def json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def describe(data: bytes, media_type: str) -> Descriptor:
    return Descriptor(media_type=media_type, digest=f"sha256:{hashlib.sha256(data).hexdigest()}",
                      size=len(data))


@dataclass(frozen=True, slots=True, kw_only=True)
class Attached:
    """One attached artifact: ``via`` says how it is found (the registry's referrers API, or the
    tag ``tag`` of the referrers tag schema); ``listed_before``: it was listed already."""

    artifact: Descriptor
    subject: Descriptor
    via: Literal["api", "tag"]
    tag: str
    listed_before: bool


def referrers_tag(digest: str) -> str:
    """The referrers tag schema's tag for ``digest``: algorithm (at most 32 characters), ``-``,
    the encoded part (at most 64), any character a tag may not hold replaced by ``-``."""
    algorithm, _, encoded = digest.partition(":")
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{algorithm[:32]}-{encoded[:64]}")


def read_manifest(client: RegistryClient, digest: str) -> tuple[Descriptor, dict[str, Any]] | None:
    """The manifest the registry holds under ``digest`` (its bytes checked against it): its
    descriptor, with the media type the registry serves it as, and its JSON; None when the
    registry has no such manifest."""
    reply = client.manifest("GET", digest, allow=frozenset({404}))
    if reply.status == 404:
        return None
    if f"sha256:{hashlib.sha256(reply.body).hexdigest()}" != digest:
        raise DataError(f"registry served {client.subject} with other bytes than its digest", hint=_BROKEN)
    manifest = _document(reply.body)
    media = reply.headers.get("Content-Type", "").split(";")[0].strip()
    if manifest is not None:
        media = media or str(manifest.get("mediaType") or "")
    if manifest is None or not media:
        raise DataError(f"{client.origin} answered for {client.subject} with something that is not a "
                        "manifest", hint=_BROKEN)
    return Descriptor(media_type=media, digest=digest, size=len(reply.body)), manifest


def push_blob(client: RegistryClient, data: bytes, media_type: str) -> Descriptor:
    """``data`` as a blob of the repository (POST an upload, PUT it whole), unless the registry
    holds it already; its descriptor."""
    blob = describe(data, media_type)
    push = f"repository:{client.name}:pull,push"
    held = client.request("HEAD", f"/{client.name}/blobs/{blob.digest}", {}, scope=push)
    if held.status == 200:
        return blob
    start = client.request("POST", f"/{client.name}/blobs/uploads/", {}, data=b"",
                           scope=push)
    _refused(client, start.status, 202, "a blob upload")
    path = _upload_path(client, start.headers.get("Location", ""))
    done = client.request("PUT", f"{path}{'&' if '?' in path else '?'}digest={quote(blob.digest)}",
                          {"Content-Type": "application/octet-stream"}, data=data, scope=push)
    _refused(client, done.status, 201, "a blob upload")
    return blob


def artifact_manifest(subject: Descriptor, layer: Descriptor, *, artifact_type: str,
                      annotations: Mapping[str, str], title: str) -> bytes:
    """The artifact's OCI image manifest: the empty config, ``layer`` (named ``title``, as ORAS
    names a pulled file), ``subject``."""
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
        "config": describe(EMPTY, EMPTY_TYPE).json(),
        "layers": [{**layer.json(), "annotations": {"org.opencontainers.image.title": title}}],
        "subject": subject.json(), "annotations": dict(sorted(annotations.items()))}
    return json.dumps(manifest, indent=2).encode("utf-8")


def attach(client: RegistryClient, subject: Descriptor, content: bytes, *, artifact_type: str,
           annotations: Mapping[str, str], title: str) -> Attached:
    """Push ``content`` as an artifact of ``artifact_type`` referring to ``subject``, and keep it
    findable from the subject's digest (the referrers API, else the tag schema, listed once)."""
    push_blob(client, EMPTY, EMPTY_TYPE)
    layer = push_blob(client, content, artifact_type)
    body = artifact_manifest(subject, layer, artifact_type=artifact_type, annotations=annotations,
                             title=title)
    artifact = describe(body, OCI_MANIFEST)
    stored = client.manifest("PUT", artifact.digest, data=body, content_type=OCI_MANIFEST)
    said = stored.headers.get("Docker-Content-Digest", artifact.digest).strip()
    if said != artifact.digest:
        raise DataError(f"registry stored the artifact as {server_text(said, 80)}, not {artifact.digest}",
                        hint=_BROKEN)
    tag = referrers_tag(subject.digest)
    if stored.headers.get("OCI-Subject", "").strip() == subject.digest:
        return Attached(artifact=artifact, subject=subject, via="api", tag=tag, listed_before=False)
    index = tag_index(client, tag)
    entries: list[dict[str, Any]] = index["manifests"]
    if any(entry.get("digest") == artifact.digest for entry in entries):
        return Attached(artifact=artifact, subject=subject, via="tag", tag=tag, listed_before=True)
    entry = {**artifact.json(), "artifactType": artifact_type}
    if annotations:
        entry["annotations"] = dict(sorted(annotations.items()))
    updated = json.dumps({**index, "manifests": [*entries, entry]}, indent=2).encode("utf-8")
    client.manifest("PUT", tag, data=updated, content_type=OCI_INDEX)
    return Attached(artifact=artifact, subject=subject, via="tag", tag=tag, listed_before=False)


def referrers(client: RegistryClient, digest: str,
              artifact_type: str | None = None) -> tuple[list[dict[str, Any]], Literal["api", "tag"]]:
    """The descriptors of what refers to ``digest`` (of ``artifact_type`` only, when given), and
    where they were read: the referrers API (its first page), else (a 404) the tag schema."""
    query = f"?artifactType={quote(artifact_type, safe='')}" if artifact_type else ""
    reply = client.request("GET", f"/{client.name}/referrers/{digest}{query}", {"Accept": OCI_INDEX},
                           scope=f"repository:{client.name}:pull")
    via: Literal["api", "tag"] = "api"
    if reply.status == 404:
        index, via = tag_index(client, referrers_tag(digest)), "tag"
    else:
        _refused(client, reply.status, 200, "the referrers list")
        index = _index(client, reply.body, "its referrers API")
    entries = index["manifests"]
    return [e for e in entries if artifact_type is None or e.get("artifactType") == artifact_type], via


def tag_index(client: RegistryClient, tag: str) -> dict[str, Any]:
    """The image index the referrers tag ``tag`` holds; an empty one where the tag is not there."""
    reply = client.manifest("GET", tag, allow=frozenset({404}))
    if reply.status == 404:
        return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    return _index(client, reply.body, f"the tag {tag}")


def _index(client: RegistryClient, body: bytes, where: str) -> dict[str, Any]:
    index = _document(body)
    entries = index.get("manifests") if index is not None else None
    if index is None or index.get("mediaType") != OCI_INDEX or not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("digest"), str) for e in entries):
        raise DataError(f"{where} of {client.subject} holds no image index of referrers: nothing was listed "
                        "there", hint="remove or rename that tag (the referrers tag schema keeps an OCI "
                                      "image index under it), then attach again")
    return index


def _document(body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) and document.get("schemaVersion") == 2 else None


def _upload_path(client: RegistryClient, location: str) -> str:
    """The upload URL a registry handed out, as a path under the client's base: one on another
    server (a storage service) is not followed, so that no credential travels there."""
    parts, base = urlsplit(location), urlsplit(client.base)
    if (parts.scheme or parts.netloc) and (parts.scheme, parts.netloc) != (base.scheme, base.netloc):
        raise DataError(f"{client.origin} sends blob uploads for {client.subject} to another server "
                        f"({server_text(parts.netloc, 80)}), which envbuild does not follow",
                        hint="push the artifact with the registry's own tools (oras attach)")
    if not parts.path.startswith(base.path + "/"):
        raise DataError(f"{client.origin} answered a blob upload without a usable Location", hint=_BROKEN)
    return parts.path[len(base.path):] + (f"?{parts.query}" if parts.query else "")


def _refused(client: RegistryClient, status: int, wanted: int, what: str) -> None:
    if status != wanted:
        raise DataError(f"{client.origin} answered {status} to {what} for {client.subject}",
                        hint="check your access to push there (docker login)" if status in (401, 403)
                        else _BROKEN)
