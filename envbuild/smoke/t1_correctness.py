"""T1 correctness: GPU visible, arch coverage, kernels, matmul, cuDNN conv, optimizer."""

# Runs on Python 3.8: zip(strict=...) is 3.10+.
# ruff: noqa: B905
from __future__ import annotations

import contextlib
import copy
import platform
import warnings
from typing import Any, Callable, Iterator

from .arch import arch_coverage, arch_hint
from .compiling import Pending, begin_compile, check_compile
from .diagnose import diagnose_no_gpu
from .gpu_count import judge_gpu_count
from .numeric import compare_result
from .probes import read_text, torch_arch_list, try_call
from .proof import (
    check_on_cuda,
    dxg_present,
    is_wsl,
    judge_device_nodes,
    judge_libcuda,
    list_device_nodes,
)
from .report import Outcome, fail, ok, skip, warn
from .runner import BLOCK_SOURCES, Run, bind, indices

# Matmul tolerances: max |got - ref| / max |ref|, ref in float64 from the same
# (already rounded) inputs. Loose enough for TF32 and reduced-precision
# reductions, far below what a wrong kernel produces (errors of order 1).
MATMUL_TOLERANCE = {"fp32": 2e-3, "fp16": 1e-2, "bf16": 3e-2}
CONV_TOLERANCE = 1e-3
OPTIMIZER_TOLERANCE = 1e-4

def tier1(run: Run) -> None:
    visible = run.check("gpu.visible", 1, lambda: _check_visible(run), gpu=True)
    if visible.status != "pass" and run.gpu_block is None:
        run.gpu_block = "no GPU visible"
    if run.options.expect_gpus is not None:
        run.check("gpu.count", 1, lambda: _check_count(run), gpu=True)
    # The compile child runs beside the checks below and is judged last, as before: on the CPU
    # (--cpu-ok without a GPU) from here, on the first GPU once its first kernel passed there
    # (a GPU that fails it may hang a new process's CUDA start, which no compile should meet).
    device = _compile_device(run)
    pending = begin_compile(run.torch, device, run.env) if device == "cpu" else None
    try:
        for index in indices(run):
            suffix = "" if index is None else "@cuda:%d" % index
            for name, fn, heavy in T1_DEVICE_CHECKS:
                done = run.check(name + suffix, 1, bind(fn, run, index), gpu=True, device=index, heavy=heavy)
                if (pending is None and device == "cuda:0" and index == 0 and name == "gpu.kernel"
                        and done.status == "pass"):
                    pending = begin_compile(run.torch, device, run.env)
        # After the kernels above: libcuda is mapped once a kernel has run.
        run.check("gpu.dev_nodes", 1, lambda: _check_dev_nodes(run), gpu=True)
        run.check("gpu.libcuda", 1, lambda: judge_libcuda(read_text("/proc/self/maps")), gpu=True)
        run.check("cpu.selfcheck", 1, lambda: _check_cpu_selfcheck(run), heavy=True)
        run.check("torch.compile", 1, lambda: _check_compile(run, pending))
    finally:
        if pending is not None:
            pending.cancel()  # a child never judged (an error, Ctrl-C) is not left running


def _compile_device(run: Run) -> str | None:
    """Where torch.compile is checked: the first GPU, the CPU when no GPU is expected
    (--cpu-ok), None when the GPU checks are blocked."""
    if run.gpu_block is not None and not run.options.cpu_ok:
        return None
    return "cuda:0" if run.devices and run.gpu_block is None else "cpu"


def _check_compile(run: Run, pending: Pending | None = None) -> Outcome:
    """Triton on the first GPU once its first kernel ran there; Inductor's C++ on the CPU when
    no GPU is expected (--cpu-ok); skipped when the GPU checks are blocked. ``pending``: the
    check begun at the tier's start, used where it is for the device known now."""
    device = _compile_device(run)
    if device is None:
        assert run.gpu_block is not None
        return skip("blocked: %s" % run.gpu_block, hint="fix %s first" % BLOCK_SOURCES.get(
            run.gpu_block, "the first failure above"))
    if device.startswith("cuda"):
        kernel = next((c for c in run.checks if c.name == "gpu.kernel@cuda:0"), None)
        if kernel is None or kernel.status != "pass":
            return skip("blocked: gpu.kernel@cuda:0 did not pass", hint="fix gpu.kernel@cuda:0 first")
    if pending is None or pending.device != device:
        return check_compile(run.torch, device, run.env, run.options.timeout)
    return pending.finish(run.options.timeout)


