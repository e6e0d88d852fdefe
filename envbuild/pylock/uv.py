"""The closure of an environment, resolved by uv (``uv pip compile``), as a PEP 751 pylock.

envbuild writes no resolver. It generates a throw-away project in a temporary directory::

    [project] dependencies = ["torch==2.13.0+cpu", <the user's torch requirements>, <the user's deps>]
    [tool.uv.sources] torch = { index = "envbuild-torch" }
    [[tool.uv.index]] name = "envbuild-torch", url = <the variant's index>, explicit = true

and asks uv for the closure on the image's platform (``--python-platform
x86_64-manylinux_2_NN``, NN from the image's glibc, which the caller maps from the Ubuntu
release: 20.04 → "2.31", 22.04 → "2.35", 24.04 → "2.39"), for its CPython
(``--python-version``), wheels only, with hashes, as ``pylock.toml``. The pinned packages come
only from the variant's index (explicit: nothing else is looked up there); every other
package comes from the default index (the user's, else pip's: flag, PIP_INDEX_URL, pip's
configuration; pip's extra indexes are not read, envbuild's pipconfig exposes none) and the
find-links. ``--no-config`` and a scrubbed environment (no UV_* variable that changes an
answer) keep a stray uv.toml or shell setting out: the same inputs give the same bytes.

``offline``: uv answers from its cache alone, and the check that the index gave every file's
sha256 (:mod:`envbuild.pylock.hashes`) is skipped: it was made when the cache was filled.

A second, hash-free run of the pinned packages alone names the torch layer: the packages the
image installs before the user's, at the first run's versions. It first runs from uv's cache
beside the first run, held to nothing, and is taken where every package of its answer is at
the first run's version (the pins' closure at fixed versions is one set); else it runs again
constrained to the first result, from the cache the first run has just brought up to date
(``--offline``), and asks the index only where that cache cannot answer. The installer's own
lock (``uv==VERSION``, an exact version whose files do not change) is asked of uv's cache alone
beside the first run, and its wheel read and checked there; where the cache cannot answer it
runs online beside that second run and the hash check. Either way its sha256 is checked against
the index; the index pages of the names known in advance are fetched meanwhile, and on a fresh
lock the page of each release uv's resolver log says it selected, as uv runs.

The survey (envbuild/pylock/sourceonly.py), a run of the same project with sdists allowed
and held to the same cut-off and constraints, needs nothing of the first run's answer, and is
compared with it afterwards. A fresh lock online of requirements from an index makes the survey's
run its first (:func:`_open_closure`): where its ``-v`` log shows it selected wheels alone, the
wheels-only run would have answered alike (sourceonly.wheels_alone) and its pylock less the sdists
is the closure's, one run in all; else the wheels-only run follows, from uv's cache where its log
proves that answer the index's. Any other fresh lock surveys after the first run, from uv's cache alone,
which that run has just brought up to date (about 60 ms instead of a second round of the
index's pages), prepared beside the first run and started at its end; it takes that answer
only where uv's ``-v`` log shows it is the index's (:func:`answered_by_cache`: no release
passed over for want of its metadata, no package whose page the first run did not read), else
asks the index. Its versions alone are read where they are the first run's (nothing held back,
the common case); else its pylock. A lock that keeps previous pins (the
first run then reads none of the newer releases the survey takes, which the cache may lack) or
is offline surveys beside the first run, in its own directory, from SURVEY_DELAY s after its
start (two runs opening their connections at once made a burst of name look-ups that a
resolver answered 5 s late); keeping pins, it also asks the cache at the first run's end, and
where that answer is proven the run beside is stopped, not waited for.
Each run is registered while it runs: where the lock fails in any thread or is interrupted
(Ctrl-C, SIGTERM), every uv still running is killed before the lock reports its error, and
none starts after.

Errors (docs/faults.md H20–H29): uv missing → UsageError (2); a conflict → NoCompatibleStack (3)
naming the stack's pin and the user's requirement; an index without sha256 for a file, uv
failing (network, a missing package) or running past ``timeout`` → DataError (4). Nothing is
written but the temporary directory, which is removed.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from envbuild.errors import DataError, EnvbuildError, NoCompatibleStack, UsageError
from envbuild.pylock.direct import (
    check_hashes,
    check_platform,
    direct_wheel,
    direct_wheels,
    is_source,
    served_sha256,
)
from envbuild.pylock.hashes import IndexPages
from envbuild.pylock.install import glibc_minor, install_requirements, python_minor, supported_tags
from envbuild.pylock.spec import PROJECT_NAME
from envbuild.pylock.spec import ClosureSpec as ClosureSpec  # re-exported: callers import it from here
from envbuild.pylock.uvbin import find_uv as find_uv  # both re-exported: callers import them from here
from envbuild.pylock.uvbin import uv_version as uv_version
from envbuild.pylock.uvlive import Cancelled, Live, Stop, TooSlow, run_uv
from envbuild.redact import redact
from envbuild.threads import Answer, Threads, read_soon, yield_cpu
from envbuild.upstream import pipconfig

TYPE_CHECKING = False  # for the type checker only: these modules are read where they are used
if TYPE_CHECKING:
    from typing import Any

    from envbuild.pylock.files import Pylock
    from envbuild.pylock.sourceonly import HeldBack

TORCH_INDEX_NAME = "envbuild-torch"
OUTPUT = "pylock.toml"  # uv insists on pylock.toml or pylock.NAME.toml
# The UV_* variables passed through to uv: where its cache lives, how it reaches the network,
# credentials. Every other one (UV_INDEX, UV_FIND_LINKS, UV_PRERELEASE, UV_EXCLUDE_NEWER, …)
# could change the answer and is dropped.
UV_KEEP = ("UV_CACHE_DIR", "UV_NO_CACHE", "UV_HTTP_TIMEOUT", "UV_NATIVE_TLS", "UV_CONCURRENT_DOWNLOADS",
           "UV_REQUEST_TIMEOUT", "UV_HTTP_RETRIES", "UV_KEYRING_PROVIDER", "UV_INSECURE_HOST")
_UV_CREDENTIAL = re.compile(r"UV_INDEX_[A-Z0-9_]+_(USERNAME|PASSWORD)")


@dataclass(frozen=True)
class InstallerWheel:
    """The installer's one wheel for the closure's platform, as the index gave it."""

    name: str
    version: str
    url: str
    sha256: str


@dataclass(frozen=True)
class Closure:
    pylock_text: str
    pylock: Pylock  # pylock_text, read (and checked) once
    packages: dict[str, str]  # canonical name -> version, every distribution of the pylock
    torch_layer: frozenset[str]  # canonical names: the pinned packages and their closure
    installer: InstallerWheel | None = None
    sdists: tuple[str, ...] = ()  # canonical names locked by their sdist alone (build-sdists)
    # Packages locked older than the newest the requirements allow, an sdist-only release
    # being the reason (envbuild/pylock/sourceonly.py); and why that check could not be made.
    held_back: tuple[HeldBack, ...] = ()
    notes: tuple[str, ...] = ()


def uv_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the UV_* variables that could change uv's answer, nor RUST_LOG (uv takes
    it over ``-v``: a user's filter would hide the log lines that prove an answer from uv's cache,
    and each proof failing costs the lock another run); pip's CA bundle (PIP_CERT,
    REQUESTS_CA_BUNDLE) handed to uv as SSL_CERT_FILE when none is set."""
    kept = {k: v for k, v in env.items() if k != "RUST_LOG"
            and (not k.startswith("UV_") or k in UV_KEEP or _UV_CREDENTIAL.fullmatch(k))}
    bundle = pipconfig.tls_verify(env)
    if isinstance(bundle, str) and "SSL_CERT_FILE" not in kept:
        kept["SSL_CERT_FILE"] = bundle
    kept["NO_COLOR"] = "1"
    return kept


