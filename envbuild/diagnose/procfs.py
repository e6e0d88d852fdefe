"""The job's CPU from /proc: per process and per thread (user, system), blocked-on-I/O time,
and the machine's iowait. Plain functions over text, so recorded snapshots test them."""

from __future__ import annotations

import os
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


def split_stat(line: str, fields: int = -1) -> tuple[str, list[str]] | None:
    """``/proc/PID/stat`` as (comm, the fields after it, the first ``fields`` of them split
    off when given: the rest is left whole); comm may hold spaces and ')'."""
    open_at, close_at = line.find("("), line.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    return line[open_at + 1:close_at], line[close_at + 2:].split(None, fields)


def parse_thread(pid: int, tid: int, text: str) -> ThreadTicks | None:
    parts = split_stat(text, 13)
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
    return parse_process(text)[0]


def parse_process(text: str) -> tuple[int, int]:
    """(field 42, delayacct_blkio_ticks: 0 where the kernel keeps no delay accounting;
    field 20, num_threads: -1 when unreadable) of a process's stat line."""
    parts = split_stat(text, 40)
    rest = parts[1] if parts is not None else []
    blkio = int(rest[39]) if len(rest) > 39 and rest[39].isdigit() else 0
    count = int(rest[17]) if len(rest) > 17 and rest[17].isdigit() else -1
    return blkio, count


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
    parts = split_stat(text, 2)
    if parts is None or len(parts[1]) < 2 or not parts[1][1].isdigit():
        return None
    return int(parts[1][1])


STAT_BYTES = 4096  # a stat line is ~300 bytes; /proc/stat's first line (the only one read) leads
FD_LIMIT = 256  # stat files held open between ticks; past it, a file is opened for each read
RELIST_EVERY = 4  # ticks between re-reads of the process tree and every thread list
# A process's parent is read once: every this many tree re-reads, all again (a pid reused
# within that time, or a process that changed parent, is then seen as it is now).
PARENTS_EVERY = 8


def _read(path: str) -> str | None:
    """One stat file, opened and closed (a read of the whole /proc, or a one-off)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # the process or thread ended meanwhile
        return None
    try:
        return os.read(fd, STAT_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def process_tree(root: int, proc: Path = Path("/proc"), parents: dict[int, int] | None = None) -> list[int]:
    """``root`` and every descendant (DataLoader workers, launched ranks), by parent pid.
    ``parents`` (pid -> parent pid), when given, is kept between calls: only processes not
    in it are read, and those that ended leave it."""
    parents = {} if parents is None else parents
    listed = {int(name) for name in os.listdir(proc) if name.isdigit()}
    for pid in [p for p in parents if p not in listed]:
        del parents[pid]
    for pid in listed - parents.keys():
        text = _read(f"{proc}/{pid}/stat")
        parent = parent_of(text) if text else None
        if parent is not None:
            parents[pid] = parent
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:  # a set: a stale cached parent (a reused pid) must not make a loop endless
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return sorted(found)


def task_ids(pid: int, proc: Path = Path("/proc")) -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(f"{proc}/{pid}/task") if name.isdigit())
    except OSError:
        return []


class StatFiles:
    """Stat files read through descriptors held open between ticks: one ``pread`` each, a
    third of an open/read/close. A descriptor whose thread ended answers ESRCH and is closed,
    so a reused pid is never read through its predecessor's descriptor."""

    def __init__(self, limit: int = FD_LIMIT) -> None:
        self.fds: dict[str, int] = {}
        self.limit = limit

    def read(self, path: str) -> str | None:
        fd = self.fds.get(path)
        if fd is None:
            if len(self.fds) >= self.limit:
                return _read(path)
            try:
                fd = self.fds[path] = os.open(path, os.O_RDONLY)
            except OSError:
                return None
        try:
            return os.pread(fd, STAT_BYTES, 0).decode("utf-8", "replace")
        except OSError:
            self.drop(path)
            return None

    def drop(self, path: str) -> None:
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def keep(self, paths: set[str]) -> None:
        """Close every descriptor but those of ``paths`` (threads that left the job)."""
        for path in [p for p in self.fds if p not in paths]:
            self.drop(path)

    def close(self) -> None:
        self.keep(set())


class JobReader:
    """Snapshots of ``root``'s process tree, cheap tick after tick: stat files are held open
    (``StatFiles``); a thread list is read again when its process's thread count changes or
    one of its threads has ended; the tree (new processes' parents) and every thread list
    each ``relist_every`` ticks, which also catches a thread that replaced another between
    two ticks; every process's parent each ``PARENTS_EVERY`` of those."""

    def __init__(self, root: int, proc: Path = Path("/proc"), relist_every: int = RELIST_EVERY) -> None:
        self.root, self.proc, self.relist_every = root, proc, relist_every
        self.files = StatFiles()
        self.pids: list[int] = []
        self.tids: dict[int, list[int]] = {}
        self.parents: dict[int, int] = {}
        self.stale: set[int] = set()  # pids whose thread list is read again next tick
        self.ticks = 0

    def snapshot(self, t: float) -> CpuSnapshot:
        relist = self.ticks % self.relist_every == 0
        if self.ticks % (self.relist_every * PARENTS_EVERY) == 0:
            self.parents = {}
        self.ticks += 1
        if relist:
            self.pids, self.tids = process_tree(self.root, self.proc, self.parents), {}
        threads: list[ThreadTicks] = []
        blkio: dict[int, int] = {}
        for pid in self.pids:
            text = self.files.read(f"{self.proc}/{pid}/stat")
            if text is not None:
                blkio[pid], count = parse_process(text)
                threads.extend(self.threads(pid, count))
        if relist:
            self.files.keep(self.paths())
        return CpuSnapshot(t=t, threads=tuple(threads), blkio=blkio,
                           machine=parse_machine(self.files.read(f"{self.proc}/stat") or ""))

    def threads(self, pid: int, count: int) -> list[ThreadTicks]:
        tids = self.tids.get(pid)
        if tids is None or len(tids) != count or pid in self.stale:
            tids = self.relist(pid, tids or [])
        found = []
        for tid in tids:
            text = self.files.read(f"{self.proc}/{pid}/task/{tid}/stat")
            parsed = parse_thread(pid, tid, text) if text else None
            if parsed is None:  # it ended: list the threads again next tick
                self.stale.add(pid)
                continue
            found.append(parsed)
        return found

    def relist(self, pid: int, known: list[int]) -> list[int]:
        listed = self.tids[pid] = task_ids(pid, self.proc)
        self.stale.discard(pid)
        for tid in set(known) - set(listed):  # ended: its descriptor is closed now
            self.files.drop(f"{self.proc}/{pid}/task/{tid}/stat")
        return listed

    def paths(self) -> set[str]:
        return {f"{self.proc}/stat"} | {f"{self.proc}/{pid}/stat" for pid in self.pids} | {
            f"{self.proc}/{pid}/task/{tid}/stat" for pid, tids in self.tids.items() for tid in tids}

    def close(self) -> None:
        self.files.close()


def snapshot(root: int, t: float, proc: Path = Path("/proc")) -> CpuSnapshot:
    """One snapshot of ``root``'s whole tree, every file opened and closed."""
    reader = JobReader(root, proc)
    try:
        return reader.snapshot(t)
    finally:
        reader.close()


def alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is a running process (not a zombie waiting for its parent)."""
    text = _read(f"{proc}/{pid}/stat")
    parts = split_stat(text) if text else None
    return parts is not None and bool(parts[1]) and parts[1][0] not in ("Z", "X")