def _matmul_on(dtype: str) -> Callable[[Run, int], Outcome]:
    def check(run: Run, index: int) -> Outcome:
        return check_matmul(run.torch, "cuda:%d" % index, dtype)

    return check


def _optimizer_on(run: Run, index: int) -> Outcome:
    return check_optimizer(run.torch, "cuda:%d" % index)


def _check_visible(run: Run) -> Outcome:
    torch = run.torch
    init_error: str | None = None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count()) if available else 0
        try:
            # Initialises CUDA when a GPU is there; raises the real reason when not.
            torch.cuda.init()
        except Exception as exc:
            init_error = str(exc)
    caught = [str(w.message) for w in seen]
    if init_error is None and not count:
        init_error = next((m for m in caught if "CUDA initialization" in m), None)
    if count and init_error is None:
        run.devices = list(range(count))
        devices = []
        for i in run.devices:
            cap = tuple(torch.cuda.get_device_capability(i))
            props = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "name": torch.cuda.get_device_name(i),
                    "capability": "%d.%d" % cap,
                    "memory_bytes": int(props.total_memory),
                    "multi_processor_count": int(props.multi_processor_count),
                }
            )
        run.torch_facts["devices"] = devices
        run.torch_facts["arch_list"] = torch_arch_list(torch)
        names = ", ".join(
            "cuda:%d %s (sm_%s)" % (d["index"], d["name"], d["capability"].replace(".", "")) for d in devices
        )
        return ok("%d GPU(s): %s" % (count, names), {"devices": devices, "warnings": caught})
    run.gpu_block = "no GPU visible"
    diagnosis = diagnose_no_gpu(
        env=run.env,
        dev_nodes=run.host.get("dev_nodes", []),
        in_container=bool(run.host.get("in_container")),
        init_error=init_error,
        torch_cuda=run.torch_facts.get("cuda"),
        driver_version=(run.driver or {}).get("version"),
        driver_cuda=(run.driver or {}).get("cuda_version"),
    )
    value = {"kind": diagnosis.kind, "init_error": init_error, "warnings": caught}
    if run.options.cpu_ok:
        return skip(diagnosis.message + "; accepted by --cpu-ok", value, diagnosis.hint)
    return fail(diagnosis.message, value, diagnosis.hint, diagnosis.exit_code)


def _check_count(run: Run) -> Outcome:
    seen = [str(d["name"]) for d in run.torch_facts.get("devices") or []]
    listed = (run.driver or {}).get("gpus")
    return judge_gpu_count(int(run.options.expect_gpus or 0), seen,
                           [str(n) for n in listed] if isinstance(listed, list) else None, run.env)


def _check_arch(run: Run, index: int) -> Outcome:
    torch = run.torch
    capability = tuple(int(x) for x in torch.cuda.get_device_capability(index))
    cap = (capability[0], capability[1])
    archs = run.torch_facts.get("arch_list") or []
    if not archs:
        return skip(
            "torch reports no arch list; the kernel checks below decide",
            hint="gpu.kernel and the matmul checks prove the GPU runs",
        )
    coverage = arch_coverage(cap, archs)
    value = {
        "capability": "%d.%d" % cap,
        "arch_list": archs,
        "how": coverage.how,
        "entry": coverage.entry,
    }
    if not coverage.covered:
        run.device_block[index] = "sm_%d%d not in the wheel's arch list" % cap
        return fail(coverage.detail, value, arch_hint(cap, archs, run.variant, platform.machine()))
    if coverage.how == "ptx-jit":
        return warn(
            "sm_%d%d covered %s" % (cap[0], cap[1], coverage.detail),
            value,
            "first use compiles every kernel (slow start) and needs a driver that knows this PTX; "
            "a variant with SASS for sm_%d%d avoids both" % cap,
        )
    return ok("sm_%d%d: %s" % (cap[0], cap[1], coverage.detail), value)


