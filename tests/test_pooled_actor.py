"""PooledActor keeps pykka's actor semantics on a Dispatcher's small, shared pool of threads.

Every test orders events with ``threading.Event``/``Barrier`` waits bounded by
``WAIT``; the ``rt`` fixture releases every gate, stops every actor and closes
every dispatcher a test made, whatever happened in it.
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
from pykka._envelope import Envelope

from sessiontree.actors import _pooled
from sessiontree.actors.runtime import (
    BlockedHandler,
    Dispatcher,
    EventLoopThread,
    LoopDispatcher,
    PooledActor,
    stop_unstarted,
)

WAIT = 5.0  # real seconds any bounded wait may take before the test fails

A = TypeVar("A", bound=PooledActor)


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


class Runtime:
    """What a test made: dispatchers, actors and gates, all cleaned up by ``rt``.

    ``dispatch``: ``threads`` makes pools of threads, ``loop`` makes each
    dispatcher a ``LoopDispatcher`` on an event loop of its own (the pool's
    size and its compensating threads do not apply there).
    """

    def __init__(self, dispatch: str = "threads") -> None:
        self.dispatch = dispatch
        self.loops: list[EventLoopThread] = []
        self.dispatchers: list[Dispatcher] = []
        self.refs: list[pykka.ActorRef[Any]] = []
        self.gates: list[threading.Event] = []
        self._bound: dict[tuple[type[PooledActor], int], type[PooledActor]] = {}

    def dispatcher(self, threads: int = 2, **options: Any) -> Dispatcher:
        options.setdefault("name", f"test-pool-{len(self.dispatchers)}")
        dispatcher: Dispatcher
        if self.dispatch == "loop":
            options.pop("max_extra_threads", None)
            loop = EventLoopThread(f"loop-of-{options['name']}")
            self.loops.append(loop)
            dispatcher = LoopDispatcher(loop, **options)
        else:
            dispatcher = Dispatcher(threads, **options)
        self.dispatchers.append(dispatcher)
        return dispatcher

    def pool(self, threads: int) -> int:
        """How many threads serve a dispatcher made with ``threads`` (a loop: its one)."""
        return threads if self.dispatch == "threads" else 1

    def serves(self, thread_name: str, name: str) -> bool:
        """Whether ``thread_name`` is one that serves the dispatcher named ``name``."""
        if self.dispatch == "threads":
            return thread_name.startswith(f"{name}-")
        return thread_name == f"loop-of-{name}"

    def gate(self) -> threading.Event:
        """An Event a handler may block on; set at teardown so none is left waiting."""
        event = threading.Event()
        self.gates.append(event)
        return event

    def start(
        self,
        actor_class: type[A],
        *args: Any,
        dispatcher: Dispatcher | None = None,
        **kwargs: Any,
    ) -> pykka.ActorRef[A]:
        """Start ``actor_class`` on ``dispatcher`` (a subclass binding it), or as it is."""
        cls: type[A] = actor_class
        if dispatcher is not None:
            key = (actor_class, id(dispatcher))
            if key not in self._bound:
                self._bound[key] = type(
                    actor_class.__name__, (actor_class,), {"dispatcher": dispatcher}
                )
            cls = self._bound[key]  # type: ignore[assignment]
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


# What only a pool of threads has: its threads, their names and counts, and
# a compensating thread standing in for a blocked handler.
POOL_THREADS_ONLY = frozenset(
    {
        "test_a_blocked_handler_is_reported_once_and_an_extra_thread_serves_the_rest",
        "test_the_compensating_thread_leaves_once_the_blocked_handler_returned",
    }
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of the actor semantics runs on a pool of threads and on an event loop."""
    if "rt" in metafunc.fixturenames:
        loop = metafunc.function.__name__ not in POOL_THREADS_ONLY
        metafunc.parametrize("dispatch", ["threads", "loop"] if loop else ["threads"])


@pytest.fixture
def rt(dispatch: str) -> Iterator[Runtime]:
    runtime = Runtime(dispatch)
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
    """A message that makes a Gate hold its pool thread."""


