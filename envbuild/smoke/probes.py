"""Host probes for the smoke run: small functions that return None instead of raising."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import math
import os
import re
import shutil
import subprocess
from typing import Any, Callable, Mapping, Sequence

from .lockfile import canonical_name
from .nvsmi import parse_smi_csv
from .report import first_line
from .rules import cuda_version_from_int, parse_proc_driver_version


def run_command(argv: Sequence[str], timeout: float = 20.0) -> tuple[int, str]:
    """(exit status, stdout+stderr); 127 when the tool is missing."""
    if shutil.which(argv[0]) is None:
        return 127, ""
    try:
        proc = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return 126, str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def detect_container(env: Mapping[str, str]) -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    if env.get("container") or env.get("KUBERNETES_SERVICE_HOST"):
        return True
    cgroup = read_text("/proc/1/cgroup") or ""
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod"))


def gpu_device_nodes() -> list[str]:
    return sorted(p for p in glob.glob("/dev/nvidia*") if re.match(r"^/dev/nvidia\d+$", p))


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return int(stat.f_blocks * stat.f_frsize)


def usable_cpus() -> int:
    """CPUs this process may use: affinity, then a cgroup v2 quota."""
    try:
        count = len(os.sched_getaffinity(0))  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = (read_text("/sys/fs/cgroup/cpu.max") or "").split()
    if len(quota) == 2 and quota[0] != "max":
        with contextlib.suppress(ValueError, ZeroDivisionError):
            count = min(count, max(1, math.ceil(int(quota[0]) / int(quota[1]))))
    return count


def libcuda_info() -> dict[str, Any]:
    """The libcuda this process would load: its path and the CUDA version it supports.

    cuDriverGetVersion needs no cuInit, so this works before torch touches the GPU.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return {}
    info: dict[str, Any] = {}
    version = ctypes.c_int(0)
    try:
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
            info["cuda_version"] = cuda_version_from_int(version.value)
    except (AttributeError, OSError):
        pass
    for line in (read_text("/proc/self/maps") or "").splitlines():
        if "libcuda.so" in line and "/" in line:
            path = line[line.index("/") :].strip()
            info["path"] = os.path.realpath(path)
            # A libcuda under .../compat/ is NVIDIA's forward-compatibility package.
            info["forward_compat"] = "/compat/" in path or "/compat/" in info["path"]
            break
    return info


def probe_driver() -> dict[str, Any]:
    """Driver facts from NVML, else nvidia-smi, else /proc; 'error' when one failed."""
    facts: dict[str, Any] = {"source": None, "version": None}
    nvml = import_pynvml()
    if nvml is not None:
        try:
            nvml.nvmlInit()
            try:
                facts["version"] = as_text(nvml.nvmlSystemGetDriverVersion())
                facts["source"] = "nvml"
                cuda = try_call(nvml.nvmlSystemGetCudaDriverVersion)
                if cuda:
                    facts["cuda_version"] = cuda_version_from_int(int(cuda))
                facts["gpus"] = _nvml_gpu_names(nvml)
            finally:
                try_call(nvml.nvmlShutdown)
        except Exception as exc:  # NVMLError subclasses; keep the text for classification
            facts["error"] = "NVML: %s" % exc
    if facts["version"] is None:
        rc, out = run_command(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total",
                "--format=csv,noheader,nounits",
            ]
        )
        if rc == 0:
            try:
                rows = parse_smi_csv(out, ("index", "name", "driver_version", "memory.total"))
            except ValueError:
                rows = []
            if rows:
                facts["version"] = rows[0]["driver_version"]
                facts["source"] = "nvidia-smi"
                facts["gpus"] = [r["name"] for r in rows]
        elif rc != 127 and out.strip():
            facts.setdefault("error", "nvidia-smi: %s" % first_line(out))
    if facts["version"] is None:
        version = parse_proc_driver_version(read_text("/proc/driver/nvidia/version") or "")
        if version:
            facts["version"] = version
            facts["source"] = "/proc/driver/nvidia/version"
    kernel = parse_proc_driver_version(read_text("/proc/driver/nvidia/version") or "")
    if kernel:
        facts["kernel_module"] = kernel
    lib = libcuda_info()
    if lib:
        facts["libcuda"] = lib
        facts.setdefault("cuda_version", lib.get("cuda_version"))
    return facts


def import_pynvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except Exception:
        return None
    return pynvml


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def try_call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _nvml_gpu_names(nvml: Any) -> list[str]:
    names = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        names.append(as_text(nvml.nvmlDeviceGetName(handle)))
    return names


def installed_versions(names: Sequence[str]) -> dict[str, str | None]:
    """Installed distribution versions by canonical name (None when missing)."""
    try:
        from importlib import metadata
    except ImportError:  # Python 3.7 and older: nothing to compare with
        return {}
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[canonical_name(name)] = metadata.version(name)
        except Exception:
            out[canonical_name(name)] = None
    return out


def torch_arch_list(torch: Any) -> list[str]:
    """The wheel's arch list, even where no GPU is visible (get_arch_list() is then [])."""
    archs = try_call(torch.cuda.get_arch_list) or []
    if not archs:
        flags = try_call(getattr(torch._C, "_cuda_getArchFlags", lambda: None))
        if flags:
            archs = str(flags).split()
    return [str(a) for a in archs]
