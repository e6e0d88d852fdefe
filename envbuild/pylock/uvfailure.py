"""What a failed uv run said, as envbuild's one-line error (docs/faults.md H20-H29): a conflict
(NoCompatibleStack naming the stack's pin and the user's requirement), refused credentials,
an offline cache that cannot answer, or uv's first error line and last cause. uv's lines may
repeat what a server said: each is sanitised like any server text."""

from __future__ import annotations

import json
import re

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from envbuild.errors import DataError, EnvbuildError, NoCompatibleStack
from envbuild.pylock.spec import PROJECT_NAME, ClosureSpec
from envbuild.redact import redact, server_text

_NOISE = re.compile(r"^(hint|help|note):", re.IGNORECASE)
# uv's words for an index that wants other credentials (its hint, or the HTTP error itself).
_AUTH_REFUSED = re.compile(r"(?:lack of valid authentication credentials|status client error) "
                           r"\((?P<status>40[13] [A-Za-z ]+)\)")
_NAME = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)(?=[=<>!~ ,*]|$)")
# uv: "Because mulext==0.1 has no usable wheels", "all versions of flash-attn have no usable wheels".
NO_WHEELS = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*?)(?:[=<>!~][^ ]*)? ha(?:s|ve) no usable wheels")


def uv_failure(stderr: str, spec: ClosureSpec) -> EnvbuildError:
    """The error for a failed uv run: a conflict (NoCompatibleStack naming both sides) or a
    one-line DataError with uv's first error line and last cause."""
    # uv's lines may repeat what a server said (a reason phrase): sanitised like any server text.
    lines = [server_text(line, 2000) for line in stderr.splitlines() if line.strip()]
    if spec.offline and any("not found in the cache" in line for line in lines):
        missing = next(line for line in lines if "not found in the cache" in line)
        return DataError(f"uv's cache cannot answer offline: {missing.removeprefix('cause:').strip()}",
                         hint="--offline uses uv's cache only: lock once with the network to fill it")
    refused = next((m for m in map(_AUTH_REFUSED.search, lines) if m is not None), None)
    if refused is not None:  # uv reports a package it may not read as one that does not exist
        return DataError(f"the index refused uv's credentials ({refused['status']}): authentication "
                         "failed, so the closure was not resolved",
                         hint="check the user name and password or token the index gets (the "
                              "environment's PIP_INDEX_URL, netrc, a keyring); the lock records none")
    if any("No solution found" in line for line in lines):
        conflict = _conflict(lines, spec)
        if spec.exclude_newer is not None and any("filtered by `exclude-newer`" in line for line in lines):
            conflict.hint = (f"the cut-off exclude-newer {spec.exclude_newer} left these out: files "
                             "uploaded after it, and files whose index gives no upload time; "
                             "choose a later cut-off, or loosen the requirement")
        return conflict
    errors = [line for line in lines if line.startswith("error:")]
    causes = [line for line in lines if line.startswith("cause:")]
    head = errors[0].removeprefix("error:").strip() if errors else ""
    tail = causes[-1].removeprefix("cause:").strip() if causes else ""
    if not head and not tail:
        meaningful = [line for line in lines if not _NOISE.match(line)]
        head = meaningful[-1] if meaningful else "no message"
    message = f"uv could not lock the closure: {head}" + (f": {tail}" if tail else "")
    hint = f"check the network and the index URLs uv was given: {_indexes_named(spec)}"
    if spec.offline:
        hint = "--offline uses uv's cache only: lock once with the network to fill it"
    return DataError(message, hint=hint)


def _indexes_named(spec: ClosureSpec) -> str:
    """The indexes a closure is resolved from, credentials masked, for an error that may be
    theirs (which one uv could not reach, its message says when it says)."""
    named = [f"{redact(spec.default_index)} (the project's dependencies)" if spec.default_index
             else "pip's configured index (the project's dependencies)"]
    if spec.torch_index and spec.torch_index != spec.default_index:
        named.append(f"{redact(spec.torch_index)} (torch)")
    return ", ".join(named)


def _conflict(lines: list[str], spec: ClosureSpec) -> EnvbuildError:
    """uv's "Because … and you require …" explanation, with the stack's pins and the user's
    requirements it involves named on their own: NoCompatibleStack when a requirement of the
    project is involved, DataError when only the stack's pins are (their index lacks them)."""
    start = next(i for i, line in enumerate(lines) if "No solution found" in line)
    story = " ".join(line.removeprefix("cause:").strip() for line in lines[start + 1:]
                     if not _NOISE.match(line))
    for phrase in (f"{PROJECT_NAME}==0 depends on", f"{PROJECT_NAME} depends on"):
        story = story.replace(phrase, "the environment needs")
    named = {canonicalize_name(m) for m in _NAME.findall(story)}
    stack = [f"{canonicalize_name(n)}=={v} (the stack)" for n, v in sorted(spec.torch_pins.items())
             if canonicalize_name(n) in named]
    user = [f"{r} (the project)" for r in (*spec.torch_constraints, *spec.dependencies)
            if canonicalize_name(Requirement(r).name) in named]
    if not user and stack:
        return DataError(
            f"the stack's pins cannot be installed from their index: {'; '.join(stack)}: {story}",
            hint="check the variant's index URL (torch_index) and refresh the data")
    if stack:
        head = f"the project's requirements conflict with the stack: {'; '.join([*stack, *user])}"
    else:
        head = f"the project's requirements cannot be satisfied: {'; '.join(user) or 'see below'}"
    hint = "loosen the project's requirement or choose another stack (--torch, --driver)"
    no_wheels = sorted({canonicalize_name(m) for m in NO_WHEELS.findall(story)} - set(spec.no_binary))
    if no_wheels:  # on the index as sdists only (flash-attn): build-sdists builds them
        names = ", ".join(json.dumps(str(n)) for n in no_wheels[:3])
        hint = (f"{no_wheels[0]} has no wheel for this platform: to build it from its sdist against the "
                f"locked torch, add build-sdists = [{names}] to the project (docs/extensions.md)")
    return NoCompatibleStack(f"{head}: {story}", conflicts=(*stack, *user), hint=hint)
