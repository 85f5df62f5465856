"""Spans from the node's events (issue 24): the one module that imports the
OpenTelemetry SDK, and only on a traced node (``NodeConfig.tracing``).

Every Branch and Worker run is a span from its spawn to its end, a child of
the span that spawned it; a Main's message cycle is a span, the root of a
trace unless its message or its child's result continues one; every model
call is a span under its session's (GenAI semantic conventions). The
runtime names each span (``SessionInfo.trace``, ``session.traceparent``)
and decides its sampling (the flags of its traceparent) before anything is
exported, so a span here is written, once it ends, as the SDK's finished
``ReadableSpan`` under exactly those ids: while it is open it is a few
fields (nothing is exported before a span ends), and no tracer, sampler or
id generator of the SDK is needed.

Everything runs on the Cortex thread (an ``EventBus`` observer) but the
export: a ``BatchSpanProcessor`` sends batches from its own thread, with a
bounded queue; what it drops (queue full, a failed export) is counted, and
a session never waits for a span.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from sessiontree.actors.runtime import span_context_of
from sessiontree.protocol import ErrorCode, ErrorInfo, child_traceparent, flags_of
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
#: The resource attribute Arize Phoenix files spans by (its "project").
_PROJECT = "openinference.project.name"
#: How much of a session's task its span carries (characters).
_TASK_CHARS = 200
#: How much of a crash's traceback its span's ``exception`` event carries
#: (characters, the end kept: the raise and the frames nearest it).
_STACK_CHARS = 16_384
#: How much of an error's message a span's status and ``exception`` event carry.
_MESSAGE_CHARS = 4096
#: Events that become span events of their session's span, by name.
_SPAN_EVENTS = {
    EventKind.CANCEL_REQUESTED: "cancel_requested",
    EventKind.SUSPEND_REQUESTED: "suspend_requested",
    EventKind.BUDGET_WARNING: "budget_warning",
    EventKind.BUDGET_EXHAUSTED: "budget_exhausted",
    EventKind.STUCK: "stuck",
}


def _link(traceparent: str, why: str) -> Link:
    return Link(span_context_of(traceparent), {"sessiontree.link": why})


@dataclass(slots=True)
class _Run:
    """A Branch's or Worker's run whose span has begun: its spawn, and the
    span events so far (the span is built once it ends)."""

    spawned: Event
    events: list[SpanEvent] = field(default_factory=list)


@dataclass(slots=True)
class _Open:
    """A span that has begun: what it will be written with once it ends."""

    name: str
    context: SpanContext
    parent: SpanContext | None
    start: int  # ns since the epoch
    attributes: dict[str, Any]
    links: Sequence[Link] = ()
    events: list[SpanEvent] = field(default_factory=list)


class _Counted(SpanExporter):
    """The exporter, counting the spans it was handed and those it failed to send."""

    def __init__(
        self,
        exporter: SpanExporter,
        counts: dict[str, int],
        lock: threading.Lock,
        monotonic: Callable[[], float],
    ) -> None:
        self.exporter, self.counts, self.lock = exporter, counts, lock
        self.monotonic = monotonic
        self.deadline: float | None = None  # closing: nothing is sent after it

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock:
            self.counts["queued"] -= len(spans)
        try:
            if self.deadline is not None and self.monotonic() > self.deadline:
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

    def __init__(self, tracing: Tracing, monotonic: Callable[[], float]) -> None:
        """``monotonic``: the node's clock, which bounds a flush and the close."""
        self.tracing = tracing
        self.monotonic = monotonic
        self.lock = threading.Lock()
        self.counts = {"queued": 0, "exported": 0, "dropped": 0}
        try:
            version = metadata.version("sessiontree")
        except metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout
            version = "0"
        self.resource = Resource.create(
            {
                "service.name": tracing.service_name,
                "service.version": version,
                # Phoenix files spans by project: the service's, unless the resource names one
                _PROJECT: tracing.service_name,
                **tracing.resource,
            }
        )
        self.scope = InstrumentationScope("sessiontree", version)
        exporter = tracing.exporter or OTLPSpanExporter(
            endpoint=tracing.endpoint,
            headers=dict(tracing.headers),
            timeout=tracing.export_timeout,
        )
        self._exporter = _Counted(exporter, self.counts, self.lock, monotonic)
        batch = BatchSpanProcessor(
            self._exporter,
            max_queue_size=tracing.max_queue_size,
            schedule_delay_millis=tracing.schedule_delay * 1000.0,
            max_export_batch_size=tracing.max_export_batch_size,
            export_timeout_millis=tracing.export_timeout * 1000.0,
        )
        self.processor = _Queued(batch, tracing.max_queue_size, self.counts, self.lock)
        # open spans: a Branch's or Worker's run, a Main's running cycle (one at a time)
        self.runs: dict[uuid.UUID, _Run] = {}
        self.cycles: dict[uuid.UUID, _Open] = {}
        # ended runs whose subtree still had model calls in flight: written once
        # their usage settles, with the final figures (see _usage_settled)
        self.unsettled: dict[uuid.UUID, tuple[_Open, float, str | None, bool, str, str | None]] = {}
        self.closed = False
        self._guard = threading.Lock()  # the open spans: the Cortex's events, close()

    # -- the observer ----------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        sid = event.session_id
        if sid is None:
            return
        with self._guard:  # close() may run on another thread
            if not self.closed:
                self._observe(event, sid)

    def _observe(self, event: Event, sid: uuid.UUID) -> None:
        kind = event.kind
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
        elif kind is EventKind.USAGE_SETTLED:
            self._usage_settled(event, sid)
        elif kind is EventKind.DISCARDED:  # taken out as if never created: no span
            self.runs.pop(sid, None)
            self.cycles.pop(sid, None)
        elif kind in _SPAN_EVENTS or (
            kind is EventKind.PROGRESS and event.data.get("note") == "retry"
        ):
            span = self.runs.get(sid) or self.cycles.get(sid)
            if span is not None:
                attributes = {"sessiontree.code": event.code} if event.code else {}
                attributes.update(_flat(event.data))
                name = _SPAN_EVENTS.get(kind, "retry")
                span.events.append(SpanEvent(name, attributes, _ns(event.at)))

    def _write(
        self,
        span: _Open,
        end: float,
        status: Status | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> None:
        """Hand the ended ``span`` to the batch processor."""
        self.processor.on_end(
            ReadableSpan(
                name=span.name,
                context=span.context,
                parent=span.parent,
                resource=self.resource,
                attributes=span.attributes,
                events=tuple(span.events),
                links=tuple(span.links),
                kind=kind,
                status=status or Status(StatusCode.UNSET),
                start_time=span.start,
                end_time=max(_ns(end), span.start),
                instrumentation_scope=self.scope,
            )
        )

    def _spawned(self, event: Event, sid: uuid.UUID) -> None:
        """A run's span begins: its spawn is kept as it is, and the span is
        built from it when it ends (nothing is exported before; a spawn
        costs a dict entry)."""
        traceparent = event.data.get("trace")
        if traceparent is not None and flags_of(traceparent) & 1:  # a Main has none
            self.runs[sid] = _Run(event)

    def _opened(self, run: _Run) -> _Open:
        """The span of ``run``, from its spawn."""
        event = run.spawned
        data = event.data
        skill = data.get("skill", "")
        attributes: dict[str, Any] = {
            "sessiontree.session.id": str(event.session_id),
            "sessiontree.session.kind": event.session_kind or "",
            "sessiontree.skill": skill,
            "gen_ai.agent.name": event.agent_id or "",
            "openinference.span.kind": "AGENT",  # how Phoenix draws it
        }
        task = data.get("task")
        if task:  # what tells runs of one skill apart (Phoenix shows it as the input)
            attributes["sessiontree.task"] = attributes["input.value"] = _clipped(task)
            attributes["input.mime_type"] = "text/plain"
        if event.parent_id is not None:
            attributes["sessiontree.parent.id"] = str(event.parent_id)
        if data.get("ttl") is not None:
            attributes["sessiontree.session.ttl"] = float(data["ttl"])
        links: tuple[Link, ...] = ()
        at = data.get("created_at", event.at)
        if data.get("cut_off"):
            links = (_link(data["cut_off"], "cut_off_by_restart"),)
            attributes["sessiontree.restored"] = True
            at = event.at
        parent = data.get("trace_parent")
        return _Open(
            f"{event.session_kind} {skill}".strip(),
            span_context_of(data["trace"], remote=False),
            None if parent is None else span_context_of(parent),
            _ns(at),
            attributes,
            links,
            run.events,
        )

    def _transition(self, event: Event, sid: uuid.UUID) -> None:
        run = self.runs.get(sid)
        if run is None:
            if event.state in _TERMINAL and sid in self.cycles:
                # a Main ended (cancelled, expired) during a cycle: the cycle ends with it
                code = event.code
                self._end(self.cycles.pop(sid), event.at, code, code in _ERRORS, state=event.state)
            return
        state, at = event.state or "", _ns(event.at)
        if state == "suspended":
            run.events.append(SpanEvent("suspended", None, at))
        elif event.previous == "suspended" and state == "active":
            run.events.append(SpanEvent("resumed", None, at))
        if state not in _TERMINAL:
            return
        del self.runs[sid]
        span = self._opened(run)
        code = event.code
        if code == ErrorCode.TERMINATED_BY_FORCE.value:
            span.events.append(SpanEvent("terminated_by_force", None, at))
        for name, value in event.data.get("usage", {}).items():
            span.attributes[f"sessiontree.usage.{name}"] = value
        error = code in _ERRORS or state == "failed"
        message = _failed(span, event.data.get("failure"), at)
        if event.data.get("settled") is False:  # its span waits for the final figures
            self.unsettled[sid] = (span, event.at, code, error, state, message)
            return
        self._end(span, event.at, code, error, state=state, message=message)

    def _usage_settled(self, event: Event, sid: uuid.UUID) -> None:
        """The last call in an ended run's subtree settled: its span is written
        now, ended when the run ended, with the settled usage."""
        parked = self.unsettled.pop(sid, None)
        if parked is None:
            return
        span, at, code, error, state, message = parked
        for name, value in event.data.get("subtree_usage", {}).items():
            span.attributes[f"sessiontree.usage.{name}"] = value
        self._end(span, at, code, error, state=state, message=message)

    def _end(
        self,
        span: _Open,
        at: float,
        code: str | None,
        error: bool,
        *,
        state: str | None = None,
        message: str | None = None,
    ) -> None:
        """Write ``span``, ended at ``at``: its end ``state`` and ``code`` as
        attributes and, when ``error``, status ERROR with ``message`` (or the code)."""
        status = None
        if state is not None:
            span.attributes["sessiontree.session.state"] = state
        if code is not None:
            span.attributes["sessiontree.error.code"] = code
            if error:
                span.attributes["error.type"] = code
                status = Status(StatusCode.ERROR, message or code)
        self._write(span, at, status)

    def _cycle_started(self, event: Event, sid: uuid.UUID) -> None:
        data = event.data
        old = self.cycles.pop(sid, None)
        if old is not None:  # its end was never told (the node closed): ended here
            self._write(old, event.at)
        traceparent = data["trace"]
        if not flags_of(traceparent) & 1:  # not sampled
            return
        links = (_link(data["cut_off"], "cut_off_by_restart"),) if data.get("cut_off") else ()
        parent = data.get("parent_trace")
        self.cycles[sid] = _Open(
            "main cycle",
            span_context_of(traceparent, remote=False),
            None if parent is None else span_context_of(parent),
            _ns(event.at),
            {
                "sessiontree.session.id": str(sid),
                "sessiontree.session.kind": "main",
                "sessiontree.cycle": data["cycle"],
                "sessiontree.skill": event.skill or "",
                "gen_ai.agent.name": event.agent_id or "",
                "openinference.span.kind": "CHAIN",
            },
            links,
        )

    def _cycle_ended(self, event: Event, sid: uuid.UUID) -> None:
        span = self.cycles.pop(sid, None)
        if span is not None:
            message = _failed(span, event.data.get("failure"), _ns(event.at))
            self._end(span, event.at, event.code, True, message=message)

    def _model_call(self, event: Event) -> None:
        data = event.data
        parent = data.get("trace")
        if parent is None or not flags_of(parent) & 1:
            return
        model = data.get("model", "")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.provider.name": data.get("provider", ""),
            "sessiontree.session.id": str(event.session_id),
            "openinference.span.kind": "LLM",
        }
        optional = {
            "gen_ai.response.model": data.get("response_model"),
            "gen_ai.request.max_tokens": data.get("max_tokens"),
            "gen_ai.usage.input_tokens": data.get("input_tokens"),
            "gen_ai.usage.output_tokens": data.get("output_tokens"),
            "gen_ai.response.finish_reasons": (
                (data["finish_reason"],) if data.get("finish_reason") else None
            ),
            "sessiontree.usage.cost": data.get("cost"),
            "sessiontree.stream": data.get("stream"),
            "error.type": data.get("error"),
        }
        if self.tracing.capture_content:
            optional["gen_ai.input.messages"] = data.get("prompt")
            optional["gen_ai.output.messages"] = data.get("reply")
        attributes.update({k: v for k, v in optional.items() if v is not None})
        own = child_traceparent(parent)  # its own span, in its session's trace
        span = _Open(
            f"chat {model}".strip(),
            span_context_of(own, remote=False),
            span_context_of(parent),
            _ns(data["started_at"]),
            attributes,
        )
        status = Status(StatusCode.ERROR, data["error"]) if data.get("error") else None
        self._write(span, data["ended_at"], status, SpanKind.CLIENT)

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
        """Export what is queued now; False if some of it could not be sent.
        Batches not sent within ``timeout`` clock seconds (default the export timeout) are
        dropped (and counted): it returns after about ``timeout`` plus the
        export timeout of a batch already on its way."""
        wait = self.tracing.export_timeout if timeout is None else timeout
        before = self.dropped()
        self._exporter.deadline = self.monotonic() + wait
        try:
            flushed = self.processor.force_flush(int(wait * 1000.0))
        finally:
            if not self.closed:
                self._exporter.deadline = None
        return flushed and self.dropped() == before

    def close(self, at: float) -> None:
        """End the spans still open at ``at`` (marked ``node_closed``; a run
        whose usage had not settled is written with what was known, marked
        ``sessiontree.usage.settled`` false), export
        what is queued and stop the export thread: batches not sent within
        the export timeout are dropped (so a closing node waits at most about
        twice that for an endpoint that does not answer). Idempotent; never
        raises (an exporter that fails to close is logged)."""
        with self._guard:
            if self.closed:
                return
            self.closed = True
            runs, cycles = list(self.runs.values()), list(self.cycles.values())
            unsettled = list(self.unsettled.values())
            self.runs.clear()
            self.cycles.clear()
            self.unsettled.clear()
        try:
            for span in [self._opened(run) for run in runs] + cycles:
                span.events.append(SpanEvent("node_closed", None, _ns(at)))
                self._write(span, at)
            for span, ended, code, error, state, message in unsettled:  # calls out: as known
                span.attributes["sessiontree.usage.settled"] = False
                self._end(span, ended, code, error, state=state, message=message)
            self._exporter.deadline = self.monotonic() + self.tracing.export_timeout
            self.processor.shutdown()
        except Exception:
            log.exception("the span export did not close cleanly; what was not sent is lost")


