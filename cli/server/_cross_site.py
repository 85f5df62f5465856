"""What keeps a web page the operator opens from driving a node (issue 38).

A browser lets any page send a "simple" request to any address, the node's
on 127.0.0.1 included: a ``text/plain`` or form-encoded POST, with no
preflight, and its answer unread; and a page whose name its owner re-points
at 127.0.0.1 (DNS rebinding) may even read the answers, since to the browser
they come from the page's own origin. Three rules close both:

- ``json_only``: a state-changing request (POST, PUT, PATCH, DELETE) that
  carries a body or names a ``Content-Type`` must say ``application/json``;
  anything else is a 415 ``rejected_input`` naming ``Content-Type`` (a
  body-less one without a type passes). A page cannot send ``application/json`` across sites
  without a CORS preflight, which the node never grants. Always on: a JSON
  client sends that type anyway.
- ``guard_hosts`` (the ``Host`` rule): every request but the health probes
  must name the node by an address it answers to (``AllowedHosts``): the
  bound address with its port, ``localhost`` on a loopback node, or a name
  given with ``node start --allowed-host``. A foreign ``Host`` is a 421
  ``rejected_input`` (a rebinding page's requests carry its own name); a
  request without one, or with one that is not a host, a 400.
- and, in the same guard, the ``Origin`` rule: a state-changing request
  whose ``Origin`` is not one of those addresses (``null`` included) is a
  403 ``not_allowed``, with or without a body (``cancel``, ``terminate``).
  A request without ``Origin`` (every non-browser client) passes.

Every refusal is an ``ErrorBody``, answered before routing. The guard is on
for a node without a token (which listens on loopback only); with a token,
the token already refuses a page (it cannot know it), and the guard is on
only when ``--allowed-host`` is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation, Reference
from litestar.types import (
    ASGIApp,
    Receive,
    Scope,
    Send,
)

from sessiontree.cli.server._auth import OPEN_PATHS
from sessiontree.cli.server._refusal import send_refusal
from sessiontree.protocol import ErrorCode

__all__ = [
    "STATE_CHANGING",
    "AllowedHosts",
    "document_cross_site",
    "guard_hosts",
    "json_only",
    "parse_authority",
]

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The methods the ``Origin`` and ``Content-Type`` rules apply to."""

_JSON = "application/json"


def parse_authority(text: str) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6]:port`` for an IPv6 address) as the host, lowered
    and without brackets, and the port (None when absent); ``ValueError`` for
    anything else (a path, a scheme, a bad port, an empty host)."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            msg = f"{text!r}: an IPv6 address must end with ']'"
            raise ValueError(msg)
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            msg = f"{text!r}: only :PORT may follow ']'"
            raise ValueError(msg)
        port_text = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            msg = f"{text!r}: an IPv6 address goes in brackets ([::1]:8470)"
            raise ValueError(msg)
        host, sep, port_text = text.partition(":")
        port_text = port_text if sep else None
    if not host or any(c in host for c in "/?#@ \t\\") or not host.isprintable():
        msg = f"{text!r} is not a host[:port]"
        raise ValueError(msg)
    if port_text is None:
        return host.lower(), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        msg = f"{text!r}: the port must be a number from 1 to 65535"
        raise ValueError(msg)
    return host.lower(), int(port_text)


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    """The addresses a node answers to: ``bound`` names (its address, and
    ``localhost`` on loopback) with its ``port`` or none, and the names given
    with ``--allowed-host`` (``given``: any port; ``given_ports``: that one)."""

    bound: frozenset[str]
    port: int
    given: frozenset[str] = frozenset()
    given_ports: frozenset[tuple[str, int]] = frozenset()

    @classmethod
    def of(
        cls, hosts: Iterable[str], port: int, *, loopback: bool, allowed: Iterable[str] = ()
    ) -> AllowedHosts:
        """The addresses of a node bound to ``port`` of ``hosts`` (the address
        asked for and the one bound, say ``localhost`` and ``127.0.0.1``) that
        also answers to every ``allowed`` name (``NAME`` or ``NAME:PORT``;
        ``ValueError`` for one that is neither)."""
        bound = {host.strip("[]").lower() for host in hosts}
        if loopback:
            bound.add("localhost")
        given: set[str] = set()
        given_ports: set[tuple[str, int]] = set()
        for text in allowed:
            name, named_port = parse_authority(text)
            if named_port is None:
                given.add(name)
            else:
                given_ports.add((name, named_port))
        return cls(frozenset(bound), port, frozenset(given), frozenset(given_ports))

    def allows(self, authority: str) -> bool:
        """Whether ``authority`` (a ``Host`` value) names this node."""
        try:
            host, port = parse_authority(authority)
        except ValueError:
            return False
        if host in self.given or (port is not None and (host, port) in self.given_ports):
            return True
        return host in self.bound and port in (None, self.port)

    def allows_origin(self, origin: str) -> bool:
        """Whether ``origin`` (an ``Origin`` value: ``scheme://host[:port]``)
        is a page of this node; ``null`` and any other scheme are not."""
        scheme, sep, authority = origin.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or "/" in authority:
            return False
        return self.allows(authority)


