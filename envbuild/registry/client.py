"""The one registry client: the Registry HTTP API v2 for one repository, reached as Docker
reaches it, logged in as ``docker login`` left the user.

- **Where**: https first; plain http only as the fallback for a loopback registry, one in
  Docker's ``insecure-registries`` (``/etc/docker/daemon.json``), or a mirror written with
  ``http://`` (``reference.endpoint``). Where the fallback is allowed, a bare TLS hello asks
  first whether anything speaks TLS there (``http_client.speaks_tls``): a plain-http
  registry is then asked over http at once, without the verified attempt's CA bundle parsed.
- **TLS**: the registry's CA from ``/etc/docker/certs.d/<host:port>/ca.crt`` (as Docker trusts
  it), else the CA bundle the command was given, else ``SSL_CERT_FILE``, ``PIP_CERT``,
  ``REQUESTS_CA_BUNDLE``, else the system store. A certificate that fails is never answered
  by falling back to http, except for loopback and insecure registries, as Docker does.
- **Who**: anonymous until the registry answers 401. Then its challenge decides: ``Basic``
  sends the user's credentials (``credentials.credentials_for``); ``Bearer`` fetches a token
  from the realm, with the credentials as Basic auth (or an identity token as the
  ``refresh_token`` grant) when there are any, anonymously when not.

Every failure is a DataError (4); a registry wanting credentials, or refusing the ones it got,
names ``docker login``. No credential or token is ever part of a message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import SplitResult, urlencode, urlsplit, urlunsplit

from envbuild.errors import DataError, UsageError
from envbuild.redact import redact
from envbuild.registry.credentials import Credentials, credentials_for, login_hint
from envbuild.registry.reference import (
    ACCEPT,
    MAX_MANIFEST_BYTES,
    Endpoint,
    endpoint,
    is_loopback,
    parse_challenge,
)
from envbuild.upstream.http_client import HttpClient, HttpPolicy, Reply, speaks_tls

CERTS_D = Path("/etc/docker/certs.d")
DAEMON_JSON = Path("/etc/docker/daemon.json")

_NOTHING: Mapping[str, str] = {}
# The longest a loopback or insecure registry is given to answer the TLS probe's hello (a TLS
# server answers at once); one that does not is asked over plain http, as the https attempt's
# failure would have led it to, and that attempt's own failure is the one reported.
PROBE_TIMEOUT_S = 2.0


def insecure_registries(path: Path = DAEMON_JSON) -> tuple[str, ...]:
    """``insecure-registries`` of Docker's daemon configuration; () when it has none."""
    from envbuild.confine import read_regular

    try:  # a regular file of at most 1 MiB, opened without blocking (never read whole, never a FIFO)
        data = json.loads(read_regular(path, str(path), limit=1024 * 1024))
    except (UsageError, ValueError, RecursionError):
        return ()
    listed = data.get("insecure-registries") if isinstance(data, dict) else None
    return tuple(str(x) for x in listed if isinstance(x, str)) if isinstance(listed, list) else ()


def trusted_ca(host: str, env: Mapping[str, str], *, ca_bundle: str | None = None,
               certs_d: Path = CERTS_D) -> str | None:
    """The CA file to check ``host``'s certificate against (None: the env's, else the system's)."""
    candidate = certs_d / host / "ca.crt"
    if candidate.is_file():
        return str(candidate)
    return ca_bundle or env.get("SSL_CERT_FILE") or None


