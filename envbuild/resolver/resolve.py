"""Resolve fully pinned Ubuntu / CUDA / cuDNN / PyTorch / Python stacks.

The search space is small: every (torch release, wheel variant) the data knows is a
*family* (``families``). Each is checked against the request in a fixed order
(``checks``, where the order is documented); the first failing check is its rejection,
with the fact's source. A family that passes becomes one pinned ``Stack``, and
``rank.rank_key`` orders them. The checks read a precompiled index of the data
(``index``), so this is the same function for every command and ``envbuild resolve``'s
start-up alike.
"""

from __future__ import annotations

from envbuild.resolver.checks import evaluate, global_conflicts
from envbuild.resolver.families import families
from envbuild.resolver.index import Index, index_of
from envbuild.resolver.model import Rejection, Resolution, Stack
from envbuild.resolver.rank import ranked
from envbuild.resolver.runtime import summarize_driver

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from envbuild.data.matrix import Matrix
    from envbuild.resolver.model import Request
    from envbuild.resolver.runtime import Runtime


def resolve(request: Request, data: Matrix | Index) -> Resolution:
    """All stacks that fit, best first, plus every rejected family with its reason.

    ``data``: a loaded matrix, or the index ``index.load_index`` read from its cache."""
    ix = data if isinstance(data, Index) else index_of(data)
    summary = summarize_driver(request.driver, ix) if request.driver else None
    conflicts = global_conflicts(request, ix)
    stacks: list[Stack] = []
    rejected: list[Rejection] = []
    verdicts: dict[Any, Runtime | Rejection] = {}  # driver verdicts shared between families
    for family in families(request, ix):
        if isinstance(family, Rejection):
            rejected.append(family)
            continue
        result = conflicts[0] if conflicts else evaluate(family, request, ix, verdicts)
        if isinstance(result, Rejection):
            rejected.append(result.renamed(family.label) if conflicts else result)
        else:
            stacks.append(result)
    return Resolution(stacks=tuple(ranked(stacks, ix.release, cpu_first=request.cpu_host)),
                      rejected=tuple(rejected), driver=summary,
                      global_conflicts=tuple(conflicts))
