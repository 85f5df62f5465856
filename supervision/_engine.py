"""The pattern engine: the commands a pattern yields and the loop that runs tasks.

A pattern (``_patterns``) is a generator that never does I/O itself: it
yields commands (``_SpawnMany`` children in one batch, ``_WaitSome`` of some children,
``_Sleep``, ``_Cancel`` a child, read the clock with ``_Now``) and receives
their answers from a driver (``_drivers``). ``gather`` is the loop every
pattern shares: it spawns the tasks ready to run as fresh sessions in one
batch (one admission, one group commit), queues those the children limit or
the node's capacity refuses, retries failed attempts on the clock, and marks
what is still running at the timeout.

On failure: a spawn refused for good ends its task with the refusal in its
``Attempt``; a retry refused at the restart intensity limit cancels what
the gather still runs and raises ``EscalationError``.
"""

from __future__ import annotations

import collections
import heapq
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from sessiontree.protocol import (
    AggregateStrategy,
    Attempt,
    ChildReport,
    Collected,
    ErrorCode,
    EscalationError,
    Gathered,
    GatherStatus,
    Hedge,
    RejectedInputError,
    Retry,
    SessionResult,
    SpawnSpec,
    Summarizer,
)
from sessiontree.supervision._aggregate import aggregate, normalise_answer
from sessiontree.supervision._continuation import continuation_token
from sessiontree.supervision._hedging import Hedger
from sessiontree.supervision._retry import Restarts

__all__ = [
    "Command",
    "Engine",
    "Program",
    "Quorum",
    "QuorumEnd",
    "Task",
    "gather",
    "gathered",
    "met_by",
    "out_of_reach",
    "status_of",
    "wait_quorum",
]

_SLOT_WAIT = 0.05  # clock seconds between spawn attempts when no child of ours can free a slot

# -- commands -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _SpawnMany:
    """Spawn ``specs`` under the parent in one batch; answered with one
    ``Spawned`` per spec, in order."""

    specs: tuple[SpawnSpec, ...]


@dataclass(frozen=True, slots=True)
class _WaitSome:
    """Wait for the first of ``children`` to end; answered with ``(child, result)``
    of each of them that has ended by then, in the order they ended (children
    that end together are taken in one wait), or ``[]`` once ``timeout`` clock
    seconds pass."""

    children: tuple[uuid.UUID, ...]
    timeout: float | None


@dataclass(frozen=True, slots=True)
class _Sleep:
    """Sleep ``seconds`` on the clock; answered with None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class _Cancel:
    """Cancel ``child``; answered with what the cancel returned."""

    child: uuid.UUID


@dataclass(frozen=True, slots=True)
class _Now:
    """Read the monotonic clock; answered with its seconds."""


@dataclass(frozen=True, slots=True)
class _Note:
    """Report progress ``note`` with ``data`` (a retry: the parent's event
    stream and its span say so); answered with None."""

    note: str
    data: dict[str, Any]


Command = _SpawnMany | _WaitSome | _Sleep | _Cancel | _Now | _Note
Engine = Generator[Command, Any, Gathered]
Program = Generator[Command, Any, Any]  # an engine, or another program of commands (collect)
# -- the engine ----------------------------------------------------------------------------


@dataclass
class Task:
    index: int
    spec: SpawnSpec
    stage: int = 0
    attempts: list[Attempt] | None = None
    result: SessionResult | None = None
    timed_out: bool = False
    started: bool = False
    done: bool = False
    token: str | None = None
    counted: bool = False  # its result is one of those that met the quorum
    superseded: bool = False  # stopped (or never started) once the quorum was met

    def report(self) -> ChildReport:
        return ChildReport(
            index=self.index,
            spec=self.spec,
            attempts=list(self.attempts or []),
            result=self.result,
            timed_out=self.timed_out,
            started=self.started,
            stage=self.stage,
            continuation=self.token,
            counted=self.counted,
            superseded=self.superseded,
        )


@dataclass(frozen=True, slots=True)
class Quorum:
    """When a gather may end before every task has: ``k`` tasks succeeded or,
    with ``vote``, ``k`` agree (the same answer, as VOTE compares them) or the
    leading answer can no longer be overtaken by the tasks still open."""

    k: int
    vote: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            msg = f"quorum must be an integer >= 1, got {self.k!r}"
            raise RejectedInputError(msg, field="quorum")


def _record(task: Task, attempt: Attempt, **changes: Any) -> None:
    """Replace ``attempt`` in ``task``'s attempts with ``changes`` made to it."""
    changed = msgspec.structs.replace(attempt, **changes)
    task.attempts = [changed if a is attempt else a for a in task.attempts or []]