class RegistryClient:
    """Requests to one repository of one registry. ``subject`` names what is asked for in
    messages (``the digest of ubuntu:22.04``); ``tail`` ends every hint (``; --no-registry …``)."""

    def __init__(self, registry: str, name: str, *, env: Mapping[str, str],
                 mirrors: Mapping[str, str] = _NOTHING, ca_bundle: str | None = None,
                 timeout: float = 30.0, log: Callable[[str], None] | None = None,
                 subject: str = "", tail: str = "", certs_d: Path | None = None,
                 daemon_json: Path | None = None) -> None:
        self.endpoint: Endpoint = endpoint(registry, mirrors, insecure_registries(daemon_json or DAEMON_JSON))
        self.name = name
        self.subject = subject or f"{registry}/{name}"
        self.tail = tail
        self._env = env
        self._base = 0
        self._authorization: str | None = None
        self._credentials: Credentials | None = None
        self._looked_up = False
        self._probed = len(self.endpoint.bases) < 2  # nothing to fall back to: no TLS probe
        ca = trusted_ca(self.endpoint.host, env, ca_bundle=ca_bundle, certs_d=certs_d or CERTS_D)
        policy = HttpPolicy(connect_timeout_s=min(10.0, timeout), read_timeout_s=timeout,
                            total_timeout_s=timeout, attempts=3, backoff_s=0.5,
                            max_body_bytes=MAX_MANIFEST_BYTES)
        self._http = HttpClient(env={**env, "PIP_CERT": ca} if ca else env, policy=policy, log=log)

    @property
    def origin(self) -> str:
        return urlunsplit((*urlsplit(self.base)[:2], "", "", ""))

    @property
    def base(self) -> str:
        return self.endpoint.bases[self._base]

    def manifest(self, method: str, reference: str, *, data: bytes | None = None,
                 content_type: str = "", allow: frozenset[int] = frozenset()) -> Reply:
        """HEAD, GET or PUT ``/v2/<name>/manifests/<reference>``; 401, 403 and 404 are errors
        (404 is answered as it is where ``allow`` holds it)."""
        headers = {"Content-Type": content_type} if data is not None else {"Accept": ACCEPT}
        actions = "pull,push" if method == "PUT" else "pull"
        reply = self.request(method, f"/{self.name}/manifests/{reference}", headers, data=data,
                             scope=f"repository:{self.name}:{actions}", allow=allow)
        if reply.status == 403:
            raise DataError(f"the registry refused {self.subject} ({self.origin} answered 403)",
                            hint=f"check the name and your access to it; {login_hint(self.endpoint.host)}"
                                 + self.tail)
        if reply.status == 404 and 404 not in allow:
            raise DataError(f"no such image or tag: {self.subject} ({self.name}:{reference} not found "
                            f"at {self.origin})",
                            hint="check the name and tag (a deleted tag needs another base image)"
                                 + self.tail)
        return reply

    def request(self, method: str, path: str, headers: Mapping[str, str], *, data: bytes | None = None,
                scope: str, allow: frozenset[int] = frozenset()) -> Reply:
        """One request under the base URL; on a 401 the challenge is answered once and the
        request sent again. A second 401 is the credentials' fault."""
        wanted = allow | {401, 403, 404}
        reply = self._send(method, path, headers, data, wanted)
        if reply.status == 401:
            self._authorize(reply.headers.get("WWW-Authenticate", ""), scope)
            reply = self._send(method, path, headers, data, wanted)
            if reply.status == 401:
                raise self._refused("answered 401")
        return reply

    def _send(self, method: str, path: str, headers: Mapping[str, str], data: bytes | None,
              allow: frozenset[int]) -> Reply:
        sent = dict(headers)
        if self._authorization is not None:
            sent["Authorization"] = self._authorization
        if not self._probed:
            self._probed = True
            wait = min(PROBE_TIMEOUT_S, self._http.policy.connect_timeout_s)
            if speaks_tls(self.base, timeout=wait) is False:  # (self._base is still 0)
                self._base = 1  # no TLS there: where the https attempt's failure would lead
        first: tuple[DataError, str] | None = None
        while True:
            try:
                return self._http.send(method, self.base + path, sent, data=data, allow=allow)
            except DataError as exc:
                first = first or (exc, self.origin)
                if self._base + 1 >= len(self.endpoint.bases) or first[0] is not exc:
                    # A certificate that failed verification is the news (U4); an https attempt
                    # that found no TLS at all is not: then plain http's own failure is.
                    told = first if "TLS verification failed" in first[0].message else (exc, self.origin)
                    raise self._unreachable(*told) from exc
                self._base += 1  # https failed where Docker too would try plain http

    def _unreachable(self, exc: DataError, origin: str = "") -> DataError:
        if "TLS verification failed" in exc.message:
            hint = (f"trust the registry's CA: put it in /etc/docker/certs.d/{self.endpoint.host}/ca.crt "
                    "or SSL_CERT_FILE")
        else:
            hint = "check the registry or mirror address and the network"
        return DataError(redact(f"cannot reach {origin or self.origin} for {self.subject}: {exc.message}"),
                         hint=hint + self.tail)

    def _lookup(self) -> Credentials | None:
        if not self._looked_up:
            self._credentials = credentials_for(self.endpoint.host, self._env)
            self._looked_up = True
        return self._credentials

    def _authorize(self, challenge: str, scope: str) -> None:
        scheme, params = parse_challenge(challenge)
        credentials = self._lookup()
        if scheme == "basic" and credentials is not None and not credentials.identity_token:
            self._authorization = credentials.basic()
        elif scheme == "bearer" and params.get("realm"):
            self._authorization = f"Bearer {self._token(params, scope, credentials)}"
        else:
            raise self._refused(f"answered 401 with {scheme or 'no'} authentication")

    def _refused(self, what: str) -> DataError:
        """401 for good: the credentials are missing, or the registry does not take them."""
        credentials = self._lookup()
        host = self.endpoint.host
        if credentials is None:
            return DataError(
                f"the registry wants credentials for {self.subject} ({self.origin} {what}; none "
                f"for {host} in Docker's client configuration)",
                hint=f"{login_hint(host)}; on Docker Hub a name that does not exist answers so too"
                     + self.tail)
        return DataError(f"the registry refused the credentials for {self.subject} ({self.origin} "
                         f"{what}; the credentials came from {credentials.source})",
                         hint=f"{login_hint(host)} again, with an account that may do this" + self.tail)

    def _token(self, params: Mapping[str, str], scope: str, credentials: Credentials | None) -> str:
        realm = params["realm"]
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.hostname or (
                parts.scheme == "http" and self.origin.startswith("https:")
                and not is_loopback(parts.netloc.rpartition("@")[2])):
            raise DataError(f"refusing the token realm {redact(realm)!r} of {self.origin}",
                            hint="a registry over https must hand out tokens over https" + self.tail)
        query = [(k, v) for k, v in (("service", params.get("service")),
                                     ("scope", params.get("scope") or scope)) if v]
        reply = self._ask_token(parts, query, credentials)
        if reply.status in (400, 401, 403):
            raise self._refused(f"(its token server) answered {reply.status}")
        try:
            answer = json.loads(reply.body)
        except (UnicodeDecodeError, ValueError):
            answer = None
        token = (answer.get("token") or answer.get("access_token")) if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token or any(c.isspace() for c in token):
            raise DataError(f"the token server of {self.origin} answered without a token",
                            hint="check the registry or mirror" + self.tail)
        return token

    def _ask_token(self, parts: SplitResult, query: list[tuple[str, str]],
                   credentials: Credentials | None) -> Reply:
        scheme, netloc, path, extra = parts.scheme, parts.netloc, parts.path, parts.query
        allow = frozenset({400, 401, 403})
        try:
            if credentials is not None and credentials.identity_token:
                form = urlencode([*query, ("grant_type", "refresh_token"), ("client_id", "envbuild"),
                                  ("refresh_token", credentials.identity_token)]).encode()
                url = urlunsplit((scheme, netloc, path, extra, ""))
                return self._http.send("POST", url, {"Content-Type": "application/x-www-form-urlencoded"},
                                       data=form, allow=allow, secret_body=True)
            url = urlunsplit((scheme, netloc, path, "&".join(q for q in (extra, urlencode(query)) if q), ""))
            headers = {"Authorization": credentials.basic()} if credentials is not None else {}
            return self._http.send("GET", url, headers, allow=allow)
        except DataError as exc:
            raise self._unreachable(exc) from exc
