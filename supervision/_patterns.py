"""Coordination patterns: fan-out, pipeline, map-reduce, continuation — one engine, three drivers.

The engine is a generator that never does I/O itself: it yields commands
(spawn a child, wait for the first of some children, sleep, cancel, read
the clock) and receives their answers. A driver carries the commands out
for a sync ``Session``, an ``AsyncSession`` or a ``Node`` acting for a
parent session, so every pattern behaves the same everywhere and tests
drive it all on a virtual clock.

What the engine guarantees:
- every attempt is a fresh session (never a reused one), and every attempt
  is recorded in its task's ``ChildReport``;
- more tasks than the children limit allows queue: a spawn refused with
  ``children_exceeded`` waits for a slot, and so does one refused with
  ``capacity_exceeded`` while a child of the pattern runs (with none running
  the node has no room the pattern could wait for: that refusal is final);
- retries are opt-in (``Retry``), wait on the clock, skip non-retryable
  errors, switch to the fallback skill, and stop at the intensity limit,
  where the pattern cancels what it still runs and raises
  ``EscalationError`` (the parent's run then ends ``escalated``);
- at ``timeout`` every task still running is reported ``timed_out`` and
  keeps running (``on_timeout="cancel"`` cancels them): the parent decides;
- partial failure goes on with what arrived; the result's ``status`` and
  ``diagnostics`` say what is missing and why.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import json
import queue
import threading
import uuid
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from sessiontree.protocol import (
    MAX_TASK_CHARS,
    AggregateStrategy,
    Attempt,
    ChildReport,
    ErrorCode,
    EscalationError,
    Gathered,
    GatherStatus,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SpawnSpec,
    make_spec,
)
from sessiontree.supervision._aggregate import Summarizer, aggregate
from sessiontree.supervision._retry import Restarts, Retry

if TYPE_CHECKING:
    from sessiontree.actors import AsyncSession, Session

__all__ = [
    "PATTERNS",
    "continuation_token",
    "drive_async",
    "drive_sync",
    "parse_continuation",
]

_SLOT_WAIT = 0.05  # clock seconds between spawn attempts when no child of ours can free a slot
_WAIT_ALL = Retry()

# -- commands -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Spawn:
    spec: SpawnSpec


@dataclass(frozen=True, slots=True)
class _WaitAny:
    children: tuple[uuid.UUID, ...]
    timeout: float | None


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class _Cancel:
    child: uuid.UUID


@dataclass(frozen=True, slots=True)
class _Now:
    pass


Command = _Spawn | _WaitAny | _Sleep | _Cancel | _Now
Engine = Generator[Command, Any, Gathered]

# -- tasks --------------------------------------------------------------------------------


def _spec(task: object, defaults: dict[str, Any], field: str) -> SpawnSpec:
    """A task (text, a ``SpawnSpec`` or a mapping of its fields) as a spec; the
    pattern's defaults fill what the task leaves out."""
    if isinstance(task, SpawnSpec):
        return task
    if isinstance(task, str):
        return make_spec(**{**defaults, "task": task})
    if isinstance(task, dict):
        return make_spec(**{**defaults, **task})
    msg = f"{field} must be a task string, a SpawnSpec or a mapping, not {type(task).__name__}"
    raise RejectedInputError(msg, field=field)


def _defaults(kind: str | SessionKind, skill: str | None, ttl: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind}
    if skill is not None:
        out["skill"] = skill
    if ttl is not None:
        out["ttl"] = ttl
    return out


def render_results(results: Sequence[SessionResult], heading: str) -> str:
    """Results as explicit context for the next sessions (capped at the spec's size)."""
    parts = [heading]
    for number, result in enumerate(results, 1):
        part = f"[{number}] {result.summary}"
        if result.artifacts:
            part += "\nartifacts: " + json.dumps(result.artifacts, sort_keys=True, default=str)
        parts.append(part)
    text = "\n\n".join(parts)
    if len(text) > MAX_TASK_CHARS:
        text = text[: MAX_TASK_CHARS - 16] + "\n… (truncated)"
    return text