QuorumEnd = Literal["met", "missed"] | None
"""How a gather with a quorum ended: ``met``, ``missed`` (it could no longer
be met), or None (no quorum, or the timeout came first)."""


def met_by(quorum: Quorum, good: Sequence[SessionResult], still_open: int) -> list[int] | None:
    """Which of the ``good`` results (the successes so far) meet ``quorum`` with
    ``still_open`` tasks yet to end: their indices, or None while it is not met."""
    if not quorum.vote:
        return list(range(len(good))) if len(good) >= quorum.k else None
    answers = [normalise_answer(result.summary) for result in good]
    ranked = collections.Counter(a for a in answers if a).most_common(2)
    if not ranked:
        return None
    leader, lead = ranked[0]
    runner = ranked[1][1] if len(ranked) > 1 else 0
    if (lead >= quorum.k and lead > runner) or lead > runner + still_open:
        return [i for i, a in enumerate(answers) if a == leader]
    return None


def out_of_reach(quorum: Quorum, good: Sequence[SessionResult], still_open: int) -> bool:
    """Whether ``quorum``, not met by the ``good`` results so far, can no longer
    be met by the ``still_open`` tasks: too few could still succeed to make
    ``k``, or (a vote) none is left to break a tie. A vote with any task open
    can still be met (one more answer decides it), so only ``k`` successes end
    early."""
    if met_by(quorum, good, still_open) is not None:
        return False
    return still_open == 0 or (not quorum.vote and len(good) + still_open < quorum.k)


