"""T0 environment: driver, container GPU variables, torch build, CPUs, lock."""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

from .diagnose import classify_cuda_error
from .installed import compare_installed, pins_whole_environment
from .lockfile import canonical_name, diff_lock, diff_stack, load_lock, validate_lock
from .probes import (
    detect_container,
    gpu_device_nodes,
    installed_versions,
    probe_driver,
    shm_bytes,
    torch_arch_list,
    try_call,
    usable_cpus,
)
from .report import Outcome, fail, first_line, ok, skip, warn
from .rules import is_wheel_variant
from .runner import Run

PYTORCH_INDEX = "https://download.pytorch.org/whl"

def tier0(run: Run) -> None:
    run.host.update(
        {
            "python": platform.python_version(),
            "executable": sys.executable,
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "usable_cpus": usable_cpus(),
            "shm_bytes": shm_bytes(),
            "in_container": detect_container(run.env),
            "dev_nodes": gpu_device_nodes(),
            "env": {
                k: run.env.get(k)
                for k in (
                    "NVIDIA_VISIBLE_DEVICES",
                    "CUDA_VISIBLE_DEVICES",
                    "NVIDIA_DRIVER_CAPABILITIES",
                    "NVIDIA_REQUIRE_CUDA",
                    "LD_LIBRARY_PATH",
                )
            },
        }
    )
    if run.options.lock:
        # The lock names the variant the image was built for: hints can name its index.
        run.variant = lock_variant(run.options.lock, run.options.target)
    run.check("python", 0, lambda: ok("Python %s" % run.host["python"], {"executable": sys.executable}))
    # The driver probe needs no torch: it runs first and is never blocked.
    run.check("driver", 0, lambda: _check_driver(run), gpu=True, standalone=True)
    run.check("torch.import", 0, lambda: _check_torch_import(run))
    run.check("torch.numpy", 0, lambda: check_numpy(run.torch))
    run.check("torch.cuda_build", 0, lambda: _check_cuda_build(run), gpu=True)
    run.check("container.gpu_env", 0, lambda: _check_gpu_env(run))
    run.check(
        "cpu",
        0,
        lambda: ok(
            "%s usable of %s CPUs" % (run.host["usable_cpus"], run.host["cpu_count"]),
            {"cpu_count": run.host["cpu_count"], "usable": run.host["usable_cpus"]},
        ),
    )
    if run.options.lock:
        run.check("lock", 0, lambda: _check_lock(run))


def check_numpy(torch: object) -> Outcome:
    """torch's numpy bridge (Tensor.numpy(), torch.from_numpy, DataLoader collation of numpy
    arrays): without numpy torch only prints "Failed to initialize NumPy" on first use."""
    if torch is None:
        return skip("torch is not importable", hint="fix torch.import first")
    try:
        torch.zeros(2).numpy()  # type: ignore[attr-defined]
    except Exception as exc:  # RuntimeError: Numpy is not available; an ABI mismatch says so too
        return warn(
            "torch's numpy bridge is missing: %s" % first_line(str(exc)),
            None,
            "pip install numpy (in a locked project: add numpy to its dependencies and re-lock); "
            "Tensor.numpy(), torch.from_numpy and most data pipelines need it",
        )
    version = str(getattr(sys.modules.get("numpy"), "__version__", "?"))  # the bridge imported it
    return ok("torch's numpy bridge works (numpy %s)" % version, {"numpy": version})


def lock_variant(path: str, target: str | None = None) -> str:
    try:
        lock = validate_lock(load_lock(path), target)
        return str(lock["stack"]["variant"] or "")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _check_torch_import(run: Run) -> Outcome:
    try:
        import torch
    except Exception as exc:
        run.gpu_block = "torch is not importable"
        return fail(
            "torch is not importable: %s: %s" % (type(exc).__name__, exc),
            hint="install the pinned torch from envbuild.lock into this interpreter (%s)" % sys.executable,
        )
    run.torch = torch
    facts = run.torch_facts
    facts["version"] = str(torch.__version__)
    facts["cuda"] = getattr(torch.version, "cuda", None)
    facts["hip"] = getattr(torch.version, "hip", None)
    facts["cudnn"] = try_call(torch.backends.cudnn.version)
    facts["arch_list"] = torch_arch_list(torch)
    facts["file"] = getattr(torch, "__file__", None)
    return ok("torch %s" % facts["version"], {"version": facts["version"], "file": facts["file"]})


def _check_cuda_build(run: Run) -> Outcome:
    torch = run.torch
    if torch is None:
        return skip("torch is not importable", hint="fix torch.import first")
    cuda, hip = run.torch_facts["cuda"], run.torch_facts["hip"]
    value = {
        "cuda": cuda,
        "cudnn": run.torch_facts["cudnn"],
        "arch_list": run.torch_facts["arch_list"],
    }
    if cuda is None:
        run.gpu_block = "torch is CPU-only"
        what = (
            "torch is a ROCm build (torch.version.hip=%s), not CUDA" % hip
            if hip
            else "torch is CPU-only (torch.version.cuda=None)"
        )
        if run.options.cpu_ok:
            hint = cpu_only_hint(run.torch_facts["version"], run.variant, run.env)
            return skip("%s; accepted by --cpu-ok" % what, value, hint)
        return fail(what, value, cpu_only_hint(run.torch_facts["version"], run.variant, run.env))
    return ok(
        "CUDA %s, cuDNN %s, archs %s" % (cuda, value["cudnn"], " ".join(value["arch_list"]) or "?"),
        value,
    )


