"""What ``envbuild resolve`` answers, once its arguments are parsed.

The one route after argv: the argparse CLI (``commands``) and the start-up fast path
(``envbuild.__main__``) both call ``answer``, so they share the index loader, the resolve
function and the writers, and differ only in how they read the command line.
"""

from __future__ import annotations

from envbuild.data.matrix import cache_directory_name, default_directory_name
from envbuild.resolver import report
from envbuild.resolver.index import load_index
from envbuild.resolver.resolve import resolve
from envbuild.resolver.selection import build_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from envbuild.errors import NoCompatibleStack
    from envbuild.resolver.selection import Selectors


def answer(selectors: Selectors, *, matrices: str | None, env: Mapping[str, str], top: int,
           as_json: bool, explain: bool) -> tuple[str | None, NoCompatibleStack | None]:
    """The text to print (None: nothing), then the failure to report after it (None: none).

    Nothing fits: the failure says why and which re-solved changes would fit; with
    ``as_json`` the text is its JSON body. Bad input and data raise as they are found."""
    index = load_index(matrices or default_directory_name(env), cache_directory_name(env))
    request = build_request(selectors, index, env)
    resolution = resolve(request, index)
    if not resolution.stacks:
        from envbuild.resolver.explain import explain_failure

        failure = explain_failure(request, index, resolution)
        body = report.json_text(report.failure_json(failure, resolution)) if as_json else None
        return (None if body is None else _redacted(body)), failure
    if as_json:
        return _redacted(report.json_text(report.resolution_json(request, resolution, top=top))), None
    return _redacted(report.resolution_text(request, resolution, top=top, explain=explain)), None


def _redacted(text: str) -> str:
    """``text`` without the credentials an index URL may carry (``user:token@``, ``?token=``).
    Only text that could hold one pays for the redaction's import."""
    if "@" not in text and "?" not in text:
        return text
    from envbuild.redact import redact

    return redact(text)
