"""Stateful property test (issue 21, "How it is checked"): random histories of a
tree that is shut down and restarted from its store.

A hypothesis state machine drives one node at a time, on a virtual clock, over
one real LMDB directory, through the public API alone: spawns (branches and
workers, from outside and from inside a skill), results, skill crashes, skills
that catch ``Cancelled`` and return a partial result, cancels, suspends,
resumes, TTL expiries (the clock advanced), messages to the Main, shutdowns
with and without grace, and restarts (a new ``Node`` on the same store). After
every step, once the tree has settled:

* the Cortex is running: the node did not fail and answers a query;
* every transition it took was legal (each ``transition`` event checked
  against the protocol's table) and no ended session ever moved again, across
  restarts too;
* every parent heard exactly once per ended child (``SessionRef.results()``),
  the Main ran exactly one cycle per ended child (once a cycle it waits in
  has gone on), and a result once seen never changes;
* nothing acknowledged is lost: every spawned session is still known after
  any number of restarts (a worker its running branch's skill spawned, only
  while that branch is: it is never written unless the branch suspends), and
  every message the Main acknowledged ran to its end once, in order (a cycle
  let go by a shutdown runs again after it);
* a shutdown leaves no skill thread behind and every Worker ended.

How skills are driven: each branch or worker skill polls, waiting one virtual
``TICK`` at a checkpoint (``sleep``, or ``collect`` while it has children of
its own), then reads the command the test left for its session id (ids, and
so commands, survive restarts). A step sets a command, advances the clock a
tick and calls ``wait_idle``; nothing real-time orders anything. Skills whose
task starts with ``wrap`` catch ``Cancelled`` and return ``"partial"``.

Run longer with ``SESSIONTREE_MACHINE_EXAMPLES=500`` (the default is a short
run that fits the suite); ``SESSIONTREE_MACHINE_SEED=N`` replaces the fixed
derandomised search with hypothesis's seed ``N``.
"""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import tempfile
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from sessiontree.actors import AsyncSession, Cancelled, Session, VirtualClock
from sessiontree.protocol import (
    SessionKind,
    SessionResult,
    SessionState,
    UnknownSessionError,
    is_legal_transition,
)
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, Spawned

AGENT = "machine"
TICK = 1 / 1024  # virtual seconds a polling skill waits between looks at its command
GRACE = 4.0
TTLS = (None, 6.0, 20.0)
ADVANCES = (0.5, 2.0, 7.0)
WAIT = 10.0  # real seconds any settle or join may take before the step fails
EXAMPLES = int(os.environ.get("SESSIONTREE_MACHINE_EXAMPLES", "50"))
SEED = os.environ.get("SESSIONTREE_MACHINE_SEED")

COMPLETE, CRASH, SPAWN = "complete", "crash", "spawn"
REFUSED = uuid.UUID(int=0)  # what the bundle of children gets for a refused spawn


class SkillCrashError(Exception):
    """What a skill raises when the test tells it to crash."""


