"""The caller's span, for a traced node's spans to continue (issue 24).

An application that traces its own work (its web framework's
instrumentation, its own spans) calls the node inside a span; a spawn or a
message then continues that trace. Only the OpenTelemetry API is read here:
without an SDK there is no valid current span and nothing continues.
"""

from __future__ import annotations

from opentelemetry import trace

__all__ = ["caller_traceparent"]


def caller_traceparent() -> str | None:
    """The W3C ``traceparent`` of the calling thread's (or task's) current
    span, or None when there is none."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
