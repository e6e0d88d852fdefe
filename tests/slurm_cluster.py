"""A real Slurm for the fleet tests: Debian's slurm-wlm and munge, one slurmctld and two
slurmd (``slurmd -N NAME``) on 127.0.0.1, two node types as two partitions, each node with a
gres ``gpu`` on a stand-in device node made with ``mknod`` (character major 195, as NVIDIA's).

Everything lives in one temporary directory (its own munge socket and key, state, spool,
logs) and runs as root, as the test machines do; the daemons are stopped by pid at the end.
``SLURM_CONF`` in ``Cluster.env`` points Slurm's client commands at it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sacct", "scontrol")
# (node name, partition = node type, gres type); one node per type.
NODES = (("nodea", "typea", "typea"), ("nodeb", "typeb", "typeb"))


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    pids: list[int] = field(default_factory=list)

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _config(root: Path, ports: list[int]) -> str:
    lines = [
        "ClusterName=envbuildtest", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={ports[0]}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket", f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n", f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid", f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "GresTypes=gpu", "ReturnToService=2", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "SwitchType=switch/none", "SchedulerType=sched/backfill", "MinJobAge=600",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "MessageTimeout=20", "KillWait=5",
        f"PluginDir={_plugin_dir()}",
    ]
    for (node, partition, kind), port in zip(NODES, ports[1:], strict=True):
        lines.append(f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=1 "
                     f"RealMemory=100 Gres=gpu:{kind}:1 State=UNKNOWN")
        lines.append(f"PartitionName={partition} Nodes={node} MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _plugin_dir() -> str:
    for candidate in ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
                      "/usr/lib/slurm-wlm", "/usr/lib/slurm"):
        if Path(candidate, "auth_munge.so").exists():
            return candidate
    return "/usr/lib/slurm-wlm"


def _gres(root: Path) -> str:
    lines = []
    for index, (node, _, kind) in enumerate(NODES):
        device = root / "dev" / f"nvidia{index}"
        os.mknod(device, 0o666 | 0o020000, os.makedev(195, index))  # a stand-in GPU: a char device
        lines.append(f"NodeName={node} Name=gpu Type={kind} File={device}")
    return "\n".join(lines) + "\n"


def _start(cluster: Cluster, argv: list[str]) -> None:
    process = subprocess.Popen(argv, env=cluster.env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    cluster.pids.append(process.pid)


def _wait_idle(cluster: Cluster, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    state = ""
    while time.monotonic() < deadline:
        done = subprocess.run([_binary("sinfo"), "--noheader", "--Node", "--format", "%N %t"],
                              env=cluster.env, capture_output=True, text=True, check=False)
        state = done.stdout.strip()
        lines = [line.split() for line in state.splitlines()]
        if len(lines) == len(NODES) and all(len(f) == 2 and f[1] == "idle" for f in lines):
            return
        time.sleep(0.5)
    raise RuntimeError(f"Slurm nodes not idle after {seconds:g} s ({state!r}); slurmctld: "
                       f"{cluster.log('slurmctld.log')}; slurmd: {cluster.log('slurmd-nodea.log')}")


@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[Cluster]:
    """Start munged, slurmctld and the two slurmd under ``root``; stop them (by pid) after."""
    for sub in ("munge", "state", "spool", "run", "log", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    ports = _free_ports(1 + len(NODES))
    conf = root / "slurm.conf"
    conf.write_text(_config(root, ports))
    (root / "gres.conf").write_text(_gres(root))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(root=root, env=env)
    try:
        _start(cluster, [_binary("munged"), "--foreground", "--force", f"--socket={root}/munge/munge.socket",
                         f"--key-file={key}", f"--pid-file={root}/run/munged.pid",
                         f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed"])
        _wait_for(root / "munge" / "munge.socket", 10)
        _start(cluster, [_binary("slurmctld"), "-D", "-i", "-f", str(conf)])
        for node, _, _ in NODES:
            _start(cluster, [_binary("slurmd"), "-D", "-N", node, "-f", str(conf)])
        _wait_idle(cluster, 40)
        yield cluster
    finally:
        for pid in reversed(cluster.pids):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        for pid in cluster.pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear in {seconds:g} s")
        time.sleep(0.1)
