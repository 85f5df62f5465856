"""LoopActor keeps pykka's actor semantics on one event loop's thread.

Every test orders events with ``threading.Event``/``Barrier`` waits bounded by
``WAIT``; the ``rt`` fixture releases every gate, stops every actor and closes
every dispatcher and loop a test made, whatever happened in it.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pykka
import pytest
from pykka import ActorDeadError, ActorRegistry

from sessiontree.actors.runtime import (
    BlockedHandler,
    EventLoopThread,
    LoopActor,
    LoopDispatcher,
    handle_now,
    stop_unstarted,
)

WAIT = 5.0  # real seconds any bounded wait may take before the test fails

A = TypeVar("A", bound=LoopActor)


# -- helpers -----------------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll ``condition`` (bounded) with short Event waits; True once it holds."""
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        pause.wait(0.01)
    return True


def thread_names(prefix: str) -> set[str]:
    return {t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(prefix)}


class FakeNow:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.value = 0.0

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


class Envelope:
    """What ``pykka.ActorRef`` puts into an inbox: a message and, for an ask, its future."""

    def __init__(self, message: Any, reply_to: pykka.Future[Any] | None = None) -> None:
        self.message = message
        self.reply_to = reply_to


class Runtime:
    """What a test made: loops, dispatchers, actors and gates, all cleaned up by ``rt``."""

    def __init__(self) -> None:
        self.loops: list[EventLoopThread] = []
        self.dispatchers: list[LoopDispatcher] = []
        self.refs: list[pykka.ActorRef[Any]] = []
        self.gates: list[threading.Event] = []
        self._bound: dict[tuple[type[LoopActor], int], type[LoopActor]] = {}

    def dispatcher(self, **options: Any) -> LoopDispatcher:
        """A dispatcher on an event loop of its own, named ``loop-of-<name>``."""
        options.setdefault("name", f"test-loop-{len(self.dispatchers)}")
        loop = EventLoopThread(f"loop-of-{options['name']}")
        self.loops.append(loop)
        dispatcher = LoopDispatcher(loop, **options)
        self.dispatchers.append(dispatcher)
        return dispatcher

    def gate(self) -> threading.Event:
        """An Event a handler may block on; set at teardown so none is left waiting."""
        event = threading.Event()
        self.gates.append(event)
        return event

    def start(
        self, actor_class: type[A], *args: Any, dispatcher: LoopDispatcher, **kwargs: Any
    ) -> pykka.ActorRef[A]:
        """Start ``actor_class`` on ``dispatcher`` (a subclass binding it)."""
        key = (actor_class, id(dispatcher))
        if key not in self._bound:
            self._bound[key] = type(
                actor_class.__name__, (actor_class,), {"dispatcher": dispatcher}
            )
        cls: type[A] = self._bound[key]  # type: ignore[assignment]
        ref = cls.start(*args, **kwargs)
        self.refs.append(ref)
        return ref

    def teardown(self) -> list[str]:
        """Release, stop, close; returns the actors that did not answer their stop."""
        for gate in self.gates:
            gate.set()
        stops = [(ref, ref.stop(block=False)) for ref in self.refs]
        stuck: list[str] = []
        for ref, stop in stops:
            try:
                stop.get(timeout=WAIT)
            except pykka.Timeout:
                stuck.append(str(ref))
        for ref in self.refs:
            ActorRegistry.unregister(ref)  # keep leftovers out of later tests (no-op if gone)
        for dispatcher in self.dispatchers:
            dispatcher.close(timeout=WAIT)
        for loop in self.loops:
            loop.close()
        return stuck


@pytest.fixture
def rt() -> Iterator[Runtime]:
    runtime = Runtime()
    try:
        yield runtime
    finally:
        stuck = runtime.teardown()
    assert not stuck, f"actors did not stop: {stuck}"
    assert all(d.live_threads == 0 for d in runtime.dispatchers)
    assert not any(ref.is_alive() for ref in runtime.refs)


# -- actors --------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A message that makes a Gate hold the loop's thread."""


class Echo(LoopActor):
    """Answers every message with itself; ``"thread"`` with the thread it runs on."""

    def on_receive(self, message: Any) -> Any:
        if message == "thread":
            return threading.current_thread().name
        return message