def read_pylock(text: str, *, reference: bool = True) -> Pylock:
    """envbuild.pylock.files' reader, that module read where a pylock is first read: on a fresh
    lock after uv's closure run has started, beside it (``compile_closure``'s ``begun``)."""
    from envbuild.pylock.files import read_pylock as read

    return read(text, reference=reference)


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII is a TOML basic string


def _checked(requirements: tuple[str, ...], what: str) -> tuple[str, ...]:
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise UsageError(f"{what}: {text!r} is not a PEP 508 requirement ({exc})") from exc
        if requirement.url and is_source(text):
            from envbuild.pylock.sources import check_source

            check_source(text, what)  # git by commit, a source archive: uv records them
        elif requirement.url:
            direct_wheel(text, what)  # an https wheel: uv fetches and hashes it; else UsageError
    return requirements


def project_text(spec: ClosureSpec, *, pins_only: bool = False) -> str:
    """The generated pyproject.toml that uv compiles."""
    pins = tuple(f"{canonicalize_name(n)}=={v}" for n, v in sorted(spec.torch_pins.items()))
    requirements = pins if pins_only else (
        *pins, *_checked(spec.torch_constraints, "torch requirement"),
        *_checked(spec.dependencies, "dependency"))
    lines = ["[project]", f"name = {_toml_string(PROJECT_NAME)}", 'version = "0"',
             f"requires-python = {_toml_string(f'=={spec.python}.*')}", "dependencies = ["]
    lines += [f"    {_toml_string(r)}," for r in requirements]
    lines.append("]")
    if spec.torch_index is not None and spec.torch_pins:
        lines += ["", "[tool.uv.sources]"]
        lines += [f"{_toml_string(canonicalize_name(n))} = {{ index = {_toml_string(TORCH_INDEX_NAME)} }}"
                  for n in sorted(spec.torch_pins)]
        lines += ["", "[[tool.uv.index]]", f"name = {_toml_string(TORCH_INDEX_NAME)}",
                  f"url = {_toml_string(spec.torch_index)}", "explicit = true"]
    return "\n".join(lines) + "\n"


# The newest manylinux level uv's --python-platform names (uv 0.13: x86_64-manylinux_2_40). A
# newer glibc runs every older manylinux wheel, so a release with a newer glibc (Ubuntu 26.04:
# 2.43) is resolved and installed as 2.40: the lock records the level it used.
NEWEST_MANYLINUX = "2.40"


def platform_glibc(glibc: str) -> str:
    """The glibc level a closure is resolved for: the image's, at most ``NEWEST_MANYLINUX``."""
    return glibc if glibc_minor(glibc) <= glibc_minor(NEWEST_MANYLINUX) else NEWEST_MANYLINUX


def _command(uv: str, spec: ClosureSpec, default_index: str, output: str, *, hashes: bool,
             annotate: bool = False) -> list[str]:
    command = [uv, "pip", "compile", "pyproject.toml", "--no-config", "--quiet", "--color", "never",
               "--no-header", *(() if annotate else ("--no-annotate",)),
               *(() if spec.all_sdists else ("--only-binary", ":all:")),
               "--python-platform", platform_tag(spec.glibc, spec.arch),
               "--python-version", f"3.{python_minor(spec.python)}",
               # The interpreter running envbuild, whatever its version: uv builds nothing
               # (wheels only), so it neither looks for nor downloads another one.
               "--python", sys.executable,
               "--default-index", default_index, "-o", output]
    command += ["--format", "pylock.toml", "--generate-hashes"] if hashes else \
        ["--format", "requirements.txt"]
    for link in spec.find_links:
        command += ["--find-links", link]
    for name in spec.no_binary:  # overrides --only-binary :all: for these packages alone
        command += ["--no-binary", name]
    if spec.offline:
        command.append("--offline")
    return command


