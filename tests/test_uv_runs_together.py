"""When the survey's uv run (sdists allowed) runs: for a fresh lock it is the closure's own run,
the wheels-only run made after it only where it met an sdist; beside the closure's run where
the lock keeps previous pins or is offline. And the lock's uv runs
end together (envbuild/pylock/uvlive.py's ``Live``): a run that fails, or Ctrl-C, leaves no uv
running and reports at once, never after the other run's own end."""

from __future__ import annotations

import hashlib
import html
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lock_command import serve_directory
from test_sdist_builds import empty_index  # noqa: F401 (fixture)
from test_sdist_survey import links, sdist, spec, uv_env, wheel  # noqa: F401 (fixtures)

from envbuild.errors import DataError
from envbuild.pylock.sourceonly import (
    answered_by_cache,
    pinned_versions,
    searched,
    selected_name,
    wheels_alone,
    without_sdists,
)
from envbuild.pylock.uv import SURVEY_DELAY, ClosureSpec, compile_closure, find_uv, project_text
from envbuild.pylock.uvlive import run_uv


def fake_uv(tmp_path: Path, closure: str, survey: str) -> str:
    """A uv whose closure's run (``--only-binary``) runs the shell text ``closure`` and whose
    survey's run runs ``survey``; each writes its pid to closure.pid / survey.pid first."""
    path = tmp_path / "uv"
    path.write_text(
        "#!/bin/sh\n"
        'case " $* " in\n'
        f'  *" --only-binary "*) echo $$ > {tmp_path}/closure.pid; {closure} ;;\n'
        f'  *) echo $$ > {tmp_path}/survey.pid; {survey} ;;\n'
        "esac\n")
    path.chmod(0o755)
    return str(path)


def after(path: Path) -> str:
    """Shell text that waits for ``path`` (the other run has started): no race with the threads' start."""
    return f"while [ ! -e {path} ]; do sleep 0.02; done; "


def closure_spec(uv: str) -> ClosureSpec:
    # offline: no index page is read, the runs alone are under test
    return ClosureSpec(torch_pins={}, python="3.11", glibc="2.35", dependencies=("six",),
                       default_index="http://127.0.0.1:9/simple", offline=True, uv=uv, timeout=120,
                       env={"PATH": "/usr/bin:/bin"})