# -- continuation tokens -------------------------------------------------------------------


class _Continuation(msgspec.Struct, frozen=True):
    v: int
    session_id: uuid.UUID
    kind: SessionKind
    skill: str | None
    task: str
    summary: str


def continuation_token(spec: SpawnSpec, result: SessionResult) -> str:
    """A token naming a finished run: what ran (kind, skill, task) and what it said."""
    body = _Continuation(1, result.session_id, spec.kind, spec.skill, spec.task, result.summary)
    return base64.urlsafe_b64encode(msgspec.msgpack.encode(body)).decode()


def parse_continuation(token: object) -> _Continuation:
    """Decode a continuation token; ``RejectedInputError`` (field ``token``) if it is not one."""
    if not isinstance(token, str) or len(token) > 4 * MAX_TASK_CHARS:
        raise RejectedInputError("token must be a continuation token string", field="token")
    try:
        raw = base64.urlsafe_b64decode(token.encode())
        body = msgspec.msgpack.decode(raw, type=_Continuation)
    except (ValueError, msgspec.DecodeError) as exc:
        msg = f"token is not a continuation token: {exc}"
        raise RejectedInputError(msg, field="token") from None
    if body.v != 1:
        raise RejectedInputError(f"continuation token version {body.v} is unknown", field="token")
    return body


# -- the engine ----------------------------------------------------------------------------


@dataclass
class _Task:
    index: int
    spec: SpawnSpec
    stage: int = 0
    attempts: list[Attempt] | None = None
    result: SessionResult | None = None
    timed_out: bool = False
    started: bool = False
    done: bool = False
    token: str | None = None

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
        )


class _Gather:
    """One run of tasks to their ends (results filled into the tasks in place)."""

    def __init__(
        self,
        parent: uuid.UUID,
        tasks: list[_Task],
        retry: Retry,
        restarts: Restarts,
        on_timeout: str,
    ) -> None:
        self.parent = parent
        self.tasks = tasks
        self.retry = retry
        self.restarts = restarts
        self.on_timeout = on_timeout
        self.ready: list[_Task] = list(tasks)  # the next to spawn is ready[0]
        self.delayed: list[tuple[float, int, _Task, float]] = []  # (when, index, task, wait)
        self.running: dict[uuid.UUID, tuple[_Task, Attempt]] = {}
        self.backoff_of: dict[int, float] = {}

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
            yield from self._spawn_ready()
            if not self.running:
                if self.ready:
                    yield _Sleep(_SLOT_WAIT)  # the parent's other children hold every slot
                elif self.delayed:
                    yield _Sleep(max(0.0, self.delayed[0][0] - now))
                continue
            soonest = self.delayed[0][0] if self.delayed else None
            limits = [t for t in (deadline, soonest) if t is not None]
            got = yield _WaitAny(
                tuple(self.running), max(0.0, min(limits) - now) if limits else None
            )
            if got is not None:
                yield from self._ended(*got)
        yield from self._out_of_time()
        self.restarts.forget(self.parent, now, self.retry.period)

    def _spawn_ready(self) -> Generator[Command, Any, None]:
        """Spawn queued tasks until the children limit refuses one (it waits for a slot)."""
        while self.ready:
            task = self.ready[0]
            number = len(task.attempts or []) + 1
            spec = task.spec
            if number > 1 and self.retry.fallback_skill is not None:
                spec = msgspec.structs.replace(spec, skill=self.retry.fallback_skill)
            spawned = yield _Spawn(spec)
            code = None if spawned.error is None else spawned.error.code
            if spawned.session_id is None and (
                code is ErrorCode.CHILDREN_EXCEEDED
                or (code is ErrorCode.CAPACITY_EXCEEDED and self.running)
            ):
                return  # queue: a child of ours ending frees a slot
            self.ready.pop(0)
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

    def _ended(self, child: uuid.UUID, result: SessionResult) -> Generator[Command, Any, None]:
        """A child's result: done, or queued for another attempt after its backoff."""
        task, attempt = self.running.pop(child)
        recorded = msgspec.structs.replace(attempt, result=result, error=result.error)
        task.attempts = [*(task.attempts or [])[:-1], recorded]
        task.result = result
        if result.ok:
            task.done = True
            task.token = continuation_token(task.spec, result)
            return
        if len(task.attempts) >= self.retry.max_attempts or not self.retry.retryable(result.error):
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
        wait = self.retry.backoff(len(task.attempts) + 1)
        heapq.heappush(self.delayed, (now + wait, task.index, task, wait))

    def _out_of_time(self) -> Generator[Command, Any, None]:
        """At the timeout: what still runs is timed out (and cancelled if asked)."""
        for child, (task, _) in self.running.items():
            task.timed_out = True
            if self.on_timeout == "cancel":
                yield _Cancel(child)
        for task in (*self.ready, *(entry[2] for entry in self.delayed)):
            task.timed_out = task.started  # never started: reported as such


