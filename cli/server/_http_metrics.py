"""Metrics of the HTTP API itself, on the node's registry: every request
counted and timed by route template, method and status class, plus the
standard process and platform metrics of ``prometheus_client``.

- ``sessiontree_http_requests_total{route,method,status_class}``
- ``sessiontree_http_request_duration_seconds{route,method,status_class}``
  (a histogram, from the request's arrival to the end of its response)
- ``process_*`` (CPU, memory, open files, start time) and
  ``python_info``.

``route`` is the path template (``/v1/sessions/{session_id}``), never a
concrete path, and ``unmatched`` for a path no route serves (404) or a
request refused before routing (401); ``method`` is one of the HTTP methods
or ``other``. The label sets are bounded by the routes, so a client cannot
grow them. A request the client abandons is counted with the status it was
being answered with, or ``5xx`` if none was sent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

__all__ = ["HttpMetrics"]

log = logging.getLogger("sessiontree.api")

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# a request is answered in about a millisecond; a long-poll waits up to a minute
_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip


class HttpMetrics:
    """The HTTP families on ``registry``; ``wrap`` instruments an ASGI app.

    The process and platform collectors join the registry unless it has them
    already (the global registry does). ``ValueError`` if the HTTP families
    are registered there already (two apps on one registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sessiontree_http_requests",
            "HTTP requests answered, by route template, method and status class.",
            ["route", "method", "status_class"],
            registry=registry,
        )
        self.duration = Histogram(
            "sessiontree_http_request_duration_seconds",
            "Time from an HTTP request's arrival to the end of its response.",
            ["route", "method", "status_class"],
            buckets=_BUCKETS,
            registry=registry,
        )
        for collector in (ProcessCollector, PlatformCollector):
            try:
                collector(registry=registry)
            except ValueError:  # already there (the global registry has them)
                continue

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with every HTTP request counted and timed (see the module)."""

        async def instrumented(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            started = time.perf_counter()
            status = 0

            async def sending(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                await send(message)

            try:
                await app(scope, receive, sending)
            finally:
                self._observe(scope, status, time.perf_counter() - started)

        return instrumented

    def _observe(self, scope: Any, status: int, seconds: float) -> None:
        route = scope.get("path_template") or "unmatched"
        method = scope.get("method", "")
        labels = (
            route,
            method if method in _METHODS else "other",
            f"{status // 100}xx" if 100 <= status < 600 else "5xx",
        )
        self.requests.labels(*labels).inc()
        self.duration.labels(*labels).observe(seconds)
