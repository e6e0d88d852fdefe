"""The diagnose sampler's cheap readers and waits: /proc through descriptors held open
between ticks, thread lists read again only when a process's threads change, the process
tree's parent cache; nvidia-smi as one looping process (a fake nvidia-smi: no GPU here);
one wake-up per tick while waiting for the job."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envbuild.diagnose import gpu, session, smi
from envbuild.diagnose.procfs import JobReader, StatFiles, parse_process, process_tree, snapshot

# fields 3-24, then 25-41 zero, 42 delayacct_blkio_ticks, two more
STAT = "{pid} (python) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} 3 0 0 20 0 {threads} 0 1 2 3 " + " ".join(
    ["0"] * 17) + " {blkio} 0 0"


def stat_line(pid: int, ppid: int = 1, utime: int = 5, threads: int = 1, blkio: int = 0) -> str:
    return STAT.format(pid=pid, ppid=ppid, utime=utime, threads=threads, blkio=blkio) + "\n"


def fake_proc(root: Path, tree: dict[int, int], threads: dict[int, list[int]] | None = None) -> None:
    """A /proc of ``tree`` (pid -> parent) whose processes have ``threads`` (default: one)."""
    (root / "stat").write_text("cpu  10 0 10 70 10 0 0 0 0 0\ncpu0 10 0 10 70 10 0 0 0 0 0\n")
    for pid, ppid in tree.items():
        tids = (threads or {}).get(pid, [pid])
        (root / str(pid) / "task").mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "stat").write_text(stat_line(pid, ppid, threads=len(tids)))
        for tid in tids:
            (root / str(pid) / "task" / str(tid)).mkdir(exist_ok=True)
            (root / str(pid) / "task" / str(tid) / "stat").write_text(stat_line(tid, ppid))


def tids_seen(reader: JobReader, pid: int) -> set[int]:
    return {t.tid for t in reader.snapshot(0.0).threads if t.pid == pid}


def test_process_fields_come_from_one_split() -> None:
    assert parse_process(stat_line(7, threads=12, blkio=345)) == (345, 12)
    assert parse_process("garbage") == (0, -1)
    assert parse_process("7 (x) S 1") == (0, -1)


def test_held_descriptor_reads_fresh_values_and_closes(tmp_path: Path) -> None:
    files = StatFiles()
    path = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/stat"
    first = files.read(path)
    sum(range(3_000_000))  # burn a few ticks of CPU
    second = files.read(path)
    assert first is not None and second is not None and path in files.fds
    assert int(second.rsplit(")", 1)[1].split()[11]) > int(first.rsplit(")", 1)[1].split()[11])
    fd = files.fds[path]
    files.close()
    assert not files.fds and not os.path.exists(f"/proc/self/fd/{fd}")


def test_ended_thread_is_dropped_and_its_descriptor_closed() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    reader = JobReader(os.getpid(), relist_every=1000)  # the cache alone, no periodic re-read
    try:
        assert worker.native_id in tids_seen(reader, os.getpid())
        stop.set()
        worker.join()
        # join() returns once Python is done with the thread; the kernel drops its task a moment
        # later, and on a loaded machine (the quick tier's workers) that moment was seen
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/self/task/{worker.native_id}") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.native_id not in tids_seen(reader, os.getpid())
        assert not any(p.endswith(f"/task/{worker.native_id}/stat") for p in reader.files.fds)
    finally:
        reader.close()


def test_new_thread_is_listed_when_the_count_changes() -> None:
    reader = JobReader(os.getpid(), relist_every=1000)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    try:
        before = tids_seen(reader, os.getpid())
        worker.start()
        after = tids_seen(reader, os.getpid())
        assert worker.native_id in after and before <= after | {worker.native_id}
    finally:
        stop.set()
        worker.join()
        reader.close()


def test_thread_that_replaced_another_shows_the_tick_after(tmp_path: Path) -> None:
    """Same count, one thread gone and another born between two ticks: the failed read of
    the gone one makes the next tick list the threads again."""
    stop_a, stop_b = threading.Event(), threading.Event()
    a, b = threading.Thread(target=stop_a.wait), threading.Thread(target=stop_b.wait)
    a.start()
    reader = JobReader(os.getpid(), relist_every=1000)
    try:
        assert a.native_id in tids_seen(reader, os.getpid())
        stop_a.set()
        a.join()
        b.start()
        assert a.native_id not in tids_seen(reader, os.getpid())
        assert b.native_id in tids_seen(reader, os.getpid())
    finally:
        stop_b.set()
        b.join()
        reader.close()


def test_thread_list_is_not_read_again_while_the_count_holds(tmp_path: Path) -> None:
    fake_proc(tmp_path, {10: 1}, {10: [10, 11]})
    reader = JobReader(10, tmp_path, relist_every=1000)
    assert tids_seen(reader, 10) == {10, 11}
    (tmp_path / "10" / "task" / "12").mkdir()  # listed, but the process still says 2 threads
    (tmp_path / "10" / "task" / "12" / "stat").write_text(stat_line(12))
    assert tids_seen(reader, 10) == {10, 11}
    (tmp_path / "10" / "stat").write_text(stat_line(10, threads=3))
    assert tids_seen(reader, 10) == {10, 11, 12}
    reader.close()


def test_periodic_relist_finds_new_workers(tmp_path: Path) -> None:
    fake_proc(tmp_path, {10: 1, 20: 1})
    reader = JobReader(10, tmp_path, relist_every=2)
    assert reader.snapshot(0.0).blkio.keys() == {10}
    fake_proc(tmp_path, {11: 10, 12: 11})  # a worker, and its own child
    assert reader.snapshot(1.0).blkio.keys() == {10}  # between re-reads: the known tree
    assert reader.snapshot(2.0).blkio.keys() == {10, 11, 12}
    reader.close()


def test_parent_cache_reads_new_processes_only_and_forgets_ended_ones(tmp_path: Path) -> None:
    fake_proc(tmp_path, {10: 1, 11: 10, 20: 1})
    parents: dict[int, int] = {}
    assert process_tree(10, tmp_path, parents) == [10, 11]
    (tmp_path / "20" / "stat").write_text("unreadable")  # known: not read again
    fake_proc(tmp_path, {13: 11})
    assert process_tree(10, tmp_path, parents) == [10, 11, 13] and parents[20] == 1
    for name in ("11", "13"):
        for path in sorted((tmp_path / name).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (tmp_path / name).rmdir()
    assert process_tree(10, tmp_path, parents) == [10] and 11 not in parents


def test_stale_parents_forming_a_cycle_end_the_walk(tmp_path: Path) -> None:
    fake_proc(tmp_path, {10: 1, 11: 10})
    assert process_tree(10, tmp_path, {10: 11, 11: 10}) == [10, 11]  # cached, as after pid reuse


def test_real_children_and_their_threads_are_found() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
                              "print(flush=True); time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()
        snap = snapshot(os.getpid(), 0.0)
        assert len({t.tid for t in snap.threads if t.pid == child.pid}) >= 2
        assert child.pid in snap.blkio and snap.machine[2] > 0
    finally:
        child.kill()
        child.wait()


# --- nvidia-smi as one looping process (envbuild/diagnose/smi.py) --------------------------

FAKE_SMI = """#!{python}
import sys, time
with open({log!r}, "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if args[0].startswith("--query-compute-apps"):
    print({apps!r})
elif "-lms" in args:
    if {refuse_loop!r}:
        sys.exit(2)
    while True:
        print({line!r}, flush=True)
        time.sleep(int(args[args.index("-lms") + 1]) / 1000)
else:
    print({line!r})
"""


def fake_smi(directory: Path, refuse_loop: bool = False) -> Path:
    fixtures = Path(__file__).parent / "fixtures" / "diagnose"
    line = (fixtures / "gpu-bound.csv").read_text().splitlines()[1]
    apps = (fixtures / "gpu-bound-apps.csv").read_text().splitlines()[1]
    log = directory / "calls.log"
    exe = directory / "nvidia-smi"
    exe.write_text(FAKE_SMI.format(python=sys.executable, log=str(log), apps=apps, line=line,
                                   refuse_loop=refuse_loop))
    exe.chmod(0o755)
    return log


def sample_for(gpus: session.Gpus, seconds: float) -> list[gpu.GpuSample]:
    sampler = session.Sampler(gpus, 0.05)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sampler.tick(os.getpid())
        time.sleep(0.05)
    sampler.close()
    gpus.close()
    return sampler.gpu


def test_nvidia_smi_is_one_looping_process_not_one_per_sample(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "SMI_INTERVAL_S", 0.1)
    log = fake_smi(tmp_path)
    gpus = session.open_gpus({"PATH": str(tmp_path)}, None)
    assert gpus.source == "nvidia-smi"
    samples = sample_for(gpus, 1.5)
    calls = log.read_text().splitlines()
    assert len(samples) >= 4 and all(s.processes == ((4242, 29800.0),) for s in samples)
    assert len(set(s.t for s in samples)) == len(samples)  # each stamped when it arrived
    assert sum("-lms 100" in c for c in calls) == 1
    assert sum("--query-compute-apps" in c for c in calls) == 1  # once per smi.APPS_EVERY_S (2 s)
    assert sum(c.startswith("--query-gpu") and "-lms" not in c for c in calls) == 1  # the first probe


def test_nvidia_smi_refusing_the_loop_is_asked_per_sample(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "SMI_INTERVAL_S", 0.1)
    monkeypatch.setattr(smi, "FALLBACK_S", 0.2)
    log = fake_smi(tmp_path, refuse_loop=True)
    gpus = session.open_gpus({"PATH": str(tmp_path)}, None)
    samples = sample_for(gpus, 2.0)
    calls = log.read_text().splitlines()
    assert len(samples) >= 3 and samples[0].util_pct == 97.0
    assert sum(c.startswith("--query-gpu") and "-lms" not in c for c in calls) >= 4


def test_samples_printed_after_the_last_tick_are_kept(tmp_path: Path) -> None:
    """A job shorter than nvidia-smi's period: the first tick comes before the loop's first
    line; closing the sampler collects what arrived since."""
    fake_smi(tmp_path)
    stream = smi.SmiStream(str(tmp_path / "nvidia-smi"), gpu.SMI_FIELDS, 100, lambda argv: "", {})
    sampler = session.Sampler(session.Gpus(read=stream.read, source="nvidia-smi", close=stream.close), 0.1)
    sampler.tick(os.getpid())
    first = len(sampler.gpu)
    time.sleep(1.0)
    sampler.close()
    stream.close()
    assert first == 0 and len(sampler.gpu) >= 2


def test_closing_the_stream_ends_its_process(tmp_path: Path) -> None:
    fake_smi(tmp_path)
    stream = smi.SmiStream(str(tmp_path / "nvidia-smi"), gpu.SMI_FIELDS, 100, lambda argv: "", {})
    stream.close()
    assert stream.process.poll() is not None and not stream.pump.is_alive()


# --- waiting for the job between ticks ------------------------------------------------------


def test_waiting_between_ticks_wakes_on_exit_without_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    waitpid = os.waitpid

    def counted(pid: int, options: int) -> tuple[int, int]:
        calls.append(pid)
        return waitpid(pid, options)

    monkeypatch.setattr(os, "waitpid", counted)
    started = time.monotonic()
    outcome = session.run_command(["sleep", "1.5"], seconds=60, env=dict(os.environ),
                                  gpus=session.Gpus(read=None, source=None), interval=1.0)
    assert outcome.exit_code == 0 and time.monotonic() - started < 2.4  # woken by the exit
    assert len(calls) <= 6  # a check per tick; Popen.wait(timeout) polls ~30 times a second