def gone(pid_file: Path) -> bool:
    """The process named in ``pid_file`` has ended (and was reaped)."""
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def logging_uv(tmp_path: Path) -> tuple[str, Path]:
    """A uv that logs each run's start, end and arguments, each run held 0.5 s before uv itself."""
    log, real = tmp_path / "runs.log", find_uv(None)
    wrapper = tmp_path / "uv"
    wrapper.write_text(f'#!/bin/sh\nstart=$(date +%s.%N)\nsleep 0.5\n"{real}" "$@"\nrc=$?\n'
                       f'echo "$start $(date +%s.%N) $rc $*" >> {log}\nexit $rc\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


def runs_of(log: Path) -> tuple[tuple[float, float], list[tuple[float, float, str]]]:
    """(the closure's run, the survey's runs: start, end and "cache" or "index"); each of them succeeded."""
    runs = [line.split(" ", 3) for line in log.read_text().splitlines()]
    [closure] = [(float(a), float(b), rc) for a, b, rc, args in runs
                 if "--only-binary" in args and "--offline" not in args]
    surveys = [(float(a), float(b), "cache" if "--offline" in args else "index", rc)
               for a, b, rc, args in runs if "--only-binary" not in args
               and ("--generate-hashes" in args or "versions.txt" in args)]
    assert closure[2] == "0" and all(rc == "0" for *_, kind, rc in surveys if kind == "index"), runs
    return closure[:2], [survey[:3] for survey in surveys]


@pytest.fixture(scope="module")
def hashed_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 index on 127.0.0.1 that gives every file's sha256 and every wheel's metadata
    (PEP 658), as a public index does: keep 1.0 and 2.0 as wheels; held 0.1 as a wheel and 0.2
    as an sdist only (static metadata); both 1.0 as a wheel and an sdist. Yields its /simple URL."""
    root = tmp_path_factory.mktemp("hashed-index")
    files: dict[str, list[tuple[str, bytes, bytes | None]]] = {
        "keep": [(f"keep-{v}-py3-none-any.whl", wheel("keep", v), metadata("keep", v))
                 for v in ("1.0", "2.0")],
        "held": [("held-0.1-py3-none-any.whl", wheel("held", "0.1"), metadata("held", "0.1")),
                 ("held-0.2.tar.gz", sdist("held", "0.2"), None)],
        "both": [("both-1.0-py3-none-any.whl", wheel("both", "1.0"), metadata("both", "1.0")),
                 ("both-1.0.tar.gz", sdist("both", "1.0"), None)],
    }
    (root / "files").mkdir()
    for name, dists in files.items():
        anchors = []
        for filename, content, meta in dists:
            (root / "files" / filename).write_bytes(content)
            attributes = ""
            if meta is not None:
                (root / "files" / f"{filename}.metadata").write_bytes(meta)
                attributes = f' data-dist-info-metadata="sha256={hashlib.sha256(meta).hexdigest()}"'
            href = html.escape(f"../../files/{filename}#sha256={hashlib.sha256(content).hexdigest()}")
            anchors.append(f'<a href="{href}"{attributes}>{filename}</a>')
        (root / "simple" / name).mkdir(parents=True)
        (root / "simple" / name / "index.html").write_text(
            "<html><body>\n" + "\n".join(anchors) + "\n</body></html>\n")
    with serve_directory(root) as url:
        yield f"{url}/simple"


def metadata(name: str, version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()


def hashed_spec(index: str, env: dict[str, str], *dependencies: str, **changes: Any) -> ClosureSpec:
    return ClosureSpec(torch_pins={}, python="3.11", glibc="2.35", dependencies=dependencies,
                       default_index=index, timeout=120, env=env, **changes)


def kinds(log: Path) -> list[tuple[str, str]]:
    """Each run of the closure's pylock, in order (not the one that reads who requires whom):
    ("sdists" where it allows them, else "wheels"; "cache" for --offline, else "index"); each
    of them succeeded unless it asked the cache."""
    found = []
    for line in log.read_text().splitlines():
        _, _, rc, args = line.split(" ", 3)
        if "--generate-hashes" not in args:
            continue
        kind = ("wheels" if "--only-binary" in args else "sdists",
                "cache" if "--offline" in args else "index")
        assert rc == "0" or kind[1] == "cache", line
        found.append(kind)
    return found


def test_a_fresh_lock_of_wheels_is_one_run_allowing_sdists(
        tmp_path: Path, hashed_index: str, uv_env: dict[str, str]) -> None:  # noqa: F811
    """keep 2.0 and both 1.0 are wheels (both 1.0 has an sdist too): the one run allowing sdists,
    the survey's, selected wheels alone, so it is the closure, and its pylock less the sdists is
    the wheels-only run's to the byte (that run made here beside, on the same cache)."""
    uv, log = logging_uv(tmp_path)
    got = compile_closure(hashed_spec(hashed_index, uv_env, "keep", "both", uv=uv))
    assert got.packages == {"both": "1.0", "keep": "2.0"} and got.held_back == () and got.notes == ()
    assert kinds(log) == [("sdists", "index")]
    [args] = [line.split(" ", 3)[3].split(" ") for line in log.read_text().splitlines()]
    assert "--generate-hashes" in args  # and its log proved it (else a wheels-only run would follow)
    assert "both-1.0.tar.gz" not in got.pylock_text and "both-1.0-py3-none-any.whl" in got.pylock_text
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "pyproject.toml").write_text(project_text(hashed_spec(hashed_index, uv_env, "keep", "both")))
    wheels_only = [find_uv(None), *args, "--only-binary", ":all:"]
    subprocess.run(wheels_only, cwd=alone, env=uv_env, check=True)
    assert got.pylock_text == (alone / "pylock.toml").read_text()


def test_a_fresh_lock_that_meets_an_sdist_asks_for_the_wheels_only_closure_after(
        tmp_path: Path, hashed_index: str, uv_env: dict[str, str]) -> None:  # noqa: F811
    """held 0.2 is an sdist only: the run allowing sdists selects it (its log says so), so its
    answer is the survey's, and the wheels-only closure is asked of uv's cache, which lacks held
    0.1's metadata (no run read it): uv's -v log says so, and the index is asked."""
    uv, log = logging_uv(tmp_path)
    got = compile_closure(hashed_spec(hashed_index, uv_env, "keep", "held", uv=uv))
    assert got.packages == {"held": "0.1", "keep": "2.0"}
    assert [(h.name, h.locked, h.newest) for h in got.held_back] == [("held", "0.1", "0.2")]
    assert "held-0.2.tar.gz" not in got.pylock_text
    assert kinds(log) == [("sdists", "index"), ("wheels", "cache"), ("wheels", "index")]
    # locked again: held 0.1's metadata is in uv's cache now, so the cache's wheels-only answer
    # is proven the index's, and the index is asked once
    log.unlink()
    again = compile_closure(hashed_spec(hashed_index, uv_env, "keep", "held", uv=uv))
    assert again.held_back == got.held_back and again.pylock_text == got.pylock_text
    assert kinds(log) == [("sdists", "index"), ("wheels", "cache")]


