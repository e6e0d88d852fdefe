"""``envbuild config show``: every effective setting and where it came from."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from envbuild.commands.options import Out

TYPE_CHECKING = False  # typing is not imported at run time: `envbuild COMMAND --help` stays cheap
if TYPE_CHECKING:
    from typing import Any

SCHEMA = "envbuild.config/1"


def add_commands(commands: Any) -> None:
    p = commands.add_parser("config", help="show every effective setting and its origin")
    sub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    s = sub.add_parser("show", help="each setting envbuild would use here, and where it came from "
                                    "(flag, project file, environment, pip configuration, default)")
    s.add_argument("--project", metavar="FILE",
                   help="project file to read (default: ./envbuild.toml, else pyproject.toml's "
                        "[tool.envbuild])")
    s.add_argument("--no-project", action="store_true", help="ignore a project file here")
    s.add_argument("--index-url", metavar="URL", help="as given to lock: the index for your dependencies")
    s.add_argument("--json", action="store_true", help=f"machine-readable output ({SCHEMA})")
    s.set_defaults(run=cmd_config_show)


def cmd_config_show(args: argparse.Namespace, env: Mapping[str, str], out: Out) -> int:
    import json
    from pathlib import Path

    from envbuild.project import settings
    from envbuild.project.config import load_project, project_file_here

    cwd = Path(os.getcwd())
    project = None
    if not args.no_project and (args.project or project_file_here(cwd) is not None):
        project = load_project(Path(args.project) if args.project else None, cwd)
    shown = settings.shown_project(project, cwd)
    found = [*settings.environment_settings(env, matrices_flag=args.matrices),
             settings.index_setting(args.index_url, project, env),
             *settings.project_settings(project, shown, from_flag=bool(args.project))]
    if args.json:
        out(json.dumps({"schema": SCHEMA, "settings": [s.as_json() for s in found]}, indent=2))
        return 0
    rows = [("SETTING", "VALUE", "ORIGIN")] + [(s.name, s.value or "-", s.origin) for s in found]
    widths = [max(len(row[i]) for row in rows) for i in (0, 1)]
    for name, value, origin in rows:
        out(f"{name:<{widths[0]}}  {value:<{widths[1]}}  {origin}")
    return 0
