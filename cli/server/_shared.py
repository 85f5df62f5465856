"""What every resource of the HTTP API shares: the caps, the node and metrics
kept in the app's state, and the path parameter of a session id.

Nothing here answers a request; a handler that fails raises, and the
exception handlers of ``_errors`` turn that into a status and an
``ErrorBody``.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Protocol

from litestar import Request
from litestar.datastructures import State
from litestar.params import PathParameter

from sessiontree.protocol import MAX_CONTROL_BYTES
from sessiontree.supervision import Node

__all__ = ["MAX_BODY_BYTES", "MAX_WAIT", "Metrics", "Sid", "count_rejected", "node_of"]

MAX_BODY_BYTES = MAX_CONTROL_BYTES
MAX_WAIT = 60.0  # the longest a result long-poll may wait, in seconds

Sid = Annotated[uuid.UUID, PathParameter(description="The session's id.")]
"""A session id in a path: anything but a UUID is a 400 naming ``session_id``."""


class Metrics(Protocol):
    """What the API needs of the node's metrics (``supervision.NodeMetrics``)."""

    content_type: str

    def exposition(self) -> bytes: ...

    def rejected_input(self, reason: str) -> None: ...


def node_of(state: State) -> Node:
    """The node the app serves (``create_app`` puts it in the app's state)."""
    node: Node = state.node
    return node


def count_rejected(request: Request[Any, Any, State], reason: str) -> None:
    """Count a request the API refused, by ``reason``, when the app has metrics."""
    metrics: Metrics | None = request.app.state.get("metrics")
    if metrics is not None:
        metrics.rejected_input(reason)
