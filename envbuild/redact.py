"""Secrets out of anything envbuild prints or records.

An index URL may carry credentials (``https://user:token@host/simple/``, as
PIP_INDEX_URL or --index-url give them) or a token in its query (``?token=…``). Every
URL that reaches standard output, an error line, a progress or retry line, a report or an
image label passes through :func:`redact` first; the credentials themselves are read from
the environment (or pip's configuration) only where a request is made.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://userinfo@ : the userinfo (user, or user:password) is a secret as a whole.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")
# Query parameters that carry credentials.
_SECRET_QUERY = re.compile(
    r"(?P<key>[?&;](?:[A-Za-z0-9_.-]*(?:token|secret|password|passwd|apikey|api_key|api-key|"
    r"access_key|signature|sig|auth|key|credential)[A-Za-z0-9_.-]*))=(?P<value>[^&#;\s\"']*)",
    re.IGNORECASE,
)


# An HTTP credential as a server may echo it: ``Bearer <token>``, ``Basic <base64>``.
_AUTH_SCHEME = re.compile(r"(?P<scheme>\b(?:bearer|basic)\s+)(?P<value>[A-Za-z0-9._~+/=-]{8,})",
                          re.IGNORECASE)
# A JSON Web Token wherever it stands (registries hand them out as bearer tokens).
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


def redact(text: str) -> str:
    """``text`` with every URL's userinfo, credential-bearing query values, ``Bearer``/``Basic``
    credentials and JSON Web Tokens replaced by ``***``."""
    lowered = text.lower()
    if "://" not in text and "=" not in text and "bearer" not in lowered and "basic" not in lowered \
            and "eyJ" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _AUTH_SCHEME.sub(_mask_credential, text)
    text = _JWT.sub(MASK, text)
    return _SECRET_QUERY.sub(lambda m: f"{m['key']}={MASK}" if m["value"] else m[0], text)


def _mask_credential(match: re.Match[str]) -> str:
    """A credential after Bearer/Basic is masked; a plain word ("Basic authentication") is not:
    a token or base64 has a digit, a capital or a symbol."""
    if re.search(r"[0-9A-Z+/=_.~-]", match["value"]) is None:
        return match[0]
    return f"{match['scheme']}{MASK}"


SERVER_TEXT_LIMIT = 100
# Terminal escape sequences: CSI (colours, cursor moves, screen clears), OSC (titles, links), and
# the two-character ones.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_]?)")
# What else a terminal would act on or hide: controls, line breaks, bidirectional overrides.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def server_text(text: str, limit: int = SERVER_TEXT_LIMIT) -> str:
    """Text a server sent (an HTTP reason phrase, an error body) as one error line may show it:
    escape sequences removed, other control characters as spaces, whitespace collapsed,
    credentials and tokens masked (before the cut, so no part of one is left), at most
    ``limit`` characters (``…`` marks a cut)."""
    text = " ".join(_CONTROL.sub(" ", _ESCAPE.sub("", text[:SCAN_LIMIT])).split())
    return cut(text, limit)


# How much of a text is masked before it is cut: bounded work on a 16 MB line, and far more
# than any credential an error could show the start of.
SCAN_LIMIT = 64 * 1024
# A URL's scheme and authority left open by a cut (``https://user:pass`` with its ``@`` cut off).
_OPEN_AUTHORITY = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*$")


def cut(text: str, limit: int) -> str:
    """``text`` masked, then cut at ``limit`` characters (``…`` marks a cut): masking first
    leaves no part of a credential the cut would have split; a URL whose authority the cut
    leaves open shows its scheme only, since the ``@`` that marks a userinfo may be past it."""
    text = redact(text[:SCAN_LIMIT])
    if len(text) <= limit:
        return text
    return _OPEN_AUTHORITY.sub(lambda m: f"{m[1]}{MASK}", text[:limit].rstrip()) + "…"


def redact_optional(text: str | None) -> str | None:
    return None if text is None else redact(text)


def strip_credentials(url: str) -> str:
    """``url`` without its userinfo and secret query values: what a lock file records."""
    return redact(url).replace(f"://{MASK}@", "://", 1)


def has_credentials(url: str) -> bool:
    return redact(url) != url
