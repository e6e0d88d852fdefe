"""CUDA, NVML and cuDNN failures recognised from their error texts, and why no GPU shows."""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

from .report import EXIT_FAILED, EXIT_GPU_MISSING, first_line
from .rules import cuda_version_from_int


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """A CUDA/NVML failure recognised from its error text."""

    kind: str
    message: str
    hint: str
    exit_code: int


_FOUND_VERSION_RE = re.compile(r"found version (\d{4,6})")
_ERROR_CODE_RE = re.compile(r"\berror[\s:]*(\d{2,3})\b", re.IGNORECASE)


def classify_cuda_error(
    text: str,
    *,
    torch_cuda: str | None = None,
    driver_version: str | None = None,
    driver_cuda: str | None = None,
) -> Diagnosis | None:
    """Recognise a CUDA/NVML/cuDNN error text; None when it is not one we know."""
    low = text.lower()
    codes = {int(c) for c in _ERROR_CODE_RE.findall(text)}
    first = first_line(text)
    if "no kernel image is available" in low or "nokernelimagefordevice" in low or 209 in codes:
        return Diagnosis(
            "arch-missing",
            "kernel launch failed: %s" % first,
            "the wheel has no SASS or usable PTX for this GPU: install a torch variant whose arch "
            "list covers it (envbuild resolve --arch sm_XY)",
            EXIT_FAILED,
        )
    if "invalid device function" in low or 98 in codes:
        return Diagnosis(
            "arch-missing",
            "kernel launch failed: %s" % first,
            "the kernel was not built for this GPU: install a variant whose arch list covers it",
            EXIT_FAILED,
        )
    if (
        "forward compatibility was attempted on non supported hw" in low
        or 804 in codes
        or ("compatnotsupportedondevice" in low)
    ):
        return Diagnosis(
            "forward-compat",
            "forward compatibility not supported on this GPU (CUDA error 804)",
            "remove cuda-compat (drop /usr/local/cuda/compat from LD_LIBRARY_PATH and ld.so.conf): "
            "forward compatibility works on datacenter GPUs only; or upgrade the host driver",
            EXIT_FAILED,
        )
    if "unsupported toolchain" in low or 222 in codes or "unsupportedptxversion" in low:
        return Diagnosis(
            "ptx-too-new",
            "PTX compiled with newer toolkit than driver (CUDA error 222)",
            "upgrade the host driver to one supporting CUDA %s, or use a variant with SASS for "
            "this GPU so no JIT is needed" % (torch_cuda or "of the wheel"),
            EXIT_FAILED,
        )
    if (
        "driver on your system is too old" in low
        or "driver version is insufficient" in low
        or "insufficientdriver" in low
        or 35 in codes
    ):
        found = _FOUND_VERSION_RE.search(text)
        supports = cuda_version_from_int(int(found.group(1))) if found else driver_cuda
        drv = "driver %s" % driver_version if driver_version else "the host driver"
        return Diagnosis(
            "driver-too-old",
            "%s supports CUDA %s but torch was built with CUDA %s (driver too old)"
            % (drv, supports or "?", torch_cuda or "?"),
            "upgrade the host driver, or use a torch variant built for CUDA <= %s "
            "(envbuild resolve --driver <version>)" % (supports or "the driver's CUDA"),
            EXIT_GPU_MISSING,
        )
    if "version mismatch" in low:
        return Diagnosis(
            "driver-mismatch",
            "NVIDIA driver/library version mismatch: host needs reboot",
            "the loaded kernel module differs from the user-space driver libraries (usually an "
            "upgrade without reboot): reboot the host or reload the nvidia modules",
            EXIT_GPU_MISSING,
        )
    if "unsupported display driver / cuda driver combination" in low or 803 in codes:
        return Diagnosis(
            "driver-mismatch",
            "libcuda does not match the loaded kernel driver (CUDA error 803)",
            "a stale libcuda (often a cuda-compat package) shadows the host driver's: remove it, "
            "or reboot after a driver upgrade",
            EXIT_GPU_MISSING,
        )
    if "system not yet initialized" in low or 802 in codes:
        return Diagnosis(
            "fabric-manager",
            "CUDA system not yet initialized (CUDA error 802)",
            "NVSwitch systems need nvidia-fabricmanager running, at the driver's version",
            EXIT_GPU_MISSING,
        )
    if "found no nvidia driver" in low or "driver not loaded" in low:
        return Diagnosis(
            "no-driver",
            "no NVIDIA driver found: %s" % first,
            "install the NVIDIA driver on the host (envbuild render script), or start the "
            "container with a GPU device request (docker run --gpus all)",
            EXIT_GPU_MISSING,
        )
    if "no cuda-capable device is detected" in low or "no cuda gpus are available" in low or (100 in codes):
        return Diagnosis(
            "no-device",
            "no CUDA-capable device is detected",
            "start the container with a GPU device request (docker run --gpus all) and check "
            "CUDA_VISIBLE_DEVICES",
            EXIT_GPU_MISSING,
        )
    if "busy or unavailable" in low or 46 in codes:
        return Diagnosis(
            "device-busy",
            "GPU busy or unavailable: %s" % first,
            "the compute mode is exclusive and another process holds the GPU, or the GPU needs a "
            "reset (nvidia-smi -q -d COMPUTE)",
            EXIT_FAILED,
        )
    if "out of memory" in low:
        return Diagnosis(
            "out-of-memory",
            "GPU out of memory: %s" % first,
            "other processes hold GPU memory (nvidia-smi), or the MIG slice is too small",
            EXIT_FAILED,
        )
    if "ecc error" in low:
        return Diagnosis(
            "ecc",
            "uncorrectable ECC error: %s" % first,
            "drain this GPU and check nvidia-smi -q -d ECC,ROW_REMAPPER",
            EXIT_FAILED,
        )
    if "cudnn_status" in low or "cudnn error" in low:
        return Diagnosis(
            "cudnn",
            "cuDNN failed: %s" % first,
            "check that the cuDNN wheel matches torch (pip show nvidia-cudnn-cu12) and that no "
            "other libcudnn shadows it on LD_LIBRARY_PATH",
            EXIT_FAILED,
        )
    if "cublas_status" in low:
        return Diagnosis(
            "cublas",
            "cuBLAS failed: %s" % first,
            "check that no other libcublas shadows the wheel's on LD_LIBRARY_PATH",
            EXIT_FAILED,
        )
    if (
        "illegal memory access" in low
        or "unspecified launch failure" in low
        or "device-side assert" in low
        or "launch failure" in low
        or "launch timed out" in low
    ):
        return Diagnosis(
            "kernel-failure",
            "kernel launch failure: %s" % first,
            "rerun with CUDA_LAUNCH_BLOCKING=1; check dmesg for Xid errors",
            EXIT_FAILED,
        )
    return None


