"""Moved: image references, endpoints and the digest lookup live in ``envbuild.registry``
(one registry client, with Docker's credentials and TLS). These names stay importable here
for code written against the old place."""

from __future__ import annotations

from envbuild.registry.digest import NO_REGISTRY_HINT, image_digest
from envbuild.registry.reference import (
    ACCEPT,
    DIGEST_RE,
    HUB,
    MANIFEST_TYPES,
    MAX_MANIFEST_BYTES,
    ImageReference,
    endpoint,
    is_loopback,
    parse_challenge,
    parse_reference,
    pinned,
    registry_url,
)

__all__ = ["ACCEPT", "DIGEST_RE", "HUB", "MANIFEST_TYPES", "MAX_MANIFEST_BYTES", "NO_REGISTRY_HINT",
           "ImageReference", "endpoint", "image_digest", "is_loopback", "parse_challenge",
           "parse_reference", "pinned", "registry_url"]
