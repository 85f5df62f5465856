"""W3C trace context: a session's place in a trace, as a ``traceparent`` string.

A traced node gives every Branch and Worker run, every Main message cycle and
every model call a span, and names it with a W3C ``traceparent``
(``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``). The runtime picks
the ids itself (a span's id is known before anything is exported, so it can
be stored with the session and handed to its skill); the tracing module
exports spans under exactly those ids.
"""

from __future__ import annotations

import random
import re

__all__ = [
    "child_traceparent",
    "flags_of",
    "parse_traceparent",
    "sampled_by_ratio",
    "span_id_of",
    "trace_id_of",
]

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_LOW_64 = (1 << 64) - 1


def parse_traceparent(value: object) -> str | None:
    """The ``traceparent`` in ``value``, normalised (version 00), or None when
    it is not one: as the W3C specification says, a malformed header is
    ignored, never an error. A later version's header is read by its first
    four fields; version ``ff`` and all-zero ids are invalid."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None:
        return None
    version, trace_id, span_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def sampled_by_ratio(trace_id: int, ratio: float) -> bool:
    """Whether a new trace is recorded: OpenTelemetry's ``TraceIdRatioBased``
    rule (the trace id's low 64 bits under ``ratio`` of their range), so the
    SDK's sampler and the runtime agree on every trace."""
    return (trace_id & _LOW_64) < round(ratio * (_LOW_64 + 1))


def child_traceparent(parent: str | None, ratio: float = 1.0) -> str:
    """A new span's ``traceparent``: in ``parent``'s trace with its sampled
    flag, or (``parent`` None) the root of a new trace sampled at ``ratio``."""
    span_id = random.getrandbits(64) or 1
    if parent is not None:
        return f"{parent[:35]}-{span_id:016x}-{parent[53:55]}"
    trace_id = random.getrandbits(128) or 1
    flags = "01" if sampled_by_ratio(trace_id, ratio) else "00"
    return f"00-{trace_id:032x}-{span_id:016x}-{flags}"


def trace_id_of(traceparent: str) -> int:
    """The trace id of a (normalised) ``traceparent``."""
    return int(traceparent[3:35], 16)


def span_id_of(traceparent: str) -> int:
    """The span id of a (normalised) ``traceparent``."""
    return int(traceparent[36:52], 16)


def flags_of(traceparent: str) -> int:
    """The trace flags of a (normalised) ``traceparent``: bit 0 says it is sampled."""
    return int(traceparent[53:55], 16)
