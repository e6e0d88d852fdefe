"""Where a target's nodes live: the project file's fleet keys, as values and their grammar.

A target (node type) may say how many nodes of it the fleet must show (``nodes``), how many
GPUs each has (``gpus-per-node``), the CI runner labels of its kind (``runs-on``), and how to
reach its nodes through the engines the fleet already runs::

    slurm = { partition = "h100", gres = "gpu:h100", launcher = "docker" }
    kubernetes = { node-selector = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3" } }

Every value reaches an sbatch script, a manifest or a workflow: each is checked here by a
grammar narrow enough that no quoting can be broken (a project file may come from a pull
request). The lock carries the placement per target (``Placement.to_json``/``from_json``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from envbuild.confine import quoted
from envbuild.errors import UsageError

Launcher = Literal["docker", "pyxis", "apptainer", "host"]
LAUNCHERS: tuple[Launcher, ...] = ("docker", "pyxis", "apptainer", "host")
# install.sh's venv (templates/install.sh.j2: VENV=/opt/envbuild/venv) and its smoke test.
DEFAULT_HOST_PYTHON = "/opt/envbuild/venv/bin/python"
MAX_NODES = 10000
MAX_GPUS_PER_NODE = 1024

_PARTITION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_GRES_RE = re.compile(r"gpu(:[A-Za-z0-9][A-Za-z0-9_.-]{0,62})?")
_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_PATH_RE = re.compile(r"(/[A-Za-z0-9._+-]+)+")
_K8S_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_K8S_PREFIX = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
_K8S_KEY_RE = re.compile(rf"({_K8S_PREFIX}/)?{_K8S_NAME}")
_K8S_VALUE_RE = re.compile(rf"({_K8S_NAME})?")

SLURM_KEYS = ("partition", "gres", "launcher", "host-python")
KUBERNETES_KEYS = ("node-selector",)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmPlacement:
    """A target's nodes under Slurm: the partition that holds them, the gres type of their
    GPUs (``gpu`` or ``gpu:TYPE``; the count is the target's ``gpus-per-node``) and how the
    smoke test starts on a node."""

    partition: str
    gres: str = "gpu"
    launcher: Launcher = "docker"
    host_python: str = DEFAULT_HOST_PYTHON


@dataclass(frozen=True, slots=True, kw_only=True)
class KubernetesPlacement:
    """A target's nodes under Kubernetes: the node labels (GPU Feature Discovery's) that
    select them."""

    node_selector: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Every fleet key of one target; all optional."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    runs_on: tuple[str, ...] = ()
    slurm: SlurmPlacement | None = None
    kubernetes: KubernetesPlacement | None = None

    def is_empty(self) -> bool:
        return self == Placement()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.nodes is not None:
            data["nodes"] = self.nodes
        if self.gpus_per_node is not None:
            data["gpus-per-node"] = self.gpus_per_node
        if self.runs_on:
            data["runs-on"] = list(self.runs_on)
        if self.slurm is not None:
            data["slurm"] = {"partition": self.slurm.partition, "gres": self.slurm.gres,
                             "launcher": self.slurm.launcher, "host-python": self.slurm.host_python}
        if self.kubernetes is not None:
            data["kubernetes"] = {"node-selector": dict(self.kubernetes.node_selector)}
        return data


# --- one check per value: UsageError(message, hint) without the file's position ----------


def check_count(value: Any, key: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise UsageError(f"{key} must be a whole number from 1 to {most}", hint=f"write {key} = 4")
    return value


def check_partition(text: str) -> str:
    if not _PARTITION_RE.fullmatch(text):
        raise UsageError(f"invalid Slurm partition {quoted(text)}",
                         hint="letters, digits and _ . - (as sinfo shows it)")
    return text


def check_gres(text: str) -> str:
    if not _GRES_RE.fullmatch(text):
        hint = ("the count comes from gpus-per-node: write gres = \"gpu:TYPE\""
                if text.count(":") >= 2 else "gpu or gpu:TYPE, as the node's gres.conf names it")
        raise UsageError(f"invalid Slurm gres {quoted(text)}", hint=hint)
    return text


def check_launcher(text: str) -> Launcher:
    if not _is_launcher(text):
        raise UsageError(f"unknown launcher {quoted(text)}", hint=" | ".join(LAUNCHERS))
    return text


def _is_launcher(text: str) -> TypeGuard[Launcher]:
    return text in LAUNCHERS


def check_host_python(text: str) -> str:
    if not _PATH_RE.fullmatch(text) or "/../" in f"{text}/" or "/./" in f"{text}/":
        raise UsageError(f"invalid host-python {quoted(text)}",
                         hint=f"an absolute path to the node's interpreter, e.g. {DEFAULT_HOST_PYTHON}")
    return text


def check_runner_label(text: str) -> str:
    if not _LABEL_RE.fullmatch(text):
        raise UsageError(f"invalid runner label {quoted(text)}",
                         hint="letters, digits and _ . - (a runs-on label)")
    return text


def check_node_label(key: str, value: str) -> tuple[str, str]:
    if len(key) > 253 or not _K8S_KEY_RE.fullmatch(key):
        raise UsageError(f"invalid node label key {quoted(key)}",
                         hint="a Kubernetes label key, e.g. nvidia.com/gpu.product")
    if not _K8S_VALUE_RE.fullmatch(value):
        raise UsageError(f"invalid node label value {quoted(value)}",
                         hint="up to 63 letters, digits and _ . -, as `kubectl get node --show-labels` shows")
    return key, value


# --- reading the lock's copy back (hostile input: every value checked again) --------------


def from_json(raw: Any) -> Placement:
    """The placement a lock recorded; any problem is a UsageError."""
    if not isinstance(raw, dict) or not set(raw) <= {"nodes", "gpus-per-node", "runs-on", "slurm",
                                                     "kubernetes"}:
        raise UsageError("lock 'fleet' has unknown fields", hint="re-create the lock")
    runs_on = raw.get("runs-on", [])
    if not isinstance(runs_on, list) or not all(isinstance(x, str) for x in runs_on):
        raise UsageError("lock fleet 'runs-on' must be a list of strings")
    return Placement(
        nodes=None if raw.get("nodes") is None else check_count(raw["nodes"], "nodes", MAX_NODES),
        gpus_per_node=None if raw.get("gpus-per-node") is None
        else check_count(raw["gpus-per-node"], "gpus-per-node", MAX_GPUS_PER_NODE),
        runs_on=tuple(check_runner_label(x) for x in runs_on),
        slurm=None if raw.get("slurm") is None else _slurm(raw["slurm"]),
        kubernetes=None if raw.get("kubernetes") is None else _kubernetes(raw["kubernetes"]),
    )


def _slurm(raw: Any) -> SlurmPlacement:
    if not isinstance(raw, dict) or set(raw) != set(SLURM_KEYS) \
            or not all(isinstance(v, str) for v in raw.values()):
        raise UsageError("lock fleet 'slurm' needs partition, gres, launcher and host-python strings")
    return SlurmPlacement(partition=check_partition(raw["partition"]), gres=check_gres(raw["gres"]),
                          launcher=check_launcher(raw["launcher"]),
                          host_python=check_host_python(raw["host-python"]))


def _kubernetes(raw: Any) -> KubernetesPlacement:
    selector = raw.get("node-selector") if isinstance(raw, dict) and set(raw) == {"node-selector"} else None
    if not isinstance(selector, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in selector.items()):
        raise UsageError("lock fleet 'kubernetes' needs a node-selector table of strings")
    pairs = tuple(check_node_label(k, v) for k, v in sorted(selector.items()))
    return KubernetesPlacement(node_selector=pairs)
