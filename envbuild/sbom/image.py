"""Whether an image in a registry is the one a lock target describes, as far as its config says.

What is compared (``sbom --attach`` refuses an image that differs in any of them):
- its platform (the config's ``os``/``architecture``) with the target's stack platform;
- every ``dev.envbuild.*`` label the target's image gets (the stack: torch, variant, Python,
  CUDA, cuDNN, the companions, the flavour, the index URL, the compatibility data's digest, …),
  and ``org.opencontainers.image.base.digest``, with the values the lock renders for them; a label
  the lock leaves out must be absent. Labels envbuild does not render (``dev.envbuild.built-by``,
  the user's own) are not compared.
What cannot be compared: the Python closure (no label carries the pylock's sha256), so an image of
the same stack built from another lock of it passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envbuild.redact import redact, server_text
from envbuild.render.docker import label_values
from envbuild.render.lock import Lock


def differences(config: Mapping[str, Any], lock: Lock) -> list[str]:
    """What the image's ``config`` (its config blob, as JSON) says otherwise than ``lock``."""
    found: list[str] = []
    platform = f"{config.get('os')}/{config.get('architecture')}"
    if platform != lock.stack.platform:
        found.append(f"platform {server_text(platform, 60)}, not {lock.stack.platform}")
    inner = config.get("config")
    labels = inner.get("Labels") if isinstance(inner, Mapping) else None
    labels = labels if isinstance(labels, Mapping) else {}
    expected = {key: value for key, value in label_values(lock).items()
                if key.startswith("dev.envbuild.") or key == "org.opencontainers.image.base.digest"}
    if not any(key.startswith("dev.envbuild.") for key in labels):
        return [*found, "no dev.envbuild.* label: not an image envbuild built"]
    for key, value in sorted(expected.items()):
        seen = labels.get(key) or ""
        if not isinstance(seen, str) or seen != value:
            shown = redact(server_text(seen, 60)) if isinstance(seen, str) and seen else "none"
            found.append(f"label {key} {shown}, not {redact(value) or 'none'}")
    return found
