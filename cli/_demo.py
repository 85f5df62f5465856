"""``sessiontree demo``: a fixed research scenario on simulated skills.

A Main fans a research question out to four branches (the agent allows four
live children, so a fifth spawn is refused with ``children_exceeded``):

- *survey the literature* (sync) reads three papers with workers; one of
  them crashes on a corrupt PDF (``failed``/``crashed``) and the branch
  completes with what the other two found.
- *trace the method to its source* (async) goes three branches deep; the
  deepest one is refused a fourth level (``depth_exceeded``) and hands the
  work to a worker at depth 4, which is refused a helper
  (``worker_cannot_spawn``) and does the check itself; the results flow up
  level by level.
- *crawl every archive* (sync) reports progress, then waits on a slow
  archive past its TTL (``expired``/``ttl_expired``, carrying its last
  progress note).
- *draft the report* (sync) starts two workers and completes while both
  still run: one wraps up within the demo grace and returns a partial result
  (``cancelled``/``parent_terminated``), the other ignores the cancellation
  and is terminated by force at the deadline (``cancelled``/
  ``terminated_by_force``).

It runs on the real clock with a short grace, so it is a real run of the
runtime; nothing in it races: the skills wait on gates (with checkpoints and
bounded waits) wherever an order matters, so states, codes and the tree's
shape are the same on every run. Only ids, timings and the wording of
messages that name ids differ.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessiontree.actors import AsyncSession, Cancelled, RealClock, Session
from sessiontree.protocol import (
    ErrorCode,
    Outcome,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.store import Store
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig

__all__ = ["DEMO_GRACE", "DemoError", "DemoReport", "run_demo"]

log = logging.getLogger("sessiontree.cli.demo")

AGENT_ID = "researcher"
MAIN_KEY_PREFIX = "demo:main:research-"  # + a run id: every run gets a Main of its own
QUESTION = "research: how do agent runtimes supervise their sub-agents?"

DEMO_GRACE = 0.5
"""Seconds a cancelled session has to wrap up in the demo (the default is 30)."""
CRAWL_TTL = 1.5
"""The TTL of the branch that overruns it."""
MAX_CHILDREN = 4
"""Live children per session for the demo's agent (the default is 8)."""

_POLL = 0.02  # seconds between checkpoints while a skill waits on a demo gate
_GATE_LIMIT = 10.0  # real seconds a skill waits on a gate before going on regardless
_STUBBORN_LIMIT = 10.0  # the stubborn worker's own bound, should the demo never release it
_SETTLE_TIMEOUT = 15.0  # real seconds the whole scenario may take to settle
_MAIN_CYCLES = 1 + 4  # the question, then one cycle per branch result


class DemoError(RuntimeError):
    """Raised when the scenario does not settle in time (a bug in the runtime or the demo)."""


@dataclass(frozen=True)
class DemoReport:
    """What one run produced: ``sessions`` and ``rejections`` in the ``--json`` shape."""

    sessions: list[dict[str, Any]]
    rejections: list[dict[str, Any]]
    elapsed: float
    stats: dict[str, int] = field(default_factory=dict)
    store: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The document ``sessiontree demo --json`` prints."""
        return {"sessions": self.sessions, "rejections": self.rejections}


# -- the simulated skills ------------------------------------------------------------


class _Gates:
    """Events that order the scenario where its outcome depends on an order."""

    def __init__(self) -> None:
        self.kickoff = threading.Event()  # all four branches are live: the fan-out may start
        self.polisher_started = threading.Event()
        self.stubborn_started = threading.Event()
        self.release = threading.Event()  # lets the stubborn worker's abandoned thread end


def _wait_gate(session: Session, *gates: threading.Event) -> None:
    """Wait for ``gates`` at checkpoints (cancellation still gets through); bounded."""
    for _ in range(int(_GATE_LIMIT / _POLL)):
        if all(g.is_set() for g in gates):
            return
        session.sleep(_POLL)


async def _await_gate(session: AsyncSession, gate: threading.Event) -> None:
    """``_wait_gate`` for async skills: waits on the session's clock, holding no thread."""
    for _ in range(int(_GATE_LIMIT / _POLL)):
        if gate.is_set():
            return
        await session.sleep(_POLL)


