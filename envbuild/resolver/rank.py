"""THE ranking policy: which of the stacks that fit comes first."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from envbuild.resolver.model import Stack

COMPAT_ORDER: dict[str | None, int] = {"native": 0, "minor-version": 1, "forward": 2, None: 3}
_NO_CUDA = (0, 1)  # newest_first((0,)): a CPU wheel ranks after every CUDA variant


def rank_key(stack: Stack, release: Callable[[str], tuple[int, ...]] | None = None, *,
             cpu_first: bool = False) -> tuple[Any, ...]:
    """Best first: every forward-compatibility stack after every native and minor-version
    one (it needs the extra cuda-compat package and runs on datacenter GPUs only); then the
    newest torch; native before minor-version; the newest CUDA variant; the newest Ubuntu;
    the newest Python; then the variant name, so that ties always break the same way and
    output is deterministic.

    ``cpu_first`` (``--host`` found no NVIDIA driver or GPU): the CPU stacks before all.

    ``release``: version text → its release tuple. The resolver passes its index's
    (precomputed, no ``packaging`` at start-up); by default ``packaging`` parses it."""
    if release is None:
        from packaging.version import Version

        def release(text: str) -> tuple[int, ...]:
            return Version(text).release

    def newest_first(text: str) -> tuple[int, ...]:
        return (*(-part for part in release(text)), 1)

    return (
        cpu_first and stack.cuda is not None,
        stack.compat == "forward",
        newest_first(stack.torch),
        COMPAT_ORDER[stack.compat],
        newest_first(stack.cuda) if stack.cuda else _NO_CUDA,
        newest_first(stack.ubuntu),
        newest_first(stack.python.rstrip("t")),
        stack.variant,
    )


def ranked(stacks: Iterable[Stack], release: Callable[[str], tuple[int, ...]], *,
           cpu_first: bool = False) -> list[Stack]:
    """``stacks`` best first, each version text parsed once (a few dozen of them)."""
    seen: dict[str, tuple[int, ...]] = {}

    def once(text: str) -> tuple[int, ...]:
        found = seen.get(text)
        if found is None:
            found = seen[text] = release(text)
        return found

    return sorted(stacks, key=lambda stack: rank_key(stack, once, cpu_first=cpu_first))
