"""The node itself: liveness and readiness probes and the Prometheus metrics at
the root, what the node runs under ``/v1/node``.

``GET /readyz`` is a 503 ``node_closed`` once the node is closing or failed;
the other routes here answer as long as the process does (``/v1/node`` reads
a closing node off the event loop rather than refusing).
"""

from __future__ import annotations

import asyncio
from importlib import metadata

from litestar import Response, get
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from sessiontree.cli._wire import NodeStatus, plain_figures, settings_of
from sessiontree.cli.server._errors import ERRORS
from sessiontree.cli.server._listing import every_session
from sessiontree.cli.server._shared import Metrics, node_of
from sessiontree.protocol import SessionState
from sessiontree.supervision import recovery_summary

__all__ = ["NODE_ROUTES", "ROOT_ROUTES"]


@get("/healthz", tags=["node"], responses=ERRORS, sync_to_thread=False)
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@get("/readyz", tags=["node"], responses=ERRORS, sync_to_thread=False)
def readyz(state: State) -> dict[str, str]:
    """Readiness: 200 while the node takes work, 503 once it is closing or failed."""
    node = node_of(state)
    if node.closed:
        raise HTTPException(status_code=503, detail="the node is not taking work")
    return {"status": "ready"}


@get(
    "/metrics",
    tags=["node"],
    media_type="text/plain",
    responses={401: ERRORS[401]},  # with a token, Prometheus must send it too
    sync_to_thread=True,
)
def metrics_page(state: State) -> Response[bytes]:
    """The node's metrics in the Prometheus text format."""
    metrics: Metrics = state.metrics
    return Response(metrics.exposition(), media_type=metrics.content_type)


@get("/node", tags=["node"], responses=ERRORS)
async def node_status(state: State) -> NodeStatus:
    """What this node runs: agents, counters, configuration, store, and what
    recovery did at its start (``recovery``; null without a store). Sessions
    are counted by state over the index and the store (those that ended
    before a restart too).

    A failing store is a 503 ``store_failed``."""
    node = node_of(state)
    if node.closed:  # the awaitable twins refuse a closing node; read it off the loop
        stats = await asyncio.to_thread(node.stats)
    else:
        stats = await node.astats()
    by_state: dict[str, int] = {s.value: 0 for s in SessionState}
    for info in await every_session(node):
        by_state[info.state.value] += 1
    store = plain_figures(node.store.stats()) if node.store is not None else None
    return NodeStatus(
        node=state.name,
        version=metadata.version("sessiontree"),
        state="closing" if node.closed else "open",
        uptime_s=node.clock.time() - state.started_at,
        agents=sorted(node.agents),
        skills=node.skills,
        sessions=by_state,
        stats=stats,
        config=settings_of(node.config),
        store=store,
        replay_held=node.recovery.replay_held,
        wedged=node.store.count("wedged") if node.store is not None else 0,
        recovery=(
            recovery_summary(node.recovery.figures, node.recovery.replay_held)
            if node.store is not None
            else None
        ),
    )


ROOT_ROUTES = (healthz, readyz, metrics_page)
"""The probes and the metrics, served at the root."""
NODE_ROUTES = (node_status,)
"""Served under ``/v1``."""