def cpu_only_hint(version: str, variant: str, env: Mapping[str, str]) -> str:
    """Name the index that has the CUDA wheel, and where the CPU one likely came from."""
    base = version.split("+")[0]
    if is_wheel_variant(variant) and variant != "cpu":  # not "default": PyPI's wheel has no index of its own
        index = "%s/%s" % (PYTORCH_INDEX, variant)
        hint = "install the CUDA build: pip install torch==%s --index-url %s" % (base, index)
    else:
        hint = (
            "install a CUDA build of torch %s from %s/cuXYZ (envbuild resolve picks cuXYZ for "
            "the host driver)" % (base, PYTORCH_INDEX)
        )
    sources = [k + "=" + env[k] for k in ("PIP_FIND_LINKS", "PIP_INDEX_URL") if env.get(k)]
    if sources:
        hint += "; the +cpu wheel probably came from " + ", ".join(sources)
    return hint


def _check_driver(run: Run) -> Outcome:
    run.driver = probe_driver()
    run.host["driver"] = run.driver
    error = run.driver.get("error")
    if error:
        known = classify_cuda_error(error)
        if known is not None and known.kind == "driver-mismatch":
            return fail(known.message, run.driver, known.hint, known.exit_code)
    if run.driver.get("version") is None:
        text = "no NVIDIA driver found (NVML, nvidia-smi, /proc/driver/nvidia/version)"
        if run.options.cpu_ok:
            return skip(text, run.driver, "a GPU check: it reads the driver on a GPU host")
        return warn(
            text,
            run.driver,
            "on a host: install the driver; in a container: start it with --gpus all and "
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility so nvidia-smi/NVML are mounted",
        )
    message = "driver %s (from %s)" % (run.driver["version"], run.driver["source"])
    if run.driver.get("cuda_version"):
        message += ", supports CUDA <= %s" % run.driver["cuda_version"]
    if (run.driver.get("libcuda") or {}).get("forward_compat"):
        message += "; forward-compat libcuda in use"
    return ok(message, run.driver)


def _check_gpu_env(run: Run) -> Outcome:
    env = run.host["env"]
    value = {
        "env": env,
        "in_container": run.host["in_container"],
        "dev_nodes": run.host["dev_nodes"],
    }
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES")
    if caps is not None and caps.strip() and not {"compute", "all"} & {c.strip() for c in caps.split(",")}:
        return warn(
            "NVIDIA_DRIVER_CAPABILITIES=%s lacks compute: libcuda is not mounted" % caps,
            value,
            "set NVIDIA_DRIVER_CAPABILITIES=compute,utility (or all)",
        )
    shown = ", ".join("%s=%s" % (k, shorten(v)) for k, v in env.items()
                      if v is not None and k != "LD_LIBRARY_PATH")
    return ok(shown or "no NVIDIA/CUDA variables set", value)


SHOWN_MAX = 80


def shorten(value: str) -> str:
    """A variable's value for the one-line message; the JSON report keeps it whole. NVIDIA's
    CUDA images set NVIDIA_REQUIRE_CUDA to the CUDA floor and then a driver range per brand:
    2,165 characters on the H200 host of 2026-11-28, all of it printed on one line before."""
    if len(value) <= SHOWN_MAX:
        return value
    terms = value.split()
    if len(terms) > 1 and len(terms[0]) <= SHOWN_MAX:
        return "%s (+%d more terms; --json has them)" % (terms[0], len(terms) - 1)
    return "%s... (%d characters; --json has them)" % (value[:SHOWN_MAX], len(value))


def _check_lock(run: Run) -> Outcome:
    path = run.options.lock or ""
    try:
        lock = validate_lock(load_lock(path), run.options.target)
    except (OSError, ValueError) as exc:
        return fail(
            "lock %s unreadable: %s" % (path, exc),
            hint="pass the envbuild.lock the image was built from",
        )
    run.variant = str((lock.get("stack") or {}).get("variant") or "")
    if pins_whole_environment(lock):
        # The lock pins every distribution: the whole installed set is compared.
        names = list((lock.get("packages") or {}).keys())
        differences = compare_installed(lock) + diff_stack(
            lock.get("stack") or {},
            torch_cuda=run.torch_facts.get("cuda"),
            python_version=platform.python_version(),
        )
        what = "installed set"
    else:
        names = list((lock.get("packages") or {}).keys())
        if "torch" not in {canonical_name(n) for n in names}:
            names.append("torch")
        differences = diff_lock(
            lock,
            installed_versions(names),
            torch_cuda=run.torch_facts.get("cuda"),
            python_version=platform.python_version(),
        )
        what = "stack"
    if differences:
        return fail(
            "%s differs from lock: " % what + "; ".join(differences),
            {"differences": differences, "lock": path},
            "rebuild from the lock (envbuild build -f %s) or reinstall the pinned versions" % path,
        )
    return ok("%s matches %s (%d packages)" % (what, path, len(names)), {"lock": path})