@dataclass(frozen=True)
class _Uv:
    """One closure's uv runs: the binary, the spec, the default index, uv's environment, the
    deadline every run shares and the runs now running."""

    uv: str
    spec: ClosureSpec
    default_index: str
    env: dict[str, str]
    deadline: float
    live: Live = field(default_factory=Live, compare=False)

    def run(self, command: list[str], cwd: Path, started: Callable[[], None] | None = None,
            stop: Stop | None = None, log: str | None = None,
            watch: Callable[[str], None] | None = None) -> str:
        """uv's run of ``command`` in ``cwd``: what it wrote to stderr (its log, with ``-v``, or
        what ``log`` asks for: a RUST_LOG filter), each line handed to ``watch`` as uv writes it."""
        env = self.env if log is None else {**self.env, "RUST_LOG": log}
        return run_uv(command, cwd, env, self.deadline, self.spec, started, self.live, stop, watch)

    def project_in(self, cwd: Path, *, pins_only: bool = False) -> None:
        """``cwd`` made, where it is not, with the generated project in it (the pins alone
        with ``pins_only``): each uv run's own directory."""
        cwd.mkdir(exist_ok=True)
        (cwd / "pyproject.toml").write_text(project_text(self.spec, pins_only=pins_only), encoding="utf-8")

    def command(self, output: str, *, hashes: bool, spec: ClosureSpec | None = None,
                annotate: bool = False) -> list[str]:
        return _command(self.uv, spec or self.spec, self.default_index, output, hashes=hashes,
                        annotate=annotate)

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 1.0)


def compile_closure(spec: ClosureSpec, *, started: Callable[[], None] | None = None) -> Closure:
    """Resolve the closure of ``spec`` with uv; see the module's docstring. ``started`` is called
    once uv's closure run has started (``lock`` asks the registry then).

    What does not need the closure starts with it: the index pages of every name known in
    advance and of each release uv selects (as its log says so), the installer's small lock and
    the torch layer from uv's cache."""
    env = dict(os.environ if spec.env is None else spec.env)
    uv = find_uv(spec.uv)
    glibc_minor(spec.glibc)
    python_minor(spec.python)
    wheels = direct_wheels(spec.dependencies)
    if wheels:  # the target's tags (a thousand) are listed only for a wheel to check
        check_platform(wheels, supported_tags(spec.python, spec.glibc, spec.arch),
                       python=spec.python, platform=platform_tag(spec.glibc, spec.arch))
    default_index = spec.default_index or pipconfig.index_url(None, env)
    if spec.previous is not None:  # a broken previous lock: UsageError naming the field
        _previous_pylock(spec.previous)
    run = _Uv(uv=uv, spec=spec, default_index=default_index, env=uv_environment(env),
              deadline=time.monotonic() + spec.timeout)
    # Leaving the block, ``run.live`` first kills what still runs where the lock failed or was
    # interrupted, so that the pool's threads end at once and the directory can be removed.
    with tempfile.TemporaryDirectory(prefix="envbuild-uv-") as tmp, \
            _index_pages(spec, default_index, env) as pages, Threads() as side, \
            run.live:
        work = Path(tmp)
        (work / "pyproject.toml").write_text(project_text(spec), encoding="utf-8")
        # The survey's run (sdists allowed, no kept pin) needs nothing of the closure's: where
        # the closure's run will not have read what the survey needs (_survey_beside), it runs
        # beside it (from SURVEY_DELAY s after its start); else from uv's cache the moment the
        # closure's run ends, its answer judged once ``locked`` (the closure's names) is known.
        locked: Answer[dict[str, str]] = Answer()
        survey: Answer[Pylock | None] | None = None  # the survey's answer
        online: Answer[Pylock | None] | None = None  # its run asking the index beside the closure's
        stop = Stop()
        opened: Answer[Pylock | None] | None = Answer() if _opens(spec) else None
        if opened is not None:  # the closure's run is the survey's (_open_closure)
            survey = opened
        elif not spec.all_sdists and _survey_beside(spec):
            survey = online = side.submit(_survey_run, run, work, stop)
            if not spec.offline:  # kept pins: the cache may answer first (_survey_raced)
                survey = side.submit(_survey_raced, run, work, locked, online, stop)
        elif not spec.all_sdists:
            survey = side.submit(_survey_after, run, work, locked)
        beside: dict[str, Answer[Any]] = {}

        def begun() -> None:
            """What runs beside the closure's run, begun once it has started (it goes first)."""
            read_soon("envbuild.pylock.files")  # its reader, for the closure's pylock
            if spec.previous is not None:  # PEP 751's reference reader too (packaging.pylock)
                beside["previous"] = side.submit(read_pylock, spec.previous)
            if pages is not None:
                pages.prefetch(_known_names(spec))
            # The installer's small lock first asks uv's cache alone, its wheel read and
            # checked meanwhile; a cache that cannot answer, and an offline lock, make it
            # after the closure's run.
            if spec.installer is not None and not spec.offline:
                beside["cached"] = side.submit(_cached_installer, run, work, pages)
            # The torch layer from uv's cache (a core the closure's run leaves idle)
            if not spec.offline and spec.torch_pins:
                beside["early"] = side.submit(_early_layer, run, work)
            if started is not None:
                started()

        try:
            if opened is not None:
                text, pylock = _open_closure(run, work, begun, opened, pages)
            else:
                text = _closure_run(run, work, begun)[0]
                pylock = read_pylock(text)
        except NoCompatibleStack as exc:
            locked.set_result({})  # no closure: the cache's answer is never taken
            _previous_refused(beside)
            raise _every_sdist_only(run, work, exc, online or survey) from None
        except BaseException as exc:
            locked.set_exception(Cancelled())
            if isinstance(exc, Exception):  # uv's failure may be the broken pylock it was given
                _previous_refused(beside)
            raise
        _previous_refused(beside)
        locked.set_result(pylock.versions())
        cached, early = beside.get("cached"), beside.get("early")
        installer = None if spec.installer is None else side.submit(_installer, run, work, pages, cached)
        if pages is not None:
            check_hashes(direct_wheels(spec.dependencies),
                         {p.name: p.wheels[0].sha256 for p in pylock.packages if p.direct},
                         lambda url: served_sha256(url, env))
            from envbuild.pylock.sources import archives

            check_hashes(archives(spec.dependencies),
                                 {p.name: p.sdist.sha256 for p in pylock.packages if p.by_url and p.sdist},
                                 lambda url: served_sha256(url, env))
            pages.check(pylock)
        _check_pins_cutoff(spec, pylock)
        layer = _torch_layer(run, pylock.versions(), work, early)
        wheel = None if installer is None else installer.result()
        sdists, held, notes = _sdists_and_held_back(run, work, pylock, survey)
    return Closure(pylock_text=text, pylock=pylock, packages=pylock.versions(), torch_layer=layer,
                   installer=wheel, sdists=sdists, held_back=held, notes=notes)


