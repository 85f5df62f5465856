"""Assembling the node's ASGI app: the routes of every resource, the strict
body hook, the exception handlers, the OpenAPI description."""

from __future__ import annotations

from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig
from prometheus_client import CollectorRegistry

from sessiontree.cli.server._auth import document_auth, require_token
from sessiontree.cli.server._bodies import close_request_schemas, strict_body
from sessiontree.cli.server._chat import CHAT_ROUTES
from sessiontree.cli.server._contract import document_contract, fix_allow
from sessiontree.cli.server._conversations import CONVERSATION_ROUTES
from sessiontree.cli.server._cross_site import (
    AllowedHosts,
    document_cross_site,
    guard_hosts,
    json_only,
)
from sessiontree.cli.server._errors import EXCEPTION_HANDLERS
from sessiontree.cli.server._event_hub import EventHub
from sessiontree.cli.server._events import EVENT_ROUTES, HEARTBEAT
from sessiontree.cli.server._http_metrics import HttpMetrics
from sessiontree.cli.server._node import NODE_ROUTES, ROOT_ROUTES
from sessiontree.cli.server._recovery import RECOVERY_ROUTES
from sessiontree.cli.server._sessions import SESSION_ROUTES
from sessiontree.cli.server._shared import MAX_BODY_BYTES, MAX_WAIT, Metrics
from sessiontree.supervision import Node

__all__ = ["EVENT_QUEUE", "EVENT_RING", "create_app"]

EVENT_RING = 4096  # recent events /v1/events keeps for a resume
EVENT_QUEUE = 1024  # events one subscriber may fall behind before it is cut off

# the order of registration is the order of the paths in the OpenAPI document
_V1 = [
    *NODE_ROUTES,
    *SESSION_ROUTES,
    *CHAT_ROUTES,
    *CONVERSATION_ROUTES,
    *RECOVERY_ROUTES,
    *EVENT_ROUTES,
]


def create_app(
    node: Node,
    metrics: Metrics,
    *,
    name: str = "sessiontree",
    max_body: int = MAX_BODY_BYTES,
    max_wait: float = MAX_WAIT,
    event_ring: int = EVENT_RING,
    event_queue: int = EVENT_QUEUE,
    event_heartbeat: float = HEARTBEAT,
    token: str | None = None,
    allowed_hosts: AllowedHosts | None = None,
) -> Litestar:
    """The node's ASGI app. ``max_body`` caps request bodies (413 past it);
    ``max_wait`` caps a long-poll's wait in seconds (at most ``MAX_WAIT``).
    ``event_ring`` is how many recent events ``/v1/events`` keeps for
    resuming, ``event_queue`` how far one subscriber may fall behind before it
    is cut off, ``event_heartbeat`` the seconds of quiet before a keep-alive.
    ``token``: the bearer token every request but the health probes must
    carry (``_auth``; None: none). ``allowed_hosts``: the addresses the node
    answers to, every other ``Host`` and a state-changing request from a page
    of another ``Origin`` refused (``_cross_site``; None: not checked, for an
    app served in-process). A state-changing body that is not
    ``application/json`` is refused (415) whatever the options. With a
    ``metrics`` that has a ``registry`` (``NodeMetrics``), every request is
    counted and timed there and the
    process metrics join it (``_http_metrics``). The app listens to the
    node's events from now until it shuts down; it never shuts the node down
    itself: its owner does.

    Nothing is checked here that could fail at request time; a route whose
    signature Litestar cannot read fails here, at start-up (a ring or queue
    size below 1 is a ``ValueError``)."""
    hub = EventHub(node, ring_size=event_ring, queue_size=event_queue)
    app = Litestar(
        route_handlers=[*ROOT_ROUTES, Router("/v1", route_handlers=_V1)],
        state=State(
            {
                "node": node,
                "metrics": metrics,
                "name": name,
                "max_body": max_body,
                "max_wait": max_wait,
                "started_at": node.clock.time(),
                "events": hub,
                "event_heartbeat": event_heartbeat,
            }
        ),
        on_shutdown=[hub.close],
        before_request=strict_body,
        request_max_body_size=max_body,
        exception_handlers=EXCEPTION_HANDLERS,
        openapi_config=OpenAPIConfig(
            title="sessiontree node",
            version="1",
            description="Supervision of AI-agent session trees: sessions, chat routing, "
            "conversation trees.",
        ),
        debug=False,
        logging_config=None,  # the cli configures logging; Litestar's own starts a thread
    )
    close_request_schemas(app)
    document_contract(app, node.config.max_ttl)
    fix_allow(app)
    document_cross_site(app, hosts_checked=allowed_hosts is not None)
    # outermost first: every request timed, its Host and Origin checked, then
    # its token, then its body's type, all before routing
    handler = json_only(app.asgi_handler)
    if token is not None:
        document_auth(app)
        handler = require_token(handler, token)
    if allowed_hosts is not None:
        handler = guard_hosts(handler, allowed_hosts)
    registry = getattr(metrics, "registry", None)
    if isinstance(registry, CollectorRegistry):
        handler = HttpMetrics(registry).wrap(handler)
    app.asgi_handler = handler
    return app
