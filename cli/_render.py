"""Session trees and events as plain text for a terminal (ASCII only).

Every line is one line: what sessions say (tasks, summaries, messages,
progress notes) is escaped with ``shown``, so it cannot break the tree or
drive the terminal."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sessiontree.cli._describe import ascii_tree
from sessiontree.cli._text import shown
from sessiontree.cli._words import plural
from sessiontree.protocol import SessionTreeError
from sessiontree.supervision import Event, EventKind, Node

__all__ = ["EventPrinter", "render_rejections", "render_summary", "render_tree"]

_INDENT = "  "


def _label(kind: str, task: str) -> str:
    return f'{shown(kind):<6} "{shown(task)}"'


def _code(code: str | None) -> str:
    return f" [{shown(code)}]" if code else ""


class EventPrinter:
    """Writes one line per event, indented by the session's depth.

    Call it from any thread but the Cortex's: it asks the node for the task of
    each session it sees spawned (once per session).
    """

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self._seen: dict[uuid.UUID, tuple[int, str]] = {}

    def _describe(self, node: Node, session_id: uuid.UUID) -> tuple[int, str]:
        known = self._seen.get(session_id)
        if known is not None:
            return known
        try:
            info = node.get(session_id)
        except SessionTreeError:
            return 0, f"session {session_id}"
        known = (info.depth, _label(info.kind.value, info.task))
        self._seen[session_id] = known
        return known

    def __call__(self, node: Node, event: Event, elapsed: float) -> None:
        line = self.line(node, event)
        if line is not None:
            self.write(f"{elapsed:6.2f}s  {line}")

    def line(self, node: Node, event: Event) -> str | None:
        """The text for ``event`` (without the timestamp), or None to skip it."""
        text = self._line(node, event)
        return None if text is None else shown(text)

    def _line(self, node: Node, event: Event) -> str | None:
        if event.kind is EventKind.REJECTED:
            depth, parent = self._describe(node, event.parent_id) if event.parent_id else (0, "?")
            kind = event.data.get("kind", "session")
            message = event.data.get("message", "")
            return (
                f"{_INDENT * (depth + 1)}x spawn of a {kind} under {parent} refused"
                f"{_code(event.code)}: {message}"
            )
        if event.session_id is None:
            return f"node: {event.kind.value} {event.data}"
        depth, label = self._describe(node, event.session_id)
        pad = _INDENT * depth
        match event.kind:
            case EventKind.SPAWNED:
                return f"{pad}+ {label} spawned ({event.state})"
            case EventKind.TRANSITION:
                return f"{pad}> {label} {event.state}{_code(event.code)}"
            case EventKind.CANCEL_REQUESTED:
                return f"{pad}! {label} cancel requested{_code(event.code)}"
            case EventKind.RESULT_DELIVERED:
                return f"{pad}^ {label} result delivered to its parent"
            case EventKind.PROGRESS:
                return f"{pad}~ {label} {event.data.get('note', '')}"
            case EventKind.CYCLE_ENDED:
                cycle = event.data.get("cycle", "?")
                return f"{pad}. {label} message cycle {cycle} done{_code(event.code)}"
            case EventKind.BUDGET_WARNING:
                dimension = event.data.get("dimension", "?")
                soft = float(event.data.get("soft", 0.8))
                return f"{pad}$ {label} budget warning: {soft:.0%} of its {dimension} spent"
            case EventKind.BUDGET_EXHAUSTED:
                dimension = event.data.get("dimension", "?")
                return (
                    f"{pad}$ {label} budget of {dimension} exhausted: the next call is refused "
                    "before it is sent, the subtree cancelled with the grace"
                )
            case EventKind.REFUSED:
                what = event.data.get("what", "call")
                return f"{pad}# {label} late {what} refused (the session is fenced)"
            case _:
                return f"{pad}{event.kind.value}: {label}{_code(event.code)}"


def _row_line(row: Mapping[str, Any]) -> str:
    result = row.get("result")
    text = f"{_label(row['kind'], row['task'])}  {shown(row['state'])}"
    if result is not None:
        error = result.get("error")
        if error is not None:
            text += _code(error["code"])
        if result.get("summary"):
            text += f"  -- {shown(result['summary'])}"
        elif error is not None and error["code"] == "crashed":
            text += f"  -- {shown(error['message'])}"
    return text


def render_tree(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``--json`` session rows (depth first) as an ASCII tree, one line per session."""
    children: dict[str | None, list[Mapping[str, Any]]] = {}
    ids = {row["session_id"] for row in rows}
    for row in rows:
        parent = row["parent_id"] if row["parent_id"] in ids else None
        children.setdefault(parent, []).append(row)
    return ascii_tree(
        children.get(None, []), lambda row: children.get(row["session_id"], []), _row_line
    )


def render_rejections(
    rejections: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    """One line per refused spawn, naming the would-be parent by its task."""
    tasks = {row["session_id"]: _label(row["kind"], row["task"]) for row in rows}
    return [
        shown(
            f"{r['kind']} under {tasks.get(r['parent_id'], r['parent_id'])}: "
            f"{r['error']['code']} -- {r['error']['message']}"
        )
        for r in rejections
    ]


def render_summary(rows: Sequence[Mapping[str, Any]], rejections: Sequence[Any]) -> str:
    """``13 sessions: 8 completed, ...; 3 spawns refused``."""
    states = Counter(row["state"] for row in rows)
    codes = Counter(
        row["result"]["error"]["code"]
        for row in rows
        if row.get("result") and row["result"].get("error")
    )
    by_state = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    by_code = ", ".join(f"{n} {code}" for code, n in sorted(codes.items()))
    return shown(
        f"{plural(len(rows), 'session')}: {by_state}; errors: {by_code or 'none'}; "
        f"{plural(len(rejections), 'spawn')} refused"
    )
