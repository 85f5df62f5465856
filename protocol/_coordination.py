"""What coordination patterns report: each child's attempts, the whole run, aggregations."""

from __future__ import annotations

import enum
import uuid
from typing import Any

import msgspec

from sessiontree.protocol._errors import ErrorCode, ErrorInfo
from sessiontree.protocol._results import Outcome, SessionResult
from sessiontree.protocol._specs import SpawnSpec

__all__ = [
    "NON_RETRYABLE",
    "AggregateStrategy",
    "Aggregated",
    "Attempt",
    "ChildReport",
    "GatherStatus",
    "Gathered",
]

#: Error codes a retry cannot fix: never retried.
NON_RETRYABLE = frozenset(
    {
        ErrorCode.REJECTED_INPUT,
        ErrorCode.UNKNOWN_SKILL,
        ErrorCode.UNKNOWN_AGENT,
        ErrorCode.UNKNOWN_SESSION,
        ErrorCode.INVALID_TTL,
        ErrorCode.DEPTH_EXCEEDED,
        ErrorCode.WORKER_CANNOT_SPAWN,
        ErrorCode.PARENT_NOT_ACTIVE,
        ErrorCode.NOT_ALLOWED,
        ErrorCode.CANCELLED,
        ErrorCode.PARENT_TERMINATED,
        ErrorCode.NODE_CLOSED,
        ErrorCode.ESCALATED,
    }
)


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt at a task: a fresh session (or a refused spawn, ``session_id`` None).

    ``backoff_s`` is the wait before this attempt (0 for the first). ``hedge``:
    a duplicate started while an earlier attempt still ran (a ``Hedge``);
    ``superseded``: cancelled because the other one succeeded first (its
    result is not waited for).
    """

    number: int
    session_id: uuid.UUID | None
    skill: str | None
    result: SessionResult | None = None
    error: ErrorInfo | None = None
    backoff_s: float = 0.0
    hedge: bool = False
    superseded: bool = False

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok


class ChildReport(msgspec.Struct, frozen=True, kw_only=True):
    """One task of a pattern: its spec, every attempt, and how it ended.

    ``result`` is the last attempt's result (None if none ended); ``timed_out``:
    still running when the pattern's timeout passed (it keeps running unless
    the pattern was told to cancel); ``started``: False for a task never
    spawned because the pattern timed out or escalated first; ``stage``: its
    pipeline stage (map-reduce: 0 map, 1 reduce); ``continuation``: a token
    to continue this run in a fresh session (``continue_run``), once it completed.
    With a quorum: ``counted``, its result is one of those that met it;
    ``superseded``, the quorum was met, or could no longer be met, while it
    still ran (it was cancelled with the node's grace, and what it returned
    in its grace is its partial ``result``, status ``cancelled``) or before
    it started (``started`` False).
    """

    index: int
    spec: SpawnSpec
    attempts: list[Attempt]
    result: SessionResult | None = None
    timed_out: bool = False
    started: bool = True
    stage: int = 0
    continuation: str | None = None
    counted: bool = False
    superseded: bool = False

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def error(self) -> ErrorInfo | None:
        """Why this task has no good result (None when it has one)."""
        if self.ok:
            return None
        if self.timed_out:
            return ErrorInfo(code=ErrorCode.TIMED_OUT, message=f"task {self.index} timed out")
        if self.result is not None and self.result.error is not None:
            return self.result.error
        last = self.attempts[-1] if self.attempts else None
        if last is not None and last.error is not None:
            return last.error
        return ErrorInfo(code=ErrorCode.TIMED_OUT, message=f"task {self.index} never started")

    def diagnostic(self) -> dict[str, Any]:
        """This task's failure as data: code, message, attempts."""
        error = self.error
        return {
            "index": self.index,
            "task": self.spec.task,
            "code": None if error is None else error.code.value,
            "message": "" if error is None else error.message,
            "attempts": len(self.attempts),
            "sessions": [str(a.session_id) for a in self.attempts if a.session_id],
            "superseded": self.superseded,
        }


class GatherStatus(enum.StrEnum):
    """How a pattern's children did, all together."""

    COMPLETED = "completed"  # every task has a good result, or a quorum was met
    PARTIAL = "partial"  # some did; the rest failed or timed out
    FAILED = "failed"  # none did, or a quorum could no longer be met


class Gathered(msgspec.Struct, frozen=True, kw_only=True):
    """What a pattern gives back: a report per task, in task order.

    ``status`` sums them up; ``diagnostics`` lists every task without a good
    result (code, message, attempts). ``aggregated`` is filled when the
    pattern was given a strategy. ``quorum``: the quorum asked for (None:
    none), ``counted`` the results that met it.
    """

    status: GatherStatus
    reports: list[ChildReport]
    aggregated: Aggregated | None = None
    quorum: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is GatherStatus.COMPLETED

    @property
    def results(self) -> list[SessionResult]:
        """The good results, in task order."""
        return [r.result for r in self.reports if r.ok and r.result is not None]

    @property
    def counted(self) -> list[SessionResult]:
        """The results that met the quorum, in task order (empty without one)."""
        return [r.result for r in self.reports if r.counted and r.result is not None]

    @property
    def diagnostics(self) -> list[dict[str, Any]]:
        return [r.diagnostic() for r in self.reports if not r.ok]

    def to_outcome(self) -> Outcome:
        """The aggregation as a skill's return value (CONCAT when none was asked)."""
        if self.aggregated is not None:
            return self.aggregated.to_outcome()
        return Outcome(summary="\n\n".join(r.summary for r in self.results if r.summary))


class AggregateStrategy(enum.StrEnum):
    """How children's results become one."""

    CONCAT = "concat"
    SUMMARIZE = "summarize"
    VOTE = "vote"
    MERGE = "merge"


class Aggregated(msgspec.Struct, frozen=True, kw_only=True):
    """Children's results made one.

    ``contributors``: the sessions whose results went in; ``missing``: the
    tasks (by index) without a good result. VOTE: ``answer`` is the winning
    normalised answer, ``votes`` the count per answer, ``tie`` the answers
    that tied for first (then ``answer`` is None). MERGE: ``conflicts`` maps
    the JSON Pointer of a differing artifact (``/meta/pages``) to each
    contributor's value there.
    """

    strategy: AggregateStrategy
    summary: str = ""
    artifacts: dict[str, Any] = msgspec.field(default_factory=dict)
    memory_ids: tuple[str, ...] = ()
    contributors: list[uuid.UUID] = msgspec.field(default_factory=list)
    missing: list[int] = msgspec.field(default_factory=list)
    answer: str | None = None
    votes: dict[str, int] = msgspec.field(default_factory=dict)
    tie: list[str] = msgspec.field(default_factory=list)
    conflicts: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)

    def to_outcome(self) -> Outcome:
        """As a skill's return value: summary, artifacts, memory ids."""
        return Outcome(summary=self.summary, artifacts=self.artifacts, memory_ids=self.memory_ids)
