"""``envbuild completion bash|zsh|fish``: a completion script generated from the parser.

shtab reads the argparse parser and writes the script once; the shell then completes with no
Python started per key press, so ``resolve``'s start-up never pays for it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from envbuild.commands.options import Out

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any

SHELLS = ("bash", "zsh", "fish")
HOW = {
    "bash": "envbuild completion bash > ~/.local/share/bash-completion/completions/envbuild",
    "zsh": "envbuild completion zsh > \"${fpath[1]}/_envbuild\"",
    "fish": "envbuild completion fish > ~/.config/fish/completions/envbuild.fish",
}


def add_commands(commands: Any) -> None:
    p = commands.add_parser(
        "completion", help="print a shell completion script (bash, zsh, fish)",
        description="Print a completion script for SHELL, generated from envbuild's own options. "
                    "Install it once, e.g.:\n  " + "\n  ".join(HOW.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(run=cmd_completion)


def cmd_completion(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    import shtab

    from envbuild.commands.cli import build_parser

    script: str = shtab.complete(build_parser(with_render=True), shell=args.shell)
    out(script.rstrip("\n"))
    return 0
