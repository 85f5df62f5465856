"""The HTTP server of a standalone node: Litestar on uvicorn, msgspec on the wire.

Root: ``/healthz``, ``/readyz``, ``/metrics`` and ``/schema/openapi.json``;
everything else is versioned under ``/v1``. Every request body is decoded by
our strict codec (byte cap, nesting cap, unknown fields refused, nothing
coerced) in a ``before_request`` hook, before the framework's own decoding
sees it; a body over the cap is refused from its ``Content-Length`` or while
it streams, never decoded. Every client mistake is a 4xx ``ErrorBody``
naming the field or session and an ``ErrorCode``; an unexpected exception is
logged and answered 500 without touching the node.

One module a resource, each route a plainly decorated handler with its full
path:

- ``_node``: ``/healthz``, ``/readyz``, ``/metrics``, ``/v1/node``
- ``_sessions``: ``/v1/sessions`` and ``/v1/sessions/{id}/…`` (spawn,
  control, messages, results)
- ``_chat``: ``/v1/route``
- ``_events``: ``/v1/events`` (server-sent events), fed by ``_event_hub``
- ``_conversations``: ``/v1/sessions/{id}/conversation/…``
- ``_errors``: ``ErrorCode`` → HTTP status, the documented error responses,
  the exception handlers
- ``_bodies``: the strict body hook and the request schemas' closing
- ``_auth``: the bearer token; ``_cross_site``: the ``Content-Type``,
  ``Host`` and ``Origin`` rules that keep a web page from driving the node
- ``_shared``: the caps, the node and metrics in the app's state
- ``_app``: ``create_app``, which assembles them
- ``_connections``: the server's timeouts and connection cap (uvicorn's side)
"""

from sessiontree.cli.server._app import EVENT_QUEUE, EVENT_RING, create_app
from sessiontree.cli.server._cross_site import AllowedHosts, parse_authority
from sessiontree.cli.server._errors import status_for
from sessiontree.cli.server._shared import MAX_BODY_BYTES, MAX_WAIT

__all__ = [
    "EVENT_QUEUE",
    "EVENT_RING",
    "MAX_BODY_BYTES",
    "MAX_WAIT",
    "AllowedHosts",
    "create_app",
    "parse_authority",
    "status_for",
]
