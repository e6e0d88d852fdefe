"""Render a lock into cloud-init user-data that fits the smallest common limit.

EC2 takes at most 16 KB of user-data (16384 bytes as uploaded, before its own base64), so the
user-data carries only what the first boot runs:

- ``install.sh`` as ``envbuild render script`` writes it, without its comments and indentation
  (the header names the sha256 of both; bash reads the same functions from either);
- ``firstboot.sh``, which runs install.sh, then either the compact ``check.py`` (torch is the
  lock's pin, sees the GPUs, multiplies on each; its two facts as arguments) or, with
  ``--smoke-url``, the full smoke test downloaded from that URL and run only when its sha256 is
  the pinned one (by default the sha256 of the smoke.py this envbuild writes beside install.sh:
  publish that file at the URL); then the lock (and a closure's requirements) come too.

The whole cloud-config is gzip'd into ``user-data`` (cloud-init reads gzip'd user-data as it
is; about a third of the text's size, with no base64 inside); ``user-data.yaml`` is the same
cloud-config as text, to read, or for a cloud whose metadata must be text (GCP's user-data key).

Pure and deterministic like ``render_script``: the same lock and smoke source render the same
bytes (gzip's header time is fixed at 0).
"""

from __future__ import annotations

import gzip
import hashlib
import re
import shlex
from dataclasses import dataclass

from envbuild.errors import UsageError
from envbuild.render.hostsetup import HostSetup
from envbuild.render.lock import Lock
from envbuild.render.script import PREFIX, render_script
from envbuild.render.templates import environment
from envbuild.render.values import check_sha256, check_url

# The smallest common user-data limit: EC2's 16 KB, counted on the raw bytes (before base64).
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html (read 2026-11-24).
USER_DATA_LIMIT = 16384


@dataclass(frozen=True)
class SmokeSource:
    """Where the first boot fetches the full smoke test, and the sha256 it must have."""

    url: str
    sha256: str


def smoke_payload_sha256() -> str:
    """The sha256 of the smoke.py this envbuild writes (``render script``, ``render docker``)."""
    from envbuild.smoke.bundle import payload

    return hashlib.sha256(payload()).hexdigest()


def smoke_source(url: str | None, sha256: str | None) -> SmokeSource | None:
    """--smoke-url (https) and --smoke-sha256 (default: this envbuild's smoke.py), validated."""
    if url is None:
        if sha256 is not None:
            raise UsageError("--smoke-sha256 pins the file of --smoke-url, which is missing",
                             hint="pass --smoke-url URL as well, or neither")
        return None
    check_url(url, "--smoke-url")
    if not url.startswith("https://"):
        raise UsageError(f"--smoke-url {url!r} is not https; the first boot downloads over https only",
                         hint="serve smoke.py over https")
    digest = smoke_payload_sha256() if sha256 is None else check_sha256(sha256, "--smoke-sha256")
    return SmokeSource(url=url, sha256=digest)


_HEREDOC = re.compile(r"(?<!<)<<-?[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def _scan(line: str, quote: str) -> tuple[int, str]:
    """Where ``line``'s comment starts (``len(line)`` without one) and the quote open at its end,
    ``quote`` being the one open at its start: '' none, "'" single, '"' double, "$'" ANSI-C."""
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote:  # double or ANSI-C: a backslash escapes the next character
            if c == "\\":
                i += 1
            elif c == quote[-1]:
                quote = ""
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
            return i, quote
        elif c in "'\"":
            quote = "$'" if c == "'" and i > 0 and line[i - 1] == "$" else c
        i += 1
    return len(line), quote


def strip_comments(script: str) -> str:
    """``script`` without its comments and indentation (the first line, ``#!``, stays): bash
    reads the same functions and values (tests/test_cloud_init.py compares ``declare -f`` of
    both). A line that starts inside a quoted string, and a here-document up to its end word,
    stay as they are; a line with a backtick keeps its comment."""
    lines = script.splitlines()
    kept = lines[:1]
    end: str | None = None
    quote = ""
    for line in lines[1:]:
        if end is not None:
            kept.append(line)
            if line.lstrip("\t") == end:
                end = None
            continue
        if quote:  # inside a string that began on an earlier line: its text, as it is
            cut, quote = _scan(line, quote)
            kept.append(line if "`" in line else line[:cut].rstrip(" \t"))
            continue
        code = line.lstrip(" \t")
        cut, quote = _scan(code, "")
        if "`" not in code[:cut]:
            code = code[:cut].rstrip(" \t")
        if code:
            kept.append(code)
        heredoc = _HEREDOC.search(code)
        if heredoc is not None:
            end = heredoc.group(2)
    return "\n".join(kept) + "\n"


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)  # mtime 0: the same bytes every time


def render_cloud_init(lock: Lock, carried: str | None = None, smoke: SmokeSource | None = None,
                      host: HostSetup | None = None) -> dict[str, bytes]:
    """``user-data``: install.sh, the lock and the first-boot step written to /opt/envbuild,
    then run once, as gzip (what a cloud is given); ``user-data.yaml``: the same cloud-config
    as text; ``envbuild.lock`` beside them as ``render script`` writes it."""
    if lock.pylock is not None and smoke is None:
        # The closure's install ends in the smoke test's installed-set check (--installed-only).
        raise UsageError("a locked closure's host install checks its installed set with the full "
                         "smoke test, which the user-data does not carry",
                         hint="pass --smoke-url URL (and --smoke-sha256 HEX for another smoke.py "
                              "than this envbuild's)")
    files = render_script(lock, carried, host)
    script = files["install.sh"]
    embedded = strip_comments(script.decode("utf-8"))
    blocks = [(f"{PREFIX}/install.sh", "0755", embedded.rstrip("\n"))]
    if smoke is not None:  # the smoke test reads the lock; check.py takes its two facts instead
        blocks += [(f"{PREFIX}/{name}", "0644", files[name].decode("utf-8").rstrip("\n")) for name in
                   ("envbuild.lock", *sorted(n for n in files if n.startswith("requirements/")))]
    env = environment()
    s = lock.stack
    values = {"smoke": smoke is not None,
              "smoke_url": shlex.quote(smoke.url) if smoke else "",
              "smoke_sha256": smoke.sha256 if smoke else "",
              "check_args": " ".join(shlex.quote(v) for v in (lock.packages["torch"], s.cuda) if v)}
    blocks.append((f"{PREFIX}/firstboot.sh", "0755",
                   env.get_template("firstboot.sh.j2").render(values).rstrip("\n")))
    if smoke is None:
        blocks.append((f"{PREFIX}/check.py", "0644", env.get_template("check.py.j2").render().rstrip("\n")))
    text = env.get_template("user-data.j2").render(
        torch=s.torch, variant=s.variant, python=s.python, ubuntu=s.ubuntu, prefix=PREFIX,
        plain=blocks, script_sha256=hashlib.sha256(script).hexdigest(),
        embedded_sha256=hashlib.sha256(embedded.encode("utf-8")).hexdigest(), **values).encode("utf-8")
    return {"envbuild.lock": files["envbuild.lock"], "user-data": _gzip(text), "user-data.yaml": text}
