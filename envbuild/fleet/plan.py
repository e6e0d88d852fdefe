"""What the fleet runs: per target of the lock, its placement, its image by digest and its count.

Images come from ``--image TARGET=REF@sha256:...`` or from a build report
(``build --push --json``, schema ``envbuild.build/1``). Only digests: a tag can move between
the render and a node's pull, and then the node would verify another image.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from envbuild.errors import UsageError
from envbuild.fleet.placement import LAUNCHERS, Placement
from envbuild.fleet.report import Required

Engine = Literal["slurm", "kubernetes"]
ENGINES: tuple[Engine, ...] = ("slurm", "kubernetes")
BUILD_SCHEMA = "envbuild.build/1"
MAX_REPORT_BYTES = 1 << 20
_DIGEST = r"sha256:[0-9a-f]{64}"
_DIGEST_REF_RE = re.compile(rf"[a-z0-9][a-z0-9._/:-]{{0,254}}@{_DIGEST}")
_CONTAINER_LAUNCHERS = frozenset(LAUNCHERS) - {"host"}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """How each node's smoke test runs: ``cpu_ok`` hands it --cpu-ok (and drops the GPU count),
    ``tier`` its --tier (None: the smoke test's default), within ``deadline`` seconds."""

    cpu_ok: bool = False
    tier: int | None = None
    deadline: float = 1800.0

    def required(self, gpus_per_node: int | None) -> Required:
        """What each node's report must hold to pass, as ``smoke_args`` asks for it: tiers 0..N
        (the smoke test's default 2), torch imported, and unless ``cpu_ok`` (from tier 1) the
        GPUs seen and, with a declared count, counted."""
        tier = 2 if self.tier is None else self.tier
        checks = ["torch.import"]
        if not self.cpu_ok and tier >= 1:
            checks += ["gpu.visible", *(["gpu.count"] if gpus_per_node else [])]
        return Required(tier=tier, checks=tuple(checks))

    def smoke_args(self, gpus_per_node: int | None) -> list[str]:
        args = [] if self.tier is None else ["--tier", str(self.tier)]
        if self.cpu_ok:
            return [*args, "--cpu-ok"]
        return [*args, "--expect-gpus", str(gpus_per_node)] if gpus_per_node else args


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetTarget:
    """One node type as the fleet checks it."""

    name: str
    placement: Placement
    nodes: int
    gpus_per_node: int | None
    image: str | None  # REF@sha256:..., None for the host launcher
    platform: str = "linux/amd64"  # the lock's stack: where its nodes' CPUs are x86_64 or arm64

    @property
    def needs_image(self) -> bool:
        return self.placement.slurm is None or self.placement.slurm.launcher in _CONTAINER_LAUNCHERS


def check_digest_ref(text: str, where: str) -> str:
    """``REF@sha256:<64 hex>``; a tag alone is refused."""
    if not _DIGEST_REF_RE.fullmatch(text):
        hint = ("pin it by digest: REF@sha256:<64 hex> (build --push prints it)" if "@" not in text
                else "write REF@sha256:<64 lowercase hex>")
        raise UsageError(f"image {text!r} ({where}) is not a reference by digest", hint=hint)
    return text


def parse_image_flags(flags: Sequence[str]) -> dict[str, str]:
    """``--image TARGET=REF@DIGEST``, each checked."""
    images: dict[str, str] = {}
    for flag in flags:
        target, sep, ref = flag.partition("=")
        if not sep or not target:
            raise UsageError(f"--image {flag!r}: expected TARGET=REF@sha256:...",
                             hint="e.g. h100=reg/app@sha256:...")
        if target in images:
            raise UsageError(f"--image names target {target!r} twice")
        images[target] = check_digest_ref(ref, f"--image {target}")
    return images


def read_build_report(path: Path) -> dict[str, str]:
    """The images a build report names per target (``{"schema": "envbuild.build/1",
    "targets": [{"target", "image", "digest", "ref"}]}``)."""
    from envbuild.confine import read_confined

    # a regular file, opened without blocking (a FIFO never hangs the command), size-capped
    data = read_confined(path, None, f"build report {path}", limit=MAX_REPORT_BYTES)
    try:
        report: Any = json.loads(data)
    except (ValueError, RecursionError):
        raise UsageError(f"build report {path} is not JSON",
                         hint="pass the file build --json wrote") from None
    if not isinstance(report, dict) or report.get("schema") != BUILD_SCHEMA \
            or not isinstance(report.get("targets"), list):
        raise UsageError(f"build report {path} is not of schema {BUILD_SCHEMA}")
    images: dict[str, str] = {}
    for entry in report["targets"]:
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("target", "ref")):
            raise UsageError(f"build report {path}: each target needs 'target' and 'ref' strings")
        images[entry["target"]] = check_digest_ref(entry["ref"], f"build report target {entry['target']!r}")
    return images


def plan_targets(placements: Mapping[str, Placement | None], engine: Engine,
                 images: Mapping[str, str], *, cpu_ok: bool = False,
                 platforms: Mapping[str, str] | None = None) -> tuple[FleetTarget, ...]:
    """Every target of the lock that names this engine, sorted; each problem a UsageError."""
    unknown = sorted(set(images) - set(placements))
    if unknown:
        raise UsageError(f"image for unknown target {unknown[0]!r}",
                         hint=f"the lock's targets: {', '.join(sorted(placements))}")
    found = [_target(name, placements[name] or Placement(), engine, images.get(name), cpu_ok=cpu_ok,
                     platform=(platforms or {}).get(name, "linux/amd64"))
             for name in sorted(placements)]
    chosen = tuple(t for t in found if t is not None)
    if not chosen:
        raise UsageError(f"no target of the lock says where its nodes are under {engine}",
                         hint=f"add {engine} = {{ ... }} and nodes = N to a target and run 'envbuild lock'")
    return chosen


def _target(name: str, placement: Placement, engine: Engine, image: str | None, *,
            cpu_ok: bool, platform: str = "linux/amd64") -> FleetTarget | None:
    if getattr(placement, engine) is None:
        return None
    if placement.nodes is None:
        raise UsageError(f"target {name!r} has no nodes count", hint="add nodes = N (the nodes of this type)")
    if placement.gpus_per_node is None and not cpu_ok:
        raise UsageError(f"target {name!r} has no gpus-per-node",
                         hint="add gpus-per-node = N (or pass --cpu-ok for a CPU-only check)")
    target = FleetTarget(name=name, placement=placement, nodes=placement.nodes,
                         gpus_per_node=placement.gpus_per_node, image=image, platform=platform)
    needs = engine == "kubernetes" or target.needs_image
    if needs and image is None:
        raise UsageError(f"target {name!r} needs its image by digest",
                         hint=f"pass --image {name}=REF@sha256:... or --images BUILD_REPORT.json")
    return target
