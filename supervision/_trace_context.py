"""The caller's span, for a traced node's spans to continue (issue 24).

An application that traces its own work (its web framework's
instrumentation, its own spans) calls the node inside a span; a spawn or a
message then continues that trace. Only the OpenTelemetry API is read here:
without an SDK there is no valid current span and nothing continues.
"""

from __future__ import annotations

import logging

from opentelemetry import trace

__all__ = ["TraceIds", "caller_traceparent"]


def caller_traceparent() -> str | None:
    """The W3C ``traceparent`` of the calling thread's (or task's) current
    span, or None when there is none."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


class TraceIds(logging.Filter):
    """A logging filter that stamps every record with the current span's ids:
    ``otelTraceID`` and ``otelSpanID`` (hex, ``"0"`` outside a span; the names
    OpenTelemetry's logging instrumentation uses) and ``trace`` (`` [trace=…
    span=…]``, or empty), for a format string. A skill's records carry its
    session's span on a traced node (its span is current while it runs).
    Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            trace_id, span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
            suffix = f" [trace={trace_id} span={span_id}]"
        else:
            trace_id = span_id = "0"
            suffix = ""
        record.otelTraceID, record.otelSpanID, record.trace = trace_id, span_id, suffix
        return True
