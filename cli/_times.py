"""Times for people and for programs: tables say "3m ago" and "in 4m";
``--json`` says ISO 8601 in UTC (``2026-05-24T10:00:03.250Z``).

The node and the store keep every instant as float seconds since the epoch
(as the README's Execution model says); only the command line turns them into text, here.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

__all__ = [
    "TIME_FIELDS",
    "ago",
    "human_duration",
    "iso",
    "iso_times",
    "local",
    "span",
    "until",
    "utc",
]

#: The fields of a session's view (its info, result timings) that hold instants.
TIME_FIELDS = frozenset({"created_at", "deadline", "started_at", "ended_at", "at"})
# what a skill or a caller wrote: never rewritten, whatever its keys are called
_OPAQUE = frozenset({"artifacts", "input", "metadata", "message", "detail", "data"})


def iso(stamp: float) -> str:
    """``stamp`` (epoch seconds) as ISO 8601 in UTC to the millisecond, ``Z``-suffixed."""
    moment = dt.datetime.fromtimestamp(stamp, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc(stamp: float) -> str:
    """``stamp`` in UTC to the second, ``Z``-suffixed (``2026-05-24 10:00:03Z``)."""
    return dt.datetime.fromtimestamp(stamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def local(stamp: float) -> str:
    """``stamp`` in the local time zone, to the second (``2026-05-24 12:00:03``)."""
    return dt.datetime.fromtimestamp(stamp).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def span(seconds: float) -> str:
    """A duration in one unit a person reads at a glance: 42s, 3m, 5h, 2d."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def human_duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``; ``-`` for None, ``0s`` below
    zero (a deadline just passed)."""
    if seconds is None or math.isnan(seconds):
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def ago(stamp: float, now: float) -> str:
    """How long before ``now`` ``stamp`` was: ``3m ago`` (``just now`` under a second)."""
    if abs(now - stamp) < 1:
        return "just now"
    return f"{span(now - stamp)} ago" if stamp <= now else f"in {span(stamp - now)}"


def until(stamp: float, now: float) -> str:
    """How long from ``now`` to ``stamp``: ``in 4m``, or ``4m overdue`` once past."""
    return f"in {span(stamp - now)}" if stamp >= now else f"{span(now - stamp)} overdue"


def iso_times(value: Any) -> Any:
    """A JSON value (a session's view, a listing, a tree) with every instant in
    ``TIME_FIELDS`` written as ``iso``; what skills wrote (artifacts, input,
    metadata, messages) is left as it is."""
    if isinstance(value, list):
        return [iso_times(item) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in TIME_FIELDS and isinstance(item, int | float) and not isinstance(item, bool):
            out[key] = iso(float(item))
        elif key in _OPAQUE:
            out[key] = item
        else:
            out[key] = iso_times(item)
    return out
