"""What the metrics learn from the node's events: ``TreeTracker``.

The tracker keeps the count of live sessions by kind, state, agent and skill
(each ``Series``' ``live``), what it needs of each live session to time its
end (``_Tracked``, which holds its series: its later events take no label
lookup), and the moments sessions ended whose results are not delivered
yet; on each event it updates the event-fed families
(``_metric_families.Families``). The counts and the untrusted-input
rejections are read at scrape time under ``lock``.

Threads: event handlers run on the Cortex thread (a few dict lookups and
counter increments per event), ``on_commit`` on the store's writer thread,
``seed``, ``reject`` and the readers on any thread. None of them raises
for an event it does not understand: such an event is ignored.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sessiontree.actors import Clock
from sessiontree.protocol import ErrorCode, SessionInfo, SessionState
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._metric_families import (
    END_STATES,
    KINDS,
    REJECT_REASONS,
    Families,
    Series,
)

__all__ = ["TreeTracker"]

_END_SET = frozenset(END_STATES)
_KIND_SET = frozenset(KINDS)
_FORCED = ErrorCode.TERMINATED_BY_FORCE.value
_TTL_EXPIRED = ErrorCode.TTL_EXPIRED.value
_EXPIRED = SessionState.EXPIRED.value

# A result is delivered in the same Cortex handler that ended its session, so
# this bound is only reached when an ended session's result is never delivered
# (a parent unknown after a restart); the oldest are dropped then.
_MAX_UNDELIVERED = 4096


@dataclass(slots=True)
class _Tracked:
    """What the metrics keep of one session until it ends."""

    series: Series  # its kind, agent and skill
    state: str
    started: float | None  # the node's monotonic clock at spawn; None if unknown
    created_at: float | None  # wall clock, for sessions spawned before this process
    cancel_at: float | None = None  # monotonic, when cancellation was requested


class TreeTracker:
    """The live sessions by kind, state, agent and skill, and the event-fed
    families of one node.

    ``clock``: the node's clock (durations, grace and delivery are timed on its
    monotonic reading). ``families``: where the observations go.
    """

    def __init__(self, clock: Clock, families: Families) -> None:
        self.clock = clock
        self._families = families
        self.lock = threading.Lock()
        self.live: dict[uuid.UUID, _Tracked] = {}
        self.ended_at: dict[uuid.UUID, float] = {}  # ended, result not yet delivered
        self.seeding = True
        self.ended_early: set[uuid.UUID] = set()  # ended while the snapshot was read
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self._handlers: dict[EventKind, Callable[[Event], None]] = {
            EventKind.SPAWNED: self._on_spawned,
            EventKind.TRANSITION: self._on_transition,
            EventKind.CANCEL_REQUESTED: self._on_cancel,
            EventKind.RESULT_DELIVERED: self._on_delivered,
            EventKind.REJECTED: self._on_rejected,
            EventKind.DISCARDED: self._on_discarded,
        }

    # -- seeding and reading (any thread) ------------------------------------------------

    def seed(self, infos: Iterable[SessionInfo]) -> None:
        """Count the sessions that existed before we subscribed. Events seen since
        subscribing are newer than or as new as the snapshot, so they win. Call
        once, after subscribing; until then an ending seen is remembered so the
        snapshot cannot bring that session back."""
        with self.lock:
            for info in infos:
                sid = info.session_id
                tracked = self.live.get(sid)
                if tracked is not None:
                    if tracked.started is None and tracked.created_at is None:
                        tracked.created_at = info.created_at
                    continue
                if info.state.is_terminal or sid in self.ended_early:
                    continue
                state = info.state.value
                series = self._families.series_of(info.agent_id, info.skill, info.kind.value)
                if state not in series.live:
                    continue
                self.live[sid] = _Tracked(series, state, None, info.created_at)
                series.live[state] += 1
            self.seeding = False
            self.ended_early.clear()

    def reject(self, reason: str) -> None:
        """Count one untrusted input refused under ``reason`` (``other`` if it is
        not one of ``REJECT_REASONS``). Any thread."""
        key = reason if reason in self.rejected else "other"
        with self.lock:
            self.rejected[key] += 1

    def session_counts(self) -> list[tuple[tuple[str, str, str, str], int]]:
        """A copy of the live counts, ``((kind, state, agent, skill), count)``
        (the gauge's labels), series by series."""
        with self.lock:
            return [
                ((series.kind, state, series.agent, series.skill), count)
                for series in self._families.series.values()
                for state, count in series.live.items()
            ]

    def rejected_counts(self) -> list[tuple[str, int]]:
        """A copy of the rejection counts, ``(reason, count)`` in ``REJECT_REASONS`` order."""
        with self.lock:
            return list(self.rejected.items())

    # -- events (the Cortex thread) ----------------------------------------------------

    def on_event(self, event: Event) -> None:
        """The node's event observer (the Cortex thread); other kinds are ignored."""
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event)

    def _on_spawned(self, event: Event) -> None:
        sid, kind, state = event.session_id, event.session_kind, event.state
        if sid is None or kind not in _KIND_SET or state is None:
            return
        restored = bool(event.data.get("restored"))
        with self.lock:
            series = self._families.series_of(event.agent_id, event.skill, kind)
            live = series.live
            if state not in live:
                return
            if restored:
                created = event.data.get("created_at")
                at = float(created) if isinstance(created, int | float) else None
                tracked = _Tracked(series, state, None, at)
            else:
                tracked = _Tracked(series, state, self.clock.monotonic(), None)
            old = self.live.get(sid)
            if old is not None:  # a dormant Main from the snapshot, now brought back
                old.series.live[old.state] -= 1
            self.live[sid] = tracked
            live[state] += 1
        (series.restored if restored else series.spawned).inc()

    def _on_transition(self, event: Event) -> None:
        sid, state = event.session_id, event.state
        if sid is None or state is None:
            return
        ending = state in _END_SET
        with self.lock:
            tracked = self.live.get(sid)
            if tracked is None:  # it existed before we subscribed
                kind = event.session_kind
                if kind not in _KIND_SET:
                    return
                series = self._families.series_of(event.agent_id, event.skill, kind)
                if ending:
                    if self.seeding:
                        self.ended_early.add(sid)
                elif state in series.live:
                    self.live[sid] = _Tracked(series, state, None, None)
                    series.live[state] += 1
                    return
                else:
                    return
            else:
                series = tracked.series
                live = series.live
                live[tracked.state] -= 1
                if not ending:
                    tracked.state = state
                    live[state] += 1
                    return
                del self.live[sid]
        self._ended(event, sid, series, state, tracked)

    def _ended(
        self, event: Event, sid: uuid.UUID, series: Series, state: str, tracked: _Tracked | None
    ) -> None:
        now = self.clock.monotonic()
        series.terminated[state].inc()
        code = event.code
        if code == _FORCED:
            series.forced.inc()
        elif code == _TTL_EXPIRED:
            series.expired.inc()
        if event.parent_id is not None:
            pending = self.ended_at
            if len(pending) >= _MAX_UNDELIVERED:
                del pending[next(iter(pending))]
            pending[sid] = now
        if tracked is None:
            return
        if tracked.started is not None:
            series.duration.observe(max(0.0, now - tracked.started))
        elif tracked.created_at is not None:
            series.duration.observe(max(0.0, event.at - tracked.created_at))
        if tracked.cancel_at is not None:
            if code == _FORCED:
                outcome = "forced"
            elif state == _EXPIRED:
                outcome = "expired"
            else:
                outcome = "wrapped_up"
            self._families.grace[outcome].observe(max(0.0, now - tracked.cancel_at))

    def _on_cancel(self, event: Event) -> None:
        sid = event.session_id
        tracked = self.live.get(sid) if sid is not None else None
        if tracked is not None and tracked.cancel_at is None:
            tracked.cancel_at = self.clock.monotonic()

    def _on_delivered(self, event: Event) -> None:
        sid = event.session_id
        ended = self.ended_at.pop(sid, None) if sid is not None else None
        if ended is not None:
            self._families.delivery.observe(max(0.0, self.clock.monotonic() - ended))

    def _on_rejected(self, event: Event) -> None:
        child = self._families.rejections.get(event.code or "")
        if child is not None:
            child.inc()

    def _on_discarded(self, event: Event) -> None:
        sid = event.session_id
        if sid is None:
            return
        with self.lock:
            tracked = self.live.pop(sid, None)
            if tracked is not None:
                tracked.series.live[tracked.state] -= 1

    # -- the store's writer thread ---------------------------------------------------

    def on_commit(self, seconds: float, batches: int) -> None:
        """The store's commit observer (its writer thread): one commit's figures."""
        self._families.commit_seconds.observe(seconds)
        self._families.commit_batches.observe(batches)