class Commands:
    """What the test leaves for skills (by session id), and the threads they ran on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commands: dict[uuid.UUID, str] = {}
        self.threads: list[threading.Thread] = []
        self.inner: list[tuple[uuid.UUID, Spawned]] = []  # spawns made by skills

    def give(self, session_id: uuid.UUID, command: str) -> None:
        with self._lock:
            self._commands[session_id] = command

    def take(self, session_id: uuid.UUID) -> str | None:
        with self._lock:
            return self._commands.pop(session_id, None)

    def ran_on(self, thread: threading.Thread) -> None:
        with self._lock:
            self.threads.append(thread)

    def spawned(self, parent: uuid.UUID, answer: Spawned) -> None:
        with self._lock:
            self.inner.append((parent, answer))

    def take_threads(self) -> list[threading.Thread]:
        with self._lock:
            threads, self.threads = self.threads, []
            return threads

    def take_inner(self) -> list[tuple[uuid.UUID, Spawned]]:
        with self._lock:
            inner, self.inner = self.inner, []
            return inner


class MainLog:
    """The Main's skill: records every cycle that ran to its end (a child's result
    as its id). A message starting with ``hold`` keeps its cycle waiting at a
    checkpoint until the test commands the Main to go on (a shutdown lets it
    go with ``Cancelled``; the message, not consumed, runs again after the
    restart)."""

    def __init__(self, commands: Commands) -> None:
        self._lock = threading.Lock()
        self.commands = commands
        self.messages: collections.Counter[Any] = collections.Counter()
        self.results: collections.Counter[uuid.UUID] = collections.Counter()

    def __call__(self, session: Session) -> None:
        message = session.message
        if isinstance(message, str) and message.startswith("hold"):
            self.commands.ran_on(threading.current_thread())
            while self.commands.take(session.session_id) != COMPLETE:
                session.sleep(TICK)
        with self._lock:
            if isinstance(message, SessionResult):
                self.results[message.session_id] += 1
            else:
                self.messages[message] += 1


def make_skills(commands: Commands, main: MainLog) -> dict[str, Any]:
    """A sync and an async polling skill, both driven by ``commands``."""

    def poll(session: Session) -> object:
        commands.ran_on(threading.current_thread())
        sid, children = session.session_id, 0
        try:
            while True:
                command = commands.take(sid)
                if command == COMPLETE:
                    return f"done:{session.task}"
                if command == CRASH:
                    raise SkillCrashError(session.task)
                if command == SPAWN:
                    answer = session.spawn(kind="worker", skill="poll", task=f"wrap-{sid}")
                    commands.spawned(sid, answer)
                    children += answer.session_id is not None
                elif children:
                    session.collect(timeout=TICK)  # waits on its workers, a checkpoint
                else:
                    session.sleep(TICK)
        except Cancelled:
            if session.task.startswith("wrap"):
                return "partial"  # the wrap-up the README invites
            raise

    async def poll_async(session: AsyncSession) -> object:
        sid = session.session_id
        try:
            while True:
                command = commands.take(sid)
                if command == COMPLETE:
                    return f"done:{session.task}"
                if command == CRASH:
                    raise SkillCrashError(session.task)
                if command == SPAWN:
                    answer = await session.spawn(kind="worker", skill="poll_async")
                    commands.spawned(sid, answer)
                else:
                    await session.sleep(TICK)
        except Cancelled:
            if session.task.startswith("wrap"):
                return "partial"
            raise

    return {"main": main, "poll": poll, "poll_async": poll_async}


class TreeMachine(RuleBasedStateMachine):
    """One store, a node at a time on it; see the module docstring."""

    mains = Bundle("mains")
    children = Bundle("children")

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="sessiontree-machine-")
        self.clock = VirtualClock()
        self.commands = Commands()
        self.main_log = MainLog(self.commands)
        self.agent = Agent(AGENT, make_skills(self.commands, self.main_log), main_skill="main")
        self.known: dict[uuid.UUID, tuple[SessionKind, uuid.UUID | None]] = {}
        self.inner: set[uuid.UUID] = set()  # workers a skill spawned (see _forget_unwritten)
        self.seen: dict[uuid.UUID, tuple[SessionState, str | None, str]] = {}  # ended ones
        self.sent: list[str] = []
        self.violations: list[str] = []
        self.ended_ids: set[uuid.UUID] = set()  # by events, across restarts
        self._lock = threading.Lock()
        self._labels = itertools.count(1)
        self.node = self._open()

    # -- plumbing -----------------------------------------------------------------------

    def _open(self) -> Node:
        node = Node([self.agent], NodeConfig(grace=GRACE), clock=self.clock, store=self.directory)
        node.subscribe(self._observe)
        return node

    def _observe(self, event: Event) -> None:
        """Observer (Cortex thread): no asserts here, the event bus would swallow them."""
        if event.kind is not EventKind.TRANSITION or event.session_id is None:
            return
        previous, state = event.previous, event.state
        with self._lock:
            if event.session_id in self.ended_ids:
                self.violations.append(f"{event.session_id} moved after it ended: {event}")
            if previous is not None and state is not None:
                if not is_legal_transition(SessionState(previous), SessionState(state)):
                    self.violations.append(f"illegal transition {previous} -> {state}: {event}")
                if SessionState(state).is_terminal:
                    self.ended_ids.add(event.session_id)

    def _settle(self) -> None:
        """Let the tree settle, give every polling skill a tick to read its command,
        and let it settle again."""
        assert self.node.wait_idle(WAIT), f"not idle: {self.node.activity.busy} in flight"
        self.clock.advance(TICK)
        assert self.node.wait_idle(WAIT), f"not idle: {self.node.activity.busy} in flight"
        for parent, answer in self.commands.take_inner():
            if answer.session_id is not None:
                self.known[answer.session_id] = (SessionKind.WORKER, parent)
                self.inner.add(answer.session_id)

    def _note(self, parent: uuid.UUID, kind: SessionKind, spawned: Spawned) -> uuid.UUID | None:
        if spawned.session_id is None:
            assert spawned.error is not None  # a refusal is an answer, never a raise
            return None
        self.known[spawned.session_id] = (kind, parent)
        return spawned.session_id

    # -- rules ----------------------------------------------------------------------------

    @initialize(target=mains)
    def open_main(self) -> uuid.UUID:
        main = self.node.main(AGENT).session_id
        self.known[main] = (SessionKind.MAIN, None)
        self._settle()
        return main

    @rule(
        target=children,
        parent=st.one_of(mains, children),
        kind=st.sampled_from([SessionKind.BRANCH, SessionKind.WORKER]),
        skill=st.sampled_from(["poll", "poll", "poll_async"]),
        wraps=st.booleans(),
        ttl=st.sampled_from(TTLS),
    )
    def spawn(
        self, parent: uuid.UUID, kind: SessionKind, skill: str, wraps: bool, ttl: float | None
    ) -> uuid.UUID:
        """Always one value for the bundle, ``REFUSED`` for a refused spawn: what is
        refused can depend on a race the runtime leaves open (a branch that a
        grace-0 shutdown parked resumes after the restart, one it fenced ends),
        and hypothesis needs the same draws to give the same bundles."""
        if parent == REFUSED:
            return REFUSED
        task = f"{'wrap' if wraps else 'plain'}-{next(self._labels)}"
        spawned = self.node.spawn(parent, kind=kind, skill=skill, task=task, ttl=ttl)
        child = self._note(parent, kind, spawned)
        self._settle()
        return REFUSED if child is None else child

    @rule(
        session=children,
        command=st.sampled_from([COMPLETE, COMPLETE, CRASH, SPAWN]),
    )
    def command(self, session: uuid.UUID, command: str) -> None:
        if session == REFUSED:
            return
        self.commands.give(session, command)
        self._settle()

    @rule(session=children)
    def cancel(self, session: uuid.UUID) -> None:
        if session == REFUSED:
            return
        self.node.cancel(session)  # None, or an answer saying it already ended
        self._settle()

    @rule(session=children)
    def suspend(self, session: uuid.UUID) -> None:
        if session == REFUSED:
            return
        self.node.suspend(session)
        self._settle()

    @rule(session=children)
    def resume(self, session: uuid.UUID) -> None:
        if session == REFUSED:
            return
        self.node.resume(session)
        self._settle()

    @rule(main=mains, hold=st.booleans())
    def send(self, main: uuid.UUID, hold: bool) -> None:
        text = f"{'hold' if hold else 'message'}-{next(self._labels)}"
        assert self.node.send(main, text) is None  # acknowledged: it must run once
        self.sent.append(text)
        self._settle()

    @rule(main=mains)
    def let_main_go_on(self, main: uuid.UUID) -> None:
        self.commands.give(main, COMPLETE)
        self._settle()

    def _main_held(self) -> bool:
        """A cycle of the Main waits (its later messages and results queue behind it)."""
        return any(self.main_log.messages[text] == 0 for text in self.sent)

    @rule(seconds=st.sampled_from(ADVANCES))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)  # TTLs and grace deadlines come due
        self._settle()

    @rule(grace=st.sampled_from([0.0, GRACE]))
    def restart(self, grace: float) -> None:
        """Shut down (with or without grace), check what it left, start a new node."""
        node, closed = self.node, threading.Event()
        live = sorted(
            info.kind.value
            for info in node.sessions()
            if info.kind is not SessionKind.MAIN and not info.state.is_terminal
        )
        event(f"restart(grace={grace}) with live {','.join(sorted(set(live))) or 'none'}")
        stopper = threading.Thread(
            target=lambda: (node.shutdown(grace=grace, timeout=WAIT), closed.set())
        )
        stopper.start()
        if not closed.wait(2.0):  # something wraps up slowly: run out the grace
            self.clock.advance(grace)
        assert closed.wait(2 * WAIT)
        stopper.join(WAIT)
        assert node.failure is None, f"the cortex failed: {node.failure!r}"
        for info in node.final_sessions:
            if info.kind is SessionKind.WORKER:
                assert info.state.is_terminal, f"worker {info.session_id} left {info.state}"
        for thread in self.commands.take_threads():
            thread.join(WAIT)
            assert not thread.is_alive(), f"{thread.name} left behind by the shutdown"
        self.node = self._open()
        self._settle()
        self._forget_unwritten()

    def _forget_unwritten(self) -> None:
        """A worker its branch's skill spawned is never written while that branch
        runs (a running branch does not survive a restart): after a restart it
        is known only if its branch suspended (or a shutdown parked it) with
        it. One gone is forgotten, and its branch must not have come back."""
        for sid in sorted(self.inner):
            try:
                self.node.get(sid)
            except UnknownSessionError:
                parent = self.known.pop(sid)[1]
                self.inner.discard(sid)
                assert parent is not None
                branch = self.node.get(parent)
                assert branch.state.is_terminal, f"{sid} is lost under {branch.state} {parent}"

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def cortex_runs(self) -> None:
        assert self.node.failure is None, f"the cortex failed: {self.node.failure!r}"
        assert isinstance(self.node.stats(), dict)  # it answers

    @invariant()
    def every_transition_was_legal(self) -> None:
        with self._lock:
            assert self.violations == []

    @invariant()
    def every_parent_hears_once_and_nothing_is_lost(self) -> None:
        node = self.node
        heard: dict[uuid.UUID, collections.Counter[uuid.UUID]] = {}
        for sid, (kind, parent) in self.known.items():
            try:
                info = node.get(sid)
            except UnknownSessionError:  # pragma: no cover - the failure it reports
                pytest.fail(f"acknowledged {kind} {sid} is lost")
            if parent is None:
                continue
            if parent not in heard:
                heard[parent] = collections.Counter(r.session_id for r in node.results(parent))
            count = heard[parent][sid]
            if not info.state.is_terminal:
                assert count == 0, f"{sid} ({info.state}) was heard {count} times"
                continue
            assert count == 1, f"ended {sid} ({info.state}) was heard {count} times"
            result = node.result(sid)
            assert result is not None
            code = None if result.error is None else result.error.code.value
            ending = (result.status, code, result.summary)
            assert result.status is info.state
            assert self.seen.setdefault(sid, ending) == ending, f"{sid} changed its result"
            if self.known[parent][0] is SessionKind.MAIN:
                cycles = self.main_log.results[sid]
                assert cycles <= 1, f"the main ran {sid}'s result {cycles} times"
                assert cycles == 1 or self._main_held(), f"the main never ran {sid}'s result"

    @invariant()
    def every_acknowledged_message_ran_once(self) -> None:
        ran = [self.main_log.messages[text] for text in self.sent]
        assert all(count <= 1 for count in ran), f"a message ran twice: {self.main_log.messages}"
        # in order: once one waits, those after it wait too
        waiting = ran.index(0) if 0 in ran else len(ran)
        assert all(count == 0 for count in ran[waiting + 1 :]), f"out of order: {ran}"
        if waiting < len(ran):
            assert self.sent[waiting].startswith("hold"), f"{self.sent[waiting]!r} never ran"

    def teardown(self) -> None:
        try:
            self.node.shutdown(grace=0, timeout=5.0)
            for thread in self.commands.take_threads():
                thread.join(WAIT)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


TreeMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    derandomize=SEED is None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # no "explain" phase: it traces every line of a threaded runtime
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
if SEED is not None:
    TreeMachine.TestCase = seed(int(SEED))(TreeMachine.TestCase)
# A passing run takes seconds; a failing one also shrinks its history, which
# can take minutes: allow for it rather than time out.
TestTreeMachine = pytest.mark.timeout(900)(TreeMachine.TestCase)
