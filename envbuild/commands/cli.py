"""Command line: parse arguments, call the library, map errors to exit codes.

Only this module prints and exits. Each command imports what it needs when it runs,
so ``envbuild resolve`` never pays for the Docker SDK or requests.
"""

from __future__ import annotations

import argparse
import errno
import gc
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from envbuild import __version__
from envbuild.commands.options import VERBOSITY, Parser, add_selectors, load_matrix, positive_int
from envbuild.errors import (
    EXIT_INTERRUPTED,
    EXIT_OUTPUT,
    WRITE_ERRNOS,
    BuildFailed,
    EnvbuildError,
    NoCompatibleStack,
    Terminated,
    UsageError,
    output_failed,
)

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any

EXIT_CODES_HELP = """exit codes:
  0 success              1 output unwritable or bug          2 invalid input (nothing written)
  3 no compatible stack  4 data error                        5 Docker or scheduler unreachable
  6 image build failed   7 smoke test failed                 8 GPU runtime/driver missing
  9 host preflight failed  10 reboot required  11 lock is stale (lock --check)
  130 interrupted (Ctrl-C)   129/143 hung up/terminated (SIGHUP/SIGTERM)     141 output pipe closed"""


# Commands whose modules import jinja2, the Docker SDK or requests: registered by
# ``<module>.add_commands(commands)`` only when one of the module's commands runs (or
# for --help), so ``envbuild resolve`` never pays for them.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    # in the order, and with the help, that the modules register them (`envbuild --help` lists
    # these without importing any; tests/test_fast_path.py holds the two equal)
    "lock": ("envbuild.commands.lock", "pin every target's whole environment: envbuild.lock + pylock files"),
    "render": ("envbuild.commands.render",
               "write a Dockerfile, host script or cloud-init user-data (with its lock and smoke test)"),
    "build": ("envbuild.commands.build", "render a stack and build its image (a lock: every target's)"),
    "verify": ("envbuild.commands.build", "run an image's smoke test in a container"),
    "promote": ("envbuild.commands.build", "tag a verified image digest in its registry"),
    "clean": ("envbuild.commands.build", "remove containers envbuild left behind"),
    "ci": ("envbuild.commands.ci", "CI for the top stacks: GitHub Actions or docker-bake.json"),
    "init": ("envbuild.commands.init", "write a commented envbuild.toml project file"),
    "fleet": ("envbuild.commands.fleet", "verify every node of every node type (Slurm, Kubernetes)"),
    "diagnose": ("envbuild.commands.diagnose", "run (or watch) a training job and say why its GPU idles"),
    "sbom": ("envbuild.commands.sbom", "write a CycloneDX bill of materials per target of a lock"),
    "config": ("envbuild.commands.config", "show every effective setting and its origin"),
    "completion": ("envbuild.commands.completion", "print a shell completion script (bash, zsh, fish)"),
}


# The commands cli.py registers itself; with LAZY_COMMANDS, every command there is.
OWN_COMMANDS = ("resolve", "detect", "smoke", "matrix")


