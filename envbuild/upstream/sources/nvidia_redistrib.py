"""NVIDIA's release manifests: cuda_toolkits rows (CUDA x.y.z → toolkit driver) and cudnn rows.

``<base>cuda/redist/`` lists ``redistrib_X.Y.Z.json``; each names its release
(``release_label``) and its components, among them ``nvidia_driver``: the driver that
ships with the toolkit, which NVIDIA's release notes list as that release's toolkit
driver. ``<base>cudnn/redist/redistrib_X.Y.Z.json`` gives cuDNN's exact version and,
under ``linux-x86_64``, one build per CUDA major (``cuda11``, ``cuda12``, ...).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

from packaging.version import Version

from envbuild.errors import DataError
from envbuild.upstream.sources import Context, Document, Row, SourceResult, with_digest

DEFAULT_URL = "https://developer.download.nvidia.com/compute/"
MANIFEST = re.compile(r'href="(?:[^"]*/)?redistrib_(\d+\.\d+\.\d+)\.json"')
FIRST_CUDA = Version("11.0.0")
_VERSION = re.compile(r"\d+(\.\d+)+")


def manifests_listed(document: Document) -> list[str]:
    """Release versions linked from a redist directory listing, oldest first."""
    text = document.body.decode("utf-8", errors="replace")
    versions = sorted({m for m in MANIFEST.findall(text)}, key=Version)
    if not versions:
        raise DataError(f"{document.url} lists no redistrib_X.Y.Z.json manifest",
                        hint="an error page served with 200? check the NVIDIA URL")
    return versions


def load_manifest(document: Document) -> dict[str, Any]:
    try:
        data = json.loads(document.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{document.url} is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise DataError(f"{document.url}: expected a JSON object")
    return data


def _field(data: dict[str, Any], path: str, url: str) -> str:
    """A string at ``a.b.c``; a missing or renamed field is named in the error."""
    value: Any = data
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise DataError(f"{url}: field {path!r} missing (upstream format changed?)")
        value = value[key]
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        raise DataError(f"{url}: field {path!r} is not a version: {value!r}")
    return value


def toolkit_row(document: Document, expected: str, retrieved: str) -> Row | None:
    data = load_manifest(document)
    label = _field(data, "release_label", document.url)
    if label != expected:
        raise DataError(f"{document.url}: release_label {label!r} does not match the file name")
    if "nvidia_driver" not in data:
        return None  # no driver shipped with this release: nothing to record
    driver = _field(data, "nvidia_driver.version", document.url)
    note = "toolkit driver: the nvidia_driver component of NVIDIA's redistrib manifest"
    if isinstance(data.get("cuda_cudart"), dict):
        note += f"; cudart {_field(data, 'cuda_cudart.version', document.url)}"
    return {"cuda": label, "min_driver": driver, "source": with_digest(document.url, document.sha256),
            "retrieved": retrieved, "note": note}


def cudnn_row(document: Document, retrieved: str) -> Row | None:
    """The cudnn row of one manifest; None for a release built only for CUDA before
    FIRST_CUDA."""
    data = load_manifest(document)
    version = _field(data, "cudnn.version", document.url)
    builds = data["cudnn"].get("linux-x86_64")
    if not isinstance(builds, dict):
        raise DataError(f"{document.url}: field 'cudnn.linux-x86_64' missing (upstream format changed?)")
    listed = sorted(int(m[1]) for key in builds if (m := re.fullmatch(r"cuda(\d+)", key)))
    if not listed:
        raise DataError(f"{document.url}: no cudaNN build under 'cudnn.linux-x86_64'")
    # CUDA 10 builds of cuDNN 8.x exist, but envbuild covers CUDA from FIRST_CUDA on.
    majors = [major for major in listed if major >= FIRST_CUDA.major]
    if not majors:
        return None
    return {"cudnn": version, "cuda_majors": majors,
            "source": with_digest(document.url, document.sha256), "retrieved": retrieved,
            "note": "CUDA majors: the cudaNN builds listed for linux-x86_64 in NVIDIA's redistrib manifest"}


@dataclass(frozen=True, slots=True, kw_only=True)
class NvidiaSource:
    name: str = "nvidia"
    projects: frozenset[str] = frozenset({"cuda", "cudnn"})
    base_url: str = DEFAULT_URL

    def collect(self, context: Context) -> SourceResult:
        base = self.base_url.rstrip("/") + "/"
        only = context.only & self.projects or self.projects
        rows: dict[str, tuple[Row, ...]] = {}
        if "cuda" in only:
            rows["cuda_toolkits"] = tuple(self._toolkits(urljoin(base, "cuda/redist/"), context))
        if "cudnn" in only:
            rows["cudnn"] = tuple(self._cudnn(urljoin(base, "cudnn/redist/"), context))
        return SourceResult(name=self.name, prefix=base, rows=rows)

    def _toolkits(self, directory: str, context: Context) -> list[Row]:
        rows = []
        for version in manifests_listed(context.fetch.document(directory)):
            if Version(version) < FIRST_CUDA:
                continue
            row = toolkit_row(context.fetch.document(f"{directory}redistrib_{version}.json"),
                              version, context.retrieved)
            context.progress(f"nvidia cuda {version}: driver {row['min_driver'] if row else 'none'}")
            if row is not None:
                rows.append(row)
        return rows

    def _cudnn(self, directory: str, context: Context) -> list[Row]:
        rows = []
        for version in manifests_listed(context.fetch.document(directory)):
            row = cudnn_row(context.fetch.document(f"{directory}redistrib_{version}.json"),
                            context.retrieved)
            if row is None:
                context.progress(f"nvidia cudnn {version}: no build for CUDA >= {FIRST_CUDA.major}")
                continue
            context.progress(f"nvidia cudnn {row['cudnn']}: CUDA {row['cuda_majors']}")
            rows.append(row)
        return rows