class _Scenario:
    """The agent's skills; each method is one skill (sync or async)."""

    def __init__(self, gates: _Gates) -> None:
        self.gates = gates

    def agent(self) -> Agent:
        return Agent(
            AGENT_ID,
            {
                "lead": self.lead,
                "survey": self.survey,
                "read": self.read,
                "trace": self.trace,
                "verify": self.verify,
                "crawl": self.crawl,
                "draft": self.draft,
                "polish": self.polish,
                "fetch": self.fetch,
            },
            main_skill="lead",
            max_children=MAX_CHILDREN,
        )

    # The Main: one cycle for the question, then one per branch result.
    def lead(self, session: Session) -> None:
        message = session.message
        if isinstance(message, SessionResult):
            session.progress(f"heard back from a branch: {message.status.value}")
            return
        plan = [
            ("survey the literature", "survey", None),
            ("trace the method to its source", "trace", None),
            ("crawl every archive", "crawl", CRAWL_TTL),
            ("draft the report", "draft", None),
        ]
        for task, skill, ttl in plan:
            session.spawn(
                kind="branch", task=task, skill=skill, ttl=ttl, context_summary=str(message)
            )
        extra = session.spawn(kind="branch", task="search the patent office", skill="survey")
        if extra.error is not None:
            session.progress(f"fifth branch refused: {extra.error.code.value}")
        self.gates.kickoff.set()

    # Branch 1: three readers, one of which crashes.
    def survey(self, session: Session) -> Outcome:
        _wait_gate(session, self.gates.kickoff)
        for paper in ("paper A", "paper B", "paper C (corrupt PDF)"):
            session.spawn(kind="worker", task=f"read {paper}", skill="read")
        collected = session.collect(timeout=_GATE_LIMIT)
        notes = sorted(c.result.summary for c in collected if c.result and c.result.ok)
        failed = [c for c in collected if c.result is None or not c.result.ok]
        return Outcome(
            summary=f"read {len(notes)} of {len(collected)} papers; {len(failed)} failed",
            artifacts={"notes": notes},
        )

    def read(self, session: Session) -> str:
        session.sleep(0.1)  # a model call
        if "corrupt" in session.task:
            msg = "corrupt PDF: unexpected end of stream"
            raise ValueError(msg)
        return f"notes on {session.task.removeprefix('read ')}"

    # Branch 2 (async): three branch levels, then a worker at depth 4.
    async def trace(self, session: AsyncSession) -> str:
        if session.depth == 1:
            await _await_gate(session, self.gates.kickoff)
        await session.sleep(0.1)  # a model call
        deeper = await session.spawn(
            kind="branch", task=f"trace level {session.depth + 1}", skill="trace"
        )
        if deeper.session_id is None:  # the deepest branch: depth_exceeded
            worker = await session.spawn(kind="worker", task="verify the citation", skill="verify")
            assert worker.session_id is not None
            child = worker.session_id
        else:
            child = deeper.session_id
        result = await session.wait(child, timeout=_GATE_LIMIT)
        found = result.summary if result is not None else "nothing (timed out)"
        return f"level {session.depth}: {found}"

    async def verify(self, session: AsyncSession) -> str:
        helper = await session.spawn(kind="worker", task="ask a helper", skill="verify")
        assert helper.error is not None  # workers never spawn: worker_cannot_spawn
        await session.sleep(0.1)  # did it itself
        return "citation verified"

    # Branch 3: overruns its TTL.
    def crawl(self, session: Session) -> str:
        _wait_gate(session, self.gates.kickoff)
        for archive in (1, 2, 3):
            session.sleep(0.05)
            session.progress(f"indexed {archive} of 40 archives", archives=archive)
        session.sleep(3600.0)  # a slow archive: the TTL ends this first
        return "indexed every archive"

    # Branch 4: completes while two workers still run.
    def draft(self, session: Session) -> str:
        _wait_gate(session, self.gates.kickoff)
        session.spawn(kind="worker", task="polish the wording", skill="polish")
        session.spawn(kind="worker", task="fetch a slow source", skill="fetch")
        _wait_gate(session, self.gates.polisher_started, self.gates.stubborn_started)
        return "draft written; not waiting for the polish or the slow source"

    def polish(self, session: Session) -> str:
        self.gates.polisher_started.set()
        try:
            session.sleep(3600.0)
        except Cancelled:
            return "partial: polished 2 of 5 sections"  # wraps up within the grace
        return "polished all 5 sections"

    def fetch(self, session: Session) -> str:
        self.gates.stubborn_started.set()
        # Ignores cancellation: blocks outside any checkpoint until the demo lets go.
        self.gates.release.wait(_STUBBORN_LIMIT)
        return "fetched the slow source (too late)"


# -- watching the node ---------------------------------------------------------------


