"""What ``sessiontree top`` reads from a node and asks of it, over the HTTP API.

``TopSource.fetch`` takes one snapshot: ``GET /v1/node``, the counters of
``GET /metrics`` and the trees (``GET /v1/sessions/{id}/tree`` of the root
followed, or of every Main). It blocks (call it off an event loop) and
raises ``NodeUnreachable`` or ``NodeRefused`` (both ``click.ClickException``)
when the node does not answer or refuses; counters the node cannot give
leave the rates unknown rather than failing the snapshot.

``TopSource.act`` asks the node to cancel, terminate, suspend or resume a
session and never raises for the node's answer: it returns what happened
as a sentence, an error one (``ok`` false) for a refusal, an unreachable
node, or a node that has no route for the action.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from sessiontree.cli._client import NodeClient, NodeRefused, NodeUnreachable
from sessiontree.cli.top._data import Counters, counters_of

__all__ = ["ACTIONS", "Outcome", "Snapshot", "TopSource"]

#: The actions on a session: the route under ``/v1/sessions/{id}/`` and what
#: the view says once the node took it.
ACTIONS: dict[str, tuple[str, str]] = {
    "cancel": ("cancel", "cancel requested"),
    "terminate": ("terminate", "termination requested"),
    "suspend": ("suspend", "suspension requested"),
    "resume": ("resume", "resumed"),
}
PAGE = 1000  # Mains per listing request


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One poll: the node (``/v1/node``), its trees (``/tree`` answers), its
    counters (None when ``/metrics`` could not be read) and when it was taken
    (epoch seconds of this machine)."""

    node: dict[str, Any]
    trees: list[dict[str, Any]]
    counters: Counters | None
    taken_at: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an action came to: ``ok`` and a sentence naming the session."""

    ok: bool
    message: str


class TopSource:
    """One node's API as ``top`` uses it. ``timeout`` bounds each request (s);
    ``clock`` gives the epoch seconds ages are counted at."""

    def __init__(
        self, url: str, *, timeout: float = 5.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.client = NodeClient(url, timeout=timeout)
        self._clock = clock

    @property
    def url(self) -> str:
        return self.client.url

    def close(self) -> None:
        self.client.close()

    def _mains(self) -> list[str]:
        ids: list[str] = []
        cursor: str | None = None
        while True:
            page = self.client.get("/v1/sessions", kind="main", limit=PAGE, cursor=cursor)
            ids += [str(info["session_id"]) for info in page["items"]]
            cursor = page.get("next_cursor")
            if not cursor:
                return ids

    def _counters(self) -> Counters | None:
        try:
            return counters_of(self.client.text("/metrics"))
        except (click.ClickException, ValueError):
            return None

    def fetch(self, root: str | None = None) -> Snapshot:
        """The node, the tree under ``root`` (every Main's tree when None) and
        the counters. ``NodeRefused`` (404 ``unknown_session``) for a root the
        node does not know; a Main that ends between the listing and its
        tree is left out."""
        node = self.client.get("/v1/node")
        trees: list[dict[str, Any]] = []
        if root is not None:
            trees.append(self.client.get(f"/v1/sessions/{root}/tree"))
        else:
            for main in self._mains():
                try:
                    trees.append(self.client.get(f"/v1/sessions/{main}/tree"))
                except NodeRefused as exc:
                    if exc.status != 404:
                        raise
        return Snapshot(node=node, trees=trees, counters=self._counters(), taken_at=self._clock())

    def act(self, action: str, session_id: str) -> Outcome:
        """``POST /v1/sessions/{id}/<action>``; ``KeyError`` for an action not in
        ``ACTIONS``. A 404 or 405 that is not about the session (the node has
        no such route: an older node) says so."""
        route, done = ACTIONS[action]
        short = session_id[:8]
        try:
            self.client.post(f"/v1/sessions/{session_id}/{route}")
        except NodeUnreachable as exc:
            return Outcome(ok=False, message=f"{action} {short}: {exc.message}")
        except NodeRefused as exc:
            if exc.status in (404, 405) and exc.error.get("code") != "unknown_session":
                return Outcome(
                    ok=False,
                    message=f"{action} {short}: this node has no {action} route "
                    f"(POST /v1/sessions/{{id}}/{route} answered {exc.status}); "
                    "it needs a newer node",
                )
            return Outcome(ok=False, message=f"{action} {short} refused: {exc.message}")
        return Outcome(ok=True, message=f"{short}: {done}")