def _ns(seconds: float) -> int:
    return int(seconds * _NS)


def _clipped(text: str, limit: int = _TASK_CHARS) -> str:
    """``text`` cut to ``limit`` characters (the last one an ellipsis when cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _failed(span: _Open, failure: ErrorInfo | None, at: int) -> str | None:
    """The status message of a span whose session ended with ``failure`` (None:
    it did not fail); a crash also adds OpenTelemetry's ``exception`` event at
    ``at`` (ns), from the exception's type, message and traceback that the
    error's detail carries (``exception.type``, ``exception.message``,
    ``exception.stacktrace``; a message past ``_MESSAGE_CHARS`` is cut, a
    traceback past ``_STACK_CHARS`` keeps its end)."""
    if failure is None:
        return None
    detail = failure.detail
    kind = detail.get("type")
    if isinstance(kind, str) and kind:
        attributes = {
            # as a traceback names it: builtins bare, everything else module-qualified
            "exception.type": kind.removeprefix("builtins."),
            "exception.message": _clipped(
                str(detail.get("message", failure.message)), _MESSAGE_CHARS
            ),
        }
        stack = detail.get("traceback")
        if isinstance(stack, str) and stack:
            if len(stack) > _STACK_CHARS:
                stack = "...\n" + stack[-(_STACK_CHARS - 4) :]
            attributes["exception.stacktrace"] = stack
        span.events.append(SpanEvent("exception", attributes, at))
    return _clipped(failure.message, _MESSAGE_CHARS)


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as span attributes (strings, numbers and bools; the rest as text)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, str | bool | int | float):
            flat[f"sessiontree.{key}"] = value
        elif value is not None:
            flat[f"sessiontree.{key}"] = str(value)
    return flat
