"""The data of ``sessiontree top``, pure: rows of the session tree, filtered and
sorted; the rates of spawns, endings and failures between two polls; and the
header's text. Nothing here touches the network or a terminal, so it is
tested on plain values (``_source`` fetches them, ``_app`` shows them).

A tree comes as ``GET /v1/sessions/{id}/tree`` answers it: nested dicts with
``info``, ``result``, ``usage``, ``subtree_usage`` and ``children``. A tree
missing one of those keys raises ``KeyError`` naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sessiontree.cli._text import shown
from sessiontree.cli._times import human_duration

__all__ = [
    "SORTS",
    "Counters",
    "RateMeter",
    "Rates",
    "Row",
    "build_rows",
    "counters_of",
    "header_text",
    "human_duration",
    "parent_of",
]

#: How rows can be ordered (among siblings: the tree stays a tree), in the
#: order the sort key cycles through them.
SORTS = ("age", "state", "kind", "usage")

_STATE_ORDER = ("pending", "active", "suspended", "completed", "failed", "expired", "cancelled")
_KIND_ORDER = ("main", "branch", "worker")
_TERMINAL = frozenset(_STATE_ORDER[3:])


@dataclass(frozen=True, slots=True)
class Row:
    """One session as a line of the view. ``prefix`` draws its place in the
    tree; ``age_s`` runs from creation to now (to its end, once it ended);
    ``ttl_left_s`` is None without a deadline or once the session ended.
    Usage is its own (``tokens``, ``cost``) and its subtree's (``subtree_*``)."""

    session_id: str
    parent_id: str | None
    prefix: str
    kind: str
    state: str
    agent: str
    skill: str
    task: str
    created_at: float
    age_s: float
    ttl_left_s: float | None
    tokens: int
    cost: float
    subtree_tokens: int
    subtree_cost: float

    @property
    def short_id(self) -> str:
        return self.session_id[:8]


def _tokens(usage: Mapping[str, Any] | None) -> int:
    if not usage:
        return 0
    return int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))


def _cost(usage: Mapping[str, Any] | None) -> float:
    return float(usage.get("cost", 0.0)) if usage else 0.0


def _row(tree: Mapping[str, Any], prefix: str, now: float) -> Row:
    info = tree["info"]
    state = str(info["state"])
    created = float(info["created_at"])
    result = tree.get("result") or {}
    ended = (result.get("timings") or {}).get("ended_at")
    terminal = state in _TERMINAL
    end = float(ended) if terminal and ended is not None else now
    deadline = info.get("deadline")
    ttl_left = None if terminal or deadline is None else float(deadline) - now
    return Row(
        session_id=str(info["session_id"]),
        parent_id=None if info.get("parent_id") is None else str(info["parent_id"]),
        prefix=prefix,
        kind=str(info["kind"]),
        state=state,
        agent=str(info.get("agent_id", "")),
        skill=str(info.get("skill", "")),
        task=str(info.get("task", "")),
        created_at=created,
        age_s=max(0.0, end - created),
        ttl_left_s=ttl_left,
        tokens=_tokens(tree["usage"]),
        cost=_cost(tree["usage"]),
        subtree_tokens=_tokens(tree["subtree_usage"]),
        subtree_cost=_cost(tree["subtree_usage"]),
    )


def _matches(tree: Mapping[str, Any], needle: str) -> bool:
    info = tree["info"]
    fields = (info.get("agent_id"), info.get("skill"), info.get("session_id"), info.get("state"))
    return any(needle in str(value).lower() for value in fields if value is not None)


def _kept(tree: Mapping[str, Any], needle: str) -> dict[str, Any] | None:
    """``tree`` cut to the sessions matching ``needle`` and their ancestors."""
    children = [kept for c in tree["children"] if (kept := _kept(c, needle)) is not None]
    if children or not needle or _matches(tree, needle):
        return {**tree, "children": children}
    return None