def _sdists_and_held_back(run: _Uv, work: Path, pylock: Pylock, survey: Answer[Pylock | None] | None
                          ) -> tuple[tuple[str, ...], tuple[HeldBack, ...], tuple[str, ...]]:
    """(the packages locked by their sdist alone, the packages held back, notes). With
    ``all_sdists`` uv already took the newest release of everything, an sdist where there is
    no wheel: nothing is held back. Otherwise the survey (sdists allowed, ``survey``: its run;
    None where it answered the closure's own versions) says what wheels-only resolution held
    back; a survey that fails is a note, never a failed lock."""
    from envbuild.pylock import sourceonly

    spec = run.spec
    if spec.all_sdists or survey is None:
        return tuple(s.name for s in sourceonly.sdist_only(pylock, {})), (), ()
    versions = pylock.versions()
    missing = sorted(set(spec.no_binary) - set(versions))
    if missing:
        raise UsageError(f"build-sdists names {', '.join(missing)}, which the locked closure does not hold",
                         hint="name packages of the closure only (or build-sdists = true)")
    kept = _kept_pins(spec)
    try:
        found = survey.result()
        if found is None:
            return spec.no_binary, (), ()
        # who requires whom, only where something was held back: a second run, from uv's cache
        annotated = _annotated(run, work, found) if sourceonly.held_back(versions, found, {}, kept) else {}
    except TooSlow:
        raise
    except EnvbuildError as exc:
        return spec.no_binary, (), (f"whether wheels-only resolution held a package back was not "
                                    f"checked: the run allowing sdists failed ({_shortened(exc.message)})",)
    # Offline, uv passes over a release whose metadata its cache lacks: a held-back package may go unseen.
    notes = ("--offline: what wheels-only resolution held back was checked against uv's cache only, "
             "which may lack a newer sdist",) if spec.offline else ()
    return spec.no_binary, tuple(sourceonly.held_back(versions, found, annotated, kept)), notes


def _kept_pins(spec: ClosureSpec) -> dict[str, str]:
    """The previous pylock's pins uv was asked to keep: none with --upgrade, none of --upgrade-package's."""
    if spec.previous is None or spec.upgrade:
        return {}
    upgraded = {canonicalize_name(n) for n in spec.upgrade_packages}
    return {n: v for n, v in _previous_pylock(spec.previous).versions().items() if n not in upgraded}


@functools.lru_cache(maxsize=2)
def _previous_pylock(text: str) -> Pylock:
    """The previous pylock, read once: it is checked, then its pins asked for, before uv's
    closure run and after it (a Pylock is frozen: one object serves each). PEP 751's reference
    reader, half the time and its import, checks it beside uv's run (:func:`_previous_refused`):
    nothing taken from it before then goes anywhere but to uv, which reads that file itself."""
    return read_pylock(text, reference=False)


def _previous_refused(beside: Mapping[str, Answer[Any]]) -> None:
    """The reference reader's refusal of the previous pylock raised (a UsageError naming the field)."""
    if "previous" in beside:
        beside["previous"].result()


