"""The kernel's seam for features (``_extension``): per hook, only the
extensions that override it are called; a node attaches recording always and
span ids only when traced; and what the kernel tells an extension as a
session is spawned and ends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sessiontree.actors import Session
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SpawnSpec,
    Usage,
)
from sessiontree.supervision import Agent, Node, Tracing
from sessiontree.supervision._contexts import Contexts
from sessiontree.supervision._entry import TreeEntry
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._extension import HOOKS, Extension, Extensions
from sessiontree.supervision._ledger import Ledgers, Reserve, Reserved, Settle
from sessiontree.supervision._recording import Recorder
from sessiontree.supervision._span_ids import SpanIds
from tests.conftest import WAIT


class _Created(Extension):
    def created(self, entry: TreeEntry, spec: SpawnSpec, data: dict[str, Any] | None) -> None:
        pass


class _Told(Extension):
    """Writes down every hook the kernel calls, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

    def identity(self, parent: TreeEntry | None, spec: SpawnSpec, info: SessionInfo) -> SessionInfo:
        with self.lock:
            self.told.append(("identity", spec.task, info.task))
        return msgspec.structs.replace(info, metadata={**info.metadata, "stamped": True})

    def created(self, entry: TreeEntry, spec: SpawnSpec, data: dict[str, Any] | None) -> None:
        with self.lock:
            self.told.append(("created", entry.info.task, spec.task, data))

    def detail(
        self, kind: EventKind, entry: TreeEntry, error: ErrorInfo | None, data: dict[str, Any]
    ) -> None:
        with self.lock:
            self.told.append(("detail", kind, entry.info.task, error and error.message))
        data["told"] = True


def test_a_hook_keeps_only_the_extensions_that_override_it() -> None:
    plain, created, told = Extension(), _Created(), _Told()
    extensions = Extensions([plain, created, told])
    assert extensions.all == (plain, created, told)
    assert extensions.created == (created, told)
    assert extensions.identity == (told,)
    assert extensions.detail == (told,)
    assert extensions.restoring == ()
    assert all(getattr(Extensions(), hook) == () for hook in HOOKS)


def test_an_extension_is_found_and_replaced_by_kind() -> None:
    created, told = _Created(), _Told()
    extensions = Extensions([created])
    assert extensions.find(_Created) is created
    assert extensions.find(_Told) is None
    extensions.replace(created, told)
    assert extensions.all == (told,)
    assert extensions.created == (told,)
    assert extensions.identity == (told,)
    with pytest.raises(ValueError, match="_Created is not one of"):
        extensions.replace(created, told)  # not there any more


class _Asked(Extension):
    answers = (int,)

    def answer(self, request: Any, reply: Any) -> object:
        return request + 1


def test_a_features_own_requests_go_to_its_extension() -> None:
    asked, plain = _Asked(), Extension()
    extensions = Extensions([plain, asked])
    assert extensions.answering == {int: asked}
    assert extensions.answering[int].answer(1, None) == 2
    with pytest.raises(NotImplementedError, match="Extension answers no int"):
        plain.answer(1, None)
    extensions.replace(asked, _Created())
    assert extensions.answering == {}