class Echo(PooledActor):
    """Answers every message with itself; ``"thread"`` with the thread it runs on."""

    def on_receive(self, message: Any) -> Any:
        if message == "thread":
            return threading.current_thread().name
        return message


class Gate(PooledActor):
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


class Signal(PooledActor):
    """Sets ``done`` when it handles ``"signal"``."""

    def __init__(self, done: threading.Event) -> None:
        super().__init__()
        self.done = done

    def on_receive(self, message: Any) -> Any:
        if message == "signal":
            self.done.set()
        return message


class Lifecycle(PooledActor):
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


class Account(PooledActor):
    """A plain object reached through a proxy."""

    def __init__(self) -> None:
        super().__init__()
        self.balance = 0

    def deposit(self, amount: int) -> int:
        self.balance += amount
        return self.balance


class OrderChecker(PooledActor):
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


class StopsItself(PooledActor):
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


class Sequenced(PooledActor):
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


class Numbered(PooledActor):
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


class Exits(PooledActor):
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


class ExitsOnStart(PooledActor):
    """Raises ``SystemExit`` from on_start."""

    def on_start(self) -> None:
        raise SystemExit(4)

    def on_receive(self, message: Any) -> Any:
        return message


class PlainOne(PooledActor):
    """No ``dispatcher`` set: runs on the process-wide default pool."""

    def on_receive(self, message: Any) -> Any:
        return threading.current_thread().name


class PlainTwo(PlainOne):
    pass


def block_pool(rt: Runtime, dispatcher: Dispatcher) -> threading.Event:
    """Occupy one of ``dispatcher``'s threads with a Gate's handler (until the returned Event)."""
    entered, release = threading.Event(), rt.gate()
    gate = rt.start(Gate, entered, release, dispatcher=dispatcher)
    assert gate.ask("ping", timeout=WAIT) == "ping"
    gate.tell(Block())
    assert entered.wait(WAIT), "the gate's handler never ran"
    return release


# -- one message at a time, in order ---------------------------------------------


def test_messages_to_one_actor_are_handled_one_at_a_time_and_in_order(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=4, batch=3)
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
    dispatcher = rt.dispatcher(threads=3, watchdog=False)
    entered, release = threading.Event(), rt.gate()
    ref = rt.start(Gate, entered, release, dispatcher=dispatcher)
    held = ref.ask(Block(), block=False)
    assert entered.wait(WAIT)
    behind = ref.ask("behind", block=False)
    # Other threads are free, yet the actor's next message waits for its handler.
    assert dispatcher.live_threads == rt.pool(3)
    with pytest.raises(pykka.Timeout):
        behind.get(timeout=0.2)
    release.set()
    assert held.get(timeout=WAIT) == "released"
    assert behind.get(timeout=WAIT) == "behind"


# -- lifecycle hooks ----------------------------------------------------------------


def test_on_start_runs_on_a_pool_thread_before_the_first_message(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2, name="starting")
    journal: list[tuple[str, str]] = []
    ref = rt.start(Lifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher)
    ref.tell("first")
    ref.tell("second")
    assert ref.ask("third", timeout=WAIT) == "third"
    assert [kind for kind, _ in journal] == ["on_start", "message", "message", "message"]
    assert [what for kind, what in journal if kind == "message"] == ["first", "second", "third"]
    start_thread = journal[0][1]
    assert rt.serves(start_thread, "starting")
    assert start_thread != threading.current_thread().name


def test_on_stop_runs_on_a_pool_thread_when_the_actor_is_stopped(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2, name="stopping")
    journal: list[tuple[str, str]] = []
    stopped = threading.Event()
    ref = rt.start(Lifecycle, journal, stopped, threading.Event(), dispatcher=dispatcher)
    assert ref.ask("hello", timeout=WAIT) == "hello"
    assert ref.stop(timeout=WAIT) is True
    assert stopped.is_set()
    assert journal[-1][0] == "on_stop"
    assert rt.serves(journal[-1][1], "stopping")
    assert not ref.is_alive()
    assert ref not in ActorRegistry.get_all()