def _shortened(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _every_sdist_only(run: _Uv, work: Path, failure: NoCompatibleStack,
                      survey_run: Answer[Pylock | None] | None) -> EnvbuildError:
    """A wheels-only run that stopped at a package with no usable wheel (uv names one per run):
    every package only an sdist provides, each with where it comes from, from one survey
    (``survey_run``: its run, started beside the closure's)."""
    from envbuild.pylock import sourceonly
    from envbuild.pylock.uvfailure import NO_WHEELS

    if not NO_WHEELS.search(failure.message):
        return failure
    try:
        survey = None if survey_run is None else survey_run.result()
        if survey is None:  # (never the closure's own answer here: it has none)
            survey = _survey_run(run, work)
        annotated = _annotated(run, work, survey)
    except EnvbuildError:
        return failure
    found = [s for s in sourceonly.sdist_only(survey, annotated) if s.name not in run.spec.no_binary]
    if not found:
        return failure
    platform = platform_tag(run.spec.glibc)
    return NoCompatibleStack(
        f"{len(found)} requirement{'s' if len(found) != 1 else ''} of the closure "
        f"{'have' if len(found) != 1 else 'has'} no wheel for {platform}, only an sdist: "
        + "; ".join(s.shown() for s in found),
        conflicts=tuple(s.name for s in found), hint=sourceonly.names_hint(found, run.spec.no_binary))


def _survey_spec(spec: ClosureSpec) -> ClosureSpec:
    return replace(spec, all_sdists=True, no_binary=(), previous=None)  # the newest, no kept pin


def _survey_run(run: _Uv, work: Path, stop: Stop | None = None) -> Pylock:
    """uv's closure of the same project with sdists allowed (no previous pin kept). It asks
    the index (unless the lock is offline): asked of uv's cache alone, uv passes over a newer
    sdist whose metadata the cache lacks and answers with the older release, silently
    (measured: rouge-score 0.0.4, not 0.1.2); :func:`_survey_after` knows when it did not."""
    survey = work / "survey"
    run.project_in(survey)
    # Beside the closure's run, a moment after it (or at its end, if sooner): each uv run opens
    # its connections (a name look-up each) in its first instant, and two runs started together
    # had one of them wait 5 s for a resolver that dropped a reply under the burst (7 pairs in
    # 16 here; started SURVEY_DELAY s apart, 0 in 16; one after the other, 3 in 16).
    run.live.after_closure_started(0.0 if run.spec.offline else SURVEY_DELAY)
    command = run.command(OUTPUT, hashes=True, spec=_survey_spec(run.spec)) + _held_to(run.spec, survey)
    if stop is not None:  # raced against uv's cache (_survey_raced): a whole resolution beside the
        yield_cpu()       # closure's run, whose CPU it took (its run -34 ms at nice 10, re-locks)
    run.run(command, survey, stop=stop)
    return read_pylock((survey / OUTPUT).read_text(encoding="utf-8"), reference=False)


def _survey_beside(spec: ClosureSpec) -> bool:
    """Whether the survey runs beside the closure's run (else after it, :func:`_survey_after`):
    offline (both ask the cache alone), or where the lock keeps previous pins, so that the
    closure's run reads none of the newer releases the survey takes and uv's cache may not
    answer for them (then raced against the cache: :func:`_survey_raced`)."""
    return spec.offline or bool(_kept_pins(spec))


def _survey_after(run: _Uv, work: Path, locked: Answer[dict[str, str]]) -> Pylock | None:
    """The survey, after the closure's run has read the index: from uv's cache alone, which
    that run has just brought up to date, wherever :func:`answered_by_cache` shows that answer
    is the index's; else asked of the index. None where it answered the closure's own versions
    (nothing held back: the common case, read without a pylock); else the survey's pylock.
    ``locked``: the closure's versions, once its pylock is read (none where it failed)."""
    proven, found = _survey_proven(run, work, locked)
    return found if proven else _survey_run(run, work)


def _survey_raced(run: _Uv, work: Path, locked: Answer[dict[str, str]], online: Answer[Pylock | None],
                  stop: Stop) -> Pylock | None:
    """A lock keeping previous pins: the survey asks the index beside the closure's run
    (``online``), and from the closure's end uv's cache is asked too; where the cache's answer
    is proven the index's (:func:`_survey_proven`) the online run is stopped and not waited
    for, else its answer is the survey's."""
    proven, found = _survey_proven(run, work, locked)
    if not proven:
        return online.result()
    stop.stop()
    return found


def _survey_proven(run: _Uv, work: Path, locked: Answer[dict[str, str]]) -> tuple[bool, Pylock | None]:
    """(proven, answer): the survey from uv's cache, where its -v log proves the answer is the
    index's; the answer None for the closure's own versions (nothing held back), else its pylock."""
    try:
        log, text = _survey_from_cache(run, work / "survey-versions", pylock=False)
        from envbuild.pylock.sourceonly import answered_by_cache, pinned_versions  # after the closure's run

        versions = pinned_versions(text)
        closure = locked.result()
        if versions is not None and answered_by_cache(log, frozenset(versions), frozenset(closure)):
            if versions == closure:
                return True, None
            log, text = _survey_from_cache(run, work / "survey-cached", pylock=True)
            found = read_pylock(text, reference=False)
            if answered_by_cache(log, frozenset(found.versions()), frozenset(closure)):
                return True, found
    except TooSlow:
        raise
    except EnvbuildError:
        pass  # the cache could not answer at all
    return False, None


def _survey_from_cache(run: _Uv, cwd: Path, *, pylock: bool) -> tuple[str, str]:
    """(uv's -v log, its output) of the survey's run made ``--offline -v`` in ``cwd``: a
    pylock with ``pylock``, else its versions alone (requirements.txt: no hashes to read)."""
    run.project_in(cwd)
    output = OUTPUT if pylock else "versions.txt"
    command = _logged_from_cache(run, cwd, _survey_spec(run.spec), output, hashes=pylock)
    run.live.closure_ended.wait()  # prepared beside the closure's run, started at its end
    log = run.run(command, cwd)
    return log, (cwd / output).read_text(encoding="utf-8")


def _logged_from_cache(run: _Uv, cwd: Path, spec: ClosureSpec, output: str, *, hashes: bool) -> list[str]:
    """uv's command for ``spec``'s run from its cache alone (``--offline``) with its ``-v`` log,
    writing ``output`` in ``cwd``, held to the lock's cut-off and constraints."""
    command = [c for c in run.command(output, hashes=hashes, spec=replace(spec, offline=True))
               if c != "--quiet"]  # no -q with -v
    return [*command, *_held_to(run.spec, cwd), "-v"]


def _annotated(run: _Uv, work: Path, pylock: Pylock) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The survey's annotated requirements (who requires whom): a second run, held to the
    survey's versions, that asks uv's cache first."""
    from envbuild.pylock import sourceonly

    via, spec = work / "survey-via", _survey_spec(run.spec)
    run.project_in(via)
    (via / "held.txt").write_text("".join(f"{n}=={v}\n" for n, v in pylock.versions().items()),
                                  encoding="utf-8")
    command = [*run.command("via.txt", hashes=False, spec=replace(spec, offline=True), annotate=True),
               "--constraints", "held.txt"]
    _cache_first(run, via, spec, command)
    return sourceonly.parse_annotated((via / "via.txt").read_text(encoding="utf-8"), PROJECT_NAME)


def _cache_first(run: _Uv, cwd: Path, spec: ClosureSpec, command: list[str]) -> None:
    """``command`` (made ``--offline``) from uv's cache; where it cannot answer and the lock is
    not offline, again with the network."""
    try:
        run.run(command, cwd)
    except TooSlow:
        raise
    except EnvbuildError:
        if spec.offline:
            raise
        run.run([c for c in command if c != "--offline"], cwd)


def _index_pages(spec: ClosureSpec, default_index: str,
                 env: Mapping[str, str]) -> AbstractContextManager[IndexPages | None]:
    """The pages the hash check reads; none offline (the check was made when the cache was filled)."""
    if spec.offline:
        return nullcontext(None)
    return IndexPages(_index_of(spec, default_index), env=env, timeout=spec.timeout)


def _known_names(spec: ClosureSpec) -> list[str]:
    """The names of the closure known before uv runs: the pins and the project's requirements
    (those from an index: a direct URL is on none)."""
    names: list[str] = [canonicalize_name(n) for n in sorted(spec.torch_pins)]
    for text in (*spec.torch_constraints, *spec.dependencies):
        requirement = Requirement(text)  # checked by project_text already
        if not requirement.url:
            names.append(canonicalize_name(requirement.name))
    if spec.installer is not None:
        names.append("uv")
    return names


def _prefetching(pages: IndexPages | None) -> Callable[[str], None] | None:
    """A watcher of the closure's run's resolver log: each release uv selects has its page's
    record read, or its page asked for, while uv still resolves (the hash check after the run
    then waits for none of them)."""
    if pages is None:
        return None

    def watch(line: str) -> None:
        from envbuild.pylock.sourceonly import selected_name

        name = selected_name(line)
        if name is not None:
            pages.prefetch([name])

    return watch


USER_CONSTRAINTS = "project-constraints.txt"
RESOLVER_LOG = "uv_resolver=debug"  # uv's resolver's -v lines: what it searched and selected
SURVEY_DELAY = 0.3  # seconds between the closure's uv run and the survey's (see _survey_run)


def _closure_run(run: _Uv, work: Path, started: Callable[[], None] | None = None,
                 command: list[str] | None = None, log: str | None = None,
                 watch: Callable[[str], None] | None = None) -> tuple[str, str]:
    """uv's locking run of the whole closure, with hashes (wheels only, unless ``command`` is
    another one: :func:`_open_closure`'s): (the pylock's text, uv's log, as ``log`` asks, each
    line handed to ``watch`` as uv writes it)."""
    spec = run.spec
    if spec.previous is not None:
        (work / OUTPUT).write_text(spec.previous, encoding="utf-8")
    command = (command or run.command(OUTPUT, hashes=True)) + _held_to(spec, work)
    if spec.upgrade:
        command.append("--upgrade")
    for name in sorted(set(spec.upgrade_packages)):
        command += ["--upgrade-package", name]
    def running() -> None:
        run.live.closure_started.set()
        # What follows the closure's run, imported while uv runs (the main thread only waits):
        # packaging's reference reader and the survey's judge, ~13 ms otherwise after it.
        read_soon("packaging.pylock", "envbuild.pylock.sourceonly")
        if started is not None:
            started()

    try:
        logged = run.run(command, work, running, log=log, watch=watch)
    finally:
        run.live.closure_ended.set()
    return (work / OUTPUT).read_text(encoding="utf-8"), logged


def _opens(spec: ClosureSpec) -> bool:
    """Whether the closure's run allows sdists, being the survey's run too (:func:`_open_closure`):
    a fresh lock (no previous pylock), online, of requirements from an index (no URL, no build-sdists)."""
    return (not spec.all_sdists and not spec.offline and spec.previous is None and not spec.no_binary
            and not any(Requirement(t).url for t in (*spec.torch_constraints, *spec.dependencies)))


def _open_closure(run: _Uv, work: Path, started: Callable[[], None], survey: Answer[Pylock | None],
                  pages: IndexPages | None) -> tuple[str, Pylock]:
    """A fresh lock's closure (text, read) from one run allowing sdists, the survey's own run
    (:func:`_survey_run`'s command, logging its resolver's decisions). Where its log shows
    that every release it selected is a wheel (sourceonly.wheels_alone), the wheels-only run
    would have answered alike: its answer less its sdists is the closure, and nothing is held
    back (``survey``: None). Else ``survey`` is its answer and the wheels-only closure is asked
    of uv's cache, which this run has just brought up to date, and of the index where the
    cache's answer is not proven (:func:`_wheels_only`). A failing run allowing sdists is the
    survey's failure (a note, never a failed lock); the wheels-only run then asks the index.
    ``pages``: the hash check's, each selected release's page read as uv selects it."""
    command = run.command(OUTPUT, hashes=True, spec=_survey_spec(run.spec))
    try:  # the resolver's debug lines alone (-v: 5 times as many, every page's every file)
        text, log = _closure_run(run, work, started, command, log=RESOLVER_LOG, watch=_prefetching(pages))
    except TooSlow:
        raise
    except EnvbuildError as exc:
        survey.set_exception(exc)
        (work / OUTPUT).unlink(missing_ok=True)
        text = _closure_run(run, work)[0]
        return text, read_pylock(text)
    from envbuild.pylock import sourceonly  # read while uv ran (_closure_run)

    wheels = sourceonly.without_sdists(text)  # the same packages: the answer's names read once
    try:
        pylock: Pylock | None = read_pylock(wheels)
    except EnvbuildError:
        pylock = None  # a package left without a file: an sdist alone
    if pylock is not None and all(p.wheels and p.sdist is None for p in pylock.packages) \
            and sourceonly.wheels_alone(log, frozenset(pylock.versions())):
        survey.set_result(None)
        return wheels, pylock
    survey.set_result(read_pylock(text, reference=False))
    (work / OUTPUT).unlink()  # the next run must not take its versions for preferences
    text = _wheels_only(run, work, sourceonly.searched(log))
    return text, read_pylock(text)


def _wheels_only(run: _Uv, work: Path, read: frozenset[str]) -> str:
    """The wheels-only closure's pylock after a run allowing sdists met an sdist: from uv's cache,
    where its ``-v`` log proves that answer the index's (sourceonly.answered_by_cache; ``read``:
    the names whose pages that run has just read); else from the index."""
    from envbuild.pylock.sourceonly import answered_by_cache

    try:
        log = run.run(_logged_from_cache(run, work, run.spec, OUTPUT, hashes=True), work)
        text = (work / OUTPUT).read_text(encoding="utf-8")
        if answered_by_cache(log, frozenset(read_pylock(text, reference=False).versions()), read):
            return text
    except TooSlow:
        raise
    except EnvbuildError:
        pass  # the cache could not answer
    (work / OUTPUT).unlink(missing_ok=True)
    return _closure_run(run, work)[0]


def _held_to(spec: ClosureSpec, cwd: Path) -> list[str]:
    """uv's options for what the project holds every package to besides its requirements: the
    cut-off and the lines of its -c constraints files (written to ``cwd``). The closure's run
    and the survey's both take them: a release they exclude is no release held back."""
    options = _cutoff_options(spec)
    if spec.constraints:
        lines = _checked(spec.constraints, "constraint")
        (cwd / USER_CONSTRAINTS).write_text("".join(f"{c}\n" for c in lines), encoding="utf-8")
        options += ["--constraints", USER_CONSTRAINTS]
    return options