def _order(trees: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
    def created(tree: Mapping[str, Any]) -> float:
        return float(tree["info"]["created_at"])

    def rank(order: tuple[str, ...], value: str) -> int:
        return order.index(value) if value in order else len(order)

    if sort == "age":
        return sorted(trees, key=created)
    if sort == "state":
        return sorted(trees, key=lambda t: (rank(_STATE_ORDER, t["info"]["state"]), created(t)))
    if sort == "kind":
        return sorted(trees, key=lambda t: (rank(_KIND_ORDER, t["info"]["kind"]), created(t)))
    if sort == "usage":
        return sorted(
            trees,
            key=lambda t: (-_tokens(t["subtree_usage"]), -_cost(t["subtree_usage"]), created(t)),
        )
    msg = f"sort {sort!r} is not one of {', '.join(SORTS)}"
    raise ValueError(msg)


def build_rows(
    trees: Iterable[Mapping[str, Any]], now: float, *, text: str = "", sort: str = "age"
) -> list[Row]:
    """The rows of ``trees`` (each a ``/tree`` answer), depth first.

    ``text`` keeps the sessions whose agent, skill, id or state contains it
    (case-insensitive) and their ancestors, so every match stays in place;
    ``sort`` (one of ``SORTS``; ``ValueError`` for another) orders siblings:
    oldest first, by lifecycle state, Main → Branch → Worker, or by the
    subtree's tokens then cost, largest first. ``now`` is the epoch second
    ages and TTLs are counted at."""
    needle = text.strip().lower()
    kept = [k for tree in trees if (k := _kept(tree, needle)) is not None]
    rows: list[Row] = []

    def walk(tree: Mapping[str, Any], lead: str, branch: str) -> None:
        rows.append(_row(tree, lead + branch, now))
        children = _order(tree["children"], sort)
        below = lead + ("   " if branch == "└─ " else "│  " if branch else "")
        for i, child in enumerate(children):
            walk(child, below, "└─ " if i == len(children) - 1 else "├─ ")

    for tree in _order(kept, sort):
        walk(tree, "", "")
    return rows


def parent_of(trees: Iterable[Mapping[str, Any]], session_id: str) -> str | None:
    """The parent id of ``session_id`` in ``trees`` (None for a root, or for an
    id none of them holds)."""
    stack = list(trees)
    while stack:
        tree = stack.pop()
        info = tree["info"]
        if str(info["session_id"]) == session_id:
            parent = info.get("parent_id")
            return None if parent is None else str(parent)
        stack.extend(tree["children"])
    return None


@dataclass(frozen=True, slots=True)
class Counters:
    """The node's cumulative counts (from its ``/metrics``): sessions spawned,
    ended (any final state) and failed."""

    spawned: float
    ended: float
    failed: float


def counters_of(exposition: str) -> Counters:
    """The counts in a Prometheus text exposition
    (``sessiontree_sessions_spawned_total``, ``…_terminated_total`` by
    ``state``); absent families count 0. ``ValueError`` for text that is
    not an exposition."""
    spawned = ended = failed = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "sessiontree_sessions_spawned_total":
                spawned += sample.value
            elif sample.name == "sessiontree_sessions_terminated_total":
                ended += sample.value
                if sample.labels.get("state") == "failed":
                    failed += sample.value
    return Counters(spawned=spawned, ended=ended, failed=failed)


@dataclass(frozen=True, slots=True)
class Rates:
    """Per second, over the last interval between two polls."""

    spawns: float
    endings: float
    failures: float


class RateMeter:
    """Rates from successive counters. The first reading gives None (nothing to
    compare with yet), and so does one whose counts went down (the node
    restarted: it becomes the new baseline) or whose time did not move."""

    def __init__(self) -> None:
        self._last: tuple[Counters, float] | None = None

    def update(self, counters: Counters, at: float) -> Rates | None:
        last, self._last = self._last, (counters, at)
        if last is None:
            return None
        before, then = last
        elapsed = at - then
        deltas = (
            counters.spawned - before.spawned,
            counters.ended - before.ended,
            counters.failed - before.failed,
        )
        if elapsed <= 0 or min(deltas) < 0:
            return None
        spawns, endings, failures = (d / elapsed for d in deltas)
        return Rates(spawns=spawns, endings=endings, failures=failures)


def header_text(node: Mapping[str, Any], rates: Rates | None) -> str:
    """Two lines: the node (name, version, state, uptime, agents) and its
    figures (sessions by state, live, slots, zombies) with the rates
    (``-`` until two polls have been compared); what the node says is
    escaped (``_text.shown``), each line one line."""
    stats = node.get("stats", {})
    config = node.get("config", {})
    by_state = node.get("sessions", {})
    states = " ".join(f"{s} {by_state[s]}" for s in _STATE_ORDER if by_state.get(s))
    rate = (
        "spawns - /s  endings - /s  failures - /s"
        if rates is None
        else f"spawns {rates.spawns:.1f}/s  endings {rates.endings:.1f}/s  "
        f"failures {rates.failures:.1f}/s"
    )
    first = (
        f"node {node.get('node', '?')} {node.get('version', '')} · {node.get('state', '?')} · "
        f"up {human_duration(node.get('uptime_s'))} · agents {', '.join(node.get('agents', []))}"
    )
    second = (
        f"sessions: {states or 'none'} · live {stats.get('live_sessions', 0)} · "
        f"slots {stats.get('slots_in_use', 0)}/{config.get('max_running_skills', '?')} · "
        f"zombies {stats.get('zombies', 0)} · {rate}"
    )
    return f"{shown(first)}\n{shown(second)}"
