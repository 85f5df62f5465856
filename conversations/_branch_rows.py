r"""What one write puts on a session's branch, and what compaction made of it.

A write is ``Entry`` rows (the session's own messages) mixed with results
that arrived from its children (``Message``\ s kept as they are); a
compaction's summary is an entry whose message ``compacts`` the older ones,
and a context read from the newest summary on.
"""

from __future__ import annotations

import uuid
from typing import Any

from sessiontree.conversations._values import draft
from sessiontree.protocol import Message, Role

__all__ = [
    "Entry",
    "drafts",
    "from_summary",
    "newest_original",
    "own_messages",
    "summary_entry",
]

#: One message to write: role, content, tool calls, name, tool call id.
Entry = tuple[Role, Any, list[Any] | None, str | None, str | None]


def summary_entry(text: str) -> Entry:
    """The message that stands for older ones a compaction replaces."""
    return (Role.SYSTEM, f"Summary of the earlier conversation: {text}", None, None, None)


def from_summary(newest_first: list[Message]) -> list[Message]:
    """A context (newest first) from its newest summary on: the messages on the
    path after the newest one it stands for, but no summary (an older one is
    part of what the newest stands for), then the summary in the place of what
    it replaced. Unchanged when it has none, or when what it stands for lies
    beyond the walk's limit."""
    summary = next((m for m in newest_first if m.compacts is not None), None)
    if summary is None:
        return newest_first
    kept: list[Message] = []
    for message in newest_first:
        if message.id == summary.compacts:
            return [*kept, summary]
        if message.compacts is None:
            kept.append(message)
    return newest_first


def newest_original(old: list[Message]) -> uuid.UUID:
    """The newest message of ``old`` that is not a summary (what a new summary
    stands for, up to and including it)."""
    return next(m.id for m in reversed(old) if m.compacts is None)


def drafts(
    rows: list[Entry | Message], usage: dict[str, Any] | None, compacts: uuid.UUID | None
) -> list[Message]:
    """The messages a write places: each entry a draft, ``usage`` and
    ``compacts`` on the last entry; an arrived result as it is (its content
    and links)."""
    last = max((i for i, row in enumerate(rows) if not isinstance(row, Message)), default=-1)
    out: list[Message] = []
    for i, row in enumerate(rows):
        if isinstance(row, Message):
            out.append(row)
            continue
        role, content, calls, name, call_id = row
        out.append(
            draft(
                role,
                content,
                tool_calls=calls,
                name=name,
                tool_call_id=call_id,
                usage=usage if i == last else None,
                compacts=compacts if i == last else None,
            )
        )
    return out


def own_messages(rows: list[Entry | Message], messages: list[Message]) -> list[Message]:
    """The messages a write made of its entries (not of what arrived)."""
    return [m for row, m in zip(rows, messages, strict=True) if not isinstance(row, Message)]