def _cutoff_options(spec: ClosureSpec) -> list[str]:
    """uv's options for the cut-off: ``--exclude-newer`` and, for the pins taken from the
    variant's index (which may give no upload times: uv would drop those files), the pins let
    past the filter; :func:`_check_pins_cutoff` holds them to it where their index gave a time."""
    if spec.exclude_newer is None:
        return []
    options = ["--exclude-newer", spec.exclude_newer]
    if spec.torch_index is not None:
        for name in sorted(spec.torch_pins):
            options += ["--exclude-newer-package", f"{canonicalize_name(name)}=false"]
    return options


def _check_pins_cutoff(spec: ClosureSpec, pylock: Pylock) -> None:
    """The stack's pins whose index gave an upload time after the cut-off: NoCompatibleStack
    (3). A pin without an upload time passes: the stack's exact version holds it."""
    if spec.exclude_newer is None or spec.torch_index is None:
        return
    from envbuild.pylock.cutoff import late_files, parse_timestamp

    pins = {canonicalize_name(n) for n in spec.torch_pins}
    uploads = {k: v for k, v in pylock.uploads().items() if k.split(" ", 1)[0] in pins}
    late = late_files(uploads, parse_timestamp(spec.exclude_newer, "exclude-newer"))
    if late:
        raise NoCompatibleStack(
            f"the stack's pins were uploaded after the cut-off exclude-newer {spec.exclude_newer}: "
            + "; ".join(late[:3]), conflicts=tuple(late),
            hint="choose an older stack (--torch), or a later cut-off")


