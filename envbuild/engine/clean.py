"""Containers envbuild left behind: found by their label, removed on request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envbuild.engine.daemon import LABEL


def leftovers(client: Any) -> list[dict[str, Any]]:
    """Containers envbuild created that are no longer running."""
    found = client.containers(all=True, filters={"label": LABEL})
    return [c for c in found if c.get("State") != "running"]


def warn_leftovers(client: Any, warn: Callable[[str], None]) -> None:
    stale = leftovers(client)
    if stale:
        warn(f"{len(stale)} container(s) left by an earlier envbuild run; "
             "'envbuild clean' removes them")


def clean(client: Any) -> list[str]:
    """Remove every container labelled by envbuild (running ones too); their short ids."""
    removed = []
    for c in client.containers(all=True, filters={"label": LABEL}):
        client.remove_container(c["Id"], force=True)
        removed.append(str(c["Id"])[:12])
    return removed