def diagnose_no_gpu(
    *,
    env: Mapping[str, str],
    dev_nodes: Sequence[str],
    in_container: bool,
    init_error: str | None,
    torch_cuda: str | None = None,
    driver_version: str | None = None,
    driver_cuda: str | None = None,
) -> Diagnosis:
    """Why does a CUDA build of torch see no GPU? The most specific reason first."""
    if init_error:
        known = classify_cuda_error(
            init_error,
            torch_cuda=torch_cuda,
            driver_version=driver_version,
            driver_cuda=driver_cuda,
        )
        if known is not None and known.kind not in ("no-driver", "no-device"):
            return known
    where = "in container" if in_container else "on this host"
    request = (
        "start the container with a GPU device request: docker run --gpus all (Docker SDK: "
        "device_requests=[DeviceRequest(count=-1, capabilities=[['gpu']])]; Kubernetes: "
        "resources.limits nvidia.com/gpu); needs nvidia-container-toolkit on the host"
    )
    nvd = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvd is not None and nvd.strip().lower() in ("void", "none", ""):
        shown = nvd.strip() or "(empty)"
        return Diagnosis(
            "no-gpu-visible",
            "no GPU visible %s: NVIDIA_VISIBLE_DEVICES=%s" % (where, shown),
            "%s; NVIDIA_VISIBLE_DEVICES=%s tells the NVIDIA runtime to expose no GPU" % (request, shown),
            EXIT_GPU_MISSING,
        )
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        return Diagnosis(
            "no-gpu-visible",
            "no GPU visible %s: CUDA_VISIBLE_DEVICES=%r hides every GPU" % (where, cvd),
            "unset CUDA_VISIBLE_DEVICES or set it to device indices or UUIDs",
            EXIT_GPU_MISSING,
        )
    if not dev_nodes:
        if in_container:
            unset = "" if nvd is not None else "; NVIDIA_VISIBLE_DEVICES is unset"
            return Diagnosis(
                "no-gpu-visible",
                "no GPU visible in container: no /dev/nvidia* device nodes%s" % unset,
                request,
                EXIT_GPU_MISSING,
            )
        return Diagnosis(
            "no-driver",
            "no GPU visible on this host: no /dev/nvidia* device nodes (NVIDIA driver not loaded)",
            "install the NVIDIA driver (envbuild render script) or load it (modprobe nvidia); "
            "check dmesg | grep -i nvrm",
            EXIT_GPU_MISSING,
        )
    if init_error:
        known = classify_cuda_error(init_error, torch_cuda=torch_cuda)
        if known is not None:
            return known
        return Diagnosis(
            "cuda-init",
            "no GPU visible %s: CUDA initialisation failed: %s" % (where, first_line(init_error)),
            "check the driver (nvidia-smi) and dmesg for Xid errors",
            EXIT_GPU_MISSING,
        )
    return Diagnosis(
        "no-gpu-visible",
        "no GPU visible %s: CUDA reports 0 devices although %s exists" % (where, dev_nodes[0]),
        "NVIDIA_DRIVER_CAPABILITIES must include compute (or all) so libcuda is mounted; check "
        "CUDA_VISIBLE_DEVICES",
        EXIT_GPU_MISSING,
    )
