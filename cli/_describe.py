"""``sessions show`` as text: one session described in sections, the way
``temporal workflow describe`` reads; and ``sessions ls`` and ``tree``'s
one line a session.

*Session* says who it is and where it stands (a TTL deadline only while it
can still run out; when it ended and how long it ran once it did), *Result*
what it returned, *Failure* (only for an error) its code and message, the
reason a cancel gave, its other details and its stack trace as lines,
*Usage* what it and its subtree spent and its budget on one line. Fields a
session does not use (no key, no input, empty metadata) are left out; the
JSON (``--json``) has everything. What the session holds (its task, summary,
error, trace) is printed escaped (``_text.shown``): each value on its line,
no control character reaching the terminal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sessiontree.cli._text import shown
from sessiontree.cli._times import ago, local, until
from sessiontree.cli._words import money, plural

__all__ = ["ascii_tree", "budget_text", "describe", "draw_tree", "session_line", "usage_text"]

T = TypeVar("T")

_LIVE = frozenset({"pending", "active", "suspended"})
_WIDTH = 14  # the label column
#: What ``Failure`` shows by itself, not among the other details.
_FAILURE_OWN = frozenset({"traceback", "type", "message", "reason"})


def usage_text(usage: dict[str, Any]) -> str:
    """A ``Usage`` (as JSON) in words: tokens, calls, cost."""
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    text = (
        f"{plural(prompt + completion, 'token')} ({prompt} prompt, {completion} completion), "
        f"{plural(usage.get('calls', 0), 'call')}, cost {money(usage.get('cost', 0.0))}"
    )
    if usage.get("unpriced_calls"):
        text += f" ({usage['unpriced_calls']} unpriced)"
    if usage.get("descendants"):
        text += f", {plural(usage['descendants'], 'descendant')}"
    return text


def budget_text(budget: dict[str, Any]) -> str:
    """A ``Budget`` (as JSON) in words: each bounded dimension, or ``unbounded``."""
    bounds = [
        f"cost {money(budget[name])}" if name == "cost" else plural(budget[name], name[:-1])
        for name in ("tokens", "cost", "calls", "descendants")
        if budget.get(name) is not None
    ]
    return ", ".join(bounds) or "unbounded"


def _row(label: str, value: object) -> str:
    return f"  {label:<{_WIDTH}}{shown(value)}"


def _compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def _when(instant: float, now: float, relative: Callable[[float, float], str]) -> str:
    return f"{local(instant)} ({relative(instant, now)})"


def _session_lines(view: dict[str, Any], now: float) -> list[str]:
    info = view["info"]
    result = view.get("result") or {}
    who = [f"skill {info['skill']}"] if info.get("skill") else []
    if info.get("model_tier"):
        who.append(f"tier {info['model_tier']}")
    lines = [
        f"Session {shown(info['session_id'])}",
        _row("Kind", f"{info['kind']}, depth {info['depth']}"),
        _row("Agent", info["agent_id"] + (f" ({', '.join(who)})" if who else "")),
        _row("State", info["state"]),
    ]
    if info.get("parent_id"):
        lines.append(_row("Parent", info["parent_id"]))
    for label, name in (("Key", "key"), ("Request id", "request_id")):
        if info.get(name):
            lines.append(_row(label, info[name]))
    if info.get("task"):
        lines.append(_row("Task", info["task"]))
    if info.get("context_summary"):
        lines.append(_row("Context", info["context_summary"]))
    lines.append(_row("Backend", info["backend"]))
    lines.append(_row("Created", _when(info["created_at"], now, ago)))
    ttl = info.get("ttl")
    if info["state"] in _LIVE and info.get("deadline") is not None:
        lines.append(_row("TTL", f"{ttl:g} s, runs out {_when(info['deadline'], now, until)}"))
    elif ttl is not None:
        lines.append(_row("TTL", f"{ttl:g} s"))
    timings = result.get("timings") or {}
    if timings.get("ended_at") is not None:
        ran = timings["ended_at"] - (timings.get("started_at") or timings["ended_at"])
        ran_text = f", ran {ran:.2f} s" if timings.get("started_at") is not None else ""
        lines.append(_row("Ended", _when(timings["ended_at"], now, ago) + ran_text))
    if info.get("conversation"):
        at = f", forked at {info['fork_at']}" if info.get("fork_at") else ""
        lines.append(_row("Conversation", f"{info['conversation']} ({info['context']}{at})"))
    for label, name in (("Trace", "trace"), ("Trace parent", "trace_parent")):
        if info.get(name):
            lines.append(_row(label, info[name]))
    if info.get("input") is not None:
        lines.append(_row("Input", _compact(info["input"])))
    if info.get("metadata"):
        lines.append(_row("Metadata", _compact(info["metadata"])))
    return lines


def _result_lines(result: dict[str, Any]) -> list[str]:
    lines = ["Result", _row("Status", result["status"])]
    if result.get("summary"):
        lines.append(_row("Summary", result["summary"]))
    if result.get("artifacts"):
        lines.append(_row("Artifacts", _compact(result["artifacts"])))
    if result.get("memory_ids"):
        lines.append(_row("Memory ids", ", ".join(result["memory_ids"])))
    return lines


def _failure_lines(error: dict[str, Any]) -> list[str]:
    detail = error.get("detail") or {}
    lines = ["Failure", _row("Code", error["code"]), _row("Message", error["message"])]
    if detail.get("type"):
        lines.append(_row("Type", detail["type"]))
    if detail.get("reason"):
        lines.append(_row("Reason", detail["reason"]))
    rest = {k: v for k, v in detail.items() if k not in _FAILURE_OWN}
    if rest:
        lines.append(_row("Detail", _compact(rest)))
    trace = detail.get("traceback")
    if isinstance(trace, str) and trace.strip():
        lines.append("  Stack trace")
        lines += [f"    {shown(line)}" for line in trace.rstrip("\n").split("\n")]
    return lines


def _usage_lines(view: dict[str, Any]) -> list[str]:
    lines = [
        "Usage",
        _row("Own", usage_text(view.get("usage") or {})),
        _row("Subtree", usage_text(view.get("subtree_usage") or {})),
    ]
    reserved = view.get("reserved") or {}
    if reserved.get("calls"):
        lines.append(_row("Reserved", usage_text(reserved)))
    budget = view.get("budget")
    if budget is None:
        lines.append(_row("Budget", "none"))
        return lines
    text = budget_text(budget)
    if view.get("budget_clamped"):
        text += " (clamped to what its parent had left)"
    text += f"; left: {budget_text(view.get('budget_left') or {})}"
    if view.get("budget_exhausted"):
        text += f"; exhausted: {view['budget_exhausted']}"
    lines.append(_row("Budget", text))
    return lines


def describe(view: dict[str, Any], now: float) -> list[str]:
    """``GET /v1/sessions/{id}``'s answer (or the same read from a store) as
    the lines ``sessions show`` prints; ``now`` is the epoch second times are
    told from."""
    lines = _session_lines(view, now)
    result = view.get("result")
    if result is not None:
        lines += ["", *_result_lines(result)]
        if result.get("error"):
            lines += ["", *_failure_lines(result["error"])]
    return [*lines, "", *_usage_lines(view)]


def _short_usage(view: dict[str, Any]) -> str:
    """What a tree line says of a session's accounts: its subtree's tokens,
    calls and cost, what its budget has left; empty when it spent nothing and
    has no budget."""
    used = view.get("subtree_usage") or {}
    tokens = used.get("prompt_tokens", 0) + used.get("completion_tokens", 0)
    parts = []
    if tokens or used.get("calls") or used.get("cost"):
        cost = money(used.get("cost", 0.0))
        parts.append(f"{tokens} tok, {plural(used.get('calls', 0), 'call')}, cost {cost}")
    left = view.get("budget_left")
    if left is not None:
        parts.append(f"left {budget_text(left)}")
    if view.get("budget_exhausted"):
        parts.append(f"exhausted: {view['budget_exhausted']}")
    return f"  ({'; '.join(parts)})" if parts else ""


def session_line(info: dict[str, Any], result: dict[str, Any] | None, now: float) -> str:
    """One session on one line (``sessions ls`` and a tree's line): kind, state,
    short id, skill, age, TTL left, task, error code; not yet escaped."""
    text = (
        f"{info['kind']:<6} {info['state']:<9} {info['session_id'][:8]}  "
        f"{info.get('skill', ''):<10} created {ago(info['created_at'], now)}"
    )
    deadline = info.get("deadline")
    if deadline is not None and info["state"] in _LIVE:
        text += f", ttl {until(deadline, now)}"
    if info.get("task"):
        task = info["task"] if len(info["task"]) <= 40 else info["task"][:39] + "~"
        text += f'  "{task}"'
    error = (result or {}).get("error")
    if error:
        text += f"  [{error['code']}]"
    return text


def draw_tree(tree: dict[str, Any], now: float) -> list[str]:
    """A session tree as ASCII lines: kind, state, short id, skill, when it
    was created, time left to its TTL,
    and the subtree's usage and what its budget has left."""

    def line(node: dict[str, Any]) -> str:
        return shown(session_line(node["info"], node.get("result"), now) + _short_usage(node))

    return ascii_tree([tree], lambda node: node.get("children", []), line)


def ascii_tree(
    tops: Sequence[T], children: Callable[[T], Sequence[T]], line: Callable[[T], str]
) -> list[str]:
    """Each of ``tops`` and what lies below it, one ``line`` a node, drawn with
    ``|--`` (or ``` `-- ``` for the last) under its parent."""
    lines: list[str] = []

    def walk(node: T, prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("`-- " if last else "|-- ")
        lines.append(f"{prefix}{branch}{line(node)}")
        below = children(node)
        deeper = prefix if root else prefix + ("    " if last else "|   ")
        for i, child in enumerate(below):
            walk(child, deeper, i == len(below) - 1, root=False)

    for top in tops:
        walk(top, "", last=True, root=True)
    return lines
