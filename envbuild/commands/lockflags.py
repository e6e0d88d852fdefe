"""The flags given to ``lock`` that change what it locks, as the lock records them.

``lock --base-image X`` then a plain ``lock --check`` must check against X, and the advice a
stale lock gets must name X, or following it would switch the base back. So the lock keeps
these flags (``flags`` in envbuild.lock: ``--opt=value`` items, in this table's order, so one
set of flags has one record), ``lock --check`` given none of them uses the recorded ones
(given any, those replace the record), and ``lock`` warns when a previous lock's flags are
not given again. The record is hostile input like the rest of a lock: only the options below,
and their values pass the same validators the command line's do.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from typing import Literal

from envbuild.errors import UsageError

Kind = Literal["value", "list", "true", "false"]

# (option, namespace attribute, kind, default): every lock flag that changes the result. Not
# here: what only steers one run (--upgrade, --upgrade-package, --check, --json, -o, --project,
# --no-project, --stack-only, which writes no recorded flags).
RESULT_FLAGS: tuple[tuple[str, str, Kind, object], ...] = (
    ("--driver", "driver", "value", None), ("--host", "host", "true", False),
    ("--gpu", "gpu", "list", ()), ("--arch", "arch", "list", ()),
    ("--datacenter", "datacenter", "true", False), ("--platform", "platform", "value", None),
    ("--torch", "torch", "value", None),
    ("--python", "python", "value", None), ("--cuda", "cuda", "value", None),
    ("--cudnn", "cudnn", "value", None), ("--ubuntu", "ubuntu", "value", None),
    ("--variant", "variant", "value", None), ("--flavor", "flavor", "value", None),
    ("--index-url", "index_url", "value", None), ("--base-image", "base_image", "value", None),
    ("--python-url", "python_url", "value", None), ("--python-sha256", "python_sha256", "value", None),
    ("--apt-package", "apt_package", "list", ()), ("--pip-package", "pip_package", "list", ()),
    ("--env", "env", "list", ()), ("--user", "user", "value", "envbuild"),
    ("--no-companions", "companions", "false", True),
    ("--no-compile-toolchain", "compile_toolchain", "false", True),
    ("--offline", "offline", "true", False), ("--no-registry", "no_registry", "true", False),
    ("--find-links", "find_links", "list", ()), ("--installer", "installer", "value", None),
    ("--exclude-newer", "exclude_newer", "value", None), ("--base-glibc", "base_glibc", "value", None),
)
_BY_OPTION = {option: (dest, kind) for option, dest, kind, _ in RESULT_FLAGS}


def given(args: argparse.Namespace) -> tuple[str, ...]:
    """The result-changing flags ``args`` holds, as the lock records them."""
    out: list[str] = []
    for option, dest, kind, default in RESULT_FLAGS:
        value = getattr(args, dest)
        if kind in ("true", "false"):
            if bool(value) != default:
                out.append(option)
        elif kind == "list":
            out += [f"{option}={item}" for item in value]
        elif value is not None and value != default:
            out.append(f"{option}={value}")
    return tuple(out)


# What names a stack or packages: without a project file, a lock needs one of them.
_NAMING = frozenset({"--driver", "--host", "--gpu", "--arch", "--torch", "--python", "--cuda", "--cudnn",
                     "--ubuntu", "--variant", "--pip-package", "--base-image"})


def names_a_stack(flags: Sequence[str]) -> bool:
    """Whether ``flags`` name a stack or packages to lock (not only how to lock)."""
    return any(f.partition("=")[0] in _NAMING for f in flags)


def applied(args: argparse.Namespace, recorded: Sequence[str]) -> argparse.Namespace:
    """``args`` with every result-changing flag as ``recorded`` has it (the rest kept)."""
    ns = argparse.Namespace(**vars(args))
    for _, dest, kind, default in RESULT_FLAGS:
        setattr(ns, dest, [] if kind == "list" else default)
    for item in recorded:
        option, eq, value = item.partition("=")
        found = _BY_OPTION.get(option)
        if found is None or (found[1] in ("value", "list")) != bool(eq):
            raise UsageError(f"the lock's flags hold {shlex.quote(item[:80])}, which is no lock flag",
                             hint="re-create the lock with 'envbuild lock'")
        dest, kind = found
        if kind == "list":
            getattr(ns, dest).append(value)
        elif kind == "value":
            setattr(ns, dest, value)
        else:
            setattr(ns, dest, kind == "true")
    return ns


def command(flags: Sequence[str]) -> str:
    """``envbuild lock`` with ``flags``, as a shell reads it."""
    return shlex.join(["envbuild", "lock", *flags])
