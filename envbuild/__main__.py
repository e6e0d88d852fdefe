"""``python -m envbuild``: the CLI, with a fast path for plain ``resolve`` commands.

``envbuild resolve`` is held to twice a bare interpreter's start-up. Building the argparse
CLI (and importing what it imports) costs more than that on its own, so a ``resolve``
command made only of the options below (``--opt value`` or ``--opt=value``, each written
out in full) is read here by hand into the same ``Selectors`` and output options the CLI
reads from its namespace, and answered by the same ``resolver.answer.answer``. Anything
else (other commands, --help, abbreviations, --host, --debug, values that start with '-')
goes to ``envbuild.commands.cli``, as does every command that does not end in a resolved
stack: errors and "no compatible stack" are reported by the CLI itself, which then redoes
the work. So the fast path prints only what the CLI would print.
"""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NoReturn

    from envbuild.resolver.selection import Selectors

# Option → (destination, kind): "one" stores a value, "add" appends one, "flag" stores True.
# Destinations are the CLI's: the Selectors' fields, then the output options.
_OPTIONS = {
    "--driver": ("driver", "one"), "--gpu": ("gpu", "add"), "--arch": ("arch", "add"),
    "--datacenter": ("datacenter", "flag"), "--torch": ("torch", "one"),
    "--python": ("python", "one"), "--cuda": ("cuda", "one"), "--cudnn": ("cudnn", "one"),
    "--ubuntu": ("ubuntu", "one"), "--variant": ("variant", "one"), "--flavor": ("flavor", "one"),
    "--index-url": ("index_url", "one"), "--top": ("top", "one"), "--json": ("json", "flag"),
    "--explain": ("explain", "flag"), "--platform": ("platform", "one"),
}


class Output:
    """How to answer: the CLI's ``--matrices`` and resolve's output options, with its defaults."""

    __slots__ = ("explain", "json", "matrices", "top")

    def __init__(self, *, matrices: str | None = None, top: int = 10, json: bool = False,
                 explain: bool = False) -> None:
        self.matrices, self.top, self.json, self.explain = matrices, top, json, explain


def plain_resolve_args(argv: Sequence[str]) -> tuple[Selectors, Output] | None:
    """What argparse would read from ``argv``, or None when unsure."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    added: dict[str, list[str]] = {"gpu": [], "arch": []}
    rest = list(argv)
    matrices = None
    if rest and rest[0].startswith("--matrices=") and _plain(rest[0][len("--matrices="):]):
        matrices, rest = rest[0][len("--matrices="):], rest[1:]
    elif rest[:1] == ["--matrices"] and len(rest) > 1 and _plain(rest[1]):
        matrices, rest = rest[1], rest[2:]
    if rest[:1] != ["resolve"]:
        return None
    i = 1
    while i < len(rest):
        option, equals, value = rest[i].partition("=")  # --opt=value, as argparse splits it
        if option not in _OPTIONS:
            return None
        dest, kind = _OPTIONS[option]
        if kind == "flag":
            if equals:
                return None  # argparse refuses a value for a flag
            flags.add(dest)
            i += 1
            continue
        if not equals:
            if i + 1 >= len(rest):
                return None
            value = rest[i + 1]
            i += 1
        if not _plain(value):
            return None
        if kind == "add":
            added[dest].append(value)
        else:
            values[dest] = value
        i += 1
    top, flavor = values.get("top", "10"), values.get("flavor", "runtime")
    # at most 6 digits: int() refuses a 5000-digit string (ValueError), which the CLI reports
    if flavor not in ("runtime", "devel") or not (top.isascii() and top.isdigit() and len(top) <= 6
                                                  and int(top) >= 1):
        return None
    from envbuild.resolver.selection import Selectors

    selectors = Selectors(
        driver=values.get("driver"), gpu=added["gpu"], arch=added["arch"],
        datacenter="datacenter" in flags, torch=values.get("torch"), python=values.get("python"),
        cuda=values.get("cuda"), cudnn=values.get("cudnn"), ubuntu=values.get("ubuntu"),
        variant=values.get("variant"), flavor="devel" if flavor == "devel" else "runtime",
        index_url=values.get("index_url"), platform=values.get("platform"))
    return selectors, Output(matrices=matrices, top=int(top), json="json" in flags,
                             explain="explain" in flags)


def _plain(value: str) -> bool:
    """A value argparse takes as it is, whatever its options are."""
    return bool(value) and not value.startswith("-")


def fast_resolve(argv: Sequence[str], env: Mapping[str, str]) -> int | None:
    """Run a plain ``resolve`` command; None when ``envbuild.commands.cli`` must run it instead."""
    parsed = plain_resolve_args(argv)
    if parsed is None:
        return None
    selectors, output = parsed
    try:
        from envbuild.resolver.answer import answer

        text, failure = answer(selectors, matrices=output.matrices, env=env, top=output.top,
                               as_json=output.json, explain=output.explain)
        if failure is not None or text is None:
            return None  # the CLI explains the failure and re-solves the ways out
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
    """The ``envbuild`` command (bin/envbuild) and ``python -m envbuild``: run, then exit.

    A resolved plain ``resolve`` leaves only its printed text behind, so the process ends
    with ``os._exit`` once stdout and stderr are flushed: an orderly interpreter shutdown
    would spend about a third of the command's time freeing the index object by object
    (measured by bench/bench_resolve.py). So does a command that says it holds nothing left
    to close (``options.exit_at_once``: ``lock``, its files written, ~15 ms). Every other
    command exits normally, so that Docker clients, temporary files and ``atexit`` handlers
    are closed as usual.
    """
    argv, env = sys.argv[1:], os.environ
    # The fast path allocates the index and the stacks and frees nothing before it exits,
    # so the cyclic collector's passes over them (about a tenth of the command's time)
    # are pure cost there. The CLI's imports free nothing either: the collector stays off
    # through them, and the CLI turns it on for every command (lock: once uv runs).
    gc.disable()
    try:  # the CLI handles Ctrl-C once it runs; until then (its imports, the fast path) it is here
        code = fast_resolve(argv, env)
        if code is None:
            from envbuild.commands.cli import main as cli_main
            from envbuild.commands.options import exits_at_once

            code = cli_main(argv, env)
            if not exits_at_once():
                sys.exit(code)
    except KeyboardInterrupt:
        interrupted()
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib.suppress would be one more import at start-up
            stream.flush()
        except OSError:
            pass  # nowhere left to say anything; the exit code still tells
    os._exit(code)


def interrupted() -> NoReturn:
    """Ctrl-C before the CLI's own handling: its one line and exit code (130), no traceback."""
    try:
        sys.stderr.write("envbuild: interrupted\n")
        sys.stderr.flush()
    except OSError:
        pass
    sys.exit(130)


if __name__ == "__main__":
    run()
