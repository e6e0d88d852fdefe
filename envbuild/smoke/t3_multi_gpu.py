"""T3 several GPUs: peer access, topology, NCCL all-reduce bus bandwidth."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Any

from .diagnose import classify_cuda_error
from .numeric import bus_bandwidth_gbs
from .nvsmi import parse_topo, summarize_topology
from .probes import run_command
from .report import Outcome, fail, ok, skip, warn
from .runner import Run


def tier3(run: Run) -> None:
    count = len(run.devices)
    few = None if count >= 2 else "needs 2 or more GPUs (found %d)" % count
    for name, fn, heavy in (
        ("p2p.access", lambda: _check_p2p(run), False),
        ("topology", _check_topology, False),
        ("nccl.allreduce", lambda: _check_nccl(run), True),
    ):
        if few is not None and run.gpu_block is None:
            run.check(name, 3, lambda f=few: skip(f), gpu=True)  # type: ignore[misc]
        else:
            run.check(name, 3, fn, gpu=True, heavy=heavy)


def _check_p2p(run: Run) -> Outcome:
    torch = run.torch
    matrix: dict[str, dict[str, bool]] = {}
    missing = []
    for i in run.devices:
        matrix["cuda:%d" % i] = {}
        for j in run.devices:
            if i == j:
                continue
            can = bool(torch.cuda.can_device_access_peer(i, j))
            matrix["cuda:%d" % i]["cuda:%d" % j] = can
            if not can:
                missing.append("%d->%d" % (i, j))
    if missing:
        return warn(
            "no peer access for %s: copies between these GPUs go through host memory" % ", ".join(missing),
            matrix,
            "PCIe P2P can be off across CPU sockets or in VMs; NVLink pairs always allow it",
        )
    return ok("peer access between all %d GPUs" % len(run.devices), matrix)


def _check_topology() -> Outcome:
    rc, out = run_command(["nvidia-smi", "topo", "-m"])
    if rc != 0:
        return skip(
            "nvidia-smi topo -m unavailable (exit %d)" % rc,
            None,
            "set NVIDIA_DRIVER_CAPABILITIES=compute,utility so nvidia-smi is mounted",
        )
    topo = parse_topo(out)
    summary = summarize_topology(topo)
    summary["cpu_affinity"] = topo.cpu_affinity
    text = "links: %s" % ", ".join("%s %s" % (p, k) for p, k in sorted(summary["pairs"].items()))
    if summary["cross_socket_pairs"]:
        return warn(
            text,
            summary,
            "some GPU pairs cross the CPU socket interconnect (SYS): keep "
            "communicating ranks on one NUMA node and pin processes to each GPU's CPU affinity",
        )
    return ok(text, summary)


def _nccl_worker(rank: int, world: int, init_file: str, nbytes: int, queue: Any) -> None:
    """One process per GPU: a checked all-reduce, then a timed one."""
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=world)
        x = torch.full((1 << 20,), float(rank + 1), device="cuda:%d" % rank)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        wrong = int((x != float(world * (world + 1) // 2)).sum().item())
        buf = torch.ones(nbytes // 4, device="cuda:%d" % rank)
        for _ in range(5):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        iters = 20
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        queue.put({"rank": rank, "wrong": wrong, "seconds": seconds})
        dist.destroy_process_group()
    except Exception as exc:
        queue.put({"rank": rank, "error": "%s: %s" % (type(exc).__name__, exc)})


def _check_nccl(run: Run) -> Outcome:
    import multiprocessing

    torch = run.torch
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return fail("torch was built without NCCL", hint="install the CUDA wheel from the PyTorch index")
    world = len(run.devices)
    nbytes = 256 << 20
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    limit = run.options.timeout or 180.0
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            context.Process(target=_nccl_worker, args=(r, world, init_file, nbytes, queue))
            for r in range(world)
        ]
        for proc in procs:
            proc.start()
        results: list[dict[str, Any]] = []
        end = time.monotonic() + limit
        try:
            while len(results) < world and time.monotonic() < end:
                with contextlib.suppress(Exception):
                    results.append(queue.get(timeout=1.0))
        finally:
            for proc in procs:
                proc.join(timeout=max(0.0, end - time.monotonic()) if len(results) == world else 1.0)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)
    if len(results) < world:
        return fail(
            "NCCL all-reduce timed out after %.0f s (%d of %d ranks reported)" % (limit, len(results), world),
            hint="rerun with NCCL_DEBUG=INFO; try NCCL_P2P_DISABLE=1 to test the P2P path",
        )
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        known = classify_cuda_error(errors[0])
        return fail(
            "NCCL all-reduce failed: %s" % errors[0],
            {"errors": errors},
            known.hint if known else "rerun with NCCL_DEBUG=INFO",
        )
    wrong = sum(int(r["wrong"]) for r in results)
    seconds = max(float(r["seconds"]) for r in results)
    busbw = bus_bandwidth_gbs(nbytes, seconds, world)
    value = {
        "ranks": world,
        "bytes": nbytes,
        "seconds": seconds,
        "busbw_gbs": round(busbw, 2),
        "wrong": wrong,
    }
    if wrong:
        return fail(
            "numerical check failed: NCCL all-reduce gave %d wrong elements" % wrong,
            value,
            "a broken link or GPU: run nccl-tests and check dmesg for Xid errors",
        )
    return ok(
        "NCCL all-reduce %d MiB over %d GPUs: bus bandwidth %.1f GB/s" % (nbytes >> 20, world, busbw),
        value,
    )
