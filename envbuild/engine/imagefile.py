"""One small file of a built image, read through the engine without running anything: a
container is created (never started), the file copied out of it as a tar, the container removed.
Used for the extension wheels' sha256 the build stage leaves in the image."""

from __future__ import annotations

import contextlib
import io
import tarfile
from typing import Any

from envbuild.engine.daemon import LABEL


def read_image_file(client: Any, image: str, path: str, *, limit: int = 1024 * 1024) -> bytes | None:
    """The bytes of the regular file ``path`` in ``image``; None when the engine lacks the image
    or the file, or the file is not regular or larger than ``limit``."""
    import docker.errors
    import requests.exceptions

    try:
        container = client.create_container(image, command=["true"], labels={LABEL: "image-file"},
                                            network_disabled=True)
    except docker.errors.APIError:
        return None
    cid = container["Id"]
    try:
        stream, info = client.get_archive(cid, path)
        if not isinstance(info, dict) or int(info.get("size", limit + 1)) > limit:
            return None
        data = bytearray()
        for chunk in stream:
            data += chunk
            if len(data) > limit + 64 * 1024:  # the tar's headers and padding around the file
                return None
        return _member(bytes(data), limit)
    except (docker.errors.APIError, requests.exceptions.RequestException):
        return None
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.remove_container(cid, force=True)


def _member(archive: bytes, limit: int) -> bytes | None:
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.next()
            if member is None or not member.isreg() or member.size > limit:
                return None
            handle = tar.extractfile(member)
            return None if handle is None else handle.read()
    except tarfile.TarError:
        return None
