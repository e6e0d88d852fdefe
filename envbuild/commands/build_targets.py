"""``envbuild build --lock`` of a lock with several targets: every target (or ``--target
NAME``), one image per target with the target in its tag, and the ``--json`` document that
names each target's image and digest.

The document (``--json`` on stdout; ``--report FILE`` of a several-target build) is versioned:

    {"schema": "envbuild.build/1",
     "targets": [{"target": "a10", "image": "envbuild/torch:…-a10",
                  "image_id": "sha256:…", "builder": "buildah",
                  "digest": "sha256:…" | null, "ref": "registry/name@sha256:…" | null}]}

``digest`` and ``ref`` are the registry's, after ``--push`` (null without it). A later
schema adds fields and keeps these; a reader checks ``schema`` first (docs/build.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BUILD_SCHEMA = "envbuild.build/1"


def target_names(args: argparse.Namespace) -> tuple[list[str | None], bool]:
    """The targets to build, in the lock's order (None: not built from a lock), and whether the
    lock holds several (then every image's tag names its target)."""
    if not args.lock:
        return [None], False
    from envbuild.render.lockset import read_lockset

    names = list(read_lockset(Path(args.lock)).targets)
    several = len(names) > 1
    if args.target is not None:
        return [args.target], several
    return list(names), several


def for_target(args: argparse.Namespace, name: str | None) -> argparse.Namespace:
    """``args`` with ``--target`` set to ``name``."""
    if name is None or args.target == name:
        return args
    return argparse.Namespace(**{**vars(args), "target": name})


def with_target(ref: str, target: str) -> str:
    """``name[:tag]`` → ``name:tag-target`` (``name:target`` when it has no tag); a registry
    port is not a tag."""
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        return f"{ref}-{target}"
    return f"{ref}:{target}"


def entry(target: str | None, image: str, image_id: str, builder: str,
          pushed: Mapping[str, str] | None) -> dict[str, Any]:
    """One target's line of the document."""
    return {"target": target or "default", "image": image, "image_id": image_id, "builder": builder,
            "digest": None if pushed is None else pushed["digest"],
            "ref": None if pushed is None else pushed["pinned"]}


def document(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"schema": BUILD_SCHEMA, "targets": list(entries)}
