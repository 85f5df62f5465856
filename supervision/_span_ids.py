"""A traced node's sessions' spans, as the kernel creates, restores and ends
them (an ``Extension``; only a node with ``NodeConfig.tracing`` has it).

Each Branch or Worker gets a span id at its creation (``SessionInfo.trace``)
and the span it continues (``trace_parent``); the events the kernel emits
about it carry what ``SpanRecorder`` (``_tracing``) needs to write its span.
Nothing here imports the OpenTelemetry SDK, and nothing here fails: a
malformed caller's ``traceparent`` is ignored (a new trace begins).
"""

from __future__ import annotations

from typing import Any

import msgspec

from sessiontree.protocol import (
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SpawnSpec,
    child_traceparent,
    parse_traceparent,
)
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._extension import Extension

__all__ = ["SpanIds"]


class SpanIds(Extension):
    """Span ids for a traced node's sessions, sampled at ``sampling_ratio``
    where a trace begins (see the module's docstring)."""

    def __init__(self, sampling_ratio: float) -> None:
        self.sampling_ratio = sampling_ratio

    def identity(self, parent: TreeEntry | None, spec: SpawnSpec, info: SessionInfo) -> SessionInfo:
        """A new Branch's or Worker's span and the span it continues: a child of
        the span ``spec.trace`` names (the spawning skill's, or a caller's),
        else of its parent Branch's span, else the root of a new trace. A Main
        has none (each of its message cycles is a span of its own)."""
        if spec.kind is SessionKind.MAIN:
            return info
        parent_trace = parse_traceparent(spec.trace) if spec.trace is not None else None
        if parent_trace is None and parent is not None and parent.kind is not SessionKind.MAIN:
            parent_trace = parent.info.trace
        trace = child_traceparent(parent_trace, self.sampling_ratio)
        return msgspec.structs.replace(info, trace=trace, trace_parent=parent_trace)

    def restoring(self, parent: TreeEntry | None, info: SessionInfo) -> SessionInfo:
        """Its run after the restart is a new span, linked to the one cut off
        (``created`` says which), in the same trace: under its parent Branch's
        new span when that came back too, else under the span it continued
        before (one that began its trace is a root again, in that trace)."""
        cut_off = info.trace
        if cut_off is None:
            return info
        trace_parent = info.trace_parent
        if parent is not None and parent.kind is not SessionKind.MAIN and parent.info.trace:
            trace_parent = parent.info.trace
        trace = child_traceparent(trace_parent or cut_off)
        return msgspec.structs.replace(info, trace=trace, trace_parent=trace_parent)

    def created(self, entry: TreeEntry, spec: SpawnSpec, data: dict[str, Any] | None) -> None:
        """Its SPAWNED event carries what its span needs."""
        if data is not None:
            _span_data(entry.info, data)

    def restored(self, entry: TreeEntry, before: SessionInfo, data: dict[str, Any] | None) -> None:
        """As ``created``, and the span its run before the restart had: its
        new span links to it."""
        if data is not None and _span_data(entry.info, data) and before.trace is not None:
            data["cut_off"] = before.trace

    def detail(
        self, kind: EventKind, entry: TreeEntry, error: ErrorInfo | None, data: dict[str, Any]
    ) -> None:
        """A traced session's ending carries its subtree's usage (and whether
        it is final) and its failure; a Main's cycle, its span and failure."""
        if kind is EventKind.CYCLE_ENDED:
            cycle_trace = entry.core.cycle_trace
            if cycle_trace:
                data["trace"] = cycle_trace
                data["failure"] = error
            return
        if entry.info.trace is None:
            return
        ledger = entry.ledger
        if ledger is not None:
            data["usage"] = msgspec.structs.asdict(ledger.subtree)
            data["settled"] = ledger.settled
        if error is not None:
            data["failure"] = error


def _span_data(info: SessionInfo, data: dict[str, Any]) -> bool:
    """Put what a traced session's span needs in its SPAWNED event's ``data``
    (False: it has no span)."""
    if info.trace is None:
        return False
    data.update(trace=info.trace, trace_parent=info.trace_parent, ttl=info.ttl, task=info.task)
    return True