def build_parser(*, with_render: bool = True, lazy: str | None = None,
                 refresh: bool = False, only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI. Lazily registered commands are listed by name and help only,
    except those of the module named by ``lazy`` (all of them when ``with_render``);
    likewise ``matrix refresh``, whose module is read only when ``refresh`` (or
    ``with_render``) asks for it. ``only``: a command named on the line; the others are
    left out (argparse builds a whole parser for each name it lists, a fifth of
    ``COMMAND --help``'s time): that command parses, and prints its help, as in the whole CLI."""
    parser = Parser(prog="envbuild", epilog=EXIT_CODES_HELP,
                    description="Reproducible GPU environments, resolved from the host driver up.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"envbuild {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-q", "--quiet", action="count", default=0,
                        help="no progress lines (errors and warnings still show); anywhere on the line")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more detail, e.g. every build log line; anywhere on the line")
    parser.add_argument("--matrices", metavar="DIR",
                        help="compatibility data to use (default: $ENVBUILD_MATRICES, then bundled)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    def add_matrix(commands: Any) -> None:
        _add_matrix(commands, refresh=refresh or with_render)

    own: dict[str, Callable[[Any], None]] = {"resolve": _add_resolve, "detect": _add_detect,
                                             "smoke": _add_smoke, "matrix": add_matrix}
    for name in OWN_COMMANDS:
        if only in (None, name):
            own[name](commands)
    import importlib

    added: set[str] = set()
    for name, (module, text) in LAZY_COMMANDS.items():
        if with_render or module == lazy:
            if module not in added:
                added.add(module)
                importlib.import_module(module).add_commands(commands)
        elif only in (None, name):
            commands.add_parser(name, help=text)
    return parser


def _add_detect(commands: Any) -> None:
    from envbuild.commands import detect  # read for its parser only: other commands do without

    detect.add_commands(commands)


def _add_resolve(commands: Any) -> None:
    p = commands.add_parser("resolve", help="rank compatible stacks for a driver and GPU",
                            description="Rank fully pinned Ubuntu/CUDA/cuDNN/PyTorch/Python "
                                        "stacks for a host driver and GPU.",
                            epilog=EXIT_CODES_HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selectors(p)
    out = p.add_argument_group("output")
    out.add_argument("--top", type=positive_int, default=10, metavar="N", help="show N stacks")
    out.add_argument("--json", action="store_true", help="machine-readable output (stable)")
    out.add_argument("--explain", action="store_true", help="say why each family was rejected")
    p.set_defaults(run=cmd_resolve)


def _add_smoke(commands: Any) -> None:
    p = commands.add_parser("smoke", help="run the GPU smoke test here", add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(run=cmd_smoke)


def _add_matrix(commands: Any, *, refresh: bool) -> None:
    p = commands.add_parser("matrix", help="validate, show or refresh the compatibility data")
    sub = p.add_subparsers(dest="matrix_command", metavar="ACTION", required=True,
                           parser_class=Parser)
    v = sub.add_parser("validate", help="check every file, row and cross-reference")
    v.add_argument("--write-manifest", action="store_true",
                   help="record each file's sha256 after a successful validation")
    v.add_argument("--json", action="store_true",
                   help="print the result as JSON (envbuild.matrix-validate/1)")
    v.set_defaults(run=cmd_matrix_validate)
    s = sub.add_parser("show", help="print one relation")
    s.add_argument("relation", help="a relation name, e.g. gpus, torch_variants, cuda_toolkits")
    s.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    s.set_defaults(run=cmd_matrix_show)
    r = sub.add_parser("refresh", help="update the data from upstream (all or nothing; exit 4 on "
                                       "any failure)")
    if refresh:  # the refresh modules (dataclasses, hashlib, shutil …) only for its own command
        from envbuild.commands.refresh import add_refresh_arguments
        add_refresh_arguments(r)


# --- commands ---------------------------------------------------------------------------


def cmd_resolve(args: argparse.Namespace, env: Mapping[str, str], out: Callable[[str], None]) -> int:
    from envbuild.resolver.answer import answer
    from envbuild.resolver.selection import Selectors

    text, failure = answer(Selectors.of(args), matrices=args.matrices, env=env, top=args.top,
                           as_json=args.json, explain=args.explain)
    if text is not None:
        out(text)
    if failure is not None:
        raise failure
    return 0


def cmd_smoke(args: argparse.Namespace, env: Mapping[str, str], out: Callable[[str], None]) -> int:
    return run_smoke(list(args.args), env)


def run_smoke(argv: list[str], env: Mapping[str, str]) -> int:
    """Run the standalone smoke test, handing it the peaks table from matrices/."""
    from envbuild.smoke import __main__ as smoke

    if any(a == "--peaks" or a.startswith("--peaks=") for a in argv) or \
            any(a in ("-h", "--help") for a in argv):
        return smoke.main(argv)
    import tempfile
    from pathlib import Path

    from envbuild.data.peaks import peaks_json
    from envbuild.errors import DataError
    try:
        data = peaks_json(load_matrix(argparse.Namespace(matrices=None), env))
    except (DataError, UsageError) as exc:  # the smoke test must still run without data
        print(f"envbuild: warning: no peaks table ({exc.message})", file=sys.stderr)
        return smoke.main(argv)
    with tempfile.TemporaryDirectory(prefix="envbuild-smoke-") as tmp:
        path = Path(tmp) / "smoke_peaks.json"
        path.write_bytes(data)
        return smoke.main([*argv, "--peaks", str(path)])


def cmd_matrix_validate(args: argparse.Namespace, env: Mapping[str, str],
                        out: Callable[[str], None]) -> int:
    import json
    from pathlib import Path

    from envbuild.data import matrix

    directory = Path(args.matrices) if args.matrices else matrix.default_directory(env)
    manifest = None
    if not args.write_manifest:
        data = matrix.load(directory, cache_dir=None)
    else:
        # One writer at a time (the lock refresh's commit takes): the manifest records exactly
        # the files validated here, never a mix of them and a refresh's.
        with matrix.lock(directory):
            matrix.load.cache_clear()
            data = matrix.load(directory, cache_dir=None)
            manifest = matrix.write_manifest(directory)
    rows = sum(len(r) for r in data.relations.values())
    if args.json:
        out(json.dumps({"schema": "envbuild.matrix-validate/1", "directory": str(directory),
                        "valid": True,
                        "relations": {name: len(r) for name, r in sorted(data.relations.items())},
                        "rows": rows, "manifest": str(manifest) if manifest else None}, indent=2))
        return 0
    out(f"{directory}: {len(data.relations)} relations, {rows} rows, all valid")
    if manifest is not None:
        out(f"wrote {manifest}")
    return 0


def cmd_matrix_show(args: argparse.Namespace, env: Mapping[str, str],
                    out: Callable[[str], None]) -> int:
    import json

    from envbuild.data.matrix import RELATIONS
    from envbuild.resolver import report

    if args.relation not in RELATIONS:
        import difflib

        close = difflib.get_close_matches(args.relation, RELATIONS, n=1)
        raise UsageError(f"unknown relation {args.relation!r}",
                         hint=f"Perhaps you meant {close[0]}?" if close else
                         f"one of: {', '.join(RELATIONS)}")
    rows = load_matrix(args, env).rows(args.relation)
    out(json.dumps(list(rows), indent=2) if args.json else report.table_of_rows(rows))
    return 0


# --- entry point ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one command; the exit code. SIGTERM and SIGHUP clean up as Ctrl-C does."""
    previous = _trap_termination()
    try:
        return _main(argv, env)
    except KeyboardInterrupt as exc:  # the smoke command, which has no handler of its own
        return _interrupted(exc)
    finally:
        _restore_handlers(previous)


TERMINATING_SIGNALS = ("SIGTERM", "SIGHUP")


def _trap_termination() -> dict[int, Any]:
    """Make SIGTERM and SIGHUP raise ``Terminated`` (a KeyboardInterrupt), so the cleanup
    that Ctrl-C runs (temporary trees, staging, build containers) runs for them as well;
    a second one during that cleanup is ignored. Only from the main thread, and only where
    nobody (an embedding program) installed a handler of its own."""
    import signal  # not threading: signal.signal itself refuses any other thread (ValueError)

    def terminate(signum: int, frame: Any) -> None:
        for name in TERMINATING_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        raise Terminated(signum, signal.Signals(signum).name)

    previous: dict[int, Any] = {}
    for name in TERMINATING_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) in (signal.SIG_DFL, None):
            try:
                previous[number] = signal.signal(number, terminate)
            except ValueError:  # not the main thread: handlers are the main thread's alone
                break
    return previous


def _restore_handlers(previous: dict[int, Any]) -> None:
    import signal

    for number, handler in previous.items():
        signal.signal(number, handler)


def _interrupted(exc: KeyboardInterrupt) -> int:
    if isinstance(exc, Terminated):
        _say(f"envbuild: terminated by {exc.name}")
        return exc.exit_code
    _say("envbuild: interrupted")
    return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None, env: Mapping[str, str] | None) -> int:
    argv, level = verbosity(list(sys.argv[1:] if argv is None else argv))
    token = VERBOSITY.set(level)
    try:
        return _run(argv, os.environ if env is None else env, level)
    finally:
        VERBOSITY.reset(token)


FLAGS_QUIET = ("-q", "--quiet")
FLAGS_VERBOSE = ("-v", "--verbose")


def verbosity(argv: list[str]) -> tuple[list[str], int]:
    """``argv`` without -q/-v (given anywhere before ``--``, and before the smoke test's own
    arguments), and the level they ask for: -1 quiet, 0, 1 verbose."""
    kept: list[str] = []
    level = 0
    for i, arg in enumerate(argv):
        if arg == "--" or (arg == "smoke" and not any(not a.startswith("-") for a in kept)):
            return kept + argv[i:], level
        if arg in FLAGS_QUIET or arg in FLAGS_VERBOSE:
            level = -1 if arg in FLAGS_QUIET else max(level, 1)
        else:
            kept.append(arg)
    return kept, level


def _run(argv: list[str], env: Mapping[str, str], level: int) -> int:
    debug = "--debug" in argv
    if argv[:1] == ["smoke"]:
        gc.enable()
        # The smoke test owns its arguments (it also runs standalone inside images).
        return run_smoke(argv[1:], env)
    try:
        words = _command_words(argv)
        command = words[0] if words else None
        if command != "lock":  # lock turns the collector on once uv's closure run has started
            gc.enable()  # (off since the start: envbuild/__main__.py)
        lazy = LAZY_COMMANDS.get(command or "", (None,))[0]
        # `envbuild --help` (no command) lists every command by name and help alone: none of
        # the lazily registered modules is imported for it.
        known = command in OWN_COMMANDS or command in LAZY_COMMANDS
        parser = build_parser(with_render=False, lazy=lazy, refresh=words[:2] == ["matrix", "refresh"],
                              only=command if known else None)
        args = parser.parse_args(argv)
        if level > 0 and hasattr(args, "verbose"):
            args.verbose = True  # a command's own --verbose (build) is the global one
        if not getattr(args, "run", None):
            parser.print_help()
            return 2
        code: int = args.run(args, env, _print)
        try:
            sys.stdout.flush()  # a write error surfaces here, not at the interpreter's exit
        except OSError as exc:
            raise _OutputFailed(exc) from exc
        return code
    except _OutputFailed as failed:
        return output_failed(failed.error)
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except EnvbuildError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        _say(exc.one_line())
        _print_story(exc)
        return exc.exit_code
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            return _internal(exc, debug)
        if debug:
            import traceback

            traceback.print_exc()
        # A full disk, a quota, a read-only or unwritable directory while writing a file:
        # the writers are atomic (envbuild/fs.py), so nothing was half-written.
        from envbuild.redact import redact

        where = f" {exc.filename}" if exc.filename else ""
        verb = "access" if exc.errno in (errno.EACCES, errno.EPERM, errno.EIO) else "write"
        _say(redact(f"envbuild: error[output]: cannot {verb}{where}: "
                     f"{exc.strerror or type(exc).__name__} — free space or choose a writable "
                     "directory; nothing was half-written"))
        return EXIT_OUTPUT
    except Exception as exc:  # a bug: one line unless --debug, never a silent failure
        return _internal(exc, debug)


def _internal(exc: BaseException, debug: bool) -> int:
    """A bug: one line unless --debug (then the traceback), never a silent failure."""
    if debug:
        raise exc
    from envbuild.redact import redact

    _say(redact(f"envbuild: error[internal]: {type(exc).__name__}: {exc} — rerun with "
                 "--debug and report it"))
    return 1


def _command_words(argv: Sequence[str]) -> list[str]:
    """The command (and its action) argparse will find in ``argv``: the words that are
    neither options nor the value of ``--matrices``, the one global option taking one."""
    words: list[str] = []
    value_next = False
    for arg in argv:
        if value_next:
            value_next = False
        elif arg == "--matrices":
            value_next = True
        elif not arg.startswith("-"):
            words.append(arg)
    return words


class _OutputFailed(Exception):
    """Standard output could not be written; raised past the command's own handlers."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _print(*values: object, **options: Any) -> None:
    """``print`` for a command's results: a failed write of standard output ends the
    command as an output failure, whatever the command was doing."""
    try:
        print(*values, **options)
    except OSError as exc:
        if options.get("file") not in (None, sys.stdout):
            raise
        raise _OutputFailed(exc) from exc


def _say(line: str) -> None:
    """One line of the command's report on stderr. A reader that is gone (``2>&1 | head``)
    changes nothing: the rest of the report goes nowhere, and the exit code is still the
    command's own (3 for no compatible stack, not whatever the write's failure would make
    of it), whenever the reader left."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _silence(sys.stderr)


def _silence(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null: its later writes and the interpreter's last
    flush have nowhere left to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # no descriptor (a test's capture): nothing will flush it


def _print_story(exc: EnvbuildError) -> None:
    """After the one line: the conflicts and verified ways out, pip-style."""
    from envbuild.redact import redact

    if isinstance(exc, NoCompatibleStack):
        if exc.conflicts:
            _say("The conflict is caused by:")
            for line in exc.conflicts:
                _say(redact(f"  - {line}"))
        if exc.fixes:
            _say("To fix this you could (each re-solved and shown to work):")
            for line in exc.fixes:
                _say(redact(f"  - {line}"))
    elif exc.details and (len(exc.details) > 1 or isinstance(exc, BuildFailed)):
        # a build's log tail is shown even when it is one line (its hint says it follows)
        for line in exc.details:
            _say(redact(f"  - {line}"))
