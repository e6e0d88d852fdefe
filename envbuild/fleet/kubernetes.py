"""Kubernetes: per target an Indexed Job (completions = parallelism = nodes, one pod per node
by hostname anti-affinity, the GPU Feature Discovery node selector, ``nvidia.com/gpu`` limits
and toleration, a Memory emptyDir on /dev/shm, the image by digest, ``backoffLimit: 0``,
``activeDeadlineSeconds``), rendered from templates/fleet/job.yaml.j2; and the engine that
drives ``kubectl`` (apply, wait, get pods, logs) as a user would, with their kubeconfig.
"""

from __future__ import annotations

import collections
import json
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envbuild.errors import SchedulerUnavailable
from envbuild.fleet.plan import FleetTarget, RunOptions
from envbuild.fleet.report import NODE_NAME_RE, NodeResult, node_result, sorted_nodes
from envbuild.fleet.slurm import IMAGE_PYTHON
from envbuild.render.lockset import kubernetes_name

JOB_PREFIX = "envbuild-fleet-"
MAX_LOG_BYTES = 4 << 20


def job_name(target: FleetTarget) -> str:
    return JOB_PREFIX + kubernetes_name(target.name)


def command(target: FleetTarget, options: RunOptions) -> list[str]:
    argv = [IMAGE_PYTHON, "/opt/envbuild/smoke.py", "--lock", "/opt/envbuild/envbuild.lock", "--json"]
    return [*argv, *options.smoke_args(target.gpus_per_node)]


ARCH_LABEL = "kubernetes.io/arch"  # the well-known node label: amd64 or arm64, as Go names them


def node_selector(target: FleetTarget) -> list[tuple[str, str]]:
    """The target's node selector, with ``kubernetes.io/arch`` of its platform: an arm64 image on
    an amd64 node (or the reverse) fails to start, or runs emulated. A selector that names
    another architecture than the lock's stack is refused."""
    from envbuild.errors import UsageError

    kube = target.placement.kubernetes
    assert kube is not None
    arch = target.platform.split("/", 1)[1]
    pairs = list(kube.node_selector)
    given = dict(pairs).get(ARCH_LABEL)
    if given is not None and given != arch:
        raise UsageError(f"target {target.name!r}: node-selector {ARCH_LABEL}={given}, but its stack is "
                         f"{target.platform}", hint=f"set {ARCH_LABEL} = \"{arch}\", or lock it for "
                                                    f"linux/{given}")
    return pairs if given is not None else [*pairs, (ARCH_LABEL, arch)]


