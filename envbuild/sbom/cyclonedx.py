"""A CycloneDX 1.6 bill of materials (JSON) for one target of a lock: what its image holds.

Components, each with a ``bom-ref`` and a package URL (purl):
- the base image (``type: container``), by digest when the lock pins one (``pkg:oci/…@sha256%3A…``);
- every Python distribution of the target's pylock (``pkg:pypi/NAME@VERSION``) with the sha256 of the
  one file the image installs (the wheel its CPython prefers on its glibc, as the build picks it; the
  sdist for a package built from it) and that file's URL (an external reference of type
  ``distribution`` carrying the same hash); its ``upload-time`` as a property where the index gave one;
- every Debian package the build recorded (``envbuild.debs.json``: ``pkg:deb/ID/NAME@VERSION?arch=…``;
  absent until a ``build --lock`` recorded them, which the document says in a property);
- every extension wheel the build made (``envbuild.built.json``), with its sha256 and what it was built
  from.

The document is deterministic: no timestamp (``SOURCE_DATE_EPOCH`` names one when set), and a
``serialNumber`` derived from its content (a UUID 5), so one lock and one record give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from envbuild import __version__
from envbuild.extensions.record import Built
from envbuild.pylock.files import Pylock, PylockFile, PylockPackage
from envbuild.pylock.install import best_wheel, supported_tags
from envbuild.render.lock import Lock
from envbuild.sbom.debs import Debs

SPEC_VERSION = "1.6"


def _hash(sha256: str) -> list[dict[str, str]]:
    return [{"alg": "SHA-256", "content": sha256}]


def _installed_file(package: PylockPackage, lock: Lock) -> PylockFile | None:
    """The file of ``package`` the image installs: the best wheel for the target's CPython and
    glibc, else its sdist (built in the image), else its first wheel."""
    assert lock.pylock is not None
    if package.name in lock.sdists and package.sdist is not None:
        return package.sdist
    chosen = best_wheel(package, supported_tags(lock.stack.python, lock.pylock.glibc, lock.pylock.arch))
    return chosen or package.sdist or (package.wheels[0] if package.wheels else None)


def python_component(package: PylockPackage, lock: Lock, layer: frozenset[str]) -> dict[str, Any]:
    chosen = _installed_file(package, lock)
    component: dict[str, Any] = {
        "type": "library", "bom-ref": f"pypi:{package.name}@{package.version}", "name": package.name,
        "version": package.version, "purl": f"pkg:pypi/{package.name}@{quote(package.version, safe='')}"}
    properties = [{"name": "envbuild:layer", "value": "torch" if package.name in layer else "project"}]
    if chosen is not None:
        component["hashes"] = _hash(chosen.sha256)
        properties.append({"name": "envbuild:file", "value": chosen.filename})
        if chosen.url is not None:
            component["externalReferences"] = [{"type": "distribution", "url": chosen.url,
                                                "hashes": _hash(chosen.sha256)}]
        if chosen.upload_time is not None:
            properties.append({"name": "envbuild:upload-time",
                               "value": chosen.upload_time.strftime("%Y-%m-%dT%H:%M:%SZ")})
    component["properties"] = properties
    return component


def deb_component(key: str, version: str, os_id: str | None) -> dict[str, Any]:
    name, _, arch = key.partition(":")
    namespace = os_id or "debian"
    return {"type": "library", "bom-ref": f"deb:{key}@{version}", "name": name, "version": version,
            "purl": f"pkg:deb/{namespace}/{name}@{quote(version, safe='')}?arch={arch}"}


def base_component(lock: Lock) -> dict[str, Any]:
    reference = lock.base_image.split("@", 1)[0]
    tagged = ":" in reference.rsplit("/", 1)[-1]
    repository, _, tag = reference.rpartition(":") if tagged else (reference, "", "")
    registry, _, path = repository.partition("/") if "/" in repository else ("", "", repository)
    if registry and not ("." in registry or ":" in registry or registry == "localhost"):
        registry, path = "", repository  # docker.io's short form: library/name or user/name
    name = path.rsplit("/", 1)[-1]
    component: dict[str, Any] = {"type": "container", "bom-ref": "base-image", "name": name,
                                 "version": lock.base_digest or tag or "latest"}
    qualifiers = [f"repository_url={quote((registry + '/' if registry else '') + path, safe='/')}"]
    if tag:
        qualifiers.append(f"tag={quote(tag, safe='')}")
    version = f"@{quote(lock.base_digest, safe='')}" if lock.base_digest else ""
    component["purl"] = f"pkg:oci/{name}{version}?{'&'.join(qualifiers)}"
    if lock.base_digest:
        component["hashes"] = _hash(lock.base_digest.split(":", 1)[1])
    else:
        component["properties"] = [{"name": "envbuild:unpinned", "value": "the lock records the base by tag"}]
    return component


def extension_component(built: Built) -> dict[str, Any]:
    parts = built.wheel[:-4].split("-")
    version = parts[1] if len(parts) > 1 else "0"
    key = built.key
    return {"type": "library", "bom-ref": f"built:{key.name}@{version}", "name": key.name, "version": version,
            "purl": f"pkg:pypi/{key.name}@{quote(version, safe='')}", "hashes": _hash(built.sha256),
            "properties": [{"name": "envbuild:built-in-image", "value": built.wheel},
                           {"name": "envbuild:source-sha256", "value": key.source_sha256},
                           {"name": "envbuild:built-against", "value": f"torch {key.torch}"}]}


def document(target: str, lock: Lock, pylock: Pylock, *, debs: Debs | None, built: Sequence[Built] = (),
             image: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The CycloneDX document of ``target``; ``image``: the built image's name (or ID), if known."""
    assert lock.pylock is not None
    layer = frozenset(lock.pylock.torch_layer)
    components = [base_component(lock)]
    components += [python_component(p, lock, layer) for p in sorted(pylock.packages, key=lambda p: p.name)]
    if debs is not None:
        components += [deb_component(k, v, debs.os) for k, v in sorted(debs.packages.items())]
    components += [extension_component(b) for b in sorted(built, key=lambda b: b.key)]
    properties = [{"name": "envbuild:target", "value": target},
                  {"name": "envbuild:stack", "value": f"torch {lock.stack.torch} ({lock.stack.variant}), "
                                                      f"Python {lock.stack.python}"},
                  {"name": "envbuild:pylock-sha256", "value": lock.pylock.sha256}]
    if lock.pylock.exclude_newer is not None:
        properties.append({"name": "envbuild:exclude-newer", "value": lock.pylock.exclude_newer})
    properties.append({"name": "envbuild:debian-packages",
                       "value": "recorded by build --lock" if debs is not None
                       else "not recorded: no build --lock of this target has read its image yet"})
    root: dict[str, Any] = {"type": "container", "bom-ref": "image",
                            "name": image or f"envbuild target {target}", "properties": properties}
    metadata: dict[str, Any] = {
        "tools": {"components": [{"type": "application", "name": "envbuild", "version": __version__}]},
        "component": root}
    epoch = (env or {}).get("SOURCE_DATE_EPOCH", "")
    if epoch.isdigit() and int(epoch) < 253402300800:  # before the year 10000
        when = datetime.fromtimestamp(int(epoch), timezone.utc)
        metadata["timestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {"metadata": metadata, "components": components,
            "dependencies": [{"ref": "image", "dependsOn": [c["bom-ref"] for c in components]}]}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()
    return {"bomFormat": "CycloneDX", "specVersion": SPEC_VERSION,
            "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'envbuild-sbom:' + digest)}",
            "version": 1, **body}


def text(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True) + "\n"
