"""What a --base-image really is: its os-release name and its glibc, read at build time by
running the image once, with no network, when the engine already holds it (nothing is
pulled for this: the build pulls as it always did, and its labels then name the base only).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from envbuild.engine.daemon import LABEL

# os-release, a separator, then ldd's first line ("ldd (Debian GLIBC 2.36-9+deb12u10) 2.36").
PROBE = "cat /etc/os-release 2>/dev/null; echo ---; ldd --version 2>&1 | head -n 1"
_NAME = re.compile(r"^PRETTY_NAME=\"?([A-Za-z0-9 ._()/+:-]{1,80}?)\"?$", re.M)  # shown only if plain
_GLIBC = re.compile(r"(?:GLIBC|GNU libc)\b.*?\s(2\.\d{1,3})\s*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseOs:
    name: str  # os-release PRETTY_NAME, "Debian GNU/Linux 12 (bookworm)"
    glibc: str | None  # "2.36"; None: no GNU libc found (musl, or no ldd)


def parse_base_os(text: str) -> BaseOs | None:
    """The probe's output as a BaseOs; None when it names no OS plainly (the image's text is
    never shown unless it is a short plain name)."""
    release, _, ldd = text.partition("\n---\n")
    name = _NAME.search(release)
    if name is None:
        return None
    glibc = _GLIBC.search(ldd.strip().splitlines()[0] if ldd.strip() else "")
    return BaseOs(name=name.group(1).strip(), glibc=None if glibc is None else glibc.group(1))


def read_base_os(client: Any, image: str, *, timeout: float = 60) -> BaseOs | None:
    """Run ``PROBE`` in ``image`` (no network, envbuild's label so ``clean`` finds a leftover);
    None when the engine lacks the image or the probe fails: the labels then name the image."""
    import docker.errors
    import requests.exceptions

    try:
        client.inspect_image(image)
        host = client.create_host_config(network_mode="none")
        container = client.create_container(image, entrypoint=["sh", "-c", PROBE], command=[],
                                            host_config=host, labels={LABEL: "base-os"},
                                            network_disabled=True)
    except docker.errors.APIError:
        return None
    cid = container["Id"]
    try:
        client.start(cid)
        if int(client.wait(cid, timeout=timeout).get("StatusCode", 1)) != 0:
            return None
        return parse_base_os(client.logs(cid, stdout=True, stderr=False).decode("utf-8", "replace"))
    except (docker.errors.APIError, requests.exceptions.RequestException):
        return None
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.remove_container(cid, force=True)