def _installer(run: _Uv, work: Path, pages: IndexPages | None,
               cached: Answer[InstallerWheel | None] | None = None) -> InstallerWheel:
    """uv at ``spec.installer`` from the default index: its wheel for the closure's platform,
    the sha256 checked against the index like every file of the closure. ``cached``: the same
    wheel from uv's cache alone (:func:`_cached_installer`); where it could not answer, the run
    is made online."""
    spec, default_index = run.spec, run.default_index
    assert spec.installer is not None
    wheel = None if cached is None else cached.result()
    if wheel is not None:
        return wheel
    try:
        text = _installer_run(run, work / "installer")
    except TooSlow:
        raise
    except (DataError, NoCompatibleStack):
        raise DataError(f"no wheel of uv {spec.installer} (the build's installer) on "
                        f"{redact(default_index)} for {platform_tag(spec.glibc, spec.arch)}",
                        hint="make uv available on that index, or lock with --installer pip") from None
    return _installer_wheel(run, pages, text)


def _cached_installer(run: _Uv, work: Path, pages: IndexPages | None) -> InstallerWheel | None:
    """The installer's wheel from uv's cache alone, read and checked like the index's answer
    while the closure's run goes on (beside it); None where the cache cannot answer. The
    version is exact and an index's file does not change, so the cache's answer is the index's,
    and the check still holds it to the index's sha256."""
    try:
        text = _installer_run(run, work / "installer-cached", offline=True)
    except TooSlow:
        raise
    except EnvbuildError:
        return None  # asked online after the closure's run
    return _installer_wheel(run, pages, text)