def _gather(
    parent: uuid.UUID,
    tasks: list[_Task],
    retry: Retry,
    restarts: Restarts,
    timeout: float | None,
    on_timeout: str,
) -> Generator[Command, Any, None]:
    """Run ``tasks`` to their ends (results filled in place)."""
    yield from _Gather(parent, tasks, retry, restarts, on_timeout).run(timeout)


def _status(tasks: Sequence[_Task]) -> GatherStatus:
    good = sum(1 for t in tasks if t.result is not None and t.result.ok)
    if good == len(tasks):
        return GatherStatus.COMPLETED
    return GatherStatus.PARTIAL if good else GatherStatus.FAILED


def _gathered(
    tasks: Sequence[_Task],
    status: GatherStatus,
    strategy: AggregateStrategy | str | None,
    summarizer: Summarizer | None,
    last_stage: Sequence[_Task] | None = None,
) -> Gathered:
    reports = [t.report() for t in tasks]
    aggregated = None
    if strategy is not None:
        final = [t.report() for t in last_stage] if last_stage is not None else reports
        aggregated = aggregate(final, strategy, summarizer=summarizer)
    return Gathered(status=status, reports=reports, aggregated=aggregated)


def _check_on_timeout(on_timeout: str) -> None:
    if on_timeout not in ("continue", "cancel"):
        msg = f"on_timeout must be 'continue' or 'cancel', got {on_timeout!r}"
        raise RejectedInputError(msg, field="on_timeout")


def _check_retry(retry: object) -> Retry:
    if retry is None:
        return _WAIT_ALL
    if not isinstance(retry, Retry):
        msg = f"retry must be a Retry, not {type(retry).__name__}"
        raise RejectedInputError(msg, field="retry")
    return retry


def fan_out(
    parent: uuid.UUID,
    restarts: Restarts,
    tasks: list[Any],
    *,
    kind: str | SessionKind = SessionKind.WORKER,
    skill: str | None = None,
    ttl: float | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    on_timeout: str = "continue",
    aggregate: AggregateStrategy | str | None = None,
    summarizer: Summarizer | None = None,
) -> Engine:
    """One child per task, in parallel up to the children limit (the rest queue).

    ``tasks``: task strings, ``SpawnSpec``s or mappings of spec fields
    (``kind``, ``skill`` and ``ttl`` fill in what they leave out). ``retry``: a
    ``Retry`` (default: no retry). ``timeout``: clock seconds for the whole
    fan-out. ``aggregate``: a strategy whose ``Aggregated`` the result carries.
    """
    _check_on_timeout(on_timeout)
    policy = _check_retry(retry)
    defaults = _defaults(kind, skill, ttl)
    work = [_Task(i, _spec(t, defaults, f"tasks[{i}]")) for i, t in enumerate(tasks)]
    yield from _gather(parent, work, policy, restarts, timeout, on_timeout)
    return _gathered(work, _status(work), aggregate, summarizer)


