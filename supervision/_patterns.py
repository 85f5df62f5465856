"""Coordination patterns as programs: fan-out, pipeline, map-reduce, continuation.

Each pattern is a generator over the engine's commands (``_engine``): it
turns its tasks into ``SpawnSpec``s, runs them with ``gather`` and builds
the ``Gathered`` result; it never does I/O itself. A driver (``_drivers``)
carries the commands out for a sync ``Session``, an ``AsyncSession`` or a
``Node`` acting for a parent session, so every pattern behaves the same
everywhere and tests drive it all on a virtual clock.

What the patterns guarantee (the engine keeps most of it):
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

On failure: a task, option or token that is not valid raises
``RejectedInputError`` naming the field when the pattern starts, before
anything is spawned.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import msgspec

from sessiontree.protocol import (
    MAX_TASK_CHARS,
    AggregateStrategy,
    Collected,
    ContextScope,
    GatherStatus,
    Hedge,
    RejectedInputError,
    Retry,
    SessionKind,
    SessionResult,
    SpawnSpec,
    Summarizer,
    make_spec,
)
from sessiontree.supervision._continuation import parse_continuation
from sessiontree.supervision._engine import (
    Command,
    Engine,
    Quorum,
    Task,
    gather,
    gathered,
    status_of,
    wait_quorum,
)
from sessiontree.supervision._hedging import hedge_of
from sessiontree.supervision._retry import Restarts

__all__ = [
    "collect",
    "continue_run",
    "fan_out",
    "map_reduce",
    "pipeline",
    "render_results",
]

_WAIT_ALL = Retry()

# -- tasks --------------------------------------------------------------------------------


def _spec(task: object, defaults: dict[str, Any], field: str) -> SpawnSpec:
    """A task (text, a ``SpawnSpec`` or a mapping of its fields) as a checked
    spec; the pattern's defaults fill what the task leaves out. A bad field is
    refused here, naming it, before anything of the pattern is spawned."""
    if isinstance(task, SpawnSpec):
        return make_spec(task)  # one built by hand may hold a field of the wrong type
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


def _check_quorum(quorum: object, tasks: int, strategy: object) -> Quorum | None:
    if quorum is None:
        return None
    if not isinstance(quorum, int) or isinstance(quorum, bool) or not 1 <= quorum <= tasks:
        msg = f"quorum must be an integer from 1 to the {tasks} tasks, got {quorum!r}"
        raise RejectedInputError(msg, field="quorum")
    vote = strategy is not None and str(strategy).lower() == AggregateStrategy.VOTE.value
    return Quorum(quorum, vote=vote)


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
    quorum: int | None = None,
    hedge: Hedge | Mapping[str, Any] | None = None,
) -> Engine:
    """One child per task, in parallel up to the children limit (the rest queue).

    ``tasks``: task strings, ``SpawnSpec``s or mappings of spec fields (e.g.
    ``{"task": ..., "input": {...}}``; ``kind``, ``skill`` and ``ttl`` fill in
    what they leave out). ``retry``: a
    ``Retry`` (default: no retry). ``timeout``: clock seconds for the whole
    fan-out. ``aggregate``: a strategy whose ``Aggregated`` the result carries.
    ``quorum``: go on once ``quorum`` tasks have succeeded (with
    ``aggregate="vote"``: once ``quorum`` agree, or the leading answer can no
    longer be overtaken): the tasks still running are cancelled with the
    node's grace and waited for, what they return in it kept as partial
    results (``superseded``), those not started never start, and the result
    is ``completed`` with the ones that met it ``counted``. Once too many
    have failed for it to be met, the same happens at once and the result
    is ``failed``. An integer from 1 to the number of tasks, else
    ``RejectedInputError`` naming ``quorum``.
    ``hedge``: a ``Hedge`` (or a mapping of its fields); a task whose child
    runs past its delay gets one duplicate, the first of the two to succeed
    is its result and the other is cancelled with the node's grace (an
    ``Attempt`` marked ``hedge``, and the loser ``superseded``).
    """
    _check_on_timeout(on_timeout)
    policy = _check_retry(retry)
    hedged = hedge_of(hedge)
    defaults = _defaults(kind, skill, ttl)
    work = [Task(i, _spec(t, defaults, f"tasks[{i}]")) for i, t in enumerate(tasks)]
    wanted = _check_quorum(quorum, len(work), aggregate)
    end = yield from gather(parent, work, policy, restarts, timeout, on_timeout, wanted, hedged)
    return gathered(work, status_of(work, end), aggregate, summarizer, quorum=wanted)


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
    done: list[Task] = []
    previous: list[SessionResult] = []
    stage_tasks: list[Task] = []
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
            stage_tasks.append(Task(len(done) + len(stage_tasks), spec, stage=number))
        yield from gather(parent, stage_tasks, policy, restarts, timeout, on_timeout)
        done.extend(stage_tasks)
        previous = [t.result for t in stage_tasks if t.result is not None and t.result.ok]
        if not previous:
            return gathered(done, GatherStatus.FAILED, aggregate, summarizer, stage_tasks)
    status = status_of(stage_tasks) if stage_tasks else GatherStatus.COMPLETED
    if status is GatherStatus.COMPLETED and status_of(done) is not GatherStatus.COMPLETED:
        status = GatherStatus.PARTIAL  # an earlier stage lost some of its tasks
    return gathered(done, status, aggregate, summarizer, stage_tasks)


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
    maps: list[Task] = []
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
        maps.append(Task(len(maps), msgspec.structs.replace(spec, context_summary=seed)))
    yield from gather(parent, maps, policy, restarts, timeout, on_timeout)
    good = [t.result for t in maps if t.result is not None and t.result.ok]
    if not good:
        return gathered(maps, GatherStatus.FAILED, None, None)
    reduce_defaults = _defaults(kind, reduce_skill or skill, ttl)
    spec = _spec(reduce_task, reduce_defaults, "reduce_task")
    seed = render_results(good, "Results of the map step:")
    reduce = Task(len(maps), msgspec.structs.replace(spec, context_summary=seed), stage=1)
    yield from gather(parent, [reduce], policy, restarts, timeout, on_timeout)
    every = [*maps, reduce]
    reduced = reduce.result is not None and reduce.result.ok
    status = status_of(maps) if reduced else GatherStatus.FAILED
    return gathered(every, status, AggregateStrategy.CONCAT, None, [reduce])


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
    nothing else carries over (every run is a fresh session). When the run wrote a
    context branch, the new session forks from its tip and sees that branch
    (``ContextScope.BRANCH``); a token whose message is not in the parent's
    conversation (forged, or its branch deleted) is refused at the spawn with
    ``ConversationError`` naming ``fork_at``."""
    body = parse_continuation(token)
    if not isinstance(context, str):
        raise RejectedInputError("context must be a string", field="context")
    seed = f"{context}\n\nPrevious run {body.session_id} concluded: {body.summary}"
    spec = make_spec(
        kind=body.kind,
        skill=body.skill,
        task=body.task,
        context_summary=seed[:MAX_TASK_CHARS],
        fork_at=body.message,
        context=ContextScope.BRANCH if body.message is not None else ContextScope.OWN,
    )
    return (
        yield from fan_out(
            parent, restarts, [spec], retry=retry, timeout=timeout, on_timeout=on_timeout
        )
    )


def collect(
    parent: uuid.UUID,
    restarts: Restarts,
    children: list[uuid.UUID],
    *,
    quorum: int,
    timeout: float | None = None,
    aggregate: AggregateStrategy | str | None = None,
) -> Generator[Command, Any, list[Collected]]:
    """``Session.collect`` with a quorum (see ``fan_out``'s ``quorum`` and
    ``wait_quorum``): ``RejectedInputError`` naming ``quorum`` for one that is
    not an integer from 1 to the number of children."""
    wanted = _check_quorum(quorum, len(children), aggregate)
    assert wanted is not None  # a quorum is what this pattern is for
    return (yield from wait_quorum(children, wanted, timeout))
