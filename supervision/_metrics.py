"""Prometheus metrics of one node: ``NodeMetrics``, a registry per node.

Two sources feed it. The node's event stream (``Node.events``) drives the
counters and histograms of the tree — spawns, terminations, forced ends, TTL
expiries, durations, grace wrap-ups, result delivery — and the count of
sessions by kind and state, all kept on the Cortex thread as the events
happen (``_metric_tracking``); the session families are also labelled by
agent and skill. Figures that are state rather than history
(compute slots, limits, zombies, the Cortex's mailbox, the store's map) and
the tallies the node keeps itself (budget warnings and exhaustions, model
calls, tokens and cost) are read when Prometheus scrapes, by a collector of
our own (``_metric_sections``). The families' names, help texts, labels and
buckets are in ``_metric_families``.

Names follow the Prometheus conventions: the ``sessiontree_`` prefix, base
units (seconds, bytes), ``_total`` on counters. Labels come from fixed sets
(kinds, states, error codes, reject reasons, and the agents and skills the
node was started with) and every combination exists from the start, so the
series a node exposes never change with its workload; no session or parent
id, task or other caller input is ever a label. An agent with n skills adds
1 + 2n (kind, agent, skill) series to each session family (its Mains run
its main skill; its Branches and Workers any skill). Model calls are labelled by agent, model
and tier: the agents' tier maps exist from the start, and a model a skill
names beyond them adds a label set, up to ``max_model_series``, past which
the rest are counted under ``other`` (``_metric_models``).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sessiontree.protocol import SessionInfo, SessionTreeError
from sessiontree.supervision._metric_families import REJECT_REASONS, Families
from sessiontree.supervision._metric_sections import Only, ScrapeCollector
from sessiontree.supervision._metric_tracking import TreeTracker

if TYPE_CHECKING:
    from sessiontree.supervision._node import Node

__all__ = ["MAX_MODEL_SERIES", "REJECT_REASONS", "NodeMetrics"]

#: How many (agent, model, tier) label sets the model-call families expose by
#: default before folding the rest into ``other``.
MAX_MODEL_SERIES = 64

log = logging.getLogger("sessiontree.metrics")


class NodeMetrics:
    """The Prometheus metrics of one ``Node``, in a registry of their own.

    ``registry``: where to register (a new ``CollectorRegistry`` when None);
    ``max_model_series``: how many (agent, model, tier) label sets the model-call
    families expose before every further one is counted under ``other``
    (``ValueError`` below 1);
    two ``NodeMetrics`` on one registry clash (``ValueError``, duplicated
    series), and the registry is left as it was. Create it right after the
    node: sessions that already exist are counted from a snapshot of the tree
    (``Node.sessions``); their spawns are not. Call ``close()`` when done.

    The event observer runs on the Cortex thread (a few dict lookups and
    counter increments per event); commit figures arrive on the store's
    writer thread; ``exposition()`` may be called from any thread and never
    raises (what cannot be read is logged and left out of that scrape). It
    asks the Cortex for its figures and waits up to 2 s for them, so call it
    off an event loop.
    """

    def __init__(
        self,
        node: Node,
        registry: CollectorRegistry | None = None,
        *,
        max_model_series: int = MAX_MODEL_SERIES,
    ) -> None:
        if not isinstance(max_model_series, int) or max_model_series < 1:
            msg = f"max_model_series must be an int >= 1, got {max_model_series!r}"
            raise ValueError(msg)
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        self.content_type: str = CONTENT_TYPE_LATEST
        self._closed = False
        self._close_lock = threading.Lock()

        self._metrics: list[Any] = []  # what this node registered, in order
        try:
            families = Families(self.registry, self._metrics, node._runtime.agents.values())
            self._tracker = TreeTracker(node.clock, families)
            collector = ScrapeCollector(node, self._tracker, max_model_series)
            self.registry.register(collector)
            self._metrics.append(collector)
        except BaseException:  # a clash on a shared registry: leave it as it was
            self._unregister()
            raise
        self._unsubscribe = node.events.subscribe(self._tracker.on_event)
        self._unhook_store = (
            node.store.observe_commits(self._tracker.on_commit) if node.store is not None else None
        )
        self._seed()

    def _seed(self) -> None:
        """Count the sessions that existed before we subscribed (a failed snapshot
        is logged; the counts then come from events only)."""
        infos: list[SessionInfo]
        try:
            infos = self.node.sessions()
        except SessionTreeError as exc:
            log.warning("metrics: no snapshot of the tree (%r); counting from events only", exc)
            infos = []
        self._tracker.seed(infos)

    def _unregister(self) -> None:
        for metric in self._metrics:
            try:
                self.registry.unregister(metric)
            except KeyError:  # already taken out by the registry's owner
                continue

    # -- the public surface ---------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format. Never raises: a family that
        cannot be read is logged and skipped; should another collector on a shared
        registry raise, only this node's metrics are rendered."""
        try:
            return generate_latest(self.registry)
        except Exception:
            log.exception("metrics: the registry could not be rendered; this node's only")
            return generate_latest(Only(self._metrics))

    def rejected_input(self, reason: str) -> None:
        """Count one untrusted input refused before it reached the node, under
        ``reason`` (one of ``REJECT_REASONS``; anything else counts as ``other``).
        Input that ``Node.control`` or ``Node.route`` refuse is counted by the node
        itself (reason ``refused_by_node``): do not report it again. Any thread."""
        self._tracker.reject(reason)

    def close(self) -> None:
        """Stop observing the node and its store, and take this node's metrics out
        of the registry (their names are free again). Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._unsubscribe()
        if self._unhook_store is not None:
            self._unhook_store()
        self._unregister()
