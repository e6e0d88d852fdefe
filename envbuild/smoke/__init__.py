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
                   host balance (can this CPU feed these GPUs), /dev/shm
  T3 several GPUs  peer access, topology, NCCL all-reduce bus bandwidth
  T4 health        temperature, power, clocks, throttle reasons, ECC, MIG

Exit codes: 0 pass (warnings allowed), 7 a check failed, 8 the GPU runtime or
driver is missing. The classification logic (arch coverage, CUDA error texts,
nvidia-smi parsing, lock diff, aggregation) is pure functions in their own modules;
``rules`` holds what the host side of envbuild shares.

Importing this package imports nothing: the host side reaches ``envbuild.smoke.rules``
on ``envbuild resolve``'s start-up path. Import each module by its own name.
"""

from __future__ import annotations