class Gate(LoopActor):
    """Its handler for a ``Block`` sets ``entered``, holds its thread until ``release``,
    then sets ``left`` (if given) as it returns."""

    def __init__(
        self,
        entered: threading.Event,
        release: threading.Event,
        left: threading.Event | None = None,
    ) -> None:
        super().__init__()
        self.entered = entered
        self.release = release
        self.left = left

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Block):
            self.entered.set()
            self.release.wait(WAIT)
            if self.left is not None:
                self.left.set()
            return "released"
        return message


class Signal(LoopActor):
    """Sets ``done`` when it handles ``"signal"``."""

    def __init__(self, done: threading.Event) -> None:
        super().__init__()
        self.done = done

    def on_receive(self, message: Any) -> Any:
        if message == "signal":
            self.done.set()
        return message


class Lifecycle(LoopActor):
    """Journals its hooks (with the thread each ran on) and the messages it handled."""

    def __init__(
        self,
        journal: list[tuple[str, str]],
        stopped: threading.Event,
        failed: threading.Event,
        *,
        fail_on_start: bool = False,
    ) -> None:
        super().__init__()
        self.journal = journal
        self.stopped = stopped
        self.failed = failed
        self.fail_on_start = fail_on_start

    def on_start(self) -> None:
        self.journal.append(("on_start", threading.current_thread().name))
        if self.fail_on_start:
            raise RuntimeError("on_start failed")

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise ValueError("handler failed")
        self.journal.append(("message", str(message)))
        return message

    def on_stop(self) -> None:
        self.journal.append(("on_stop", threading.current_thread().name))
        self.stopped.set()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self.journal.append(("on_failure", exception_type.__name__))
        self.failed.set()


class OrderChecker(LoopActor):
    """Records ``(producer, seq)`` messages per producer; counts handlers running at once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, list[int]] = {}
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0

    def on_receive(self, message: Any) -> Any:
        if message == "report":
            return {p: list(s) for p, s in self.seen.items()}, self.most_inside
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        producer, seq = message
        self.seen.setdefault(producer, []).append(seq)
        sum(range(2000))  # a little work, so an overlap would be seen
        with self.lock:
            self.inside -= 1
        return None


class StopsItself(LoopActor):
    """``"stop yourself"`` calls ``self.stop()``, then holds until ``go_on``."""

    def __init__(
        self, handled: list[Any], stop_queued: threading.Event, go_on: threading.Event
    ) -> None:
        super().__init__()
        self.handled = handled
        self.stop_queued = stop_queued
        self.go_on = go_on

    def on_receive(self, message: Any) -> Any:
        self.handled.append(message)
        if message == "stop yourself":
            self.stop()
            self.stop_queued.set()
            self.go_on.wait(WAIT)
            return "stopping"
        return message


class Sequenced(LoopActor):
    """Appends its label to a shared sequence for every message but ``"ping"``."""

    def __init__(self, label: str, sequence: list[str], lock: threading.Lock) -> None:
        super().__init__()
        self.label = label
        self.sequence = sequence
        self.lock = lock

    def on_receive(self, message: Any) -> Any:
        if message == "ping":
            return "pong"
        with self.lock:
            self.sequence.append(self.label)
        return None


class Numbered(LoopActor):
    """Answers with its number; notes the dispatcher's thread count on every message."""

    def __init__(self, number: int, thread_counts: list[int]) -> None:
        super().__init__()
        self.number = number
        self.thread_counts = thread_counts

    def on_receive(self, message: Any) -> Any:
        dispatcher = type(self).dispatcher
        assert dispatcher is not None
        self.thread_counts.append(dispatcher.live_threads)
        return self.number


class Exits(LoopActor):
    """Raises ``SystemExit`` for ``"exit"``; sets ``stopped`` in on_stop."""

    def __init__(self, stopped: threading.Event) -> None:
        super().__init__()
        self.stopped = stopped

    def on_receive(self, message: Any) -> Any:
        if message == "exit":
            raise SystemExit(3)
        return message

    def on_stop(self) -> None:
        self.stopped.set()


class ExitsOnStart(LoopActor):
    """Raises ``SystemExit`` from on_start."""

    def on_start(self) -> None:
        raise SystemExit(4)

    def on_receive(self, message: Any) -> Any:
        return message