def pipeline(
    parent: uuid.UUID,
    restarts: Restarts,
    stages: list[Any],
    *,
    kind: str | SessionKind = SessionKind.WORKER,
    skill: str | None = None,
    ttl: float | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    on_timeout: str = "continue",
    aggregate: AggregateStrategy | str | None = AggregateStrategy.CONCAT,
    summarizer: Summarizer | None = None,
) -> Engine:
    """Stages in order; a stage is one task or a list of tasks run in parallel.

    Each stage's children get the previous stage's good results as their
    explicit ``context_summary`` (appended to their own). A stage with no good
    result stops the pipeline (``failed``). ``timeout`` applies per stage; the
    result's ``aggregated`` is the last stage's.
    """
    _check_on_timeout(on_timeout)
    policy = _check_retry(retry)
    defaults = _defaults(kind, skill, ttl)
    done: list[_Task] = []
    previous: list[SessionResult] = []
    stage_tasks: list[_Task] = []
    for number, stage in enumerate(stages):
        items = stage if isinstance(stage, list) else [stage]
        if not items:
            msg = f"stage {number} has no task"
            raise RejectedInputError(msg, field=f"stages[{number}]")
        stage_tasks = []
        for item in items:
            spec = _spec(item, defaults, f"stages[{number}]")
            if previous:
                seed = render_results(previous, f"Results of stage {number - 1}:")
                joined = f"{spec.context_summary}\n\n{seed}" if spec.context_summary else seed
                spec = msgspec.structs.replace(spec, context_summary=joined[:MAX_TASK_CHARS])
            stage_tasks.append(_Task(len(done) + len(stage_tasks), spec, stage=number))
        yield from _gather(parent, stage_tasks, policy, restarts, timeout, on_timeout)
        done.extend(stage_tasks)
        previous = [t.result for t in stage_tasks if t.result is not None and t.result.ok]
        if not previous:
            return _gathered(done, GatherStatus.FAILED, aggregate, summarizer, stage_tasks)
    status = _status(stage_tasks) if stage_tasks else GatherStatus.COMPLETED
    if status is GatherStatus.COMPLETED and _status(done) is not GatherStatus.COMPLETED:
        status = GatherStatus.PARTIAL  # an earlier stage lost some of its tasks
    return _gathered(done, status, aggregate, summarizer, stage_tasks)


