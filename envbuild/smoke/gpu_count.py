"""``--expect-gpus N``: the node type has N GPUs, and this process must see every one.

A node with 7 of its 8 GPUs passes every other check: the count is a check of its own.
When the driver lists more GPUs than torch sees (NVML or nvidia-smi against
``torch.cuda.device_count()``), the report says which were left out of this process.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .report import Outcome, fail, ok, warn

MASK_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def judge_gpu_count(
    expected: int,
    seen: Sequence[str],
    listed: Sequence[str] | None,
    env: Mapping[str, str],
) -> Outcome:
    """``seen``: the names torch reports, one per visible device; ``listed``: the names
    the driver lists on the node (None when it could not be asked)."""
    value: dict[str, Any] = {"expected": expected, "seen": len(seen), "names": list(seen)}
    if listed is not None:
        value["listed"] = list(listed)
    if len(seen) > expected:
        return warn(
            "%d GPUs visible, the node type declares %d" % (len(seen), expected),
            value,
            "set the target's gpus-per-node to %d, or check that this node is of that type" % len(seen),
        )
    if len(seen) == expected:
        return ok("%d of %d GPUs visible" % (len(seen), expected), value)
    message = "expected %d GPUs, %d visible" % (expected, len(seen))
    if listed is not None and len(listed) > len(seen):
        message += "; the driver lists %d (%s), this process sees %d" % (
            len(listed), ", ".join(listed), len(seen))
        return fail(message, value, _mask_hint(env))
    return fail(
        message,
        value,
        "the node has lost a GPU, or it is not of this type: check nvidia-smi and the "
        "kernel log (Xid errors) on it, and drain it until it shows all %d" % expected,
    )


def _mask_hint(env: Mapping[str, str]) -> str:
    masks = ["%s=%s" % (k, env[k]) for k in MASK_VARIABLES if env.get(k)]
    if masks:
        return "this process is limited by %s: hand it every GPU of the node" % ", ".join(masks)
    return ("the container or job got fewer GPUs than the node has: request all of them "
            "(--gpus all, --gres=gpu:N, nvidia.com/gpu: N)")
