"""Bearer-token authentication of a node's HTTP API (``node start
--token-file``).

With a token, every request but the health probes (``/healthz``,
``/readyz``: a load balancer or kubelet asks them without credentials) must
carry ``Authorization: Bearer <token>`` (the scheme in any case, as RFC
9110 says: ``bearer`` too); ``/metrics`` is no exception
(Prometheus sends one with ``authorization: {credentials_file: …}``), nor
is the OpenAPI document. Anything else is a 401 ``not_allowed`` with
``WWW-Authenticate: Bearer``, answered before routing, so it says nothing
of which paths exist. The comparison takes the same time whatever the
token sent (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.openapi.spec import Components, Operation, SecurityScheme
from litestar.types import (
    ASGIApp,
    Receive,
    Scope,
    Send,
)

from sessiontree.cli.server._refusal import send_refusal
from sessiontree.protocol import ErrorCode

__all__ = ["OPEN_PATHS", "document_auth", "require_token"]

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
"""The paths answered without a token: the liveness and readiness probes."""

_SCHEME = "bearer"


def _credentials(header: bytes) -> bytes:
    """The token of an ``Authorization`` value whose scheme is ``Bearer`` in any
    case (RFC 9110 §11.1), spaces after the scheme skipped; b"" for another
    scheme or none (which no token equals)."""
    scheme, _, rest = header.partition(b" ")
    return rest.lstrip(b" ") if scheme.lower() == b"bearer" else b""


def require_token(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` answering only requests that carry ``token`` as a bearer token
    (the health probes excepted). ``ValueError`` for an empty token."""
    if not token:
        msg = "the bearer token is empty"
        raise ValueError(msg)
    expected = token.encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["path"] in OPEN_PATHS:
            await app(scope, receive, send)
            return
        sent = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if sent is not None and hmac.compare_digest(_credentials(sent), expected):
            await app(scope, receive, send)
            return
        reason = (
            "this node requires a bearer token (Authorization: Bearer …)"
            if sent is None
            else "the bearer token is not this node's"
        )
        await send_refusal(
            send,
            401,
            ErrorCode.NOT_ALLOWED,
            reason,
            headers=[(b"www-authenticate", b'Bearer realm="sessiontree"')],
        )

    return guarded


def document_auth(app: Litestar) -> None:
    """Say in the OpenAPI document that every operation but the probes wants
    a bearer token."""
    schema = app.openapi_schema
    components = schema.components or Components()
    schema.components = components
    components.security_schemes = {
        **(components.security_schemes or {}),
        _SCHEME: SecurityScheme(
            type="http", scheme="bearer", description="The token of node start --token-file."
        ),
    }
    schema.security = [{_SCHEME: []}]
    for path in OPEN_PATHS:
        item = (schema.paths or {}).get(path)
        op = item.get if item is not None else None
        if isinstance(op, Operation):
            op.security = []