def _installer_wheel(run: _Uv, pages: IndexPages | None, text: str) -> InstallerWheel:
    """The installer's one wheel in uv's small lock ``text``, its sha256 checked against the index."""
    spec = run.spec
    assert spec.installer is not None
    pylock = read_pylock(text)
    if pages is not None:  # the pages' index for "uv" is the default index: it is no pin
        pages.check(pylock)
    line = install_requirements(pylock, ["uv"], python=spec.python, glibc=spec.glibc,
                                arch=spec.arch).strip()
    match = re.fullmatch(r"uv @ (\S+) --hash=sha256:([0-9a-f]{64})", line)
    if match is None:
        raise DataError(f"the index's uv {spec.installer} is not one remote wheel with a sha256 "
                        f"({line[:120]})", hint="lock with --installer pip")
    return InstallerWheel(name="uv", version=spec.installer, url=match.group(1), sha256=match.group(2))


def _installer_run(run: _Uv, tool: Path, *, offline: bool = False) -> str:
    """The pylock text of uv's run locking ``uv==spec.installer`` alone (in ``tool``)."""
    spec = run.spec
    assert spec.installer is not None
    tool.mkdir()
    (tool / "pyproject.toml").write_text(
        f'[project]\nname = "envbuild-installer"\nversion = "0"\n'
        f'dependencies = [{_toml_string("uv==" + spec.installer)}]\n', encoding="utf-8")
    command = run.command(OUTPUT, hashes=True,
                          spec=replace(spec, find_links=(), offline=spec.offline or offline))
    run.run(command, tool)
    return (tool / OUTPUT).read_text(encoding="utf-8")


def platform_tag(glibc: str, arch: str = "x86_64") -> str:
    """uv's --python-platform (and the lock's ``platform``) for glibc "2.NN": x86_64-manylinux_2_NN,
    or aarch64-manylinux_2_NN for a linux/arm64 target."""
    if arch not in ("x86_64", "aarch64"):
        raise UsageError(f"unknown CPU architecture {arch!r}", hint="x86_64 or aarch64")
    return f"{arch}-manylinux_2_{glibc_minor(glibc)}"


def _index_of(spec: ClosureSpec, default_index: str) -> Callable[[str], str]:
    """Which index a package of the closure came from: the pinned ones from the torch index."""
    pins = {canonicalize_name(n) for n in spec.torch_pins}
    torch_index = spec.torch_index

    def index_of(name: str) -> str:
        return torch_index if torch_index is not None and name in pins else default_index

    return index_of


def _torch_layer(run: _Uv, versions: dict[str, str], work: Path,
                 early: Answer[dict[str, str] | None] | None = None) -> frozenset[str]:
    """The pinned packages and their own closure, every version held to ``versions``.

    ``early``: the pins' closure uv answered from its cache beside the closure's run, held to
    nothing (:func:`_early_layer`). Where each of its packages is at the closure's version, it
    is this layer: the pins' closure at fixed versions is one set (every package the
    dependencies of those versions name, markers evaluated for the platform), which any
    resolution holding those versions finds. Else the closure's run has just brought uv's cache
    up to date for every one of these packages, so uv answers from its cache (``--offline``: no
    second round of the index's pages); only where the cache cannot answer (UV_NO_CACHE, a cache
    pruned meanwhile) it asks the index."""
    if not run.spec.torch_pins:
        return frozenset()
    try:
        guessed = None if early is None else early.result()
    except TooSlow:
        raise
    except EnvbuildError:
        guessed = None
    if guessed and all(versions.get(name) == version for name, version in guessed.items()):
        return frozenset(guessed)
    if not run.spec.offline:
        try:
            return frozenset(_layer_run(run, work / "cached", versions, offline=True))
        except TooSlow:
            raise
        except EnvbuildError:
            pass
    return frozenset(_layer_run(run, work / "layer", versions))


def _early_layer(run: _Uv, work: Path) -> dict[str, str] | None:
    """The pins' closure from uv's cache alone, held to nothing ({name: version}), run beside
    the closure's run: judged by :func:`_torch_layer` against the closure's versions."""
    early = work / "layer-early"
    run.project_in(early, pins_only=True)
    run.run(run.command("layer.txt", hashes=False, spec=replace(run.spec, offline=True)), early)
    from envbuild.pylock.sourceonly import pinned_versions  # read after: the closure's run has begun
    return pinned_versions((early / "layer.txt").read_text(encoding="utf-8"))


def _layer_run(run: _Uv, layer: Path, held: dict[str, str], *, offline: bool = False) -> set[str]:
    """The names of the pins' closure, resolved by uv (no hashes) with ``held`` as constraints."""
    run.project_in(layer, pins_only=True)
    (layer / "constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in held.items()), encoding="utf-8")
    held_spec = replace(run.spec, offline=run.spec.offline or offline)
    command = [*run.command("layer.txt", hashes=False, spec=held_spec), "--constraints", "constraints.txt"]
    run.run(command, layer)
    names: set[str] = set()
    for line in (layer / "layer.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonicalize_name(Requirement(line).name))
    return names