class Unbound(LoopActor):
    """No ``dispatcher`` set."""


def block_loop(rt: Runtime, dispatcher: LoopDispatcher) -> threading.Event:
    """Hold ``dispatcher``'s loop in a Gate's handler (until the returned Event)."""
    entered, release = threading.Event(), rt.gate()
    gate = rt.start(Gate, entered, release, dispatcher=dispatcher)
    assert gate.ask("ping", timeout=WAIT) == "ping"
    gate.tell(Block())
    assert entered.wait(WAIT), "the gate's handler never ran"
    return release


# -- one message at a time, in order ---------------------------------------------


def test_messages_to_one_actor_are_handled_one_at_a_time_and_in_order(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(batch=3)
    actors = [rt.start(OrderChecker, dispatcher=dispatcher) for _ in range(2)]
    producers, per_producer = 8, 400
    barrier = threading.Barrier(producers)
    errors: list[BaseException] = []

    def produce(producer: int) -> None:
        try:
            barrier.wait(WAIT)
            for seq in range(per_producer):
                for ref in actors:
                    ref.tell((producer, seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []

    for ref in actors:
        report: Any = ref.ask("report", timeout=WAIT)
        seen, most_inside = report
        assert most_inside == 1, "two handlers of one actor ran at the same time"
        assert sorted(seen) == list(range(producers))
        for producer, seqs in seen.items():
            assert seqs == list(range(per_producer)), f"producer {producer} out of order"


def test_a_message_is_handled_only_after_the_one_before_it_returned(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(watchdog=False)
    entered, release = threading.Event(), rt.gate()
    ref = rt.start(Gate, entered, release, dispatcher=dispatcher)
    held = ref.ask(Block(), block=False)
    assert entered.wait(WAIT)
    behind = ref.ask("behind", block=False)
    with pytest.raises(pykka.Timeout):
        behind.get(timeout=0.2)
    release.set()
    assert held.get(timeout=WAIT) == "released"
    assert behind.get(timeout=WAIT) == "behind"


# -- handled at once, from the loop's own thread ------------------------------------


class Forwarder(LoopActor):
    """Handles ``("now", msg)`` by trying ``handle_now(target, msg)`` from inside
    its handler (nested: refused); journals what it handles."""

    def __init__(self, journal: list[str], target: list[pykka.ActorRef[Any]]) -> None:
        super().__init__()
        self.journal = journal
        self.target = target

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, tuple):
            return handle_now(self.target[0], message[1])
        self.journal.append(str(message))
        return message


def on_loop(dispatcher: LoopDispatcher, work: Callable[[], Any]) -> Any:
    """Run ``work`` as a callback on ``dispatcher``'s loop (not in a handler); its value."""
    done: list[Any] = []
    ran = threading.Event()

    def call() -> None:
        done.append(work())
        ran.set()

    dispatcher.loop.loop.call_soon_threadsafe(call)  # type: ignore[attr-defined]
    assert ran.wait(WAIT)
    return done[0]


def test_a_message_is_handled_at_once_on_the_loop_when_nothing_waits_before_it(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(name="now")
    journal: list[str] = []
    ref = rt.start(Forwarder, journal, [], dispatcher=dispatcher)
    assert ref.ask("started", timeout=WAIT) == "started"  # on_start has run
    turns = dispatcher._serving.handlers

    def tell_twice() -> list[Any]:
        first = handle_now(ref, "a")
        seen = list(journal)
        return [first, seen, handle_now(ref, "b")]

    first, seen, second = on_loop(dispatcher, tell_twice)
    assert (first, second) == (True, True)
    assert seen == ["started", "a"]  # handled before handle_now returned
    assert journal == ["started", "a", "b"]
    assert dispatcher._serving.handlers == turns + 2


def test_handle_now_refuses_where_it_would_change_the_order_or_nest(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(name="refused", watchdog=False)
    journal: list[str] = []
    target = rt.start(Forwarder, journal, [], dispatcher=dispatcher)
    assert target.ask("started", timeout=WAIT) == "started"
    # off the loop's thread
    assert handle_now(target, "off") is False
    # inside another actor's handler
    nesting = rt.start(Forwarder, [], [target], dispatcher=dispatcher)
    assert nesting.ask(("now", "nested"), timeout=WAIT) is False

    # with a message queued before it: it waits behind that message
    def behind() -> bool:
        target.tell("queued")
        return handle_now(target, "jumped")

    assert on_loop(dispatcher, behind) is False
    assert target.ask("last", timeout=WAIT) == "last"
    assert journal == ["started", "queued", "last"]
    # an actor whose on_start has not run (it runs with the first message served)
    lazy = type("Lazy", (Forwarder,), {"start_on_first_message": True})
    unstarted = rt.start(lazy, [], [], dispatcher=dispatcher)
    assert on_loop(dispatcher, lambda: handle_now(unstarted, "x")) is False


# -- lifecycle hooks ----------------------------------------------------------------


def test_on_start_runs_on_the_loop_before_the_first_message(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(name="starting")
    journal: list[tuple[str, str]] = []
    ref = rt.start(Lifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher)
    ref.tell("first")
    ref.tell("second")
    assert ref.ask("third", timeout=WAIT) == "third"
    assert [kind for kind, _ in journal] == ["on_start", "message", "message", "message"]
    assert [what for kind, what in journal if kind == "message"] == ["first", "second", "third"]
    start_thread = journal[0][1]
    assert start_thread == "loop-of-starting"
    assert start_thread != threading.current_thread().name


def test_on_stop_runs_on_the_loop_when_the_actor_is_stopped(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(name="stopping")
    journal: list[tuple[str, str]] = []
    stopped = threading.Event()
    ref = rt.start(Lifecycle, journal, stopped, threading.Event(), dispatcher=dispatcher)
    assert ref.ask("hello", timeout=WAIT) == "hello"
    assert ref.stop(timeout=WAIT) is True
    assert stopped.is_set()
    assert journal[-1][0] == "on_stop"
    assert journal[-1][1] == "loop-of-stopping"
    assert not ref.is_alive()
    assert ref not in ActorRegistry.get_all()


def test_a_told_message_whose_handler_raises_calls_on_failure_and_stops_the_actor(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher()
    journal: list[tuple[str, str]] = []
    stopped, failed = threading.Event(), threading.Event()
    ref = rt.start(Lifecycle, journal, stopped, failed, dispatcher=dispatcher)
    ref.tell("crash")
    assert failed.wait(WAIT), "on_failure was not called"
    assert ref.actor_stopped.wait(WAIT)
    assert ("on_failure", "ValueError") in journal
    assert not stopped.is_set(), "on_stop runs only on a clean stop, as in pykka"
    assert ref not in ActorRegistry.get_all()
    with pytest.raises(ActorDeadError):
        ref.ask("still there?", timeout=WAIT)


def test_an_asked_message_whose_handler_raises_gives_the_asker_the_exception_and_the_actor_lives_on(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher()
    failed = threading.Event()
    ref = rt.start(Lifecycle, [], threading.Event(), failed, dispatcher=dispatcher)
    with pytest.raises(ValueError, match="handler failed"):
        ref.ask("crash", timeout=WAIT)
    assert ref.ask("still here", timeout=WAIT) == "still here"
    assert ref.is_alive()
    assert not failed.is_set()


class LazyLifecycle(Lifecycle):
    start_on_first_message = True


def test_an_actor_started_on_its_first_message_takes_no_turn_until_then(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(name="lazy")
    journal: list[tuple[str, str]] = []
    ref = rt.start(
        LazyLifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher
    )
    assert not ref.actor_inbox.scheduled  # no turn will serve it until a message
    assert journal == []  # on_start waits for the first message
    ref.tell("first")
    assert ref.ask("second", timeout=WAIT) == "second"
    assert [kind for kind, _ in journal] == ["on_start", "message", "message"]
    assert journal[0][1] == "loop-of-lazy"


def test_an_actor_started_on_its_first_message_runs_on_start_and_on_stop_when_stopped(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(name="lazy-stop")
    journal: list[tuple[str, str]] = []
    stopped = threading.Event()
    ref = rt.start(LazyLifecycle, journal, stopped, threading.Event(), dispatcher=dispatcher)
    ref.stop(timeout=WAIT)
    assert stopped.is_set()
    assert [kind for kind, _ in journal] == ["on_start", "on_stop"]


def test_an_actor_that_never_got_a_message_is_stopped_on_the_calling_thread_without_hooks(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(name="unstarted")
    journal: list[tuple[str, str]] = []
    ref = rt.start(
        LazyLifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher
    )
    assert stop_unstarted(ref) is True
    assert not ref.is_alive()
    assert journal == []  # it ran no hook, so none runs now
    assert dispatcher.live_threads == 0  # and no turn was taken for it
    with pytest.raises(ActorDeadError, match="LazyLifecycle"):
        ref.tell("anyone?")
    assert ref.stop(timeout=WAIT) is False


def test_an_actor_that_got_a_message_is_not_stopped_unstarted(rt: Runtime) -> None:
    dispatcher = rt.dispatcher()
    journal: list[tuple[str, str]] = []
    lazy = rt.start(
        LazyLifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher
    )
    assert lazy.ask("hello", timeout=WAIT) == "hello"
    eager = rt.start(Echo, dispatcher=dispatcher)
    threading_ref = pykka.ThreadingActor.start()  # not a loop actor
    try:
        assert stop_unstarted(lazy) is False
        assert stop_unstarted(eager) is False
        assert stop_unstarted(threading_ref) is False
    finally:
        threading_ref.stop(timeout=WAIT)
    assert lazy.ask("still there", timeout=WAIT) == "still there"
    assert lazy.stop(timeout=WAIT) is True
    assert [kind for kind, _ in journal][-1] == "on_stop"


def test_on_start_raising_stops_the_actor_and_its_asks_get_actor_dead_error(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(watchdog=False)
    release = block_loop(rt, dispatcher)  # so a message is queued before on_start runs
    journal: list[tuple[str, str]] = []
    stopped = threading.Event()
    ref = rt.start(
        Lifecycle, journal, stopped, threading.Event(), fail_on_start=True, dispatcher=dispatcher
    )
    waiting = ref.ask("queued before on_start", block=False)
    release.set()
    assert ref.actor_stopped.wait(WAIT)
    with pytest.raises(ActorDeadError):
        waiting.get(timeout=WAIT)
    with pytest.raises(ActorDeadError):
        ref.ask("later", timeout=WAIT)
    assert [kind for kind, _ in journal] == ["on_start"]
    assert not stopped.is_set()
    assert ref not in ActorRegistry.get_all()


# -- ask, tell, stop ---------------------------------------------------------------------


def test_ask_and_tell_reach_the_actor(rt: Runtime) -> None:
    dispatcher = rt.dispatcher()
    echo = rt.start(Echo, dispatcher=dispatcher)
    echo.tell("told")
    assert echo.ask("asked", timeout=WAIT) == "asked"
    future = echo.ask({"a": 1}, block=False)
    assert future.get(timeout=WAIT) == {"a": 1}


def test_stop_returns_true_and_a_second_stop_returns_false(rt: Runtime) -> None:
    dispatcher = rt.dispatcher()
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.stop(timeout=WAIT) is True
    assert ref.stop(timeout=WAIT) is False
    assert ref.stop(block=False).get(timeout=WAIT) is False


def test_two_stops_queued_together_both_return_true(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(watchdog=False)
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    release = block_loop(rt, dispatcher)
    first, second = ref.stop(block=False), ref.stop(block=False)
    release.set()
    assert first.get(timeout=WAIT) is True
    assert second.get(timeout=WAIT) is True  # "was being stopped at the time of the call"


# -- what is left in a stopped actor's inbox ----------------------------------------------


def test_messages_left_behind_a_stop_from_a_handler_are_answered_with_actor_dead_error(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(watchdog=False)
    handled: list[Any] = []
    stop_queued, go_on = threading.Event(), rt.gate()
    ref = rt.start(StopsItself, handled, stop_queued, go_on, dispatcher=dispatcher)
    assert ref.ask("ping", timeout=WAIT) == "ping"

    stopping = ref.ask("stop yourself", block=False)
    assert stop_queued.wait(WAIT)
    left_behind = [ref.ask(("later", i), block=False) for i in range(3)]
    ref.tell("a later tell")
    go_on.set()

    assert stopping.get(timeout=WAIT) == "stopping"
    assert ref.actor_stopped.wait(WAIT)
    for future in left_behind:
        with pytest.raises(ActorDeadError, match="stopped before handling the message"):
            future.get(timeout=WAIT)
    assert handled == ["ping", "stop yourself"]


def test_messages_before_a_stop_are_handled_and_those_after_it_get_actor_dead_error(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(watchdog=False)
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    release = block_loop(rt, dispatcher)
    before = ref.ask("before", block=False)
    stop = ref.stop(block=False)
    after = ref.ask("after", block=False)
    release.set()
    assert before.get(timeout=WAIT) == "before"
    assert stop.get(timeout=WAIT) is True
    with pytest.raises(ActorDeadError):
        after.get(timeout=WAIT)


def test_a_tell_or_an_ask_to_a_stopped_actor_raises_actor_dead_error(rt: Runtime) -> None:
    dispatcher = rt.dispatcher()
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.stop(timeout=WAIT) is True
    with pytest.raises(ActorDeadError):
        ref.tell("anyone?")
    with pytest.raises(ActorDeadError):
        ref.ask("anyone?", timeout=WAIT)
    with pytest.raises(ActorDeadError):
        ref.ask("anyone?", block=False).get(timeout=WAIT)


def test_a_stopped_actor_is_freed_with_its_last_reference_not_by_the_collector(
    rt: Runtime,
) -> None:
    # The inbox and its actor refer to each other; a stopped inbox lets go, so
    # ten thousand ended actors are not left for a cyclic collection.
    dispatcher = rt.dispatcher()
    ref = rt.start(Echo, dispatcher=dispatcher)
    freed = threading.Event()
    actor = ref._actor_weakref()
    assert actor is not None
    weakref.finalize(actor, freed.set)
    del actor
    gc.disable()
    try:
        assert ref.stop(timeout=WAIT) is True
        assert freed.wait(WAIT), "the stopped actor is still referenced"
    finally:
        gc.enable()
    with pytest.raises(ActorDeadError, match=r"Echo.*not found"):
        ref.tell("anyone?")


def test_a_message_put_into_a_closed_inbox_is_refused(rt: Runtime) -> None:
    # The race a ref's is_alive() check cannot close: a put that lands after teardown.
    dispatcher = rt.dispatcher()
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.stop(timeout=WAIT) is True
    assert wait_until(lambda: getattr(ref.actor_inbox, "closed", False))
    with pytest.raises(ActorDeadError):
        ref.actor_inbox.put(Envelope("a tell"))
    reply = pykka.ThreadingFuture[Any]()
    ref.actor_inbox.put(Envelope("an ask", reply_to=reply))
    with pytest.raises(ActorDeadError):
        reply.get(timeout=WAIT)


# -- fairness and scale ----------------------------------------------------------------------


def test_a_busy_actor_yields_the_loop_after_a_batch_so_others_are_served(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(batch=4, watchdog=False)
    sequence: list[str] = []
    lock = threading.Lock()
    busy = rt.start(Sequenced, "A", sequence, lock, dispatcher=dispatcher)
    other = rt.start(Sequenced, "B", sequence, lock, dispatcher=dispatcher)
    assert busy.ask("ping", timeout=WAIT) == "pong"
    assert other.ask("ping", timeout=WAIT) == "pong"

    release = block_loop(rt, dispatcher)  # everything below is queued before any is served
    for _ in range(1000):
        busy.tell("work")
    other.tell("work")
    release.set()

    assert busy.ask("ping", timeout=WAIT) == "pong"
    assert other.ask("ping", timeout=WAIT) == "pong"
    with lock:
        handled = list(sequence)
    assert handled.count("A") == 1000
    assert handled.count("B") == 1
    a_before_b = handled.index("B")
    assert a_before_b <= dispatcher.batch, f"B waited behind {a_before_b} of A's messages"
    assert a_before_b < 1000


@pytest.mark.slow
def test_thousands_of_actors_all_answer_on_the_loops_one_thread(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(name="many")
    thread_counts: list[int] = []
    count = 5000
    refs = [rt.start(Numbered, n, thread_counts, dispatcher=dispatcher) for n in range(count)]
    futures = [ref.ask("number?", block=False) for ref in refs]
    assert [future.get(timeout=WAIT * 4) for future in futures] == list(range(count))
    assert len(thread_counts) == count
    assert max(thread_counts) == 1
    assert dispatcher.live_threads == 1
    # The watchdog runs beside the loop: the only thread the dispatcher starts.
    assert thread_names("many-") == {"many-watchdog"}


# -- the blocking guard -------------------------------------------------------------------------


@dataclass
class BlockedScene:
    dispatcher: LoopDispatcher
    now: FakeNow
    reports: list[BlockedHandler]
    blocked: pykka.ActorRef[Gate]
    release: threading.Event
    other_done: threading.Event


def block_the_loop(rt: Runtime) -> BlockedScene:
    """The loop held by actor A's handler (a Block); a "signal" queued to actor B."""
    now = FakeNow()
    reports: list[BlockedHandler] = []
    dispatcher = rt.dispatcher(
        block_threshold=1.0, now=now, watchdog=False, on_blocked=reports.append, name="guarded"
    )
    entered, release = threading.Event(), rt.gate()
    other_done = threading.Event()
    blocked = rt.start(Gate, entered, release, dispatcher=dispatcher)
    other = rt.start(Signal, other_done, dispatcher=dispatcher)
    assert blocked.ask("ping", timeout=WAIT) == "ping"
    assert other.ask("ping", timeout=WAIT) == "ping"
    blocked.tell(Block())
    assert entered.wait(WAIT)
    other.tell("signal")
    return BlockedScene(dispatcher, now, reports, blocked, release, other_done)


def test_a_blocked_handler_is_reported_once_and_the_others_are_served_once_it_returns(
    rt: Runtime,
) -> None:
    scene = block_the_loop(rt)
    dispatcher = scene.dispatcher
    assert dispatcher.check_blocked() is None  # not past the threshold yet
    scene.now.advance(0.9)
    assert dispatcher.check_blocked() is None
    scene.now.advance(0.6)

    report = dispatcher.check_blocked()
    assert report is not None
    assert scene.reports == [report]
    assert report.actor == str(scene.blocked)
    assert report.message_type == "Block"
    assert report.seconds == pytest.approx(1.5)

    assert dispatcher.check_blocked() is None  # once per handler
    scene.now.advance(60.0)
    assert dispatcher.check_blocked() is None
    assert not scene.other_done.is_set()  # nothing stands in for the loop's thread

    scene.release.set()
    assert scene.other_done.wait(WAIT)
    assert scene.blocked.ask("ping", timeout=WAIT) == "ping"
    assert dispatcher.blocked_reports == 1
    assert len(scene.reports) == 1


def test_the_next_handler_that_blocks_is_reported_too(rt: Runtime) -> None:
    scene = block_the_loop(rt)
    scene.now.advance(1.5)
    assert scene.dispatcher.check_blocked() is not None
    entered, release = threading.Event(), rt.gate()
    second = rt.start(Gate, entered, release, dispatcher=scene.dispatcher)
    second.tell(Block())  # queued behind the first
    scene.release.set()
    assert entered.wait(WAIT)
    assert scene.dispatcher.check_blocked() is None  # it has only begun
    scene.now.advance(1.5)
    report = scene.dispatcher.check_blocked()
    assert report is not None
    assert report.actor == str(second)
    release.set()
    assert second.ask("ping", timeout=WAIT) == "ping"
    assert scene.dispatcher.blocked_reports == 2


def test_an_on_blocked_callback_that_raises_does_not_break_the_check(rt: Runtime) -> None:
    now = FakeNow()

    def on_blocked(report: BlockedHandler) -> None:
        raise RuntimeError("callback failed")

    dispatcher = rt.dispatcher(block_threshold=1.0, now=now, watchdog=False, on_blocked=on_blocked)
    entered, release = threading.Event(), rt.gate()
    ref = rt.start(Gate, entered, release, dispatcher=dispatcher)
    ref.tell(Block())
    assert entered.wait(WAIT)
    now.advance(5.0)
    report = dispatcher.check_blocked()
    assert report is not None
    assert report.message_type == "Block"
    release.set()
    assert ref.ask("ping", timeout=WAIT) == "ping"


def test_the_watchdog_reports_a_blocked_handler_on_its_own(rt: Runtime) -> None:
    reported = threading.Event()
    reports: list[BlockedHandler] = []

    def on_blocked(report: BlockedHandler) -> None:
        reports.append(report)
        reported.set()

    dispatcher = rt.dispatcher(block_threshold=0.1, on_blocked=on_blocked)
    entered, release = threading.Event(), rt.gate()
    blocked = rt.start(Gate, entered, release, dispatcher=dispatcher)
    blocked.tell(Block())
    assert entered.wait(WAIT)
    assert reported.wait(WAIT), "the watchdog never reported the blocked handler"
    release.set()
    assert blocked.ask("ping", timeout=WAIT) == "ping"
    assert [r.actor for r in reports] == [str(blocked)]


# -- BaseException -----------------------------------------------------------------------------


def test_a_system_exit_in_a_handler_stops_that_actor_and_nothing_else(rt: Runtime) -> None:
    dispatcher = rt.dispatcher()
    bystander = rt.start(Echo, dispatcher=dispatcher)
    assert bystander.ask("ping", timeout=WAIT) == "ping"
    stopped = threading.Event()
    victim = rt.start(Exits, stopped, dispatcher=dispatcher)
    assert victim.ask("ping", timeout=WAIT) == "ping"

    with pytest.raises(SystemExit):
        victim.ask("exit", timeout=WAIT)  # the asker is answered, not left waiting
    assert victim.actor_stopped.wait(WAIT)
    assert stopped.wait(WAIT), "on_stop runs, as pykka's stop does"
    with pytest.raises(ActorDeadError):
        victim.ask("ping", timeout=WAIT)
    assert victim not in ActorRegistry.get_all()
    # Unlike pykka's stop_all, the others and the loop live on.
    assert bystander.ask("still served?", timeout=WAIT) == "still served?"
    fresh = rt.start(Echo, dispatcher=dispatcher)
    assert fresh.ask("still served?", timeout=WAIT) == "still served?"


def test_a_system_exit_in_on_start_stops_that_actor_and_the_loop_serves_on(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher()
    ref = rt.start(ExitsOnStart, dispatcher=dispatcher)
    assert ref.actor_stopped.wait(WAIT)
    with pytest.raises(ActorDeadError):
        ref.ask("ping", timeout=WAIT)
    assert ref not in ActorRegistry.get_all()
    other = rt.start(Echo, dispatcher=dispatcher)
    assert other.ask("ping", timeout=WAIT) == "ping"
    assert dispatcher.live_threads == 1


# -- the dispatcher itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"batch": 0}, "batch"),
        ({"batch": -3}, "batch"),
        ({"batch": 1.5}, "batch"),
        ({"block_threshold": 0}, "block_threshold"),
        ({"block_threshold": -1.0}, "block_threshold"),
        ({"block_threshold": float("nan")}, "block_threshold"),
    ],
)
def test_the_dispatcher_rejects_a_bad_argument_naming_it(
    rt: Runtime, options: dict[str, Any], argument: str
) -> None:
    loop = EventLoopThread("loop-of-refused")
    rt.loops.append(loop)
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        LoopDispatcher(loop, **options)


def test_close_stops_the_watchdog_and_is_idempotent(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(name="closing")
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    assert dispatcher.live_threads == 1
    assert thread_names("closing-") == {"closing-watchdog"}
    assert ref.stop(timeout=WAIT) is True

    dispatcher.close()
    assert dispatcher.live_threads == 0
    assert thread_names("closing-") == set()
    dispatcher.close()
    assert dispatcher.live_threads == 0


def test_closing_an_unused_dispatcher_starts_no_threads(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(name="unused")
    dispatcher.close()
    dispatcher.close()
    assert dispatcher.live_threads == 0
    assert thread_names("unused-") == set()


def test_an_actor_class_without_a_dispatcher_is_refused_naming_it() -> None:
    assert Unbound.dispatcher is None
    with pytest.raises(RuntimeError, match="Unbound has no dispatcher"):
        Unbound.start()
    assert not any(isinstance(ref, Unbound) for ref in ActorRegistry.get_all())