def test_a_users_rust_log_hides_nothing_the_lock_reads(
        tmp_path: Path, hashed_index: str, uv_env: dict[str, str]) -> None:  # noqa: F811
    """docs/faults.md H28: RUST_LOG=off in the user's environment would silence the -v log that
    proves the cache's wheels-only answer (uv takes RUST_LOG over -v): it is dropped, so locked
    again the held-back case still asks the index once."""
    env = {**uv_env, "RUST_LOG": "off"}
    uv, log = logging_uv(tmp_path)
    compile_closure(hashed_spec(hashed_index, env, "keep", "held", uv=uv))
    log.unlink()
    again = compile_closure(hashed_spec(hashed_index, env, "keep", "held", uv=uv))
    assert [(h.name, h.locked, h.newest) for h in again.held_back] == [("held", "0.1", "0.2")]
    assert kinds(log) == [("sdists", "index"), ("wheels", "cache")]


def test_a_lock_keeping_previous_pins_surveys_beside_the_closures_run(
        tmp_path: Path, empty_index: str, links: str, uv_env: dict[str, str]) -> None:  # noqa: F811
    """Kept pins: the closure's run reads none of the newer releases the survey takes, so the
    survey asks the index beside it (from SURVEY_DELAY s after its start); the cache is asked
    too once the closure's run has ended, and here cannot prove its answer (held 0.2 is on a
    find-links page without hashes, which uv offline cannot compute): the result is the
    online survey's, as before."""
    first = compile_closure(spec(empty_index, links, uv_env, "keep==1.0", "held"))
    uv, log = logging_uv(tmp_path)
    got = compile_closure(spec(empty_index, links, uv_env, "keep", "held", uv=uv, previous=first.pylock_text))
    assert got.packages == {"held": "0.1", "keep": "1.0"}
    assert [(h.name, h.locked, h.newest) for h in got.held_back] == [("held", "0.1", "0.2")]
    closure, surveys = runs_of(log)
    [survey] = [s for s in surveys if s[2] == "index"]
    assert survey[0] < closure[1] and closure[0] < survey[1], (closure, survey)  # they overlap
    # the survey's starts a moment later: two runs' connections opened at once stalled one
    assert survey[0] - closure[0] >= SURVEY_DELAY * 0.6, (closure, survey)  # the shells' own start: jitter
    assert all(s[0] >= closure[1] for s in surveys if s[2] == "cache")


def test_only_the_survey_raced_against_the_cache_runs_at_a_lower_priority(
        tmp_path: Path, empty_index: str, links: str, uv_env: dict[str, str]) -> None:  # noqa: F811
    """Kept pins: the survey asking the index is a whole resolution beside the closure's run,
    wanted only where the cache cannot prove its answer; on two cores it took CPU from that run
    (a re-lock's closure run 34 ms faster with it at nice 10, 41 rounds). The closure's run,
    the cache's survey and the lock's own thread keep their priority."""
    first = compile_closure(spec(empty_index, links, uv_env, "keep==1.0", "held"))
    log, real = tmp_path / "nice.log", find_uv(None)
    wrapper = tmp_path / "uv"
    wrapper.write_text(f"#!/bin/sh\necho \"$(awk '{{print $19}}' /proc/$$/stat) $*\" >> {log}\n"
                       f'exec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    got = compile_closure(spec(empty_index, links, uv_env, "keep", "held", uv=str(wrapper),
                               previous=first.pylock_text))
    assert [(h.name, h.locked, h.newest) for h in got.held_back] == [("held", "0.1", "0.2")]
    runs = [line.split(" ", 1) for line in log.read_text().splitlines()]
    def survey_online(args: str) -> bool:  # sdists allowed, a pylock, the index asked
        return "--only-binary" not in args and "--offline" not in args and "-o pylock.toml" in args

    online = [int(nice) for nice, args in runs if survey_online(args)]
    rest = [(int(nice), args) for nice, args in runs if not survey_online(args)]
    assert online == [min(base + 10, 19)], runs
    assert {nice for nice, _ in rest} == {base}, runs
    assert any("--only-binary" in args and "-o pylock.toml" in args and "--offline" not in args
               for _, args in rest), runs  # the closure's run among them
    assert os.getpriority(os.PRIO_PROCESS, 0) == base