class _Gather:
    """One run of tasks to their ends (results filled into the tasks in place)."""

    def __init__(
        self,
        parent: uuid.UUID,
        tasks: list[Task],
        retry: Retry,
        restarts: Restarts,
        on_timeout: str,
        quorum: Quorum | None = None,
        hedge: Hedge | None = None,
    ) -> None:
        self.parent = parent
        self.tasks = tasks
        self.retry = retry
        self.restarts = restarts
        self.on_timeout = on_timeout
        self.quorum = quorum
        self.end: QuorumEnd = None
        self.hedger = None if hedge is None else Hedger(hedge)
        self.next_hedge: float | None = None  # when the next duplicate falls due
        self.ready: list[Task] = list(tasks)  # the next to spawn is ready[0]
        self.delayed: list[tuple[float, int, Task, float]] = []  # (when, index, task, wait)
        self.running: dict[uuid.UUID, tuple[Task, Attempt]] = {}
        self.backoff_of: dict[int, float] = {}
        # Once the children limit refused a task, a batch asks only for as many
        # as children of ours ended since (each frees one place), so a long
        # queue is not offered to the Cortex whole every time one child ends.
        self.limited = False
        self.freed = 0

    def run(self, timeout: float | None) -> Generator[Command, Any, None]:
        now: float = yield _Now()
        deadline = None if timeout is None else now + timeout
        while self.ready or self.delayed or self.running:
            now = yield _Now()
            if deadline is not None and now >= deadline:
                break
            while self.delayed and self.delayed[0][0] <= now:
                _, _, task, wait = heapq.heappop(self.delayed)
                self.backoff_of[task.index] = wait
                self.ready.insert(0, task)
            yield from self._spawn_ready(now)
            if self.quorum is not None and self._quorum_decided(self.quorum):
                yield from self._stop_the_rest(deadline)  # refusals put it out of reach
                break
            if self.hedger is not None:
                yield from self._hedge(self.hedger, now)
            if not self.running:
                if self.ready:
                    yield _Sleep(_SLOT_WAIT)  # the parent's other children hold every slot
                elif self.delayed:
                    yield _Sleep(max(0.0, self.delayed[0][0] - now))
                continue
            soonest = self.delayed[0][0] if self.delayed else None
            limits = [t for t in (deadline, soonest, self.next_hedge) if t is not None]
            ended = yield _WaitSome(
                tuple(self.running), max(0.0, min(limits) - now) if limits else None
            )
            if ended and self.hedger is not None:
                now = yield _Now()  # how long they took: the hedge's percentile
            for child, result in ended:
                yield from self._ended(child, result, now)
            if self.quorum is not None and self._quorum_decided(self.quorum):
                yield from self._stop_the_rest(deadline)
                break
        yield from self._out_of_time()
        self.restarts.forget(self.parent, now, self.retry.period)

    def _spawn_ready(self, now: float) -> Generator[Command, Any, None]:
        """Spawn the queued tasks in one batch; those the children limit (or the
        node's capacity, while a child of ours runs) refuses wait for a slot."""
        if not self.ready:
            return
        size = max(1, self.freed) if self.limited else len(self.ready)
        batch, self.ready = self.ready[:size], self.ready[size:]
        self.freed = 0
        numbers = [len(task.attempts or []) + 1 for task in batch]
        specs = tuple(self._spec(task, n) for task, n in zip(batch, numbers, strict=True))
        answers = yield _SpawnMany(specs)
        waiting: list[Task] = []
        for task, number, spec, spawned in zip(batch, numbers, specs, answers, strict=True):
            code = None if spawned.error is None else spawned.error.code
            if spawned.session_id is None and (
                code is ErrorCode.CHILDREN_EXCEEDED
                or (code is ErrorCode.CAPACITY_EXCEEDED and self.running)
            ):
                self.limited = True
                waiting.append(task)  # queued: a child of ours ending frees a slot
                continue
            task.started = True
            attempt = Attempt(
                number=number,
                session_id=spawned.session_id,
                skill=spec.skill,
                error=spawned.error,
                backoff_s=self.backoff_of.pop(task.index, 0.0),
            )
            task.attempts = [*(task.attempts or []), attempt]
            if spawned.session_id is None:
                task.done = True  # refused for good (depth, ttl, unknown skill…)
            else:
                self.running[spawned.session_id] = (task, attempt)
                if self.hedger is not None:
                    self.hedger.started[spawned.session_id] = now
        self.ready[:0] = waiting  # in their order, ahead of the rest

    def _spec(self, task: Task, number: int) -> SpawnSpec:
        """A task's spec for attempt ``number`` (a retry may run the fallback skill)."""
        if number > 1 and self.retry.fallback_skill is not None:
            return msgspec.structs.replace(task.spec, skill=self.retry.fallback_skill)
        return task.spec

    def _hedge(self, hedger: Hedger, now: float) -> Generator[Command, Any, None]:
        """Start a duplicate of each task whose one child has run past the
        hedge's delay, in one batch (once a task); one the children limit or
        the budget refuses is not started."""
        running = collections.Counter(task.index for task, _ in self.running.values())
        alone = {t.index: c for c, (t, _) in self.running.items() if running[t.index] == 1}
        due, self.next_hedge = hedger.due(alone, now)
        if not due:
            return
        runs = [self.running[alone[i]] for i in due]
        # the same work as the run it doubles (a retry's may be the fallback skill);
        # optional: a duplicate the budget cannot fit is not started, and stops nothing
        specs = tuple(
            msgspec.structs.replace(task.spec, skill=run.skill, optional=True) for task, run in runs
        )
        answers = yield _SpawnMany(specs)
        for (task, run), spawned in zip(runs, answers, strict=True):
            hedger.hedged.add(task.index)
            if spawned.session_id is None:
                continue
            attempt = Attempt(
                number=len(task.attempts or []) + 1,
                session_id=spawned.session_id,
                skill=run.skill,
                hedge=True,
            )
            task.attempts = [*(task.attempts or []), attempt]
            self.running[spawned.session_id] = (task, attempt)
            hedger.started[spawned.session_id] = now

    def _ended(
        self, child: uuid.UUID, result: SessionResult, now: float
    ) -> Generator[Command, Any, None]:
        """A child's result: done, or queued for another attempt after its backoff.
        With a hedge: the first of a task's two children to succeed is its
        result (the other is cancelled); a failure waits for the other."""
        task, attempt = self.running.pop(child)
        self.freed += 1
        if self.hedger is not None:
            self.hedger.ended(child, now, result.ok)
        _record(task, attempt, result=result, error=result.error)
        twin = None  # with a hedge: the task's other child still running
        if self.hedger is not None:
            twin = next((c for c, (t, _) in self.running.items() if t is task), None)
        task.result = result
        if result.ok:
            task.done = True
            task.token = continuation_token(task.spec, result)
            if twin is not None:  # the slower of the two: stopped, not waited for
                _, slower = self.running.pop(twin)
                _record(task, slower, superseded=True)
                if self.hedger is not None:
                    self.hedger.started.pop(twin, None)
                yield _Cancel(twin)
            return
        if twin is not None:  # the other may still succeed
            return
        tries = sum(1 for a in task.attempts or [] if not a.hedge)
        if tries >= self.retry.max_attempts or not self.retry.retryable(result.error):
            task.done = True
            return
        now = yield _Now()
        if not self.restarts.allow(self.parent, now, self.retry):
            for other in list(self.running):
                yield _Cancel(other)
            errors = [t.report().diagnostic() for t in self.tasks if not t.report().ok]
            msg = (
                f"more than {self.retry.intensity} restarts within {self.retry.period} s "
                f"under session {self.parent}: escalating instead of retrying"
            )
            raise EscalationError(msg, errors=errors)
        wait = self.retry.backoff(tries + 1)
        yield _Note(
            "retry",
            {
                "task": task.index,
                "attempt": tries + 1,
                "after_s": wait,
                "failed": str(child),
                "code": result.error.code.value if result.error else None,
            },
        )
        heapq.heappush(self.delayed, (now + wait, task.index, task, wait))

    def _quorum_decided(self, quorum: Quorum) -> bool:
        """Whether the quorum is met now (the tasks that met it are counted) or
        can no longer be met (too many failed); either ends the gather."""
        good = [t for t in self.tasks if t.done and t.result is not None and t.result.ok]
        results = [t.result for t in good if t.result]
        still_open = sum(1 for t in self.tasks if not t.done)
        counted = met_by(quorum, results, still_open)
        if counted is not None:
            self.end = "met"
            for i in counted:
                good[i].counted = True
            return True
        if out_of_reach(quorum, results, still_open):
            self.end = "missed"
            return True
        return False

    def _stop_the_rest(self, deadline: float | None) -> Generator[Command, Any, None]:
        """The quorum is met or out of reach: what has not started never does,
        what runs is cancelled (with the node's grace) and waited for, so what
        it returns in its grace is kept as its partial result (one that never
        returns ends at the grace, terminated by force); nothing is retried."""
        for task in (*self.ready, *(entry[2] for entry in self.delayed)):
            task.superseded = True
        self.ready, self.delayed = [], []
        for child, (task, _) in self.running.items():
            task.superseded = True
            yield _Cancel(child)
        while self.running:
            now: float = yield _Now()
            if deadline is not None and now >= deadline:
                return  # still winding down at the timeout: reported as timed out
            ended = yield _WaitSome(
                tuple(self.running), None if deadline is None else max(0.0, deadline - now)
            )
            for child, result in ended:
                task, attempt = self.running.pop(child)
                _record(task, attempt, result=result, error=result.error)
                task.result = result
                task.done = True

    def _out_of_time(self) -> Generator[Command, Any, None]:
        """At the timeout: what still runs is timed out (and cancelled if asked)."""
        for child, (task, _) in self.running.items():
            task.timed_out = True
            if self.on_timeout == "cancel":
                yield _Cancel(child)
        for task in (*self.ready, *(entry[2] for entry in self.delayed)):
            task.timed_out = task.started  # never started: reported as such


