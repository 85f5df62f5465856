"""The pattern engine against a simulated tree (hypothesis): no runtime, no threads.

The engine only yields commands, so a small simulator can answer them: a
clock, a children limit, children whose outcome and duration each attempt
are drawn. Whatever is drawn, the engine keeps its promises: never more
children at once than the limit, at most ``max_attempts`` attempts a task,
every attempt a new session, retries only of retryable failures and only
after their backoff, escalation exactly when restarts pass the intensity
within the period, and every task reported.
"""

from __future__ import annotations

import collections
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    EscalationError,
    GatherStatus,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.supervision import Retry
from sessiontree.supervision._engine import _Cancel, _Now, _Sleep, _SpawnMany, _WaitSome
from sessiontree.supervision._patterns import fan_out
from sessiontree.supervision._retry import Restarts

PARENT = uuid.UUID(int=1)


@dataclass
class Spawned:
    session_id: uuid.UUID | None
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        return self.session_id is not None


@dataclass
class Sim:
    """A clock and a tree of children with scripted outcomes."""

    limit: int
    script: dict[str, list[tuple[str, float]]]  # task -> (outcome, duration) per attempt
    now: float = 0.0
    running: dict[uuid.UUID, tuple[float, str, str]] = field(default_factory=dict)
    ended: dict[uuid.UUID, SessionResult] = field(default_factory=dict)
    started: dict[uuid.UUID, float] = field(default_factory=dict)
    finished: dict[uuid.UUID, float] = field(default_factory=dict)
    attempts: collections.Counter[str] = field(default_factory=collections.Counter)
    peak: int = 0
    seen_ids: set[uuid.UUID] = field(default_factory=set)
    numbers: dict[uuid.UUID, tuple[int, str]] = field(default_factory=dict)  # (attempt, outcome)

    def spawn(self, task: str) -> Spawned:
        if len(self.running) >= self.limit:
            error = ErrorInfo(code=ErrorCode.CHILDREN_EXCEEDED, message="full")
            return Spawned(None, error)
        sid = uuid.uuid4()
        assert sid not in self.seen_ids
        self.seen_ids.add(sid)
        plan = self.script[task]
        outcome, duration = plan[min(self.attempts[task], len(plan) - 1)]
        self.attempts[task] += 1
        self.numbers[sid] = (self.attempts[task], outcome)
        self.running[sid] = (self.now + duration, outcome, task)
        self.started[sid] = self.now
        self.peak = max(self.peak, len(self.running))
        return Spawned(sid)

    def _end(self, sid: uuid.UUID, outcome: str) -> SessionResult:
        self.running.pop(sid)
        self.finished[sid] = self.now
        if outcome == "ok":
            return SessionResult(session_id=sid, status=SessionState.COMPLETED, summary="ok")
        detail = {"retryable": False} if outcome == "never" else {}
        code = ErrorCode.CANCELLED if outcome == "cancelled" else ErrorCode.CRASHED
        status = SessionState.CANCELLED if outcome == "cancelled" else SessionState.FAILED
        error = ErrorInfo(code=code, message=outcome, detail=detail)
        return SessionResult(session_id=sid, status=status, kind=SessionKind.WORKER, error=error)

    def wait_some(
        self, children: tuple[uuid.UUID, ...], timeout: float | None
    ) -> list[tuple[uuid.UUID, SessionResult]]:
        ended = [(sid, self.ended.pop(sid)) for sid in children if sid in self.ended]
        if ended:
            return ended
        ends = [(self.running[c][0], c) for c in children if c in self.running]
        first = min(ends) if ends else None
        if first is None or (timeout is not None and self.now + timeout < first[0]):
            assert timeout is not None, "waiting forever on nothing"
            self.now += timeout
            return []
        self.now = max(self.now, first[0])
        # every child due by now ends; the wanted ones are answered in the order they ended
        due = sorted((end, c) for c, (end, _, _) in self.running.items() if end <= self.now)
        for _, sid in due:
            self.ended[sid] = self._end(sid, self.running[sid][1])
        wanted = set(children)
        return [(sid, self.ended.pop(sid)) for _, sid in due if sid in wanted]

    def cancel(self, sid: uuid.UUID) -> None:
        if sid in self.running:
            self.ended[sid] = self._end(sid, "cancelled")


def drive(sim: Sim, engine: Any) -> Any:
    answer: Any = None
    while True:
        try:
            command = engine.send(answer)
        except StopIteration as stop:
            return stop.value
        match command:
            case _SpawnMany(specs=specs):
                answer = [sim.spawn(spec.task) for spec in specs]
            case _WaitSome(children=children, timeout=timeout):
                answer = sim.wait_some(children, timeout)
            case _Sleep(seconds=seconds):
                sim.now += seconds
                answer = None
            case _Cancel(child=child):
                sim.cancel(child)
                answer = None
            case _Now():
                answer = sim.now