def test_a_lock_keeping_previous_pins_takes_the_caches_proven_answer_without_waiting_for_the_index(
        tmp_path: Path, hashed_index: str, uv_env: dict[str, str]) -> None:  # noqa: F811
    """Kept pins, nothing newer: the cache's answer (the closure's own versions) is proven the
    index's as soon as the closure's run ends, and the survey asking the index beside it (made
    to take 60 s here) is stopped, not waited for."""
    first = compile_closure(hashed_spec(hashed_index, uv_env, "keep", "held"))
    slow = tmp_path / "uv"
    slow.write_text(f"#!{sys.executable}\nimport os, sys, time\n"
                    "if '--only-binary' not in sys.argv and '--offline' not in sys.argv:\n"
                    "    time.sleep(60)  # the survey asking the index\n"
                    f"os.execv({find_uv(None)!r}, [{find_uv(None)!r}, *sys.argv[1:]])\n")
    slow.chmod(0o755)
    start = time.monotonic()
    got = compile_closure(hashed_spec(hashed_index, uv_env, "keep", "held", uv=str(slow),
                                      previous=first.pylock_text))
    assert time.monotonic() - start < 30
    assert got.packages == first.packages == {"held": "0.1", "keep": "2.0"}
    assert [(h.name, h.locked, h.newest) for h in got.held_back] == [("held", "0.1", "0.2")]


def test_a_closure_run_that_fails_ends_the_survey_and_reports_at_once(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path, closure=after(tmp_path / "survey.pid")
                 + "echo 'error: the index said no' >&2; exit 2",
                 survey="exec sleep 60")
    start = time.monotonic()
    with pytest.raises(DataError, match="uv could not lock the closure: the index said no"):
        compile_closure(closure_spec(uv))
    assert time.monotonic() - start < 30  # not the survey's 60 s
    assert gone(tmp_path / "survey.pid")


def test_a_survey_that_fails_leaves_the_closures_run_to_finish(tmp_path: Path) -> None:
    """The survey's failure is a note (test_sdist_survey): it never ends the closure's run,
    whose own failure, when it comes, is what the lock reports."""
    uv = fake_uv(tmp_path, closure=after(tmp_path / "survey.pid")
                 + "sleep 1; echo 'error: the closure failed late' >&2; exit 2",
                 survey="echo 'error: no sdist here' >&2; exit 2")
    with pytest.raises(DataError, match="the closure failed late"):
        compile_closure(closure_spec(uv))
    assert gone(tmp_path / "closure.pid") and gone(tmp_path / "survey.pid")


def test_ctrl_c_kills_both_runs(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path, closure="exec sleep 60", survey="exec sleep 60")
    main = threading.main_thread().ident or 0

    def interrupt() -> None:  # Ctrl-C reaches the command's main thread once both runs are up
        deadline = time.monotonic() + 20
        while not all((tmp_path / n).exists() for n in ("closure.pid", "survey.pid")):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            compile_closure(closure_spec(uv))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30
    assert gone(tmp_path / "closure.pid") and gone(tmp_path / "survey.pid")


CACHED_LOG = """\
DEBUG uv 0.13.9 (x86_64-unknown-linux-gnu)
DEBUG Adding direct dependency: keep*
DEBUG Searching for a compatible version of keep (*)
DEBUG Selecting: keep==2.0 [compatible] (keep-2.0-py3-none-any.whl)
DEBUG Adding transitive dependency for keep==2.0: six*
DEBUG Searching for a compatible version of six{sys_platform == 'linux'} (*)
DEBUG Searching for a compatible version of cuda-toolkit[cublas] (>=13.0.3, <13.0.3+)
DEBUG Selecting: six==1.17.0 [compatible] (six-1.17.0-py2.py3-none-any.whl)
Resolved 2 packages in 7ms
"""


def test_a_cache_run_that_searched_only_the_closures_names_and_fetched_nothing_is_the_index_answer() -> None:
    locked = frozenset({"keep", "six", "cuda-toolkit"})
    assert answered_by_cache(CACHED_LOG, frozenset({"keep", "six"}), locked)