class _Watch:
    """Follows the event stream (on the Cortex thread, so it only records and notifies)."""

    def __init__(self, main_cycles: int) -> None:
        self.cond = threading.Condition()
        self.states: dict[uuid.UUID, str] = {}
        self.kinds: dict[uuid.UUID, str] = {}
        self.rejections: list[Event] = []
        self.main_cycles = 0
        self.wanted_cycles = main_cycles
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def __call__(self, event: Event) -> None:
        self.events.put(event)
        with self.cond:
            sid = event.session_id
            match event.kind:
                case EventKind.SPAWNED if sid is not None:
                    self.kinds[sid] = str(event.data.get("kind", ""))
                    self.states[sid] = event.state or ""
                case EventKind.TRANSITION if sid is not None:
                    self.states[sid] = event.state or ""
                case EventKind.REJECTED:
                    self.rejections.append(event)
                case EventKind.CYCLE_ENDED if sid is not None and self._is_main(sid):
                    self.main_cycles += 1
                case _:
                    pass
            self.cond.notify_all()

    def _is_main(self, session_id: uuid.UUID) -> bool:
        return self.kinds.get(session_id) == SessionKind.MAIN.value

    def settled(self) -> bool:
        """The Main heard back from every branch and every other session has ended."""
        with self.cond:
            return self.main_cycles >= self.wanted_cycles and all(
                SessionState(state).is_terminal
                for sid, state in self.states.items()
                if not self._is_main(sid)
            )

    def wait(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(self.settled, timeout)


# -- running it --------------------------------------------------------------------


@contextmanager
def _store_dir(store: Path | None) -> Iterator[Path]:
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
        yield store
        return
    with tempfile.TemporaryDirectory(prefix="sessiontree-demo-") as tmp:
        yield Path(tmp)


def run_demo(
    *,
    store: Path | None = None,
    on_event: Callable[[Node, Event, float], None] | None = None,
) -> DemoReport:
    """Run the scenario once on a fresh node and return what it produced.

    ``on_event(node, event, elapsed)`` is called for every event, in order, on
    the calling thread (never on the Cortex's), so it may ask the node
    questions. The node runs on an LMDB store in ``store`` (a temporary
    directory when None); each run adds a Main of its own to it, and the
    report's ``store`` says what the store holds afterwards (read back
    through a read-only open). Raises ``DemoError`` if the scenario does not
    settle within 15 s, ``StoreLockedError`` if another node holds ``store``.
    """
    clock = RealClock()  # the node's, and the demo's stopwatch
    started = clock.monotonic()
    gates = _Gates()
    scenario = _Scenario(gates)
    watch = _Watch(_MAIN_CYCLES)
    with _store_dir(store) as where:
        log.info("demo store directory: %s", where)
        node = Node([scenario.agent()], NodeConfig(grace=DEMO_GRACE), clock=clock, store=where)
        try:
            node.subscribe(watch)
            main = node.main(AGENT_ID, MAIN_KEY_PREFIX + uuid.uuid4().hex[:8])
            error = main.send(QUESTION)
            if error is not None:
                raise DemoError(f"the main session refused the question: {error.message}")
            deadline = started + _SETTLE_TIMEOUT
            while not watch.settled():
                if clock.monotonic() > deadline:
                    raise DemoError(f"the scenario did not settle in {_SETTLE_TIMEOUT:.0f} s")
                _drain(watch, node, on_event, lambda: clock.monotonic() - started, block=0.05)
            gates.release.set()  # the stubborn worker was terminated; let its thread end
            if not node.wait_idle(5.0):
                log.warning("the node was not idle 5 s after the scenario settled")
            _drain(watch, node, on_event, lambda: clock.monotonic() - started, block=None)
            sessions = _rows(node.tree(main))
            stats = node.stats()
        finally:
            gates.release.set()
            node.shutdown(grace=DEMO_GRACE, timeout=5.0)
            clock.close()
        _drain(watch, node, on_event, lambda: clock.monotonic() - started, block=None)
        with Store(where, readonly=True) as stored:
            figures = {
                "path": str(where),
                "sessions": stored.count("sessions"),
                "results_filed": stored.count("received"),
                "results_owed": stored.count("outbox"),
                "recovered": dict(node.recovery),
            }
    rejections = [_rejection(event) for event in watch.rejections]
    return DemoReport(sessions, rejections, clock.monotonic() - started, stats, figures)


def _drain(
    watch: _Watch,
    node: Node,
    on_event: Callable[[Node, Event, float], None] | None,
    elapsed: Callable[[], float],
    block: float | None,
) -> None:
    """Hand queued events to ``on_event``; wait up to ``block`` seconds for the first."""
    while True:
        try:
            event = watch.events.get(timeout=block) if block else watch.events.get_nowait()
        except queue.Empty:
            return
        block = None
        if on_event is not None:
            on_event(node, event, elapsed())


def _rows(tree: dict[str, Any]) -> list[dict[str, Any]]:
    """The tree, depth first in spawn order, as ``--json`` session rows."""
    info = tree["info"]
    result: SessionResult | None = tree["result"]
    row: dict[str, Any] = {
        "session_id": str(info.session_id),
        "parent_id": str(info.parent_id) if info.parent_id is not None else None,
        "agent_id": info.agent_id,
        "kind": info.kind.value,
        "state": info.state.value,
        "depth": info.depth,
        "task": info.task,
        "result": None,
    }
    if result is not None:
        error = result.error
        row["result"] = {
            "status": result.status.value,
            "summary": result.summary,
            "error": None if error is None else {"code": error.code, "message": error.message},
        }
    rows = [row]
    for child in tree["children"]:
        rows.extend(_rows(child))
    return rows


def _rejection(event: Event) -> dict[str, Any]:
    return {
        "parent_id": str(event.parent_id) if event.parent_id is not None else None,
        "kind": str(event.data.get("kind", "")),
        "error": {
            "code": event.code or ErrorCode.REJECTED_INPUT.value,
            "message": str(event.data.get("message", "")),
        },
    }
