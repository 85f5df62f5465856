"""Prometheus metrics of one node: ``NodeMetrics``, a registry per node.

Two sources feed it. The node's event stream (``Node.events``) drives the
counters and histograms of the tree — spawns, terminations, forced ends, TTL
expiries, durations, grace wrap-ups, result delivery — and the count of
sessions by kind and state, all kept on the Cortex thread as the events
happen. Figures that are state rather than history (compute slots, limits,
zombies, the Cortex's mailbox, the store's map) are read when Prometheus
scrapes, by a collector of our own.

Names follow the Prometheus conventions: the ``sessiontree_`` prefix, base
units (seconds, bytes), ``_total`` on counters. Labels come from fixed sets
(kinds, states, error codes, reject reasons) and every combination exists from
the start, so the series a node exposes never change with its workload; no
session or parent id is ever a label.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sessiontree.protocol import ErrorCode, SessionKind, SessionState, SessionTreeError
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._requests import GetStats

if TYPE_CHECKING:
    from sessiontree.supervision._node import Node

__all__ = ["REJECT_REASONS", "NodeMetrics"]

log = logging.getLogger("sessiontree.metrics")

#: Why untrusted input was refused before it reached the node, the label values
#: of ``sessiontree_rejected_inputs_total`` (``NodeMetrics.rejected_input``).
#: Any other reason is counted as ``other``, so the label set stays bounded.
REJECT_REASONS: tuple[str, ...] = (
    "invalid_field",
    "malformed",
    "too_deep",
    "too_large",
    "unknown_agent",
    "unknown_field",
    "unknown_session",
    "unsupported_media_type",
    "other",
)
#: The reason under which the node's own refusals (``Node.rejected_input``:
#: ``Node.control`` and ``Node.route``) appear in the same family.
_NODE_REASON = "refused_by_node"

_KINDS: tuple[str, ...] = tuple(kind.value for kind in SessionKind)
_LIVE_STATES: tuple[str, ...] = tuple(s.value for s in SessionState if not s.is_terminal)
_END_STATES: tuple[str, ...] = tuple(s.value for s in SessionState if s.is_terminal)
_END_SET = frozenset(_END_STATES)
_CODES: tuple[str, ...] = tuple(code.value for code in ErrorCode)
_GRACE_OUTCOMES = ("wrapped_up", "forced", "expired")

_FORCED = ErrorCode.TERMINATED_BY_FORCE.value
_TTL_EXPIRED = ErrorCode.TTL_EXPIRED.value
_EXPIRED = SessionState.EXPIRED.value

# Branches live up to 30 min and workers 5 min by default (TTLs run to a week);
# mains live for days.
_DURATION_BUCKETS = (
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    4 * 3600.0, 24 * 3600.0, 7 * 24 * 3600.0,
)  # fmt: skip
# The default grace is 30 s: a wrap-up at exactly 30 s is the deadline.
_GRACE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# State change to delivery happens in one Cortex handler: sub-millisecond.
_DELIVERY_BUCKETS = (
    0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0,
)  # fmt: skip
# One fsync'd commit costs ~1 ms on a local disk.
_COMMIT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.125, 0.25,
    0.5, 1.0,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # the writer caps at 2048

# A result is delivered in the same Cortex handler that ended its session, so
# this bound is only reached when an ended session's result is never delivered
# (a parent unknown after a restart); the oldest are dropped then.
_MAX_UNDELIVERED = 4096
# How long a scrape waits for the Cortex's figures before skipping them.
_STATS_TIMEOUT = 2.0


@dataclass(slots=True)
class _Tracked:
    """What the metrics keep of one session until it ends."""

    kind: str
    state: str
    started: float | None  # the node's monotonic clock at spawn; None if unknown
    created_at: float | None  # wall clock, for sessions spawned before this process
    cancel_at: float | None = None  # monotonic, when cancellation was requested


# name -> (type, help, label names) of the families read at scrape time
_SCRAPED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "sessiontree_sessions": (
        "gauge",
        "Sessions not yet ended, by kind and state.",
        ("kind", "state"),
    ),
    "sessiontree_compute_slots_in_use": ("gauge", "Compute slots held by running skills.", ()),
    "sessiontree_compute_slots_waiting": ("gauge", "Sessions queued for a compute slot.", ()),
    "sessiontree_cortex_mailbox_depth": ("gauge", "Messages queued for the Cortex.", ()),
    "sessiontree_work_in_flight": (
        "gauge",
        "Messages queued or being handled by any actor, plus running skills.",
        (),
    ),
    "sessiontree_node_failed": ("gauge", "1 once the Cortex failed and the node refuses work.", ()),
    "sessiontree_compute_slots_limit": (
        "gauge",
        "Limit on skills running at once (max_running_skills).",
        (),
    ),
    "sessiontree_step_threads_limit": (
        "gauge",
        "Limit on threads for sync skills, zombies included (max_step_threads).",
        (),
    ),
    "sessiontree_sessions_limit": ("gauge", "Limit on live sessions (max_sessions).", ()),
    "sessiontree_zombie_threads_limit": (
        "gauge",
        "Limit on abandoned skill threads before spawns are refused (max_zombies).",
        (),
    ),
    "sessiontree_grace_period_seconds": (
        "gauge",
        "Time a cancelled session has to wrap up before it is terminated by force.",
        (),
    ),
    "sessiontree_retries": (
        "counter",
        "Failed attempts of coordination patterns that were retried as fresh sessions.",
        (),
    ),
    "sessiontree_retry_escalations": (
        "counter",
        "Retries refused at the restart intensity limit (the pattern escalated).",
        (),
    ),
    "sessiontree_rejected_inputs": (
        "counter",
        f"Untrusted inputs refused, by reason ({_NODE_REASON}: by Node.control or Node.route).",
        ("reason",),
    ),
    "sessiontree_zombie_threads": (
        "gauge",
        "Threads of sync skills terminated by force that have not returned yet.",
        (),
    ),
    "sessiontree_step_threads": ("gauge", "Threads held by live sessions' sync skills.", ()),
    "sessiontree_indexed_sessions": (
        "gauge",
        "Sessions in the Cortex's index, retained ended ones included.",
        (),
    ),
    "sessiontree_result_waiters": ("gauge", "Callers waiting for a session's result.", ()),
    "sessiontree_session_mailbox_depth": (
        "gauge",
        "Messages queued in the mailboxes of all session actors.",
        (),
    ),
    "sessiontree_rejected_messages": (
        "counter",
        "Messages the Cortex or a session actor did not take.",
        (),
    ),
    "sessiontree_fenced_refusals": (
        "counter",
        "Results, writes, spawns or messages of fenced sessions that were refused.",
        (),
    ),
    "sessiontree_stuck_flags": (
        "counter",
        "Sessions flagged as stuck (no checkpoint for stuck_after).",
        (),
    ),
    "sessiontree_main_cycles_failed": ("counter", "Message cycles of mains that raised.", ()),
    "sessiontree_store_write_errors": (
        "counter",
        "Store writes of the Cortex that were refused or failed.",
        (),
    ),
    "sessiontree_store_map_used_bytes": ("gauge", "Bytes of the LMDB map in use.", ()),
    "sessiontree_store_map_size_bytes": ("gauge", "Size of the LMDB map.", ()),
    "sessiontree_store_readers": ("gauge", "LMDB reader slots in use.", ()),
    "sessiontree_store_commit_errors": ("counter", "Store commits that failed.", ()),
    "sessiontree_store_map_full": (
        "counter",
        "Store writes refused because the map was full.",
        (),
    ),
}


def _family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    kind, doc, labels = _SCRAPED[name]
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


def _single(name: str, value: float) -> GaugeMetricFamily | CounterMetricFamily:
    family = _family(name)
    family.add_metric((), value)
    return family


class _Collector:
    """The families read at scrape time. Each section is read whole or skipped:
    a section that raises is logged and left out of that scrape."""

    def __init__(self, sections: Iterable[Callable[[], Iterable[Metric]]]) -> None:
        self._sections = tuple(sections)

    def describe(self) -> list[Metric]:
        return [_family(name) for name in _SCRAPED]

    def collect(self) -> Iterator[Metric]:
        for section in self._sections:
            try:
                families = list(section())
            except SessionTreeError as exc:  # a closed node or store, a busy Cortex
                log.warning("metrics: %s skipped: %s", section.__name__, exc)
                continue
            except Exception:
                log.warning(
                    "metrics: %s failed; its families are skipped", section.__name__, exc_info=True
                )
                continue
            yield from families


class _Only:
    """A registry stand-in that collects just the given collectors."""

    def __init__(self, collectors: Iterable[Any]) -> None:
        self._collectors = tuple(collectors)

    def collect(self) -> Iterator[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


class NodeMetrics:
    """The Prometheus metrics of one ``Node``, in a registry of their own.

    ``registry``: where to register (a new ``CollectorRegistry`` when None);
    two ``NodeMetrics`` on one registry clash (``ValueError``, duplicated
    series). Create it right after the node: sessions that already exist are
    counted from a snapshot of the tree (``Node.sessions``); their spawns are
    not. Call ``close()`` when done.

    The event observer runs on the Cortex thread (a few dict lookups and
    counter increments per event); commit figures arrive on the store's
    writer thread; ``exposition()`` may be called from any thread and never
    raises (what cannot be read is logged and left out of that scrape). It
    asks the Cortex for its figures and waits up to 2 s for them, so call it
    off an event loop.
    """

    def __init__(self, node: Node, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        self.content_type: str = CONTENT_TYPE_LATEST
        self._clock = node.clock
        self._lock = threading.Lock()
        self._live: dict[uuid.UUID, _Tracked] = {}
        self._counts: dict[tuple[str, str], int] = {
            (kind, state): 0 for kind in _KINDS for state in _LIVE_STATES
        }
        self._ended_at: dict[uuid.UUID, float] = {}  # ended, result not yet delivered
        self._seeding = True
        self._ended_early: set[uuid.UUID] = set()  # ended while the snapshot was read
        self._rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self._closed = False
        self._close_lock = threading.Lock()

        self._metrics: list[Any] = []  # what this node registered, in order
        try:
            self._register(self.registry)
        except BaseException:  # a clash on a shared registry: leave it as it was
            self._unregister()
            raise
        self._handlers: dict[EventKind, Callable[[Event], None]] = {
            EventKind.SPAWNED: self._on_spawned,
            EventKind.TRANSITION: self._on_transition,
            EventKind.CANCEL_REQUESTED: self._on_cancel,
            EventKind.RESULT_DELIVERED: self._on_delivered,
            EventKind.REJECTED: self._on_rejected,
            EventKind.DISCARDED: self._on_discarded,
        }
        self._unsubscribe = node.events.subscribe(self._on_event)
        self._unhook_store = (
            node.store.observe_commits(self._on_commit) if node.store is not None else None
        )
        self._seed()

    def _register(self, r: CollectorRegistry) -> None:
        """Create this node's metrics in ``r``; ``ValueError`` if a name is taken."""
        spawned = self._add(
            Counter("sessiontree_sessions_spawned", "Sessions created.", ["kind"], registry=r)
        )
        restored = self._add(
            Counter(
                "sessiontree_sessions_restored",
                "Sessions brought back from the store after a restart.",
                ["kind"],
                registry=r,
            )
        )
        rejections = self._add(
            Counter(
                "sessiontree_spawn_rejections",
                "Spawns refused, by error code.",
                ["code"],
                registry=r,
            )
        )
        terminated = self._add(
            Counter(
                "sessiontree_sessions_terminated",
                "Sessions that ended, by kind and final state.",
                ["kind", "state"],
                registry=r,
            )
        )
        forced = self._add(
            Counter(
                "sessiontree_forced_terminations",
                "Sessions still running at their cancellation deadline, terminated by force.",
                ["kind"],
                registry=r,
            )
        )
        expired = self._add(
            Counter(
                "sessiontree_ttl_expirations",
                "Sessions that outlived their TTL.",
                ["kind"],
                registry=r,
            )
        )
        duration = self._add(
            Histogram(
                "sessiontree_session_duration_seconds",
                "Lifetime of ended sessions, from creation to their final state.",
                ["kind"],
                buckets=_DURATION_BUCKETS,
                registry=r,
            )
        )
        grace = self._add(
            Histogram(
                "sessiontree_grace_wrap_up_duration_seconds",
                "From a cancellation request to the session's end, by how it ended.",
                ["outcome"],
                buckets=_GRACE_BUCKETS,
                registry=r,
            )
        )
        self._delivery = self._add(
            Histogram(
                "sessiontree_result_delivery_latency_seconds",
                "From a session's final state to its result reaching its parent.",
                buckets=_DELIVERY_BUCKETS,
                registry=r,
            )
        )
        self._commit_seconds = self._add(
            Histogram(
                "sessiontree_store_commit_duration_seconds",
                "Duration of one store commit, puts to durable.",
                buckets=_COMMIT_BUCKETS,
                registry=r,
            )
        )
        self._commit_batches = self._add(
            Histogram(
                "sessiontree_store_commit_batches",
                "Write batches that shared one store commit.",
                buckets=_BATCH_BUCKETS,
                registry=r,
            )
        )
        # Every label combination exists from the start (and the hot path skips
        # the label lookup): the series never change with the workload.
        self._spawned = {kind: spawned.labels(kind) for kind in _KINDS}
        self._restored = {kind: restored.labels(kind) for kind in _KINDS}
        self._rejections = {code: rejections.labels(code) for code in _CODES}
        self._terminated = {
            (kind, state): terminated.labels(kind, state)
            for kind in _KINDS
            for state in _END_STATES
        }
        self._forced = {kind: forced.labels(kind) for kind in _KINDS}
        self._expired = {kind: expired.labels(kind) for kind in _KINDS}
        self._duration = {kind: duration.labels(kind) for kind in _KINDS}
        self._grace = {outcome: grace.labels(outcome) for outcome in _GRACE_OUTCOMES}

        self._collector = _Collector(
            (
                self._sessions_section,
                self._slots_section,
                self._activity_section,
                self._limits_section,
                self._retries_section,
                self._rejected_section,
                self._cortex_section,
                self._store_section,
            )
        )
        r.register(self._collector)
        self._metrics.append(self._collector)

    def _unregister(self) -> None:
        for metric in self._metrics:
            try:
                self.registry.unregister(metric)
            except KeyError:  # already taken out by the registry's owner
                continue

    def _add(self, metric: Any) -> Any:
        self._metrics.append(metric)
        return metric

    # -- the public surface ---------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format. Never raises: a family that
        cannot be read is logged and skipped; should another collector on a shared
        registry raise, only this node's metrics are rendered."""
        try:
            return generate_latest(self.registry)
        except Exception:
            log.exception("metrics: the registry could not be rendered; this node's only")
            return generate_latest(_Only(self._metrics))

    def rejected_input(self, reason: str) -> None:
        """Count one untrusted input refused before it reached the node, under
        ``reason`` (one of ``REJECT_REASONS``; anything else counts as ``other``).
        Input that ``Node.control`` or ``Node.route`` refuse is counted by the node
        itself (reason ``refused_by_node``): do not report it again. Any thread."""
        key = reason if reason in self._rejected else "other"
        with self._lock:
            self._rejected[key] += 1

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

    # -- seeding --------------------------------------------------------------------

    def _seed(self) -> None:
        """Count the sessions that existed before we subscribed. Events seen since
        subscribing are newer than or as new as the snapshot, so they win."""
        try:
            infos = self.node.sessions()
        except SessionTreeError as exc:
            log.warning("metrics: no snapshot of the tree (%r); counting from events only", exc)
            infos = []
        with self._lock:
            for info in infos:
                sid = info.session_id
                tracked = self._live.get(sid)
                if tracked is not None:
                    if tracked.started is None and tracked.created_at is None:
                        tracked.created_at = info.created_at
                    continue
                if info.state.is_terminal or sid in self._ended_early:
                    continue
                key = (info.kind.value, info.state.value)
                if key not in self._counts:
                    continue
                self._live[sid] = _Tracked(key[0], key[1], None, info.created_at)
                self._counts[key] += 1
            self._seeding = False
            self._ended_early.clear()

    # -- events (the Cortex thread) ----------------------------------------------------

    def _on_event(self, event: Event) -> None:
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event)

    def _on_spawned(self, event: Event) -> None:
        sid, kind, state = event.session_id, event.session_kind, event.state
        if sid is None or kind is None or state is None or (kind, state) not in self._counts:
            return
        restored = bool(event.data.get("restored"))
        if restored:
            created = event.data.get("created_at")
            at = float(created) if isinstance(created, int | float) else None
            tracked = _Tracked(kind, state, None, at)
        else:
            tracked = _Tracked(kind, state, self._clock.monotonic(), None)
        with self._lock:
            old = self._live.get(sid)
            if old is not None:  # a dormant Main from the snapshot, now brought back
                self._counts[(old.kind, old.state)] -= 1
            self._live[sid] = tracked
            self._counts[(kind, state)] += 1
        (self._restored if restored else self._spawned)[kind].inc()

    def _on_transition(self, event: Event) -> None:
        sid, state = event.session_id, event.state
        if sid is None or state is None:
            return
        ending = state in _END_SET
        with self._lock:
            tracked = self._live.get(sid)
            if tracked is None:  # it existed before we subscribed
                kind = event.session_kind
                if kind is None:
                    return
                if ending:
                    if self._seeding:
                        self._ended_early.add(sid)
                elif (kind, state) in self._counts:
                    self._live[sid] = _Tracked(kind, state, None, None)
                    self._counts[(kind, state)] += 1
                    return
                else:
                    return
            else:
                kind = tracked.kind
                self._counts[(kind, tracked.state)] -= 1
                if not ending:
                    tracked.state = state
                    self._counts[(kind, state)] += 1
                    return
                del self._live[sid]
        self._ended(event, sid, kind, state, tracked)

    def _ended(
        self, event: Event, sid: uuid.UUID, kind: str, state: str, tracked: _Tracked | None
    ) -> None:
        now = self._clock.monotonic()
        self._terminated[(kind, state)].inc()
        code = event.code
        if code == _FORCED:
            self._forced[kind].inc()
        elif code == _TTL_EXPIRED:
            self._expired[kind].inc()
        if event.parent_id is not None:
            pending = self._ended_at
            if len(pending) >= _MAX_UNDELIVERED:
                del pending[next(iter(pending))]
            pending[sid] = now
        if tracked is None:
            return
        if tracked.started is not None:
            self._duration[kind].observe(max(0.0, now - tracked.started))
        elif tracked.created_at is not None:
            self._duration[kind].observe(max(0.0, event.at - tracked.created_at))
        if tracked.cancel_at is not None:
            if code == _FORCED:
                outcome = "forced"
            elif state == _EXPIRED:
                outcome = "expired"
            else:
                outcome = "wrapped_up"
            self._grace[outcome].observe(max(0.0, now - tracked.cancel_at))

    def _on_cancel(self, event: Event) -> None:
        sid = event.session_id
        tracked = self._live.get(sid) if sid is not None else None
        if tracked is not None and tracked.cancel_at is None:
            tracked.cancel_at = self._clock.monotonic()

    def _on_delivered(self, event: Event) -> None:
        sid = event.session_id
        ended = self._ended_at.pop(sid, None) if sid is not None else None
        if ended is not None:
            self._delivery.observe(max(0.0, self._clock.monotonic() - ended))

    def _on_rejected(self, event: Event) -> None:
        child = self._rejections.get(event.code or "")
        if child is not None:
            child.inc()

    def _on_discarded(self, event: Event) -> None:
        sid = event.session_id
        if sid is None:
            return
        with self._lock:
            tracked = self._live.pop(sid, None)
            if tracked is not None:
                self._counts[(tracked.kind, tracked.state)] -= 1

    # -- the store's writer thread ---------------------------------------------------

    def _on_commit(self, seconds: float, batches: int) -> None:
        self._commit_seconds.observe(seconds)
        self._commit_batches.observe(batches)

    # -- scrape time (any thread) --------------------------------------------------------

    def _sessions_section(self) -> Iterator[Metric]:
        with self._lock:
            counts = list(self._counts.items())
        family = _family("sessiontree_sessions")
        for (kind, state), value in counts:
            family.add_metric((kind, state), value)
        yield family

    def _slots_section(self) -> Iterator[Metric]:
        slots = self.node._runtime.slots
        yield _single("sessiontree_compute_slots_in_use", slots.in_use)
        yield _single("sessiontree_compute_slots_waiting", slots.waiting)

    def _activity_section(self) -> Iterator[Metric]:
        inbox = self.node._cortex.actor_inbox
        if isinstance(inbox, queue.Queue):  # a threading actor's; other kinds cannot tell
            yield _single("sessiontree_cortex_mailbox_depth", inbox.qsize())
        yield _single("sessiontree_work_in_flight", max(0, self.node.activity.busy))
        yield _single("sessiontree_node_failed", 1 if self.node.failure is not None else 0)

    def _limits_section(self) -> Iterator[Metric]:
        config = self.node.config
        yield _single("sessiontree_compute_slots_limit", config.max_running_skills)
        yield _single("sessiontree_step_threads_limit", config.max_step_threads)
        yield _single("sessiontree_sessions_limit", config.max_sessions)
        yield _single("sessiontree_zombie_threads_limit", config.max_zombies)
        yield _single("sessiontree_grace_period_seconds", config.grace)

    def _retries_section(self) -> Iterator[Metric]:
        restarts = self.node._restarts
        yield _single("sessiontree_retries", restarts.retries)
        yield _single("sessiontree_retry_escalations", restarts.escalations)

    def _rejected_section(self) -> Iterator[Metric]:
        with self._lock:
            counts = list(self._rejected.items())
        family = _family("sessiontree_rejected_inputs")
        for reason, value in counts:
            family.add_metric((reason,), value)
        family.add_metric((_NODE_REASON,), self.node.rejected_input)
        yield family

    def _cortex_section(self) -> Iterator[Metric]:
        """The Cortex's own figures: one call to it, bounded by ``_STATS_TIMEOUT``."""
        stats: dict[str, int] = self.node._call(GetStats(), check=False, timeout=_STATS_TIMEOUT)
        yield _single("sessiontree_zombie_threads", stats.get("zombies", 0))
        yield _single("sessiontree_step_threads", stats.get("sync_threads", 0))
        yield _single("sessiontree_indexed_sessions", stats.get("indexed_sessions", 0))
        yield _single("sessiontree_result_waiters", stats.get("result_waiters", 0))
        yield _single("sessiontree_session_mailbox_depth", stats.get("session_mailbox_depth", 0))
        yield _single("sessiontree_rejected_messages", stats.get("rejected_messages", 0))
        yield _single("sessiontree_fenced_refusals", stats.get("refused_after_fence", 0))
        yield _single("sessiontree_stuck_flags", stats.get("stuck_flagged", 0))
        yield _single("sessiontree_main_cycles_failed", stats.get("main_cycles_failed", 0))
        yield _single("sessiontree_store_write_errors", stats.get("store_write_errors", 0))

    def _store_section(self) -> Iterator[Metric]:
        store = self.node.store
        if store is None:
            return
        figures = store.stats()
        yield _single("sessiontree_store_map_used_bytes", figures["used_bytes"])
        yield _single("sessiontree_store_map_size_bytes", figures["map_size"])
        yield _single("sessiontree_store_readers", figures["readers"])
        yield _single("sessiontree_store_commit_errors", figures.get("write_errors", 0))
        yield _single("sessiontree_store_map_full", figures.get("store_full", 0))