@pytest.mark.parametrize(("log", "locked", "why"), [
    (CACHED_LOG + "DEBUG Sending fresh GET request for: http://127.0.0.1/files/held-0.2.tar.gz\n",
     {"keep", "six", "cuda-toolkit"}, "it tried to fetch a file"),
    (CACHED_LOG + "WARN `held==0.2` needs to be downloaded from a registry\n",
     {"keep", "six", "cuda-toolkit"}, "it passed over a release it lacked"),
    (CACHED_LOG + "warning: something uv says at any verbosity\n", {"keep", "six", "cuda-toolkit"},
     "a line that is not uv's DEBUG log"),
    (CACHED_LOG, {"keep", "cuda-toolkit"}, "it decided six, whose page the closure's run did not read"),
    (CACHED_LOG.replace("Searching for a compatible version of six", "Choosing a version of six"),
     {"keep", "six", "cuda-toolkit"}, "its log does not name every package of its answer"),
    ("", {"keep", "six"}, "an empty log proves nothing"),
])
def test_a_cache_run_is_not_taken_for_the_index_answer(log: str, locked: set[str], why: str) -> None:
    assert not answered_by_cache(log, frozenset({"keep", "six"}), frozenset(locked)), why


def test_an_empty_answer_proves_nothing() -> None:
    assert not answered_by_cache("DEBUG Solving\n", frozenset(), frozenset({"keep"}))


def test_uvs_requirements_output_is_read_as_versions_and_anything_else_is_not_judged() -> None:
    assert pinned_versions("# a comment\nKeep_It==2.0\ntorch==2.13.0+cpu\n\n") == {
        "keep-it": "2.0", "torch": "2.13.0+cpu"}
    for line in ("six @ https://files.example/six-1.0-py3-none-any.whl", "six==1.0 ; sys_platform == 'linux'",
                 "-e ./here", "six>=1.0"):
        assert pinned_versions(f"keep==2.0\n{line}\n") is None, line


def test_a_run_that_selected_wheels_alone_answered_as_the_wheels_only_run() -> None:
    assert wheels_alone(CACHED_LOG, frozenset({"keep", "six"}))


@pytest.mark.parametrize(("log", "why"), [
    (CACHED_LOG + "DEBUG Selecting: held==0.2 [compatible] (held-0.2.tar.gz)\n",
     "it selected an sdist, which a wheels-only run passes over"),
    (CACHED_LOG.replace("DEBUG Selecting: six==1.17.0 [compatible] (six-1.17.0-py2.py3-none-any.whl)\n", ""),
     "six, in its answer, is not among those it selected"),
    (CACHED_LOG + "DEBUG Selecting: held 0.2 from held-0.2-py3-none-any.whl\n",
     "a selecting line of another form"),
    (CACHED_LOG.replace("Selecting:", "Choosing:"), "another uv's wording names no selection"),
    ("", "an empty log proves nothing"),
])
def test_a_run_allowing_sdists_is_not_taken_for_the_wheels_only_run(log: str, why: str) -> None:
    assert not wheels_alone(log, frozenset({"keep", "six"})), why


def test_an_empty_answer_is_no_wheels_only_answer() -> None:
    assert not wheels_alone(CACHED_LOG, frozenset())


def test_the_pylock_of_a_run_allowing_sdists_loses_its_sdists_and_nothing_else() -> None:
    head = 'lock-version = "1.0"\ncreated-by = "uv"\n\n[[packages]]\nname = "both"\nversion = "1.0"\n'
    sdist_line = 'sdist = { url = "http://127.0.0.1/files/both-1.0.tar.gz", hashes = { sha256 = "aa" } }\n'
    wheels = 'wheels = [{ url = "http://127.0.0.1/w/both-1.0-py3-none-any.whl", hashes = {sha256 = "bb"} }]\n'
    assert without_sdists(head + sdist_line + wheels) == head + wheels


def test_the_names_a_log_searched_are_canonical_and_markers_and_extras_dropped() -> None:
    assert searched(CACHED_LOG) == frozenset({"keep", "six", "cuda-toolkit"})


def test_the_name_a_selecting_line_gives_is_canonical_and_other_lines_give_none() -> None:
    assert selected_name("DEBUG Selecting: Typing_Extensions==4.12.2 [compatible] "
                         "(typing_extensions-4.12.2-py3-none-any.whl)\n") == "typing-extensions"
    assert selected_name("DEBUG Selecting: held==0.2 [compatible] (held-0.2.tar.gz)") == "held"
    assert selected_name("DEBUG Searching for a compatible version of keep (*)") is None
    assert selected_name("DEBUG Selecting: held 0.2 from held-0.2-py3-none-any.whl") is None


