"""The Cortex's rules as pure functions over plain data: spawn validation (the
first failing check is the answer), what a new session inherits, how a run's
end ends its session."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sessiontree.actors.runtime import RunEnd
from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    Outcome,
    SessionKind,
    SessionState,
    SpawnSpec,
)
from sessiontree.supervision._config import Agent, NodeConfig

__all__ = [
    "ENDING_MESSAGES",
    "MAX_BRANCH_DEPTH",
    "MAX_WORKER_DEPTH",
    "Capacity",
    "ParentView",
    "check_spawn",
    "ending_of",
    "model_tier",
    "resolve_ttl",
]

MAX_BRANCH_DEPTH = 3
MAX_WORKER_DEPTH = 4


# Both made per spawn: plain slots (a frozen dataclass's __init__ costs about
# five times as much); the rules only read them.
@dataclass(slots=True)
class ParentView:
    """What the rules need to know of a would-be parent."""

    session_id: object
    kind: SessionKind
    state: SessionState
    depth: int
    live_children: int
    cancelling: bool


@dataclass(slots=True)
class Capacity:
    """The node's counters that the capacity check reads."""

    live_sessions: int
    zombies: int
    sync_threads: int
    needs_thread: bool


def _error(code: ErrorCode, message: str, **detail: object) -> ErrorInfo:
    return ErrorInfo(code=code, message=message, detail=dict(detail))


def resolve_ttl(spec: SpawnSpec, agent: Agent) -> float | None:
    """The TTL a spawn gets: its own, or the agent's default for the kind."""
    return spec.ttl if spec.ttl is not None else agent.ttl_for(spec.kind)


def check_spawn(
    parent: ParentView | None,
    spec: SpawnSpec,
    agent: Agent | None,
    config: NodeConfig,
    capacity: Capacity,
) -> ErrorInfo | None:
    """Validate a spawn in the order the README's Limits and defaults gives; ``None`` means allowed.

    Order: unknown_session, parent_not_active, worker_cannot_spawn,
    depth_exceeded, children_exceeded, invalid_ttl, unknown_skill,
    capacity_exceeded. Every message names the session and the limit.
    """
    if parent is None or agent is None:
        return _error(ErrorCode.UNKNOWN_SESSION, "parent session does not exist")
    pid = parent.session_id
    if parent.state not in (SessionState.PENDING, SessionState.ACTIVE) or parent.cancelling:
        why = "cancellation requested" if parent.cancelling else parent.state.value
        return _error(
            ErrorCode.PARENT_NOT_ACTIVE,
            f"parent {pid} is not active ({why})",
            parent_state=parent.state.value,
        )
    if parent.kind is SessionKind.WORKER:
        return _error(
            ErrorCode.WORKER_CANNOT_SPAWN, f"parent {pid} is a worker; workers never spawn"
        )
    depth = parent.depth + 1
    if spec.kind is SessionKind.MAIN:
        return _error(
            ErrorCode.DEPTH_EXCEEDED, "a main session lives at depth 0 only; it is never spawned"
        )
    limit = MAX_BRANCH_DEPTH if spec.kind is SessionKind.BRANCH else MAX_WORKER_DEPTH
    if depth > limit:
        return _error(
            ErrorCode.DEPTH_EXCEEDED,
            f"a {spec.kind.value} under {pid} would be at depth {depth}; the limit is {limit}",
            depth=depth,
            limit=limit,
        )
    if parent.live_children >= agent.max_children:
        return _error(
            ErrorCode.CHILDREN_EXCEEDED,
            f"parent {pid} already has {parent.live_children} live children; "
            f"the limit is {agent.max_children}",
            limit=agent.max_children,
        )
    ttl = resolve_ttl(spec, agent)
    if ttl is not None and (
        not isinstance(ttl, int | float)
        or not math.isfinite(ttl)
        or ttl <= 0
        or ttl > config.max_ttl
    ):
        return _error(
            ErrorCode.INVALID_TTL,
            f"ttl {ttl!r} must be a finite number of seconds in (0, {config.max_ttl}]",
            ttl=repr(ttl),
            max_ttl=config.max_ttl,
        )
    skill = spec.skill or agent.default
    if skill not in agent.skills:
        return _error(
            ErrorCode.UNKNOWN_SKILL,
            f"agent {agent.agent_id!r} has no skill {skill!r}",
            skills=sorted(agent.skills),
        )
    if capacity.live_sessions >= config.max_sessions:
        return _error(
            ErrorCode.CAPACITY_EXCEEDED,
            f"the node holds {capacity.live_sessions} live sessions; max_sessions is "
            f"{config.max_sessions}",
            limit="max_sessions",
        )
    if capacity.zombies >= config.max_zombies:
        return _error(
            ErrorCode.CAPACITY_EXCEEDED,
            f"{capacity.zombies} abandoned skill threads; max_zombies is {config.max_zombies}",
            limit="max_zombies",
        )
    if capacity.needs_thread and capacity.sync_threads >= config.max_step_threads:
        return _error(
            ErrorCode.CAPACITY_EXCEEDED,
            f"all {config.max_step_threads} step threads are taken by sync skills "
            "(use async skills for many waiting sessions)",
            limit="max_step_threads",
        )
    return None


def model_tier(spec: SpawnSpec, agent: Agent, parent_tier: str | None, *, root: bool) -> str | None:
    """The model tier a new session gets: the spawn's own; else the cheapest for
    a Worker, its parent's for a Branch, the best for a root."""
    if spec.model_tier is not None:
        return spec.model_tier
    if spec.kind is SessionKind.WORKER:
        return agent.model_tiers[0]
    if not root:
        return parent_tier
    return agent.model_tiers[-1]


def ending_of(
    end: RunEnd, cancel_code: ErrorCode | None
) -> tuple[SessionState, ErrorCode | None, Outcome | None, ErrorInfo | None]:
    """How a run's end ends its session (state, code, outcome, error): cancelled
    once cancellation was asked (what it returned is the partial result), else
    failed on its error, cancelled by a ``Cancelled`` of its own, or completed."""
    if cancel_code is not None:
        return SessionState.CANCELLED, cancel_code, end.outcome, None
    if end.error is not None:
        return SessionState.FAILED, end.error.code, None, end.error
    if end.cancelled:
        return SessionState.CANCELLED, ErrorCode.CANCELLED, None, None
    return SessionState.COMPLETED, None, end.outcome, None


#: The message of an ending's error, by its code ({} is the session id).
ENDING_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.CANCELLED: "session {} was cancelled",
    ErrorCode.PARENT_TERMINATED: "session {} was cancelled because its parent ended",
    ErrorCode.TERMINATED_BY_FORCE: "session {} was still running at its deadline and was "
    "terminated by force",
    ErrorCode.TTL_EXPIRED: "session {} outlived its ttl",
    ErrorCode.NODE_RESTARTED: "session {} was running when the node stopped",
    ErrorCode.WEDGED: "session {} was cut off by a crash on every run; held back",
    ErrorCode.NODE_CLOSED: "session {} was stopped with the node",
    ErrorCode.BUDGET_EXHAUSTED: "session {} was cancelled: its subtree's budget ran out",
    ErrorCode.TIMED_OUT: "session {} was cancelled: the run waiting for it timed out",
}
