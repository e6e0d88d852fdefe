"""The Jinja environment every renderer shares, and the helpers its templates need.

Only rendering pays for jinja2: the CLI's other commands never import this module.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2


def _templates_dir() -> Path:
    """The packaged copy (installed wheel), else the repository's top-level templates/."""
    from importlib import resources  # here: lock imports this module for major_minor alone

    packaged = Path(str(resources.files("envbuild"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "templates"


@cache  # one loader and template cache per process; templates are read-only files
def environment() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, never an empty string
        autoescape=False,  # a Dockerfile, not HTML: values are validated and quoted instead
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