outcomes = st.sampled_from(["ok", "ok", "crash", "never"])
attempt_plan = st.lists(st.tuples(outcomes, st.floats(0.1, 20.0)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(
    plans=st.lists(attempt_plan, min_size=1, max_size=12),
    limit=st.integers(1, 5),
    max_attempts=st.integers(1, 4),
    initial=st.floats(0.0, 5.0),
    intensity=st.integers(0, 6),
    period=st.floats(1.0, 100.0),
    timeout=st.one_of(st.none(), st.floats(1.0, 200.0)),
)
def test_the_engine_keeps_its_promises_whatever_the_children_do(
    plans: list[list[tuple[str, float]]],
    limit: int,
    max_attempts: int,
    initial: float,
    intensity: int,
    period: float,
    timeout: float | None,
) -> None:
    tasks = [f"task {i}" for i in range(len(plans))]
    sim = Sim(limit=limit, script=dict(zip(tasks, plans, strict=True)))
    retry = Retry(
        max_attempts=max_attempts,
        initial=initial,
        multiplier=2.0,
        intensity=intensity,
        period=period,
    )
    engine = fan_out(PARENT, Restarts(), list(tasks), skill="work", retry=retry, timeout=timeout)
    escalation: EscalationError | None = None
    try:
        gathered = drive(sim, engine)
    except EscalationError as exc:
        gathered, escalation = None, exc
    if escalation is not None:
        assert escalation.errors
        # it escalates only when this restart request finds the intensity used up
        # within the period: requests in (now - period, now] number intensity + 1
        requests = [
            sim.finished[sid]
            for sid, (number, outcome) in sim.numbers.items()
            if sid in sim.finished and outcome == "crash" and number < max_attempts
        ]
        assert sum(1 for t in requests if sim.now - period < t <= sim.now) >= intensity + 1
    assert sim.peak <= limit
    assert len(sim.seen_ids) == sum(sim.attempts.values())  # a fresh session every attempt
    assert all(n <= max_attempts for n in sim.attempts.values())
    if gathered is None:
        return
    assert [r.spec.task for r in gathered.reports] == tasks
    for report in gathered.reports:
        attempts = report.attempts
        assert len(attempts) <= max_attempts
        for before, after in itertools.pairwise(attempts):
            # a retry comes only after a retryable failure, and only after its backoff
            assert before.result is not None
            assert not before.result.ok
            assert before.result.error.detail.get("retryable") is not False
            assert (
                sim.started[after.session_id]
                >= sim.finished[before.session_id] + after.backoff_s - 1e-9
            )
            assert after.backoff_s == retry.backoff(after.number)
        if report.ok:
            assert attempts[-1].result is not None
            assert attempts[-1].result.ok
        if timeout is None:
            assert not report.timed_out
            assert report.started
    good = sum(r.ok for r in gathered.reports)
    expected = (
        GatherStatus.COMPLETED
        if good == len(tasks)
        else GatherStatus.PARTIAL
        if good
        else GatherStatus.FAILED
    )
    assert gathered.status is expected
    # restarts never passed the intensity within one period
    restart_times = sorted(
        sim.finished[report.attempts[i - 1].session_id]
        for report in gathered.reports
        for i in range(1, len(report.attempts))
    )
    for i, start in enumerate(restart_times):
        within = [t for t in restart_times[i:] if t < start + period]
        assert len(within) <= intensity


def test_the_simulator_itself_answers_in_time_order() -> None:
    sim = Sim(limit=3, script={"a": [("ok", 5.0)], "b": [("ok", 1.0)], "c": [("crash", 3.0)]})
    ids = [sim.spawn(t).session_id for t in ("a", "b", "c")]
    order = []
    pending = tuple(i for i in ids if i is not None)
    while pending:
        got = sim.wait_some(pending, None)
        assert len(got) == 1  # no two end at the same instant here
        order.append(got[0][0])
        pending = tuple(i for i in pending if i != got[0][0])
    assert order == [ids[1], ids[2], ids[0]]
    assert sim.now == 5.0


def test_the_simulator_answers_children_that_end_together_in_one_wait() -> None:
    sim = Sim(limit=3, script={"a": [("ok", 2.0)], "b": [("ok", 1.0)], "c": [("ok", 2.0)]})
    ids = [sim.spawn(t).session_id for t in ("a", "b", "c")]
    assert [sid for sid, _ in sim.wait_some(tuple(ids), None)] == [ids[1]]
    assert sorted(sid for sid, _ in sim.wait_some((ids[0], ids[2]), None)) == sorted(
        (ids[0], ids[2])
    )
    assert sim.now == 2.0
