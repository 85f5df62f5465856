"""Spans from the node's events (issue 24): the one module that imports the
OpenTelemetry SDK, and only on a traced node (``NodeConfig.tracing``).

Every Branch and Worker run is a span from its spawn to its end, a child of
the span that spawned it; a Main's message cycle is a span, the root of a
trace unless its message or its child's result continues one; every model
call is a span under its session's (GenAI semantic conventions). The
runtime names each span (``SessionInfo.trace``, ``session.traceparent``)
before anything is exported, so a span here gets exactly that id: a
one-shot ``IdGenerator`` hands the SDK the chosen ids.

Everything runs on the Cortex thread (an ``EventBus`` observer) but the
export: a ``BatchSpanProcessor`` sends batches from its own thread, with a
bounded queue; what it drops (queue full, a failed export) is counted, and
a session never waits for a span.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from sessiontree.protocol import ErrorCode, span_id_of, trace_id_of
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._tracing_config import Tracing

__all__ = ["SpanRecorder"]

log = logging.getLogger("sessiontree.tracing")

_NS = 1_000_000_000
_TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
#: Codes that mark a span as failed (a cancellation that wrapped up in grace is no error).
_ERRORS = frozenset(
    {
        ErrorCode.CRASHED.value,
        ErrorCode.TTL_EXPIRED.value,
        ErrorCode.TERMINATED_BY_FORCE.value,
        ErrorCode.BUDGET_EXHAUSTED.value,
    }
)
#: Events that become span events of their session's span, by name.
_SPAN_EVENTS = {
    EventKind.CANCEL_REQUESTED: "cancel_requested",
    EventKind.SUSPEND_REQUESTED: "suspend_requested",
    EventKind.BUDGET_WARNING: "budget_warning",
    EventKind.BUDGET_EXHAUSTED: "budget_exhausted",
    EventKind.STUCK: "stuck",
}


def _parent_context(parent: str | None) -> otel_context.Context:
    """A context whose current span is ``parent`` (a traceparent), or an empty one."""
    if parent is None:
        return otel_context.Context()
    flags = TraceFlags(int(parent[53:55], 16))
    span_context = SpanContext(trace_id_of(parent), span_id_of(parent), True, flags)
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


def _link(traceparent: str, why: str) -> Link:
    flags = TraceFlags(int(traceparent[53:55], 16))
    span_context = SpanContext(trace_id_of(traceparent), span_id_of(traceparent), True, flags)
    return Link(span_context, {"sessiontree.link": why})


class _ChosenIds(IdGenerator):
    """The SDK's ids, but the ones chosen for the next span when there are."""

    def __init__(self) -> None:
        self.next: tuple[int, int] | None = None
        self._random = RandomIdGenerator()

    def generate_trace_id(self) -> int:
        return self._random.generate_trace_id() if self.next is None else self.next[0]

    def generate_span_id(self) -> int:
        chosen, self.next = self.next, None
        return self._random.generate_span_id() if chosen is None else chosen[1]


class _Counted(SpanExporter):
    """The exporter, counting the spans it was handed and those it failed to send."""

    def __init__(self, exporter: SpanExporter, counts: dict[str, int], lock: threading.Lock):
        self.exporter, self.counts, self.lock = exporter, counts, lock
        self.deadline: float | None = None  # closing: nothing is sent after it

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock:
            self.counts["queued"] -= len(spans)
        try:
            if self.deadline is not None and time.monotonic() > self.deadline:
                result = SpanExportResult.FAILURE  # the node closes: no more waiting
            else:
                result = self.exporter.export(spans)
        except Exception:  # an exporter's bug drops its batch, never the node
            log.exception("the span exporter raised; %d spans dropped", len(spans))
            result = SpanExportResult.FAILURE
        with self.lock:
            key = "exported" if result is SpanExportResult.SUCCESS else "dropped"
            self.counts[key] += len(spans)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class _Queued(SpanProcessor):
    """In front of the batch processor: counts the spans its bounded queue
    drops (it drops the oldest when full, as this mirrors)."""

    def __init__(self, batch: BatchSpanProcessor, size: int, counts: dict[str, int], lock: Any):
        self.batch, self.size, self.counts, self.lock = batch, size, counts, lock

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        self.batch.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            with self.lock:
                if self.counts["queued"] >= self.size:
                    self.counts["dropped"] += 1
                else:
                    self.counts["queued"] += 1
        self.batch.on_end(span)

    def shutdown(self) -> None:
        self.batch.shutdown()  # type: ignore[no-untyped-call]  # untyped in the SDK

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.batch.force_flush(timeout_millis)


