"""``envbuild matrix refresh`` on the command line: its options, and what it prints.

The refresh itself is ``envbuild.upstream.refresh``; this module turns the parsed
arguments into its ``RefreshOptions``, prints progress and warnings on stderr and the
summary (or JSON report) on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from envbuild.commands.options import progress
from envbuild.redact import redact
from envbuild.upstream import refresh

WARNING_PREFIX = "envbuild: warning: "


def add_refresh_arguments(p: argparse.ArgumentParser) -> None:
    """``envbuild matrix refresh``'s options (the CLI creates the subcommand)."""
    p.add_argument("--source", action="append", choices=(*refresh.ORDER, "all"),
                   help="which upstream to read (repeatable; default: all, which is "
                        f"{', '.join(refresh.SOURCES)})")
    p.add_argument("--only", action="append", choices=refresh.PROJECTS,
                   help="limit to these projects (repeatable)")
    p.add_argument("--out", metavar="DIR", help="write a refreshed copy to DIR (new or empty)")
    p.add_argument("--offline", action="store_true",
                   help="no network: derive from the refresh cache only")
    p.add_argument("--dry-run", action="store_true", help="fetch and check, write nothing")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--allow-shrink", action="store_true",
                   help="accept a source giving fewer rows than recorded (drops the missing ones)")
    p.add_argument("--index-url", metavar="URL",
                   help="Python package index (default: $PIP_INDEX_URL, then pip's configuration)")
    p.add_argument("--pytorch-url", metavar="URL", help="PyTorch wheel indexes (default: "
                   "https://download.pytorch.org/whl/)")
    p.add_argument("--nvidia-url", metavar="URL", help="NVIDIA redist base (default: "
                   "https://developer.download.nvidia.com/compute/)")
    p.add_argument("--registry-url", metavar="URL", help="the nvidia/cuda repository's registry "
                   "API (default: https://registry-1.docker.io/v2/nvidia/cuda/)")
    p.add_argument("--python-downloads-url", metavar="URL", help="uv's list of python-build-standalone "
                   "builds (default: crates/uv-python-managed/download-metadata.json on uv's main "
                   "branch, https://raw.githubusercontent.com/astral-sh/uv/main/)")
    p.add_argument("--uv-release", metavar="VERSION", help="read uv's list from the sdist of this uv "
                   "release (or 'latest') on the package index instead, sha256-checked against the "
                   "index (where the code host is unreachable)")
    p.set_defaults(run=cmd_refresh)


def options_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> refresh.RefreshOptions:
    from envbuild.data.matrix import default_directory

    chosen = tuple(args.source or ["all"])
    # "all" stands for the default sources; one named besides it (wheels) is read too.
    sources = tuple(s for s in refresh.ORDER if s in chosen or ("all" in chosen and s in refresh.SOURCES))
    out = Path(args.out) if args.out else None
    if out is not None:
        refresh.check_out(out)
    return refresh.RefreshOptions(
        matrices=Path(args.matrices) if getattr(args, "matrices", None) else default_directory(env),
        out=out, sources=sources, only=frozenset(args.only or ()),
        offline=args.offline, dry_run=args.dry_run, allow_shrink=args.allow_shrink,
        index_url=args.index_url, pytorch_url=args.pytorch_url, nvidia_url=args.nvidia_url,
        registry_url=args.registry_url, python_downloads_url=args.python_downloads_url,
        uv_release=args.uv_release)


def cmd_refresh(args: argparse.Namespace, env: Mapping[str, str], out: Callable[[str], None]) -> int:
    options = options_from_args(args, env)
    report = refresh.refresh(options, env, log=lambda message: progress(redact(message)),
                             warn=lambda message: _progress(WARNING_PREFIX + message))
    if args.json:
        out(redact(json.dumps(report.to_json(), indent=2)))
    elif report.up_to_date:
        out(f"{report.target}: up to date")
    else:
        verb = "would write" if report.dry_run else "wrote"
        summary = ", ".join(f"{k} +{c.added} ~{c.updated} -{c.dropped}" + _kept(c.kept_hand_sourced)
                            for k, c in sorted(report.changes.items()))
        out(redact(f"{report.target}: {verb} {', '.join(report.written) or 'nothing'} ({summary}); "
            f"{report.bytes_received} bytes in {report.requests_made} requests"))
    return 0


def _kept(rows: int) -> str:
    """Rows the source derived again but left as recorded: their source is not the upstream's."""
    return f" ={rows} hand-sourced kept" if rows else ""


def _progress(message: str) -> None:
    """A progress, retry or warning line: on stderr, without credentials."""
    print(redact(message), file=sys.stderr, flush=True)
