"""The job's CPU from /proc: per process and per thread (user, system), blocked-on-I/O time,
and the machine's iowait. Plain functions over text, so recorded snapshots test them."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadTicks:
    pid: int
    tid: int
    comm: str
    utime: int  # clock ticks in user mode
    stime: int  # clock ticks in kernel mode
    state: str = "R"  # R running, S sleeping, D uninterruptible (disk) sleep, …


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuSnapshot:
    """One reading of the job's threads and the machine's CPU counters."""

    t: float
    threads: tuple[ThreadTicks, ...]
    blkio: dict[int, int]  # pid -> delayacct_blkio_ticks (ticks blocked on block I/O)
    machine: tuple[int, int, int]  # (iowait, busy, total) ticks over every CPU


def split_stat(line: str) -> tuple[str, list[str]] | None:
    """``/proc/PID/stat`` as (comm, the fields after it); comm may hold spaces and ')'."""
    open_at, close_at = line.find("("), line.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    return line[open_at + 1:close_at], line[close_at + 2:].split()


def parse_thread(pid: int, tid: int, text: str) -> ThreadTicks | None:
    parts = split_stat(text)
    if parts is None or len(parts[1]) < 13:
        return None
    comm, rest = parts  # rest[0] is field 3 (state): utime is field 14, stime 15
    try:
        return ThreadTicks(pid=pid, tid=tid, comm=comm, utime=int(rest[11]), stime=int(rest[12]),
                           state=rest[0][:1])
    except ValueError:
        return None


def parse_blkio(text: str) -> int:
    """Field 42, delayacct_blkio_ticks (0 where the kernel keeps no delay accounting)."""
    parts = split_stat(text)
    if parts is None or len(parts[1]) < 40:
        return 0
    value = parts[1][39]
    return int(value) if value.isdigit() else 0


def parse_machine(text: str) -> tuple[int, int, int]:
    """(iowait, busy, total) ticks from /proc/stat's first ``cpu`` line."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            ticks = [int(v) for v in line.split()[1:] if v.isdigit()]
            ticks += [0] * (8 - len(ticks))
            idle, iowait = ticks[3], ticks[4]
            total = sum(ticks[:8])
            return iowait, total - idle - iowait, total
    return 0, 0, 0


def parent_of(text: str) -> int | None:
    parts = split_stat(text)
    if parts is None or len(parts[1]) < 2 or not parts[1][1].isdigit():
        return None
    return int(parts[1][1])


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # the process or thread ended meanwhile
        return None


def process_tree(root: int, proc: Path = Path("/proc")) -> list[int]:
    """``root`` and every descendant (DataLoader workers, launched ranks), by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            text = _read(Path(entry.path) / "stat")
            parent = parent_of(text) if text else None
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(found)


def threads_of(pid: int, proc: Path = Path("/proc")) -> Iterable[ThreadTicks]:
    try:
        tids = [int(e.name) for e in os.scandir(proc / str(pid) / "task") if e.name.isdigit()]
    except OSError:
        return
    for tid in sorted(tids):
        text = _read(proc / str(pid) / "task" / str(tid) / "stat")
        found = parse_thread(pid, tid, text) if text else None
        if found is not None:
            yield found


def snapshot(root: int, t: float, proc: Path = Path("/proc"), pids: list[int] | None = None) -> CpuSnapshot:
    """The threads of ``pids`` (default: ``root``'s whole tree, a scan of every process)."""
    pids = process_tree(root, proc) if pids is None else pids
    threads = tuple(t for pid in pids for t in threads_of(pid, proc))
    blkio = {pid: parse_blkio(_read(proc / str(pid) / "stat") or "") for pid in pids}
    return CpuSnapshot(t=t, threads=threads, blkio=blkio,
                       machine=parse_machine(_read(proc / "stat") or ""))


def alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is a running process (not a zombie waiting for its parent)."""
    text = _read(proc / str(pid) / "stat")
    parts = split_stat(text) if text else None
    return parts is not None and bool(parts[1]) and parts[1][0] not in ("Z", "X")