def _check_kernel(run: Run, index: int) -> Outcome:
    """A first, trivial kernel with an exact answer: launch failures surface here."""
    torch = run.torch
    device = "cuda:%d" % index
    n = 1 << 20
    x = torch.arange(n, device=device, dtype=torch.int64)
    y = x * 2 + 1
    for label, tensor in (("arange", x), ("elementwise kernel", y)):
        elsewhere = check_on_cuda(label, tensor)
        if elsewhere is not None:
            return elsewhere
    total = int(y.sum().item())
    torch.cuda.synchronize(index)
    if total != n * n:  # sum of the first n odd numbers
        return fail(
            "numerical check failed: elementwise kernel sum %d, expected %d" % (total, n * n),
            hint="the GPU returns wrong results for a trivial kernel: check dmesg for Xid errors",
        )
    return ok("elementwise kernel launched and verified on %s" % device)


def _check_dev_nodes(run: Run) -> Outcome:
    dxg = dxg_present()
    return judge_device_nodes(
        list_device_nodes(),
        wsl=is_wsl(read_text("/proc/version"), dxg),
        dxg_exists=dxg,
        gpus=len(run.devices),
    )


def _seeded(torch: Any, seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def no_tf32(torch: Any) -> Iterator[None]:
    """Numerical checks compare real fp32; TF32 would widen the tolerance tenfold."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def dtype_of(torch: Any, name: str) -> Any:
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def check_matmul(torch: Any, device: str, dtype_name: str, n: int = 512) -> Outcome:
    """A @ B on ``device`` in ``dtype`` vs float64 on the CPU from the same rounded inputs."""
    if device.startswith("cuda") and dtype_name == "bf16":
        index = int(device.split(":")[1])
        if tuple(torch.cuda.get_device_capability(index)) < (8, 0):
            supported = try_call(torch.cuda.is_bf16_supported)
            if not supported:
                return skip(
                    "bf16 matmul not supported on this GPU (needs sm_80 or newer)",
                    hint="fp16 and fp32 are checked instead",
                )
    dtype = dtype_of(torch, dtype_name)
    gen = _seeded(torch, 1234)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    ref = a.double() @ b.double()
    with no_tf32(torch):
        product = a.to(device) @ b.to(device)
    if device.startswith("cuda"):
        elsewhere = check_on_cuda("%s matmul" % dtype_name, product)
        if elsewhere is not None:
            return elsewhere
    got = product.float().cpu()
    return compare_result(
        "%s matmul %dx%d on %s" % (dtype_name, n, n, device), got, ref, MATMUL_TOLERANCE[dtype_name]
    )


def check_conv(torch: Any, device: str) -> Outcome:
    """conv2d forward and backward (input and weight gradients) vs float64 on the CPU."""
    functional = torch.nn.functional
    gen = _seeded(torch, 4321)
    x = torch.randn(8, 16, 32, 32, generator=gen)
    w = torch.randn(32, 16, 3, 3, generator=gen) * 0.1
    grad = torch.randn(8, 32, 32, 32, generator=gen)

    def run_on(dev: str, dtype: Any) -> tuple[Any, Any, Any]:
        xi = x.to(dev, dtype).requires_grad_(True)
        wi = w.to(dev, dtype).requires_grad_(True)
        out = functional.conv2d(xi, wi, padding=1)
        out.backward(grad.to(dev, dtype))
        return out.detach(), xi.grad, wi.grad

    ref = [t.cpu() for t in run_on("cpu", torch.float64)]
    with no_tf32(torch):
        results = run_on(device, torch.float32)
    if device.startswith("cuda"):
        for label, tensor in zip(("conv2d forward", "conv2d grad_input", "conv2d grad_weight"), results):
            elsewhere = check_on_cuda(label, tensor)
            if elsewhere is not None:
                return elsewhere
    got = [t.cpu() for t in results]
    for label, g, r in zip(("forward", "grad_input", "grad_weight"), got, ref):
        verdict = compare_result("conv2d %s on %s" % (label, device), g, r, CONV_TOLERANCE)
        if verdict.status != "pass":
            return verdict
    return ok("conv2d forward+backward on %s match the CPU reference" % device)


def _check_conv(run: Run, index: int) -> Outcome:
    torch = run.torch
    if not torch.backends.cudnn.is_available():
        return fail(
            "cuDNN is not available to torch",
            hint="the wheel's nvidia-cudnn package is missing or shadowed: run pip check, "
            "and ldd on libtorch_cuda.so",
        )
    saved = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = True
    try:
        verdict = check_conv(torch, "cuda:%d" % index)
    finally:
        torch.backends.cudnn.enabled = saved
    if verdict.status == "pass":
        return ok(verdict.message + " (cuDNN %s)" % run.torch_facts.get("cudnn"), verdict.value)
    return verdict


def check_optimizer(torch: Any, device: str) -> Outcome:
    """One SGD step (momentum, weight decay) of a small MLP; parameters vs the CPU."""
    gen = _seeded(torch, 99)
    layers = [torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)]
    for layer in layers:
        if isinstance(layer, torch.nn.Linear):
            with torch.no_grad():
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.1)
                layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen) * 0.1)
    model = torch.nn.Sequential(*layers)
    x = torch.randn(32, 64, generator=gen)
    y = torch.randint(0, 10, (32,), generator=gen)

    def step(dev: str, dtype: Any) -> list[Any]:
        m = _clone_module(torch, model).to(dev, dtype)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        loss = torch.nn.functional.cross_entropy(m(x.to(dev, dtype)), y.to(dev))
        loss.backward()
        opt.step()
        return [p.detach() for p in m.parameters()]

    ref = [p.cpu() for p in step("cpu", torch.float64)]
    with no_tf32(torch):
        params = step(device, torch.float32)
    if device.startswith("cuda"):
        for i, param in enumerate(params):
            elsewhere = check_on_cuda("optimizer step parameter %d" % i, param)
            if elsewhere is not None:
                return elsewhere
    got = [p.cpu() for p in params]
    for i, (g, r) in enumerate(zip(got, ref)):
        verdict = compare_result("optimizer step parameter %d on %s" % (i, device), g, r, OPTIMIZER_TOLERANCE)
        if verdict.status != "pass":
            return verdict
    return ok("one SGD step on %s matches the CPU reference" % device)


def _clone_module(torch: Any, module: Any) -> Any:
    return copy.deepcopy(module)


def _check_cpu_selfcheck(run: Run) -> Outcome:
    """The same comparisons on the CPU: proves torch's CPU kernels and the checker itself."""
    torch = run.torch
    if torch is None:
        return skip("torch is not importable", hint="fix torch.import first")
    for verdict in (
        check_matmul(torch, "cpu", "fp32"),
        check_conv(torch, "cpu"),
        check_optimizer(torch, "cpu"),
    ):
        if verdict.status != "pass":
            return verdict
    return ok("CPU fp32 matmul, conv2d forward+backward and an SGD step match float64")


# Per-device correctness checks: (name, function, heavy). Order matters: the arch
# check can block the rest for its device.
T1_DEVICE_CHECKS: tuple[tuple[str, Callable[[Run, int], Outcome], bool], ...] = (
    ("gpu.arch", _check_arch, False),
    ("gpu.kernel", _check_kernel, False),
    ("matmul.fp32", _matmul_on("fp32"), True),
    ("matmul.fp16", _matmul_on("fp16"), True),
    ("matmul.bf16", _matmul_on("bf16"), True),
    ("conv2d.cudnn", _check_conv, True),
    ("optimizer.step", _optimizer_on, True),
)