def test_a_told_message_whose_handler_raises_calls_on_failure_and_stops_the_actor(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(threads=2)
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
    dispatcher = rt.dispatcher(threads=2)
    failed = threading.Event()
    ref = rt.start(Lifecycle, [], threading.Event(), failed, dispatcher=dispatcher)
    with pytest.raises(ValueError, match="handler failed"):
        ref.ask("crash", timeout=WAIT)
    assert ref.ask("still here", timeout=WAIT) == "still here"
    assert ref.is_alive()
    assert not failed.is_set()


class LazyLifecycle(Lifecycle):
    start_on_first_message = True


def test_an_actor_started_on_its_first_message_takes_no_pool_thread_until_then(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(threads=2, name="lazy")
    journal: list[tuple[str, str]] = []
    ref = rt.start(
        LazyLifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher
    )
    assert not ref.actor_inbox.scheduled  # no pool thread will serve it until a message
    assert journal == []  # on_start waits for the first message
    assert dispatcher.live_threads == 0
    ref.tell("first")
    assert ref.ask("second", timeout=WAIT) == "second"
    assert [kind for kind, _ in journal] == ["on_start", "message", "message"]
    assert rt.serves(journal[0][1], "lazy")


def test_an_actor_started_on_its_first_message_runs_on_start_and_on_stop_when_stopped(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(threads=2, name="lazy-stop")
    journal: list[tuple[str, str]] = []
    stopped = threading.Event()
    ref = rt.start(LazyLifecycle, journal, stopped, threading.Event(), dispatcher=dispatcher)
    ref.stop(timeout=WAIT)
    assert stopped.is_set()
    assert [kind for kind, _ in journal] == ["on_start", "on_stop"]


def test_an_actor_that_never_got_a_message_is_stopped_on_the_calling_thread_without_hooks(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(threads=2, name="unstarted")
    journal: list[tuple[str, str]] = []
    ref = rt.start(
        LazyLifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher
    )
    assert stop_unstarted(ref) is True
    assert not ref.is_alive()
    assert journal == []  # it ran no hook, so none runs now
    assert dispatcher.live_threads == 0  # and no pool thread was taken for it
    with pytest.raises(ActorDeadError, match="LazyLifecycle"):
        ref.tell("anyone?")
    assert ref.stop(timeout=WAIT) is False


def test_an_actor_that_got_a_message_is_not_stopped_unstarted(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2)
    journal: list[tuple[str, str]] = []
    lazy = rt.start(
        LazyLifecycle, journal, threading.Event(), threading.Event(), dispatcher=dispatcher
    )
    assert lazy.ask("hello", timeout=WAIT) == "hello"
    eager = rt.start(Echo, dispatcher=dispatcher)
    threading_ref = rt.start(pykka.ThreadingActor)  # not a pooled actor
    assert stop_unstarted(lazy) is False
    assert stop_unstarted(eager) is False
    assert stop_unstarted(threading_ref) is False
    assert lazy.ask("still there", timeout=WAIT) == "still there"
    assert lazy.stop(timeout=WAIT) is True
    assert [kind for kind, _ in journal][-1] == "on_stop"


def test_on_start_raising_stops_the_actor_and_its_asks_get_actor_dead_error(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(threads=1, watchdog=False)
    release = block_pool(rt, dispatcher)  # so a message is queued before on_start runs
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


# -- ask, tell, proxies, stop ---------------------------------------------------------


def test_ask_tell_and_proxy_calls_gets_and_sets_reach_the_actor(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2)
    echo = rt.start(Echo, dispatcher=dispatcher)
    echo.tell("told")
    assert echo.ask("asked", timeout=WAIT) == "asked"
    future = echo.ask({"a": 1}, block=False)
    assert future.get(timeout=WAIT) == {"a": 1}

    account = rt.start(Account, dispatcher=dispatcher).proxy()
    assert account.deposit(5).get(timeout=WAIT) == 5
    assert account.deposit(7).get(timeout=WAIT) == 12
    assert account.balance.get(timeout=WAIT) == 12
    account.balance = 100
    assert account.balance.get(timeout=WAIT) == 100
    assert account.deposit(1).get(timeout=WAIT) == 101


def test_stop_returns_true_and_a_second_stop_returns_false(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2)
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.stop(timeout=WAIT) is True
    assert ref.stop(timeout=WAIT) is False
    assert ref.stop(block=False).get(timeout=WAIT) is False


def test_two_stops_queued_together_both_return_true(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=1, watchdog=False)
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    release = block_pool(rt, dispatcher)
    first, second = ref.stop(block=False), ref.stop(block=False)
    release.set()
    assert first.get(timeout=WAIT) is True
    assert second.get(timeout=WAIT) is True  # "was being stopped at the time of the call"


# -- what is left in a stopped actor's inbox ----------------------------------------------


def test_messages_left_behind_a_stop_from_a_handler_are_answered_with_actor_dead_error(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(threads=2, watchdog=False)
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
    dispatcher = rt.dispatcher(threads=1, watchdog=False)
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    release = block_pool(rt, dispatcher)
    before = ref.ask("before", block=False)
    stop = ref.stop(block=False)
    after = ref.ask("after", block=False)
    release.set()
    assert before.get(timeout=WAIT) == "before"
    assert stop.get(timeout=WAIT) is True
    with pytest.raises(ActorDeadError):
        after.get(timeout=WAIT)


def test_a_tell_or_an_ask_to_a_stopped_actor_raises_actor_dead_error(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2)
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
    dispatcher = rt.dispatcher(threads=2)
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
    dispatcher = rt.dispatcher(threads=2)
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


def test_a_busy_actor_yields_its_thread_after_a_batch_so_others_are_served(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=1, batch=4, watchdog=False)
    sequence: list[str] = []
    lock = threading.Lock()
    busy = rt.start(Sequenced, "A", sequence, lock, dispatcher=dispatcher)
    other = rt.start(Sequenced, "B", sequence, lock, dispatcher=dispatcher)
    assert busy.ask("ping", timeout=WAIT) == "pong"
    assert other.ask("ping", timeout=WAIT) == "pong"

    release = block_pool(rt, dispatcher)  # everything below is queued before any is served
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
def test_thousands_of_actors_all_answer_on_two_threads(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2, name="many")
    thread_counts: list[int] = []
    count = 5000
    refs = [rt.start(Numbered, n, thread_counts, dispatcher=dispatcher) for n in range(count)]
    futures = [ref.ask("number?", block=False) for ref in refs]
    assert [future.get(timeout=WAIT * 4) for future in futures] == list(range(count))
    assert len(thread_counts) == count
    assert max(thread_counts) <= 2
    assert dispatcher.live_threads == rt.pool(2)
    # The watchdog runs beside the pool and is not one of its threads.
    pool = {"many-0", "many-1"} if rt.dispatch == "threads" else set()
    assert thread_names("many-") == pool | {"many-watchdog"}


# -- the blocking guard -------------------------------------------------------------------------


@dataclass
class BlockedScene:
    dispatcher: Dispatcher
    now: FakeNow
    reports: list[BlockedHandler]
    blocked: pykka.ActorRef[Gate]
    release: threading.Event
    left: threading.Event
    other_done: threading.Event


def block_one_of_one(rt: Runtime, *, max_extra_threads: int = 8) -> BlockedScene:
    """One pool thread, held by actor A's handler (a Block); a "signal" queued to actor B."""
    now = FakeNow()
    reports: list[BlockedHandler] = []
    dispatcher = rt.dispatcher(
        threads=1,
        block_threshold=1.0,
        now=now,
        watchdog=False,
        on_blocked=reports.append,
        max_extra_threads=max_extra_threads,
        name="guarded",
    )
    entered, release, left = threading.Event(), rt.gate(), threading.Event()
    other_done = threading.Event()
    blocked = rt.start(Gate, entered, release, left, dispatcher=dispatcher)
    other = rt.start(Signal, other_done, dispatcher=dispatcher)
    assert blocked.ask("ping", timeout=WAIT) == "ping"
    assert other.ask("ping", timeout=WAIT) == "ping"
    blocked.tell(Block())
    assert entered.wait(WAIT)
    other.tell("signal")
    return BlockedScene(dispatcher, now, reports, blocked, release, left, other_done)


def test_a_blocked_handler_is_reported_once_and_an_extra_thread_serves_the_rest(
    rt: Runtime,
) -> None:
    scene = block_one_of_one(rt)
    dispatcher = scene.dispatcher
    assert dispatcher.check_blocked() == []  # not past the threshold yet
    scene.now.advance(0.9)
    assert dispatcher.check_blocked() == []
    scene.now.advance(0.6)

    new = dispatcher.check_blocked()
    assert len(new) == 1
    assert scene.reports == new
    report = new[0]
    assert report.actor == str(scene.blocked)
    assert report.message_type == "Block"
    assert report.seconds == pytest.approx(1.5)

    assert scene.other_done.wait(WAIT), "no compensating thread served the other actor"
    assert dispatcher.live_threads == 2
    assert "guarded-extra" in thread_names("guarded-")

    assert dispatcher.check_blocked() == []
    scene.now.advance(60.0)
    assert dispatcher.check_blocked() == []

    scene.release.set()
    assert scene.blocked.ask("ping", timeout=WAIT) == "ping"
    assert dispatcher.blocked_reports == 1
    assert len(scene.reports) == 1


def test_the_compensating_thread_leaves_once_the_blocked_handler_returned(rt: Runtime) -> None:
    scene = block_one_of_one(rt)
    dispatcher = scene.dispatcher
    scene.now.advance(1.5)
    assert len(dispatcher.check_blocked()) == 1
    assert scene.other_done.wait(WAIT)
    assert dispatcher.live_threads == 2

    scene.release.set()
    assert scene.left.wait(WAIT)
    # Nothing else is sent: the extra thread must leave on its own, not on the next message.
    assert wait_until(lambda: dispatcher.live_threads == 1), (
        f"the compensating thread stayed: live_threads={dispatcher.live_threads}"
    )
    assert wait_until(lambda: thread_names("guarded-") == {"guarded-0"})
    assert scene.blocked.ask("ping", timeout=WAIT) == "ping"
    assert dispatcher.blocked_reports == 1


def test_without_extra_threads_allowed_a_blocked_handler_is_reported_but_no_thread_is_added(
    rt: Runtime,
) -> None:
    scene = block_one_of_one(rt, max_extra_threads=0)
    scene.now.advance(2.0)
    assert len(scene.dispatcher.check_blocked()) == 1
    assert scene.dispatcher.live_threads == 1
    scene.release.set()
    assert scene.other_done.wait(WAIT)


def test_an_on_blocked_callback_that_raises_does_not_break_the_check(rt: Runtime) -> None:
    now = FakeNow()

    def on_blocked(report: BlockedHandler) -> None:
        raise RuntimeError("callback failed")

    dispatcher = rt.dispatcher(
        threads=1, block_threshold=1.0, now=now, watchdog=False, on_blocked=on_blocked
    )
    entered, release = threading.Event(), rt.gate()
    ref = rt.start(Gate, entered, release, dispatcher=dispatcher)
    ref.tell(Block())
    assert entered.wait(WAIT)
    now.advance(5.0)
    assert [r.message_type for r in dispatcher.check_blocked()] == ["Block"]
    release.set()
    assert ref.ask("ping", timeout=WAIT) == "ping"


def test_the_watchdog_reports_a_blocked_handler_on_its_own(rt: Runtime) -> None:
    reported = threading.Event()
    reports: list[BlockedHandler] = []

    def on_blocked(report: BlockedHandler) -> None:
        reports.append(report)
        reported.set()

    dispatcher = rt.dispatcher(threads=1, block_threshold=0.1, on_blocked=on_blocked)
    entered, release, other_done = threading.Event(), rt.gate(), threading.Event()
    blocked = rt.start(Gate, entered, release, dispatcher=dispatcher)
    other = rt.start(Signal, other_done, dispatcher=dispatcher)
    blocked.tell(Block())
    assert entered.wait(WAIT)
    other.tell("signal")
    assert reported.wait(WAIT), "the watchdog never reported the blocked handler"
    assert other_done.wait(WAIT)
    release.set()
    assert blocked.ask("ping", timeout=WAIT) == "ping"
    assert [r.actor for r in reports] == [str(blocked)]


# -- BaseException -----------------------------------------------------------------------------


def test_a_system_exit_in_a_handler_stops_that_actor_but_not_the_pool(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2)
    bystander = rt.start(Echo, dispatcher=dispatcher)
    assert bystander.ask("ping", timeout=WAIT) == "ping"
    stopped = threading.Event()
    victim = rt.start(Exits, stopped, dispatcher=dispatcher)
    assert victim.ask("ping", timeout=WAIT) == "ping"

    victim.tell("exit")
    assert victim.actor_stopped.wait(WAIT)
    assert stopped.wait(WAIT), "on_stop runs, as pykka's _stop() does"
    with pytest.raises(ActorDeadError):
        victim.ask("ping", timeout=WAIT)
    # As in pykka, every registered actor is asked to stop.
    assert bystander.actor_stopped.wait(WAIT)

    # The pool itself lives on, with all its threads.
    fresh = rt.start(Echo, dispatcher=dispatcher)
    assert fresh.ask("still served?", timeout=WAIT) == "still served?"
    assert dispatcher.live_threads == rt.pool(2)


def test_a_system_exit_in_on_start_stops_that_actor_and_keeps_the_pool_threads(
    rt: Runtime,
) -> None:
    dispatcher = rt.dispatcher(threads=2)
    ref = rt.start(ExitsOnStart, dispatcher=dispatcher)
    assert ref.actor_stopped.wait(WAIT)
    with pytest.raises(ActorDeadError):
        ref.ask("ping", timeout=WAIT)
    other = rt.start(Echo, dispatcher=dispatcher)
    assert other.ask("ping", timeout=WAIT) == "ping"
    assert dispatcher.live_threads == rt.pool(2)


def test_an_actor_stopped_by_a_system_exit_in_on_start_is_unregistered(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2)
    ref = rt.start(ExitsOnStart, dispatcher=dispatcher)
    assert ref.actor_stopped.wait(WAIT)
    assert ref not in ActorRegistry.get_all()


# -- the Dispatcher itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"threads": 0}, "threads"),
        ({"threads": -1}, "threads"),
        ({"threads": 1.5}, "threads"),
        ({"batch": 0}, "batch"),
        ({"batch": -3}, "batch"),
        ({"block_threshold": 0}, "block_threshold"),
        ({"block_threshold": -1.0}, "block_threshold"),
        ({"block_threshold": float("nan")}, "block_threshold"),
    ],
)
def test_dispatcher_rejects_a_bad_argument_naming_it(
    options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        Dispatcher(**options)


def test_close_stops_the_pool_threads_and_is_idempotent(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=3, name="closing")
    ref = rt.start(Echo, dispatcher=dispatcher)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    assert dispatcher.live_threads == rt.pool(3)
    assert ref.stop(timeout=WAIT) is True

    dispatcher.close()
    assert dispatcher.live_threads == 0
    assert thread_names("closing-") == set()
    dispatcher.close()
    assert dispatcher.live_threads == 0


def test_closing_an_unused_dispatcher_starts_no_threads(rt: Runtime) -> None:
    dispatcher = rt.dispatcher(threads=2, name="unused")
    dispatcher.close()
    dispatcher.close()
    assert dispatcher.live_threads == 0
    assert thread_names("unused-") == set()


def test_actors_without_a_dispatcher_share_the_process_wide_default_pool(rt: Runtime) -> None:
    assert PlainOne.dispatcher is None
    one, two = rt.start(PlainOne), rt.start(PlainTwo)
    default = _pooled._default_dispatcher()
    assert default is _pooled._default_dispatcher()
    assert getattr(one.actor_inbox, "dispatcher", None) is default
    assert getattr(two.actor_inbox, "dispatcher", None) is default
    for ref in (one, two):
        where: Any = ref.ask("where?", timeout=WAIT)
        assert where.startswith(f"{default.name}-")
    assert one.stop(timeout=WAIT) is True
    assert two.stop(timeout=WAIT) is True