def _header(scope: Scope, name: bytes) -> str | None:
    raw = next((v for k, v in scope["headers"] if k == name), None)
    return None if raw is None else raw.decode("latin-1")


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    if length is not None and length.strip() not in ("", "0"):
        return True
    return _header(scope, b"transfer-encoding") is not None


def json_only(app: ASGIApp) -> ASGIApp:
    """``app`` refusing (415) a body that is not ``application/json`` (see the
    module's docstring)."""

    async def checked(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP and scope["method"] in STATE_CHANGING:
            kind = _header(scope, b"content-type")
            if kind is not None or _has_body(scope):
                media = (kind or "").partition(";")[0].strip().lower()
                if media != _JSON:
                    shown = f"{media!r}" if media else "none"
                    message = (
                        f"a request body must be {_JSON} (Content-Type: {shown}); "
                        "the node takes nothing else"
                    )
                    await send_refusal(
                        send, 415, ErrorCode.REJECTED_INPUT, message, field="Content-Type"
                    )
                    return
        await app(scope, receive, send)

    return checked


def guard_hosts(app: ASGIApp, hosts: AllowedHosts) -> ASGIApp:
    """``app`` answering only requests for one of ``hosts`` (421 otherwise;
    400 without a ``Host``), and refusing (403) a state-changing request from
    a page of another origin (see the module's docstring)."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["path"] in OPEN_PATHS:
            await app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if host is None:
            message = "the request names no Host (this node answers to its own address only)"
            await send_refusal(send, 400, ErrorCode.REJECTED_INPUT, message, field="Host")
            return
        if not hosts.allows(host):
            message = (
                f"this node does not answer to Host {host[:200]!r}: give its address, "
                "or start it with --allowed-host NAME"
            )
            await send_refusal(send, 421, ErrorCode.REJECTED_INPUT, message, field="Host")
            return
        origin = _header(scope, b"origin")
        if (
            origin is not None
            and scope["method"] in STATE_CHANGING
            and not hosts.allows_origin(origin)
        ):
            message = (
                f"a page of another origin ({origin[:200]!r}) may not change this node; "
                "a client that is not a browser sends no Origin"
            )
            await send_refusal(send, 403, ErrorCode.NOT_ALLOWED, message, field="Origin")
            return
        await app(scope, receive, send)

    return guarded


_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_ANSWERS = {
    "400": "A client mistake: the field is named",
    "415": "The body is not application/json (Content-Type is named)",
    "421": "The Host is not one this node answers to (its address, or an --allowed-host)",
}


def _answer(status: str) -> OpenAPIResponse:
    error_body = Reference(ref="#/components/schemas/ErrorBody")
    return OpenAPIResponse(
        description=_ANSWERS[status],
        content={_JSON: OpenAPIMediaType(schema=error_body)},
    )


def document_cross_site(app: Litestar, *, hosts_checked: bool) -> None:
    """Say in the OpenAPI document what these rules answer: 415 on every
    state-changing operation; when ``hosts_checked``, 400 and 421 on every
    operation but the probes (403 is documented on every state-changing one
    already)."""
    for path, item in (app.openapi_schema.paths or {}).items():
        for method in _METHODS:
            operation = getattr(item, method, None)
            if not isinstance(operation, Operation):
                continue
            responses = operation.responses if operation.responses is not None else {}
            operation.responses = responses
            wanted = ["415"] if method.upper() in STATE_CHANGING else []
            if hosts_checked and path not in OPEN_PATHS:
                wanted += ["400", "421"]
            for status in wanted:
                responses.setdefault(status, _answer(status))
