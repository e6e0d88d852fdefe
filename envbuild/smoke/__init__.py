"""envbuild smoke test: prove the GPU really works, and say why it idles.

This package is shipped into every image and host script as one file,
``/opt/envbuild/smoke.py`` (a zipapp built by ``bundle.payload``), so it runs
standalone: the standard library plus torch, Python 3.8 or newer, and it never
imports the rest of envbuild. ``torch.cuda.is_available()`` is not verification: this
runs real kernels, compares them with a CPU reference and names each failure.

Tiers (``--tier N`` runs 0..N):
  T0 environment   driver, container GPU variables, torch build, CPUs, lock
  T1 correctness   GPU visible, arch coverage, kernels, matmul, cuDNN conv, optimizer
  T2 idle causes   matmul vs peak, host<->device bandwidth, launch latency,
                   DataLoader workers, /dev/shm
  T3 several GPUs  peer access, topology, NCCL all-reduce bus bandwidth
  T4 health        temperature, power, clocks, throttle reasons, ECC, MIG

Exit codes: 0 pass (warnings allowed), 7 a check failed, 8 the GPU runtime or
driver is missing. The classification logic (arch coverage, CUDA error texts,
nvidia-smi parsing, lock diff, aggregation) is pure functions in their own modules;
``rules`` holds what the host side of envbuild shares.

Importing this package imports nothing: the host side reaches ``envbuild.smoke.rules``
on ``envbuild resolve``'s start-up path. The public names below load their module
on first use.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Public name -> the module that defines it.
_PUBLIC = {
    "Check": "report",
    "Outcome": "report",
    "exit_code_for": "report",
    "render_text": "report",
    "summarize": "report",
    "Coverage": "arch",
    "arch_coverage": "arch",
    "parse_arch": "arch",
    "Diagnosis": "diagnose",
    "classify_cuda_error": "diagnose",
    "diagnose_no_gpu": "diagnose",
    "diff_lock": "lockfile",
    "HealthReading": "health",
    "evaluate_health": "health",
    "match_peak": "numeric",
    "Topology": "nvsmi",
    "parse_smi_csv": "nvsmi",
    "parse_topo": "nvsmi",
    "Options": "runner",
    "run_smoke": "suite",
    "main": "__main__",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    import importlib

    return getattr(importlib.import_module("." + module, __name__), name)