def map_reduce(
    parent: uuid.UUID,
    restarts: Restarts,
    items: list[Any],
    map_task: Any,
    reduce_task: Any,
    *,
    batch_size: int = 1,
    kind: str | SessionKind = SessionKind.WORKER,
    skill: str | None = None,
    reduce_skill: str | None = None,
    ttl: float | None = None,
    retry: Retry | None = None,
    timeout: float | None = None,
    on_timeout: str = "continue",
) -> Engine:
    """Map batches of ``items`` in parallel, then reduce what the maps returned.

    ``map_task``: a task (string, spec or mapping) each map child runs, with
    its batch (a JSON list) as its ``context_summary``; or a callable taking
    the batch and returning such a task. ``reduce_task``: the task of the one
    reduce child, whose context is every good map result. Maps that failed
    are left out (the result is then ``partial``); no good map at all, or a
    failed reduce, is ``failed``. ``aggregated`` is the reduce's result.
    """
    _check_on_timeout(on_timeout)
    policy = _check_retry(retry)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        msg = f"batch_size must be an integer >= 1, got {batch_size!r}"
        raise RejectedInputError(msg, field="batch_size")
    defaults = _defaults(kind, skill, ttl)
    maps: list[_Task] = []
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        task = map_task(batch) if callable(map_task) else map_task
        spec = _spec(task, defaults, "map_task")
        try:
            seed = json.dumps(batch, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            msg = f"items must be JSON values: {exc}"
            raise RejectedInputError(msg, field="items") from None
        if len(seed) > MAX_TASK_CHARS:
            msg = f"a batch of {len(batch)} items is over {MAX_TASK_CHARS} characters"
            raise RejectedInputError(msg, field="batch_size")
        maps.append(_Task(len(maps), msgspec.structs.replace(spec, context_summary=seed)))
    yield from _gather(parent, maps, policy, restarts, timeout, on_timeout)
    good = [t.result for t in maps if t.result is not None and t.result.ok]
    if not good:
        return _gathered(maps, GatherStatus.FAILED, None, None)
    reduce_defaults = _defaults(kind, reduce_skill or skill, ttl)
    spec = _spec(reduce_task, reduce_defaults, "reduce_task")
    seed = render_results(good, "Results of the map step:")
    reduce = _Task(len(maps), msgspec.structs.replace(spec, context_summary=seed), stage=1)
    yield from _gather(parent, [reduce], policy, restarts, timeout, on_timeout)
    every = [*maps, reduce]
    reduced = reduce.result is not None and reduce.result.ok
    status = _status(maps) if reduced else GatherStatus.FAILED
    return _gathered(every, status, AggregateStrategy.CONCAT, None, [reduce])


def continue_run(
    parent: uuid.UUID,
    restarts: Restarts,
    token: str,
    context: str,
    *,
    retry: Retry | None = None,
    timeout: float | None = None,
    on_timeout: str = "continue",
) -> Engine:
    """A fresh session continuing a finished run: the token says what ran and
    what it concluded, ``context`` is the explicit context for this step;
    nothing else carries over (the Fresh-Session ADR)."""
    body = parse_continuation(token)
    if not isinstance(context, str):
        raise RejectedInputError("context must be a string", field="context")
    seed = f"{context}\n\nPrevious run {body.session_id} concluded: {body.summary}"
    spec = make_spec(
        kind=body.kind,
        skill=body.skill,
        task=body.task,
        context_summary=seed[:MAX_TASK_CHARS],
    )
    return (
        yield from fan_out(
            parent, restarts, [spec], retry=retry, timeout=timeout, on_timeout=on_timeout
        )
    )


PATTERNS: dict[str, Callable[..., Engine]] = {
    "fan_out": fan_out,
    "pipeline": pipeline,
    "map_reduce": map_reduce,
    "continue_run": continue_run,
}

# -- drivers -------------------------------------------------------------------------------


def _start(
    name: str, parent: uuid.UUID, restarts: Restarts, args: tuple[Any, ...], options: dict[str, Any]
) -> Engine:
    pattern = PATTERNS.get(name)
    if pattern is None:
        msg = f"no pattern {name!r}"
        raise RejectedInputError(msg, field="pattern")
    try:
        return pattern(parent, restarts, *args, **options)
    except TypeError as exc:  # an unknown option
        raise RejectedInputError(f"{name}: {exc}", field="options") from None


def drive_sync(
    session: Session, restarts: Restarts, name: str, args: tuple[Any, ...], options: dict[str, Any]
) -> Gathered:
    """Run a pattern for a sync skill's ``Session`` (its thread waits)."""
    engine = _start(name, session.session_id, restarts, args, options)
    answer: Any = None
    try:
        while True:
            command = engine.send(answer)
            match command:
                case _Spawn(spec=spec):
                    answer = session.spawn(spec)
                case _WaitAny(children=children, timeout=timeout):
                    got = session.next_result(children, timeout)
                    answer = None if got is None else (got.session_id, got.result)
                case _Sleep(seconds=seconds):
                    session.sleep(seconds)
                    answer = None
                case _Cancel(child=child):
                    answer = session.cancel_child(child)
                case _Now():
                    answer = session.clock.monotonic()
    except StopIteration as stop:
        gathered: Gathered = stop.value
        return gathered


async def drive_async(
    session: AsyncSession,
    restarts: Restarts,
    name: str,
    args: tuple[Any, ...],
    options: dict[str, Any],
) -> Gathered:
    """Run a pattern for an async skill's ``AsyncSession`` (no thread held)."""
    engine = _start(name, session.session_id, restarts, args, options)
    answer: Any = None
    try:
        while True:
            command = engine.send(answer)
            match command:
                case _Spawn(spec=spec):
                    answer = await session.spawn(spec)
                case _WaitAny(children=children, timeout=timeout):
                    got = await session.next_result(children, timeout)
                    answer = None if got is None else (got.session_id, got.result)
                case _Sleep(seconds=seconds):
                    await session.sleep(seconds)
                    answer = None
                case _Cancel(child=child):
                    answer = await session.cancel_child(child)
                case _Now():
                    answer = session.clock.monotonic()
    except StopIteration as stop:
        gathered: Gathered = stop.value
        return gathered


class NodeDriver:
    """Runs a pattern from outside the tree, for a parent session, on a ``Node``.

    Children end as events; the driver keeps its own queue of the ones it
    spawned, so waiting for the first of them costs no polling. Sleeps and
    timeouts run on the node's clock.
    """

    def __init__(self, node: Any, parent: uuid.UUID) -> None:
        self.node = node
        self.parent = parent
        self._ended: queue.SimpleQueue[uuid.UUID | None] = queue.SimpleQueue()
        self._mine: set[uuid.UUID] = set()
        self._results: dict[uuid.UUID, SessionResult] = {}

    def run(
        self, restarts: Restarts, name: str, args: tuple[Any, ...], options: dict[str, Any]
    ) -> Gathered:
        engine = _start(name, self.parent, restarts, args, options)
        unsubscribe = self.node.subscribe(self._observe)
        answer: Any = None
        try:
            while True:
                command = engine.send(answer)
                answer = self._do(command)
        except StopIteration as stop:
            gathered: Gathered = stop.value
            return gathered
        finally:
            unsubscribe()

    def _observe(self, event: Any) -> None:
        """On the Cortex thread: note the end of a child of ours."""
        if (
            event.session_id in self._mine
            and event.kind == "transition"
            and event.state in ("completed", "failed", "expired", "cancelled")
        ):
            self._ended.put(event.session_id)

    def _do(self, command: Command) -> Any:
        node = self.node
        match command:
            case _Spawn(spec=spec):
                spawned = node.spawn(self.parent, spec)
                if spawned.session_id is not None:
                    self._mine.add(spawned.session_id)
                    if node.result(spawned.session_id) is not None:  # ended already
                        self._ended.put(spawned.session_id)
                return spawned
            case _WaitAny(children=children, timeout=timeout):
                return self._wait_any(children, timeout)
            case _Sleep(seconds=seconds):
                self._sleep(seconds)
                return None
            case _Cancel(child=child):
                return node.cancel(child)
            case _Now():
                return node.clock.monotonic()
        return None

    def _wait_any(
        self, children: tuple[uuid.UUID, ...], timeout: float | None
    ) -> tuple[uuid.UUID, SessionResult] | None:
        wanted = set(children)
        for child in children:
            if child in self._results:
                return child, self._results.pop(child)
        timer = None
        if timeout is not None:
            timer = self.node.clock.call_later(timeout, lambda: self._ended.put(None))
        try:
            while True:
                ended = self._ended.get()
                if ended is None:
                    return None  # the timeout
                result = self.node.result(ended)
                if result is None:
                    continue
                if ended in wanted:
                    return ended, result
                self._results[ended] = result
        finally:
            if timer is not None:
                timer.cancel()

    def _sleep(self, seconds: float) -> None:
        woken = threading.Event()
        timer = self.node.clock.call_later(seconds, woken.set)
        try:
            woken.wait()
        finally:
            timer.cancel()


async def drive_node_async(
    node: Any,
    parent: uuid.UUID,
    restarts: Restarts,
    name: str,
    args: tuple[Any, ...],
    options: dict[str, Any],
) -> Gathered:
    """``NodeDriver.run`` off the event loop (it waits on children and the clock)."""
    driver = NodeDriver(node, parent)
    return await asyncio.to_thread(driver.run, restarts, name, args, options)