class SpanRecorder:
    """Turns a node's events into spans (an ``EventBus`` observer, Cortex thread).

    ``close`` ends the spans still open (sessions the node leaves running or
    suspended: their span says so) and flushes the queue, bounded by the
    export timeout; what cannot be sent is dropped and counted.
    """

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self.lock = threading.Lock()
        self.counts = {"queued": 0, "exported": 0, "dropped": 0}
        try:
            version = metadata.version("sessiontree")
        except metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout
            version = "0"
        resource = Resource.create(
            {"service.name": tracing.service_name, "service.version": version, **tracing.resource}
        )
        self._ids = _ChosenIds()
        self.provider = TracerProvider(
            resource=resource,
            sampler=ParentBased(TraceIdRatioBased(tracing.sampling_ratio)),
            id_generator=self._ids,
        )
        exporter = tracing.exporter or OTLPSpanExporter(
            endpoint=tracing.endpoint,
            headers=dict(tracing.headers),
            timeout=tracing.export_timeout,
        )
        self._exporter = _Counted(exporter, self.counts, self.lock)
        batch = BatchSpanProcessor(
            self._exporter,
            max_queue_size=tracing.max_queue_size,
            schedule_delay_millis=tracing.schedule_delay * 1000.0,
            max_export_batch_size=tracing.max_export_batch_size,
            export_timeout_millis=tracing.export_timeout * 1000.0,
        )
        self.provider.add_span_processor(
            _Queued(batch, tracing.max_queue_size, self.counts, self.lock)
        )
        self.tracer = self.provider.get_tracer("sessiontree", version)
        # open spans: a Branch's or Worker's run, a Main's running cycle (one at a time)
        self.runs: dict[uuid.UUID, trace.Span] = {}
        self.cycles: dict[uuid.UUID, trace.Span] = {}

    # -- the observer ----------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        kind = event.kind
        sid = event.session_id
        if sid is None:
            return
        if kind is EventKind.SPAWNED:
            self._spawned(event, sid)
        elif kind is EventKind.TRANSITION:
            self._transition(event, sid)
        elif kind is EventKind.CYCLE_STARTED:
            self._cycle_started(event, sid)
        elif kind is EventKind.CYCLE_ENDED:
            self._cycle_ended(event, sid)
        elif kind is EventKind.MODEL_CALL:
            self._model_call(event)
        elif kind in _SPAN_EVENTS:
            span = self.runs.get(sid) or self.cycles.get(sid)
            if span is not None:
                attributes = {"sessiontree.code": event.code} if event.code else {}
                attributes.update(_flat(event.data))
                span.add_event(_SPAN_EVENTS[kind], attributes, int(event.at * _NS))

    def _start(
        self,
        name: str,
        traceparent: str,
        parent: str | None,
        at: float,
        attributes: dict[str, Any],
        links: list[Link] | None = None,
    ) -> trace.Span:
        self._ids.next = (trace_id_of(traceparent), span_id_of(traceparent))
        try:
            return self.tracer.start_span(
                name,
                context=_parent_context(parent),
                attributes=attributes,
                links=links,
                start_time=int(at * _NS),
            )
        finally:
            self._ids.next = None

    def _spawned(self, event: Event, sid: uuid.UUID) -> None:
        data = event.data
        traceparent = data.get("trace")
        if traceparent is None:  # a Main: its cycles are its spans
            return
        attributes: dict[str, Any] = {
            "sessiontree.session.id": str(sid),
            "sessiontree.session.kind": event.session_kind or "",
            "sessiontree.skill": data.get("skill", ""),
            "gen_ai.agent.name": event.agent_id or "",
        }
        if event.parent_id is not None:
            attributes["sessiontree.parent.id"] = str(event.parent_id)
        if data.get("ttl") is not None:
            attributes["sessiontree.session.ttl"] = float(data["ttl"])
        links = None
        if data.get("cut_off"):
            links = [_link(data["cut_off"], "cut_off_by_restart")]
            attributes["sessiontree.restored"] = True
        name = f"{event.session_kind} {data.get('skill', '')}".strip()
        at = data.get("created_at", event.at) if links is None else event.at
        self.runs[sid] = self._start(
            name, traceparent, data.get("trace_parent"), at, attributes, links
        )

    def _transition(self, event: Event, sid: uuid.UUID) -> None:
        span = self.runs.get(sid)
        if span is None:
            return
        state, at = event.state or "", int(event.at * _NS)
        if state == "suspended":
            span.add_event("suspended", timestamp=at)
        elif event.previous == "suspended" and state == "active":
            span.add_event("resumed", timestamp=at)
        if state not in _TERMINAL:
            return
        del self.runs[sid]
        code = event.code
        if code == ErrorCode.TERMINATED_BY_FORCE.value:
            span.add_event("terminated_by_force", timestamp=at)
        span.set_attribute("sessiontree.session.state", state)
        if code is not None:
            span.set_attribute("sessiontree.error.code", code)
            if code in _ERRORS or state == "failed":
                span.set_attribute("error.type", code)
                span.set_status(Status(StatusCode.ERROR, code))
        for name, value in event.data.get("usage", {}).items():
            span.set_attribute(f"sessiontree.usage.{name}", value)
        span.end(at)

    def _cycle_started(self, event: Event, sid: uuid.UUID) -> None:
        data = event.data
        old = self.cycles.pop(sid, None)
        if old is not None:  # its end was never told (the node closed): ended here
            old.end(int(event.at * _NS))
        links = [_link(data["cut_off"], "cut_off_by_restart")] if data.get("cut_off") else None
        attributes = {
            "sessiontree.session.id": str(sid),
            "sessiontree.session.kind": "main",
            "sessiontree.cycle": data["cycle"],
            "gen_ai.agent.name": event.agent_id or "",
        }
        name = "main cycle"
        self.cycles[sid] = self._start(
            name, data["trace"], data.get("parent_trace"), event.at, attributes, links
        )

    def _cycle_ended(self, event: Event, sid: uuid.UUID) -> None:
        span = self.cycles.pop(sid, None)
        if span is None:
            return
        if event.code is not None:
            span.set_attribute("sessiontree.error.code", event.code)
            span.set_attribute("error.type", event.code)
            span.set_status(Status(StatusCode.ERROR, event.data.get("error", event.code)))
        span.end(int(event.at * _NS))

    def _model_call(self, event: Event) -> None:
        data = event.data
        parent = data.get("trace")
        if parent is None:
            return
        model = data.get("model", "")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.provider.name": data.get("provider", ""),
            "sessiontree.session.id": str(event.session_id),
        }
        optional = {
            "gen_ai.response.model": data.get("response_model"),
            "gen_ai.request.max_tokens": data.get("max_tokens"),
            "gen_ai.usage.input_tokens": data.get("input_tokens"),
            "gen_ai.usage.output_tokens": data.get("output_tokens"),
            "gen_ai.response.finish_reasons": (
                [data["finish_reason"]] if data.get("finish_reason") else None
            ),
            "sessiontree.usage.cost": data.get("cost"),
            "sessiontree.stream": data.get("stream"),
        }
        if self.tracing.capture_content:
            optional["gen_ai.input.messages"] = data.get("prompt")
            optional["gen_ai.output.messages"] = data.get("reply")
        attributes.update({k: v for k, v in optional.items() if v is not None})
        self._ids.next = None
        span = self.tracer.start_span(
            f"chat {model}".strip(),
            context=_parent_context(parent),
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
            start_time=int(data["started_at"] * _NS),
        )
        if data.get("error"):
            span.set_attribute("error.type", data["error"])
            span.set_status(Status(StatusCode.ERROR, data["error"]))
        span.end(int(data["ended_at"] * _NS))

    # -- closing ---------------------------------------------------------------------

    def dropped(self) -> int:
        """Spans dropped so far: the queue was full, or their export failed."""
        with self.lock:
            return self.counts["dropped"]

    def exported(self) -> int:
        """Spans the exporter sent."""
        with self.lock:
            return self.counts["exported"]

    def flush(self, timeout: float | None = None) -> bool:
        """Export what is queued now (bounded by ``timeout`` s, default the
        export timeout); False if it could not finish."""
        millis = (self.tracing.export_timeout if timeout is None else timeout) * 1000.0
        return self.provider.force_flush(int(millis))

    def close(self, at: float) -> None:
        """End the spans still open at ``at`` (marked ``node_closed``), export
        what is queued and stop the export thread: batches not sent within
        the export timeout are dropped (so a closing node waits at most about
        twice that for an endpoint that does not answer)."""
        for spans in (self.runs, self.cycles):
            for span in spans.values():
                span.add_event("node_closed", timestamp=int(at * _NS))
                span.end(int(at * _NS))
            spans.clear()
        self._exporter.deadline = time.monotonic() + self.tracing.export_timeout
        self.provider.shutdown()


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as span attributes (strings, numbers and bools; the rest as text)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, str | bool | int | float):
            flat[f"sessiontree.{key}"] = value
        elif value is not None:
            flat[f"sessiontree.{key}"] = str(value)
    return flat
