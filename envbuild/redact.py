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


def redact(text: str) -> str:
    """``text`` with every URL's userinfo and credential-bearing query values replaced by ``***``."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    return _SECRET_QUERY.sub(lambda m: f"{m['key']}={MASK}" if m["value"] else m[0], text)


def redact_optional(text: str | None) -> str | None:
    return None if text is None else redact(text)


def strip_credentials(url: str) -> str:
    """``url`` without its userinfo and secret query values: what a lock file records."""
    return redact(url).replace(f"://{MASK}@", "://", 1)


def has_credentials(url: str) -> bool:
    return redact(url) != url
