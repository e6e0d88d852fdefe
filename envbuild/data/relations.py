"""The names of the compatibility data: one relation per file in ``matrices/``.

Its own module so that the loader (``matrix``) and the schema (``validate``) both read
it without importing each other. It imports nothing: ``envbuild resolve`` loads it at
start-up.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RELATIONS = (
    "cuda_toolkits",
    "cuda_compat",
    "cuda_archs",
    "cuda_ubuntu",
    "cudnn",
    "gpus",
    "gpu_peaks",
    "torch_variants",
    "torch_aarch64",
    "torch_pypi",
    "torch_wheels",
    "torch_companions",
    "cuda_images",
    "ubuntu_python",
    "python_standalone",
    "ci_actions",
    "driver_branches",
    "container_toolkit",
)
# Relations no stack is resolved from (the CI workflow's action pins; the host script's driver
# branches and container toolkit pin, read when it is rendered): left out of
# ``Matrix.digest``, the matrices digest a lock records, so that refreshing them leaves
# every lock current. The JSON cache is still keyed by every file.
NOT_RESOLVED = ("ci_actions", "driver_branches", "container_toolkit")
if TYPE_CHECKING:
    Row = dict[str, Any]
else:
    Row = dict  # the alias, without importing typing
MANIFEST = "manifest.json"