def test_a_watched_run_hands_over_each_line_as_uv_writes_it(tmp_path: Path) -> None:
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\necho first >&2\nsleep 1\necho second >&2\n")
    uv.chmod(0o755)
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    log = run_uv([str(uv)], tmp_path, {"PATH": "/usr/bin:/bin"}, start + 60, closure_spec(str(uv)),
                 watch=lambda line: seen.append((time.monotonic(), line)))
    ended = time.monotonic()
    assert log == "first\nsecond\n" and [line for _, line in seen] == ["first\n", "second\n"]
    assert seen[0][0] < ended - 0.5  # the first line long before the run's end


def test_a_watcher_that_fails_leaves_the_run_read_to_its_end(tmp_path: Path) -> None:
    """200 KB of log is more than a pipe holds: a reader that stopped at the failing watcher's
    line would leave uv blocked until the deadline."""
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\ni=0\nwhile [ $i -lt 2000 ]; do\n"
                  "  echo \"line $i $(printf '%0100d' 0)\" >&2; i=$((i+1))\ndone\nexit 0\n")
    uv.chmod(0o755)
    calls: list[str] = []

    def failing(line: str) -> None:
        calls.append(line)
        raise RuntimeError("a watcher's bug")

    start = time.monotonic()
    log = run_uv([str(uv)], tmp_path, {"PATH": "/usr/bin:/bin"}, start + 30, closure_spec(str(uv)),
                 watch=failing)
    assert time.monotonic() - start < 20
    assert len(log.splitlines()) == 2000 and len(calls) == 1


Served = tuple[float, str, str]  # a request served: (time, path, User-Agent)


@pytest.fixture(scope="module")
def deep_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Served]]]:
    """A PEP 503 index on 127.0.0.1 (sha256s, PEP 658 metadata): top 1.0 requires leaf, a name
    no project requirement gives. Yields its /simple URL and the requests it is served, each
    (time, path, User-Agent)."""
    root = tmp_path_factory.mktemp("deep-index")
    (root / "files").mkdir()
    for name, requires in (("top", ("leaf",)), ("leaf", ())):
        filename = f"{name}-1.0-py3-none-any.whl"
        content = wheel(name, "1.0", requires)
        meta = "".join(f"{line}\n" for line in ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0",
                                                *(f"Requires-Dist: {r}" for r in requires)]).encode()
        (root / "files" / filename).write_bytes(content)
        (root / "files" / f"{filename}.metadata").write_bytes(meta)
        href = html.escape(f"../../files/{filename}#sha256={hashlib.sha256(content).hexdigest()}")
        (root / "simple" / name).mkdir(parents=True)
        (root / "simple" / name / "index.html").write_text(
            f'<html><body>\n<a href="{href}" data-dist-info-metadata="sha256='
            f'{hashlib.sha256(meta).hexdigest()}">{filename}</a>\n</body></html>\n')
    served: list[Served] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            served.append((time.time(), self.path, self.headers.get("User-Agent", "")))
            super().do_GET()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", served
    finally:
        server.shutdown()
        server.server_close()


def test_a_fresh_lock_reads_the_pages_of_what_uv_selects_while_uv_still_runs(
        tmp_path: Path, deep_index: tuple[str, list[Served]],
        uv_env: dict[str, str]) -> None:  # noqa: F811
    """The hash check needs the page of every package of the closure. leaf's name is in no
    requirement: it is known once uv selects it, which its resolver's log says as uv runs.
    The run's end here is held 1.5 s after uv itself has finished (stderr still open): leaf's
    page is asked for by envbuild (its own User-Agent) before that end, not after it."""
    index, served = deep_index
    real, ended = find_uv(None), tmp_path / "ended"
    wrapper = tmp_path / "uv"
    wrapper.write_text(f'#!/bin/sh\n"{real}" "$@"\nrc=$?\nsleep 1.5\ndate +%s.%N > {ended}\nexit $rc\n')
    wrapper.chmod(0o755)
    got = compile_closure(hashed_spec(index, uv_env, "top", uv=str(wrapper)))
    assert got.packages == {"leaf": "1.0", "top": "1.0"}
    asked = [when for when, path, agent in served
             if path.startswith("/simple/leaf") and agent.startswith("envbuild/")]
    assert asked and min(asked) < float(ended.read_text())
