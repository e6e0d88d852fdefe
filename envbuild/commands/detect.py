"""``envbuild detect``: the host's driver, GPUs, OS and /dev/shm, probed or read from a file."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from envbuild.commands.options import Out
from envbuild.errors import DataError, UsageError

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any


def add_commands(commands: Any) -> None:
    p = commands.add_parser("detect", help="report host facts: driver, GPUs, OS, /dev/shm")
    p.add_argument("--json", action="store_true", help="machine-readable host facts (schema_version 1)")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="read saved nvidia-smi output instead of probing")
    p.set_defaults(run=cmd_detect)


def _catalogue_lookup(args: argparse.Namespace, env: Mapping[str, str]) -> Callable[[str], str | None]:
    """A GPU name → its compute capability in the GPU catalogue (None: not there)."""
    from envbuild.commands.options import load_matrix
    from envbuild.data.gpus import find_gpu, gpu_keys

    try:
        rows = load_matrix(args, env).rows("gpus")
    except (DataError, UsageError):  # detect reports the host even when the data cannot be read
        return lambda name: None
    keys = gpu_keys(rows)

    def lookup(name: str) -> str | None:
        try:
            return find_gpu(rows, name, keys).compute_capability
        except UsageError:
            return None

    return lookup


def cmd_detect(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    import json
    from pathlib import Path

    from envbuild.host import probe as host
    from envbuild.host import report as host_report
    from envbuild.host.facts import with_catalogue

    if args.from_file:
        from envbuild.confine import read_confined

        # a regular file, opened without blocking: '--from FIFO' never hangs
        text = read_confined(Path(args.from_file), None, f"--from {args.from_file}",
                             missing_hint="save 'nvidia-smi' (or 'nvidia-smi -q') output to a file "
                                          "first").decode("utf-8", "replace")
        facts = host.parse_saved(text)
    else:
        facts = host.probe_host(env)
    facts = with_catalogue(facts, _catalogue_lookup(args, env))
    out(json.dumps(host_report.to_json(facts), indent=2) if args.json else host_report.format_human(facts))
    return 0