def render_target(target: FleetTarget, options: RunOptions) -> dict[str, bytes]:
    """``NAME.job.yaml`` for one target."""
    from envbuild.render.templates import environment

    kube = target.placement.kubernetes
    assert kube is not None and target.image is not None
    context = {
        "name": target.name, "job_name": job_name(target), "nodes": target.nodes,
        "deadline": max(1, math.ceil(options.deadline)), "node_selector": node_selector(target),
        "image": target.image, "command": command(target, options),
        "gpus": 0 if options.cpu_ok else (target.gpus_per_node or 0), "shm_size": "16Gi",
    }
    text = environment().get_template("fleet/job.yaml.j2").render(context)
    return {f"{target.name}.job.yaml": text.encode()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    target: FleetTarget
    job: str = ""
    problem: str = ""


class KubectlEngine:
    """kubectl as a subprocess, in the caller's environment (KUBECONFIG, context)."""

    name = "kubernetes"

    def __init__(self, env: Mapping[str, str], directory: Any, options: RunOptions | None = None) -> None:
        self.env, self.directory, self.options = dict(env), directory, options or RunOptions()

    def _run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["kubectl", *argv], capture_output=True, text=True, env=self.env,
                                  cwd=self.directory, timeout=timeout, check=False)
        except FileNotFoundError:
            raise SchedulerUnavailable("kubectl not found", hint="install kubectl and point it at the "
                                       "cluster (KUBECONFIG)") from None
        except subprocess.TimeoutExpired:
            raise SchedulerUnavailable(f"kubectl {argv[0]} did not answer in {timeout:g} s",
                                       hint="kubectl cluster-info") from None

    def submit(self, target: FleetTarget) -> Submission:
        name = job_name(target)
        self._run(["delete", "job", name, "--ignore-not-found", "--wait=true"])  # an earlier run's
        done = self._run(["apply", "-f", f"{target.name}.job.yaml"])
        if done.returncode != 0:
            why = _first_line(done.stderr) or f"kubectl apply exited {done.returncode}"
            return Submission(target=target, problem=f"target {target.name}: kubectl apply refused it: {why}")
        return Submission(target=target, job=name)

    def finished(self, submission: Submission) -> bool:
        if not submission.job:
            return True
        done = self._run(["get", "job", submission.job, "-o", "json"])
        if done.returncode != 0:
            raise SchedulerUnavailable(f"kubectl get job failed: {_first_line(done.stderr)}")
        status = _json(done.stdout).get("status") or {}
        conditions = status.get("conditions") or []
        return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in conditions if isinstance(c, dict))

    def cancel(self, submission: Submission) -> None:
        if submission.job:
            self._run(["delete", "job", submission.job, "--ignore-not-found", "--wait=false"])

    def final_state(self, submission: Submission) -> str:
        return ""

    def collect(self, submission: Submission) -> tuple[NodeResult, ...]:
        done = self._run(["get", "pods", "-l", f"batch.kubernetes.io/job-name={submission.job}",
                          "-o", "json"])
        pods = _json(done.stdout).get("items") or [] if done.returncode == 0 else []
        results = []
        for pod in pods:
            if not isinstance(pod, dict):
                continue
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            name = str((pod.get("metadata") or {}).get("name") or "")
            if not NODE_NAME_RE.fullmatch(node) or not NODE_NAME_RE.fullmatch(name):
                continue  # not scheduled: no node answered for it
            text, errors = self._log_tail(name, timeout=120)
            required = self.options.required(submission.target.gpus_per_node)
            results.append(node_result(node, report_from_logs(text), _last_line(text + errors),
                                       required))
        return sorted_nodes(results)

    def _log_tail(self, pod: str, *, timeout: float) -> tuple[str, str]:
        """The last MAX_LOG_BYTES of ``kubectl logs POD`` (the report is at its end) and the end
        of kubectl's own stderr: read as it streams, never held whole (a pod can log gigabytes);
        kubectl is killed at ``timeout``."""
        import tempfile
        import threading

        with tempfile.TemporaryFile() as errors:
            try:
                child = subprocess.Popen(["kubectl", "logs", pod], stdout=subprocess.PIPE, stderr=errors,
                                         env=self.env, cwd=self.directory)
            except FileNotFoundError:
                raise SchedulerUnavailable("kubectl not found", hint="install kubectl and point it at "
                                           "the cluster (KUBECONFIG)") from None
            timer = threading.Timer(timeout, child.kill)
            timer.start()
            kept: collections.deque[bytes] = collections.deque()
            size = 0
            try:
                assert child.stdout is not None
                while chunk := child.stdout.read(1 << 20):
                    kept.append(chunk)
                    size += len(chunk)
                    while size - len(kept[0]) >= MAX_LOG_BYTES:
                        size -= len(kept.popleft())
                child.wait()
            finally:
                timer.cancel()
                if child.stdout is not None:
                    child.stdout.close()
                if child.poll() is None:
                    child.kill()
                    child.wait()
            errors.seek(max(0, errors.seek(0, 2) - 4096))
            tail = errors.read()
        return b"".join(kept)[-MAX_LOG_BYTES:].decode("utf-8", "replace"), tail.decode("utf-8", "replace")


def report_from_logs(text: str) -> dict[str, Any] | None:
    """The smoke test's JSON report in a pod's log. ``kubectl logs`` interleaves stderr (a
    library's warning) with it: the report is what follows the last line that is a lone ``{``
    (``--json`` indents, so only its outermost braces start a line)."""
    whole = _json(text)
    if whole:
        return whole
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "{"]
    for start in reversed(starts):
        found = _json("\n".join(lines[start:]))
        if found:
            return found
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
