"""A session's span as the current OpenTelemetry context while its skill runs.

On a traced node a skill runs with its span (a Main: its cycle's) current,
so what the skill traces itself (its own spans, an instrumented HTTP client)
and the log records it makes carry the session's trace. The OpenTelemetry
API alone is used; the spans are the node's ``SpanRecorder``'s.
"""

from __future__ import annotations

from opentelemetry import context, trace

from sessiontree.protocol import flags_of, span_id_of, trace_id_of

__all__ = ["context_of", "enter_span", "leave_span", "span_context_of"]


def span_context_of(traceparent: str, remote: bool = True) -> trace.SpanContext:
    """The OpenTelemetry ``SpanContext`` a (normalised) W3C traceparent names."""
    return trace.SpanContext(
        trace_id_of(traceparent),
        span_id_of(traceparent),
        is_remote=remote,
        trace_flags=trace.TraceFlags(flags_of(traceparent)),
    )


def context_of(traceparent: str | None) -> context.Context:
    """A context whose current span is ``traceparent``'s (a normalised W3C
    traceparent), or an empty context for None."""
    if traceparent is None:
        return context.Context()
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context_of(traceparent)))


def enter_span(traceparent: str | None) -> object | None:
    """Make ``traceparent`` the current span of this thread or task; a token
    for ``leave_span`` (None: nothing to enter)."""
    if traceparent is None:
        return None
    return context.attach(context_of(traceparent))


def leave_span(token: object | None) -> None:
    """Undo ``enter_span``."""
    if token is not None:
        context.detach(token)  # type: ignore[arg-type]
