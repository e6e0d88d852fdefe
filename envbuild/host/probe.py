"""Host probing for ``envbuild detect``: driver, GPUs, topology, OS, CPUs, /dev/shm.

Sources, best first: NVML through ``pynvml`` (only when importable; never a
dependency), ``nvidia-smi`` (a CSV query, the plain table for the "CUDA Version",
``-L`` for MIG devices, ``topo -m``), then ``/proc/driver/nvidia/version``.
Every probe is a small function that returns ``None`` (or an empty fragment)
instead of raising: a host without a GPU is a normal answer, not an error.

``parse_saved`` reads what a user saved from ``nvidia-smi`` (plain table, ``-q``,
``-q -x``, the CSV query, ``-L``, ``topo -m``, ``/proc/driver/nvidia/version``),
in any combination within one file; it detects each part by its own markers.
The JSON contract of the result is in ``envbuild.host.report``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuild.errors import UsageError
from envbuild.host.facts import HostFacts, merge, merge_all, with_source
from envbuild.host.nvidia_smi import (
    FALLBACK_FIELDS,
    QUERY_FIELDS,
    parse_list,
    parse_query_csv,
    parse_table,
    parse_topology,
)
from envbuild.host.nvml import load_nvml, probe_nvml
from envbuild.host.os_facts import (
    probe_cpu_count,
    probe_os_release,
    probe_proc_driver,
    probe_shm_bytes,
)
from envbuild.host.problems import HINT_MISMATCH, find_problems
from envbuild.host.smi_report import parse_query_report, parse_query_xml, split_xml
from envbuild.smoke.rules import parse_proc_driver_version

Runner = Callable[[Sequence[str]], str | None]

RUN_TIMEOUT_S = 15.0  # nvidia-smi can hang on a GPU in a bad state


def parse_saved(text: str) -> HostFacts:
    """Host facts from saved tool output (``envbuild detect --from FILE``).

    Raises :class:`UsageError` when nothing in ``text`` is recognised.
    """
    document, rest = split_xml(text)
    parts = [
        parse_query_xml(document) if document else HostFacts(),
        parse_query_report(rest),
        parse_query_csv(rest),
        parse_table(rest),
        parse_list(rest),
        HostFacts(driver_version=parse_proc_driver_version(rest)),
        HostFacts(topology=parse_topology(rest), problems=find_problems(rest, "nvidia-smi")),
    ]
    facts = with_source(merge_all(parts), "file")
    if facts == HostFacts():
        raise UsageError(
            "no nvidia-smi output recognised",
            hint="save the output of `nvidia-smi`, `nvidia-smi -q`, `nvidia-smi -q -x`, "
            "`nvidia-smi --query-gpu=... --format=csv`, `nvidia-smi -L` or "
            "`nvidia-smi topo -m` (or /proc/driver/nvidia/version)",
        )
    return facts


def make_runner(env: Mapping[str, str], *, timeout: float = RUN_TIMEOUT_S) -> Runner:
    """Run a tool found on ``env``'s PATH.

    Returns stdout on success; on failure the combined output if there is any
    (so known failure texts can be recognised), else None. A missing binary or
    a timeout gives None.
    """

    def run(argv: Sequence[str]) -> str | None:
        exe = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if exe is None:
            return None
        try:
            done = subprocess.run(
                [exe, *argv[1:]],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
                env={**env, "LC_ALL": "C"},
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0:
            return done.stdout
        output = done.stdout + done.stderr
        return output if output.strip() else None

    return run


def probe_nvidia_smi(run: Runner) -> HostFacts | None:
    """GPUs and driver from the CSV query, then the table's CUDA version and MIG devices."""
    answered, facts = False, HostFacts()
    # Older nvidia-smi rejects the compute_cap field: then ask again without it.
    for fields in (QUERY_FIELDS, FALLBACK_FIELDS):
        output = run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        )
        if output is None:
            continue
        answered = True
        if problems := find_problems(output, "nvidia-smi"):
            return HostFacts(problems=problems)
        facts = parse_query_csv(output)
        if facts.gpus:
            break
    if not answered:
        return None
    parts = [facts, parse_table(run(["nvidia-smi"]) or "")]
    if any(g.mig_mode == "Enabled" for g in facts.gpus):
        parts.append(parse_list(run(["nvidia-smi", "-L"]) or ""))
    return with_source(merge_all(parts), "nvidia-smi")


def probe_topology(run: Runner, gpu_count: int) -> dict[str, dict[str, str]] | None:
    if gpu_count < 2:
        return None  # one GPU has no interconnect worth a subprocess
    return parse_topology(run(["nvidia-smi", "topo", "-m"]) or "")


def _consistency_problems(
    facts: HostFacts, kernel: str | None, env: Mapping[str, str]
) -> tuple[str, ...]:
    found: list[str] = []
    if kernel and facts.driver_version and facts.driver_version != kernel:
        found.append(
            f"driver: user-space {facts.driver_version} but kernel module {kernel} is loaded"
            f" — {HINT_MISMATCH}"
        )
    hidden = env.get("CUDA_VISIBLE_DEVICES")
    if facts.gpus and hidden is not None and hidden.strip() in ("", "-1"):
        found.append(
            f"env: CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU from CUDA programs"
            " — unset it, or list the GPU indexes to use"
        )
    return tuple(found)


_AUTO: Any = object()


# uname's machine → the platform (Docker's reading of the same names)
MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64",
            "arm64": "linux/arm64"}


def probe_platform(machine: str | None = None) -> str | None:
    """This host's platform as Docker spells it (linux/amd64, linux/arm64); None for another
    machine (its wheels are none envbuild resolves)."""
    return MACHINES.get(machine if machine is not None else os.uname().machine)


def probe_host(
    env: Mapping[str, str],
    *,
    run: Runner | None = None,
    root: Path = Path("/"),
    nvml: Any = _AUTO,
) -> HostFacts:
    """Everything ``envbuild detect`` reports; never raises for a missing GPU or tool.

    ``run`` defaults to :func:`make_runner` over ``env``; ``nvml`` to the
    ``pynvml`` module when importable (pass None to skip NVML, as tests do);
    ``root`` relocates /proc, /etc/os-release and /dev/shm for tests.
    """
    runner = run if run is not None else make_runner(env)
    from_nvml = probe_nvml(load_nvml() if nvml is _AUTO else nvml)
    facts = from_nvml or HostFacts()
    # A recognised NVML failure (mismatch, module not loaded) would fail nvidia-smi too.
    if not facts.gpus and not facts.problems:
        facts = merge(facts, probe_nvidia_smi(runner) or HostFacts())
    kernel = probe_proc_driver(root)
    host = HostFacts(
        driver_version=kernel,
        driver_source="proc" if kernel else None,
        topology=probe_topology(runner, len(facts.gpus)),
        os_release=probe_os_release(root),
        cpu_count=probe_cpu_count(),
        shm_bytes=probe_shm_bytes(root),
        platform=probe_platform(),
        problems=_consistency_problems(facts, kernel, env),
    )
    return merge(facts, host)
