"""``python -m envbuild``: the CLI, with a fast path for plain ``resolve`` commands.

Issue 2 holds ``envbuild resolve`` to twice a bare interpreter's start-up. Building the
argparse CLI (and importing what it imports) costs more than that on its own, so a
``resolve`` command made only of the options below, each written out in full, is
recognised here and resolved through ``envbuild.candidates`` directly. Anything else
(other commands, --help, abbreviations, ``--opt=value``, --host, --debug, values that
start with '-') goes to ``envbuild.cli``, as does every command that does not end in a
resolved stack: errors and "no compatible stack" are reported by the CLI itself, which
then redoes the work. So the fast path prints only what the CLI would print.
"""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# Option → (destination, kind): "one" stores a value, "add" appends one, "flag" stores True.
_OPTIONS = {
    "--driver": ("driver", "one"), "--gpu": ("gpu", "add"), "--arch": ("arch", "add"),
    "--datacenter": ("datacenter", "flag"), "--torch": ("torch", "one"),
    "--python": ("python", "one"), "--cuda": ("cuda", "one"), "--cudnn": ("cudnn", "one"),
    "--ubuntu": ("ubuntu", "one"), "--variant": ("variant", "one"), "--flavor": ("flavor", "one"),
    "--index-url": ("index_url", "one"), "--top": ("top", "one"), "--json": ("json", "flag"),
    "--explain": ("explain", "flag"),
}


class _Args:
    """The parts of ``cli``'s argparse namespace that ``resolve`` reads, with its defaults."""

    def __init__(self) -> None:
        self.matrices: str | None = None
        self.driver: str | None = None
        self.host = False
        self.gpu: list[str] = []
        self.arch: list[str] = []
        self.datacenter = False
        self.torch: str | None = None
        self.python: str | None = None
        self.cuda: str | None = None
        self.cudnn: str | None = None
        self.ubuntu: str | None = None
        self.variant: str | None = None
        self.flavor = "runtime"
        self.index_url: str | None = None
        self.top: str | int = 10
        self.json = False
        self.explain = False


def plain_resolve_args(argv: Sequence[str]) -> _Args | None:
    """The namespace argparse would build for ``argv``, or None when unsure."""
    args = _Args()
    rest = list(argv)
    if rest[:1] == ["--matrices"] and len(rest) > 1 and _plain(rest[1]):
        args.matrices, rest = rest[1], rest[2:]
    if rest[:1] != ["resolve"]:
        return None
    i = 1
    while i < len(rest):
        if rest[i] not in _OPTIONS:
            return None
        dest, kind = _OPTIONS[rest[i]]
        if kind == "flag":
            setattr(args, dest, True)
            i += 1
            continue
        if i + 1 >= len(rest) or not _plain(rest[i + 1]):
            return None
        value = rest[i + 1]
        if kind == "add":
            getattr(args, dest).append(value)
        else:
            setattr(args, dest, value)
        i += 2
    if args.flavor not in ("runtime", "devel"):
        return None
    top = str(args.top)
    if not (top.isascii() and top.isdigit() and int(top) >= 1):
        return None
    args.top = int(top)
    return args


def _plain(value: str) -> bool:
    """A value argparse takes as it is, whatever its options are."""
    return bool(value) and not value.startswith("-")


def fast_resolve(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """Run a plain ``resolve`` command; None when ``envbuild.cli`` must run it instead."""
    args = plain_resolve_args(argv)
    if args is None:
        return None
    try:
        from envbuild.data.matrix import cache_directory_name, default_directory_name
        from envbuild.resolver import candidates, report
        from envbuild.resolver.selection import Selectors, build_query

        directory = args.matrices or default_directory_name(env)
        index = candidates.load_index(directory, cache_directory_name(env))
        query = build_query(Selectors.of(args), index, env)
        outcome = candidates.solve(query, index)
        if not outcome.stacks:
            return None  # the CLI explains the failure and re-solves the ways out
        assert isinstance(args.top, int)
        if args.json:
            text = report.json_text(report.resolution_json(query, outcome, top=args.top))
        else:
            text = report.resolution_text(query, outcome, top=args.top, explain=args.explain)
    except KeyboardInterrupt:
        print("envbuild: interrupted", file=sys.stderr)
        return 130
    except Exception:  # any error: the CLI reports it, exactly as it always has
        return None
    try:
        print(text)
        sys.stdout.flush()
    except OSError as exc:  # as cli.main reports a failure to write
        from envbuild.errors import output_failed

        return output_failed(exc)
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The CLI as a function: tests and embedders call this; it never exits the process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    code = fast_resolve(argv, env)
    if code is not None:
        return code
    from envbuild.commands.cli import main as cli_main

    return cli_main(argv, env)


def run() -> None:
    """The ``envbuild`` console script and ``python -m envbuild``: run, then exit.

    A resolved plain ``resolve`` leaves only its printed text behind, so the process ends
    with ``os._exit`` once stdout and stderr are flushed: an orderly interpreter shutdown
    would spend about a third of the command's time freeing the index object by object
    (measured by bench/bench_resolve.py). Every other command exits normally, so that
    Docker clients, temporary files and ``atexit`` handlers are closed as usual.
    """
    argv, env = sys.argv[1:], os.environ
    # The fast path allocates the index and the stacks and frees nothing before it exits,
    # so the cyclic collector's passes over them (about a tenth of the command's time)
    # are pure cost there; every other command runs with the collector on.
    gc.disable()
    code = fast_resolve(argv, env)
    if code is None:
        gc.enable()
        from envbuild.commands.cli import main as cli_main

        sys.exit(cli_main(argv, env))
    try:  # noqa: SIM105 - contextlib.suppress would be one more import at start-up
        sys.stderr.flush()
    except OSError:
        pass  # nowhere left to say anything; the exit code still tells
    os._exit(code)


if __name__ == "__main__":
    run()