def test_a_node_answers_a_model_calls_reservation_through_its_ledgers(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(Agent("a", {"main": _idle}))
    ledgers = node._runtime.extensions.find(Ledgers)
    assert ledgers is not None
    assert node._runtime.extensions.answering == {Reserve: ledgers, Settle: ledgers}
    main = node.main("a").session_id
    held = node._call(Reserve(main, 10, 5, None))
    assert isinstance(held, Reserved)
    assert held.chain == (main,)
    assert node._call(Settle(held, Usage(prompt_tokens=10, completion_tokens=5, calls=1))) is None
    assert node.spending(main).usage.calls == 1


def _idle(session: Session) -> None:
    return None


def test_an_untraced_node_has_no_span_hooks(make_node: Callable[..., Node]) -> None:
    node = make_node(Agent("a", {"main": _idle}))
    extensions = node._runtime.extensions
    ledgers, recorder, contexts = extensions.all
    assert (type(ledgers), type(recorder), type(contexts)) == (Ledgers, Recorder, Contexts)
    # tracing off costs nothing: no hook stamps, restores or details
    assert extensions.identity == extensions.restoring == extensions.detail == ()
    # budgets cost an unbounded spawn their admit alone, recording its created
    assert extensions.admit == (ledgers,)
    assert extensions.created == (recorder,)
    assert extensions.restored == (ledgers,)
    assert extensions.result == extensions.delivered == (contexts,)


def test_a_traced_node_has_span_ids(make_node: Callable[..., Node]) -> None:
    tracing = Tracing(exporter=InMemorySpanExporter(), schedule_delay=0.05, sampling_ratio=0.5)
    node = make_node(Agent("a", {"main": _idle}), tracing=tracing)
    spans = node._runtime.extensions.find(SpanIds)
    assert spans is not None
    assert spans.sampling_ratio == 0.5


def test_the_kernel_tells_an_extension_of_a_spawn_and_its_end(
    make_node: Callable[..., Node],
) -> None:
    def fails(session: Session) -> None:
        raise RuntimeError("broke")

    node = make_node(Agent("a", {"main": _idle, "fails": fails}))
    told = _Told()
    extensions = node._runtime.extensions
    recorder = extensions.find(Recorder)
    assert recorder is not None
    extensions.replace(recorder, told)
    seen: list[Any] = []
    node.subscribe(seen.append)
    main = node.main("a")
    spawned = node.spawn(main, SpawnSpec(kind=SessionKind.WORKER, skill="fails", task="t"))
    assert spawned.ok, spawned.error
    result = spawned.ref.wait(WAIT)
    assert result is not None
    assert result.error is not None
    # what identity returned is what was made
    assert spawned.ref.info().metadata == {"stamped": True}
    with told.lock:
        calls = [c for c in told.told if c[0] != "detail" or c[2] == "t"]
    main_task = "main for internal:main:main"
    assert calls[0][:3] == ("identity", main_task, main_task)
    assert calls[2][:3] == ("identity", "t", "t")
    # its SPAWNED event's data, to add to
    assert calls[3] == ("created", "t", "t", {"kind": "worker", "skill": "fails"})
    assert calls[4] == ("detail", EventKind.TRANSITION, "t", result.error.message)
    ended = [
        e
        for e in seen
        if e.kind == EventKind.TRANSITION.value
        and e.session_id == spawned.session_id
        and e.state == "failed"
    ]
    assert ended
    assert ended[0].data == {"told": True}


def test_a_budget_is_granted_to_the_sessions_it_bounds(
    make_node: Callable[..., Node], release: threading.Event
) -> None:
    def waits(session: Session) -> None:
        release.wait(WAIT)

    agents = Budget(tokens=1000, descendants=10)
    node = make_node(Agent("a", {"main": _idle, "waits": waits}, budget=agents))
    main = node.main("a")
    assert main.info().budget == agents  # a Main is granted its agent's budget
    budget = Budget(tokens=1000, descendants=1)
    holder = node.spawn(main, SpawnSpec(kind=SessionKind.BRANCH, skill="waits", budget=budget))
    assert holder.ok, holder.error
    assert holder.ref.info().budget == budget
    asked = Budget(tokens=5000)
    spawned = node.spawn(
        holder.ref, SpawnSpec(kind=SessionKind.BRANCH, skill="waits", budget=asked)
    )
    assert spawned.ok, spawned.error
    # narrowed to what the holder has left (its one descendant is this child)
    assert spawned.ref.info().budget == Budget(tokens=1000, descendants=0)
    assert spawned.clamped
    assert node.spending(spawned.session_id).budget_clamped
    refused = node.spawn(holder.ref, SpawnSpec(kind=SessionKind.BRANCH, skill="waits"))
    assert refused.error is not None
    assert refused.error.code is ErrorCode.BUDGET_EXHAUSTED