def gather(
    parent: uuid.UUID,
    tasks: list[Task],
    retry: Retry,
    restarts: Restarts,
    timeout: float | None,
    on_timeout: str,
    quorum: Quorum | None = None,
    hedge: Hedge | None = None,
) -> Generator[Command, Any, QuorumEnd]:
    """Run ``tasks`` to their ends, or until ``quorum`` is met or can no longer
    be met (results filled in place), with duplicates of slow children when
    ``hedge`` says; returns how the quorum ended (None without one)."""
    run = _Gather(parent, tasks, retry, restarts, on_timeout, quorum, hedge)
    yield from run.run(timeout)
    return run.end


def wait_quorum(
    children: Sequence[uuid.UUID], quorum: Quorum, timeout: float | None
) -> Generator[Command, Any, list[Collected]]:
    """``collect`` with a quorum: the children's results in arrival order until
    ``quorum`` is met (those that met it ``counted``) or can no longer be met
    (too many failed: none ``counted``); then the rest are cancelled with the
    node's grace and waited for, what they return in it kept (``superseded``;
    one that never returns ends at the grace, terminated by force). At
    ``timeout`` a child still running gives a ``timed_out`` entry (and keeps
    running unless the quorum cancelled it)."""
    now: float = yield _Now()
    deadline = None if timeout is None else now + timeout
    pending = list(children)
    got: list[Collected] = []
    counted: set[uuid.UUID] = set()
    superseded: set[uuid.UUID] = set()
    while pending:
        if deadline is not None and now >= deadline:
            break
        ended = yield _WaitSome(
            tuple(pending), None if deadline is None else max(0.0, deadline - now)
        )
        for child, result in ended:
            pending.remove(child)
            got.append(Collected(session_id=child, result=result))
        if not superseded:
            good = [c for c in got if c.result is not None and c.result.ok]
            results = [c.result for c in good if c.result]
            met = met_by(quorum, results, len(pending))
            if met is not None or out_of_reach(quorum, results, len(pending)):
                counted = {good[i].session_id for i in met or []}
                superseded = set(pending)
                for child in pending:
                    yield _Cancel(child)
        now = yield _Now()
    got += [Collected(session_id=child, result=None, timed_out=True) for child in pending]
    return [
        msgspec.structs.replace(
            c, counted=c.session_id in counted, superseded=c.session_id in superseded
        )
        for c in got
    ]


def status_of(tasks: Sequence[Task], quorum: QuorumEnd = None) -> GatherStatus:
    """``completed`` when every task succeeded or a quorum was met, ``failed``
    when a quorum could no longer be met (whatever did succeed)."""
    if quorum == "missed":
        return GatherStatus.FAILED
    good = sum(1 for t in tasks if t.result is not None and t.result.ok)
    if good == len(tasks) or quorum == "met":
        return GatherStatus.COMPLETED
    return GatherStatus.PARTIAL if good else GatherStatus.FAILED


def gathered(
    tasks: Sequence[Task],
    status: GatherStatus,
    strategy: AggregateStrategy | str | None,
    summarizer: Summarizer | None,
    last_stage: Sequence[Task] | None = None,
    quorum: Quorum | None = None,
) -> Gathered:
    reports = [t.report() for t in tasks]
    aggregated = None
    if strategy is not None:
        final = [t.report() for t in last_stage] if last_stage is not None else reports
        aggregated = aggregate(final, strategy, summarizer=summarizer)
    k = None if quorum is None else quorum.k
    return Gathered(status=status, reports=reports, aggregated=aggregated, quorum=k)
