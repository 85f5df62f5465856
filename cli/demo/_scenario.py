"""``sessiontree demo``: a fixed research scenario on simulated skills and a model.

A Main fans a research question out to five branches (the agent allows five
live children, so a sixth spawn is refused with ``children_exceeded``):

- *survey the literature* (sync) reads three papers with workers, each of
  which asks the model for notes; one of them then crashes on a corrupt PDF
  (``failed``/``crashed``; its call still counts) and the branch asks the
  model to combine what the other two found. Its subtree's usage is its own
  call plus its three workers', each counted once.
- *trace the method to its source* (async) goes three branches deep; the
  deepest one is refused a fourth level (``depth_exceeded``) and hands the
  work to a worker at depth 4, which is refused a helper
  (``worker_cannot_spawn``) and checks the citation with the model itself;
  the results (and the usage) flow up level by level.
- *crawl every archive* (sync) reports progress, then waits on a slow
  archive past its TTL (``expired``/``ttl_expired``, carrying its last
  progress note).
- *draft the report* (sync) starts two workers and completes while both
  still run: one wraps up within the demo grace and returns a partial result
  (``cancelled``/``parent_terminated``), the other ignores the cancellation
  and is terminated by force at the deadline (``cancelled``/
  ``terminated_by_force``).
- *summarise every source* (sync) runs under a budget of 3 model calls and
  fans out to five workers that each make one: three calls are sent, the
  other two are refused before they are sent (``budget_exhausted``), and the
  whole subtree is cancelled with the grace: every session in it ends
  ``cancelled``/``budget_exhausted``, and the replies that arrived are kept
  as partial results.

Model calls go to a local chat-completions stand-in the demo starts on
127.0.0.1 (deterministic replies, tokens counted as words), or with
``model_url`` to a real endpoint (``_models``). It runs on the real
clock with a short grace, so it is a real run of the runtime; nothing in it
races: the skills wait on gates (with checkpoints and bounded waits)
wherever an order matters, so states, codes, the tree's shape and (on the
stand-in) every usage figure are the same on every run. Only ids, timings
and the wording of messages that name ids differ.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from sessiontree.actors import AsyncSession, Cancelled, RealClock, Session
from sessiontree.cli.demo._models import Endpoint, model_endpoint, model_figures, usage_json
from sessiontree.protocol import (
    Budget,
    Completion,
    ErrorCode,
    Outcome,
    SessionKind,
    SessionResult,
    SessionState,
    Usage,
)
from sessiontree.store import Store
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, Tracing

__all__ = ["DEMO_GRACE", "REAL_MODEL_GRACE", "DemoError", "DemoReport", "run_demo"]

log = logging.getLogger("sessiontree.cli.demo")

AGENT_ID = "researcher"
MAIN_KEY_PREFIX = "demo:main:research-"  # + a run id: every run gets a Main of its own
QUESTION = "research: how do agent runtimes supervise their sub-agents?"

DEMO_GRACE = 0.5
"""Seconds a cancelled session has to wrap up in the demo (the default is 30)."""
REAL_MODEL_GRACE = 5.0
"""The grace on a real endpoint: replies in flight when the budget runs out land within it."""
CRAWL_TTL = 1.5
"""The TTL of the branch that overruns it."""
MAX_CHILDREN = 5
"""Live children per session for the demo's agent (the default is 8)."""
SURVEY_TASK = "survey the literature"
BUDGET_TASK = "summarise every source"
BUDGET = Budget(calls=3)
"""The budget of the fan-out that runs out: fewer calls than it has workers."""
SOURCES = 5
MAX_TOKENS = 64
"""The completion tokens each of the demo's calls asks for at most."""

_POLL = 0.02  # seconds between checkpoints while a skill waits on a demo gate
_MAIN_CYCLES = 1 + 5  # the question, then one cycle per branch result


@dataclass(frozen=True)
class _Timing:
    """Real-time bounds of one run: a real endpoint gets more of everything."""

    grace: float = DEMO_GRACE
    gate_limit: float = 10.0  # seconds a skill waits on a gate before going on regardless
    stubborn_limit: float = 10.0  # the stubborn worker's own bound, should the demo never release
    settle: float = 15.0  # seconds the whole scenario may take to settle


_STANDIN_TIMING = _Timing()
_REAL_TIMING = _Timing(grace=REAL_MODEL_GRACE, gate_limit=120.0, stubborn_limit=120.0, settle=300.0)


class DemoError(RuntimeError):
    """Raised when the scenario does not settle in time (a bug in the runtime or the demo)."""


@dataclass(frozen=True)
class DemoReport:
    """What one run produced: ``sessions``, ``rejections`` and ``models`` in the
    ``--json`` shape."""

    sessions: list[dict[str, Any]]
    rejections: list[dict[str, Any]]
    elapsed: float
    stats: dict[str, int] = field(default_factory=dict)
    store: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The document ``sessiontree demo --json`` prints."""
        return {"sessions": self.sessions, "rejections": self.rejections, "models": self.models}


# -- the simulated skills ------------------------------------------------------------


class _Gates:
    """Events that order the scenario where its outcome depends on an order."""

    def __init__(self) -> None:
        self.kickoff = threading.Event()  # all five branches are live: the fan-out may start
        self.polisher_started = threading.Event()
        self.stubborn_started = threading.Event()
        self.release = threading.Event()  # lets the stubborn worker's abandoned thread end
        self.fanned_out = threading.Event()  # every summariser is live: the calls may go
        self.budget_spent = threading.Event()  # the budget ran out (set by the watch)


def _wait_gate(session: Session, limit: float, *gates: threading.Event) -> None:
    """Wait for ``gates`` at checkpoints (cancellation still gets through); bounded."""
    for _ in range(int(limit / _POLL)):
        if all(g.is_set() for g in gates):
            return
        session.sleep(_POLL)


async def _await_gate(session: AsyncSession, limit: float, gate: threading.Event) -> None:
    """``_wait_gate`` for async skills: waits on the session's clock, holding no thread."""
    for _ in range(int(limit / _POLL)):
        if gate.is_set():
            return
        await session.sleep(_POLL)


def _line(reply: Completion) -> str:
    """A reply's first line, short enough for the tree (or why there is none)."""
    if reply.error is not None:
        return f"no reply [{reply.error.code}]"
    text = (reply.text or "").strip().splitlines()
    first = text[0] if text else ""
    return first if len(first) <= 70 else first[:67] + "..."


class _Scenario:
    """The agent's skills; each method is one skill (sync or async)."""

    def __init__(self, gates: _Gates, timing: _Timing, models: Mapping[str, str]) -> None:
        self.gates = gates
        self.timing = timing
        self.models = dict(models)

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
                "summarise": self.summarise,
                "digest": self.digest,
            },
            main_skill="lead",
            max_children=MAX_CHILDREN,
            models=self.models,  # workers call the small tier's model, the rest the large one's
        )

    # The Main: one cycle for the question, then one per branch result.
    def lead(self, session: Session) -> None:
        message = session.message
        if isinstance(message, SessionResult):
            session.progress(f"heard back from a branch: {message.status.value}")
            return
        plan: list[tuple[str, str, float | None, Budget | None]] = [
            (SURVEY_TASK, "survey", None, None),
            ("trace the method to its source", "trace", None, None),
            ("crawl every archive", "crawl", CRAWL_TTL, None),
            ("draft the report", "draft", None, None),
            (BUDGET_TASK, "summarise", None, BUDGET),
        ]
        for task, skill, ttl, budget in plan:
            session.spawn(
                kind="branch",
                task=task,
                skill=skill,
                ttl=ttl,
                budget=budget,
                context_summary=str(message),
            )
        extra = session.spawn(kind="branch", task="search the patent office", skill="survey")
        if extra.error is not None:
            session.progress(f"sixth branch refused: {extra.error.code.value}")
        self.gates.kickoff.set()

    # Branch 1: three readers call the model, one of which crashes; usage rolls up.
    def survey(self, session: Session) -> Outcome:
        _wait_gate(session, self.timing.gate_limit, self.gates.kickoff)
        for paper in ("paper A", "paper B", "paper C (corrupt PDF)"):
            session.spawn(kind="worker", task=f"read {paper}", skill="read")
        collected = session.collect(timeout=self.timing.gate_limit)
        notes = sorted(c.result.summary for c in collected if c.result and c.result.ok)
        failed = [c for c in collected if c.result is None or not c.result.ok]
        combined = session.complete("combine the notes: " + "; ".join(notes), max_tokens=MAX_TOKENS)
        return Outcome(
            summary=f"read {len(notes)} of {len(collected)} papers; {len(failed)} failed",
            artifacts={"notes": notes, "combined": _line(combined)},
        )

    def read(self, session: Session) -> str:
        paper = session.task.removeprefix("read ")
        reply = session.complete(f"notes on {paper}", max_tokens=MAX_TOKENS)
        session.progress(f"the model replied: {_count(reply.usage.tokens, 'token')}")
        if "corrupt" in session.task:  # its call was made, and counts, though it crashes
            msg = "corrupt PDF: unexpected end of stream"
            raise ValueError(msg)
        return _line(reply)

    # Branch 2 (async): three branch levels, then a worker at depth 4.
    async def trace(self, session: AsyncSession) -> str:
        if session.depth == 1:
            await _await_gate(session, self.timing.gate_limit, self.gates.kickoff)
        await session.sleep(0.1)  # reads its sources
        deeper = await session.spawn(
            kind="branch", task=f"trace level {session.depth + 1}", skill="trace"
        )
        if deeper.session_id is None:  # the deepest branch: depth_exceeded
            worker = await session.spawn(kind="worker", task="verify the citation", skill="verify")
            assert worker.session_id is not None
            child = worker.session_id
        else:
            child = deeper.session_id
        result = await session.wait(child, timeout=self.timing.gate_limit)
        found = result.summary if result is not None else "nothing (timed out)"
        return f"level {session.depth}: {found}"

    async def verify(self, session: AsyncSession) -> Outcome:
        helper = await session.spawn(kind="worker", task="ask a helper", skill="verify")
        assert helper.error is not None  # workers never spawn: worker_cannot_spawn
        reply = await session.complete("check the citation", max_tokens=MAX_TOKENS)  # itself
        return Outcome(summary="citation verified", artifacts={"model": _line(reply)})

    # Branch 3: overruns its TTL.
    def crawl(self, session: Session) -> str:
        _wait_gate(session, self.timing.gate_limit, self.gates.kickoff)
        for archive in (1, 2, 3):
            session.sleep(0.05)
            session.progress(f"indexed {archive} of 40 archives", archives=archive)
        session.sleep(3600.0)  # a slow archive: the TTL ends this first
        return "indexed every archive"

    # Branch 4: completes while two workers still run.
    def draft(self, session: Session) -> str:
        _wait_gate(session, self.timing.gate_limit, self.gates.kickoff)
        session.spawn(kind="worker", task="polish the wording", skill="polish")
        session.spawn(kind="worker", task="fetch a slow source", skill="fetch")
        _wait_gate(
            session,
            self.timing.gate_limit,
            self.gates.polisher_started,
            self.gates.stubborn_started,
        )
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
        self.gates.release.wait(self.timing.stubborn_limit)
        return "fetched the slow source (too late)"

    # Branch 5: a fan-out under a budget that fits fewer calls than it has workers.
    def summarise(self, session: Session) -> Outcome:
        _wait_gate(session, self.timing.gate_limit, self.gates.kickoff)
        for source in range(1, SOURCES + 1):
            session.spawn(kind="worker", task=f"summarise source {source}", skill="digest")
        self.gates.fanned_out.set()
        try:
            collected = session.collect(timeout=self.timing.gate_limit)
        except Cancelled:  # the budget ran out: wrap up within the grace with what arrives
            collected = session.collect(timeout=self.timing.grace * 0.8)
        results = [c.result for c in collected if c.result is not None]
        kept = sorted(r.summary for r in results if r.artifacts.get("sent"))
        refused = len(collected) - len(kept)
        return Outcome(
            summary=f"partial: {len(kept)} of {len(collected)} sources summarised, "
            f"{_count(refused, 'call')} refused by the budget",
            artifacts={"summaries": kept},
        )

    def digest(self, session: Session) -> Outcome:
        """One call; the reply is held until the budget's fate is decided (a
        demo gate), so every summariser is still live when the budget runs out."""
        reply: Completion | None = None
        try:
            _wait_gate(session, self.timing.gate_limit, self.gates.fanned_out)
            reply = session.complete(session.task, max_tokens=MAX_TOKENS)
            if reply.error is None:
                _wait_gate(session, self.timing.gate_limit, self.gates.budget_spent)
        except Cancelled:
            pass  # the budget ran out: wrap up (within the grace) with what there is
        refused = reply is None or (
            reply.error is not None and reply.error.code is ErrorCode.BUDGET_EXHAUSTED
        )
        if refused:
            return Outcome(summary="not sent: the budget ran out first", artifacts={"sent": False})
        assert reply is not None
        return Outcome(summary=_line(reply), artifacts={"sent": True})


# -- watching the node ---------------------------------------------------------------


class _Watch:
    """Follows the event stream (on the Cortex thread, so it only records and notifies)."""

    def __init__(self, main_cycles: int, gates: _Gates) -> None:
        self.cond = threading.Condition()
        self.states: dict[uuid.UUID, str] = {}
        self.kinds: dict[uuid.UUID, str] = {}
        self.rejections: list[Event] = []
        self.budget_events = dict.fromkeys(
            (EventKind.BUDGET_WARNING.value, EventKind.BUDGET_EXHAUSTED.value), 0
        )
        self.main_cycles = 0
        self.wanted_cycles = main_cycles
        self.gates = gates
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
                case EventKind.BUDGET_WARNING:
                    self.budget_events[event.kind.value] += 1
                case EventKind.BUDGET_EXHAUSTED:
                    self.budget_events[event.kind.value] += 1
                    self.gates.budget_spent.set()
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


def _count(n: int, noun: str) -> str:
    """``1 call``, ``2 calls``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def run_demo(
    *,
    store: Path | None = None,
    on_event: Callable[[Node, Event, float], None] | None = None,
    model_url: str | None = None,
    model: str | None = None,
    api_key_file: Path | None = None,
    otlp_endpoint: str | None = None,
) -> DemoReport:
    """Run the scenario once on a fresh node and return what it produced.

    ``on_event(node, event, elapsed)`` is called for every event, in order, on
    the calling thread (never on the Cortex's), so it may ask the node
    questions. The node runs on an LMDB store in ``store`` (a temporary
    directory when None); each run adds a Main of its own to it, and the
    report's ``store`` says what the store holds afterwards (read back
    through a read-only open). Model calls go to a stand-in started here,
    or with ``model_url`` to that OpenAI-compatible endpoint, every tier
    calling ``model`` (its key in ``api_key_file``), with a grace of
    ``REAL_MODEL_GRACE``. With ``otlp_endpoint`` the node is traced to it
    (``Tracing``; the otlp extra). Raises ``DemoError`` if the scenario does not
    settle in time (15 s on the stand-in), ``StoreLockedError`` if another
    node holds ``store``, ``ValueError`` for a bad endpoint or key file.
    """
    timing = _STANDIN_TIMING if model_url is None else _REAL_TIMING
    with model_endpoint(model_url, model, api_key_file) as endpoint:
        return _run(endpoint, timing, store, on_event, otlp_endpoint)


def _run(
    endpoint: Endpoint,
    timing: _Timing,
    store: Path | None,
    on_event: Callable[[Node, Event, float], None] | None,
    otlp_endpoint: str | None,
) -> DemoReport:
    clock = RealClock()  # the node's, and the demo's stopwatch
    started = clock.monotonic()
    gates = _Gates()
    scenario = _Scenario(gates, timing, endpoint.models)
    watch = _Watch(_MAIN_CYCLES, gates)
    tracing = None
    if otlp_endpoint is not None:
        tracing = Tracing(endpoint=otlp_endpoint, service_name="sessiontree-demo")
    config = NodeConfig(grace=timing.grace, providers=(endpoint.provider,), tracing=tracing)
    with _store_dir(store) as where:
        log.info("demo store directory: %s", where)
        node = Node([scenario.agent()], config, clock=clock, store=where)
        try:
            node.subscribe(watch)
            main = node.main(AGENT_ID, MAIN_KEY_PREFIX + uuid.uuid4().hex[:8])
            error = main.send(QUESTION)
            if error is not None:
                raise DemoError(f"the main session refused the question: {error.message}")
            deadline = started + timing.settle
            while not watch.settled():
                if clock.monotonic() > deadline:
                    raise DemoError(f"the scenario did not settle in {timing.settle:.0f} s")
                _drain(watch, node, on_event, lambda: clock.monotonic() - started, block=0.05)
            gates.release.set()  # the stubborn worker was terminated; let its thread end
            if not node.wait_idle(5.0):
                log.warning("the node was not idle 5 s after the scenario settled")
            _drain(watch, node, on_event, lambda: clock.monotonic() - started, block=None)
            sessions = _rows(node.tree(main))
            stats = node.stats()
        finally:
            gates.release.set()
            node.shutdown(grace=timing.grace, timeout=5.0)
            clock.close()
        _drain(watch, node, on_event, lambda: clock.monotonic() - started, block=None)
        with Store(where, readonly=True) as stored:
            figures = {
                "path": str(where),
                "sessions": stored.count("sessions"),
                "results_filed": stored.count("received"),
                "results_owed": stored.count("outbox"),
                "recovered": dict(node.recovery.figures),
            }
            spent = stored.usage(main.session_id)
    models = model_figures(
        sessions,
        endpoint=endpoint,
        stored=spent.subtree if spent is not None else Usage(),
        roll_up_task=SURVEY_TASK,
        budget_task=BUDGET_TASK,
        budget=_bounds(BUDGET),
        events=watch.budget_events,
    )
    rejections = [_rejection(event) for event in watch.rejections]
    elapsed = clock.monotonic() - started
    return DemoReport(sessions, rejections, elapsed, stats, figures, models)


def _bounds(budget: Budget) -> dict[str, Any]:
    """The dimensions ``budget`` bounds, by name (``calls: 3``)."""
    fields = msgspec.structs.asdict(budget)
    return {k: v for k, v in fields.items() if k != "soft" and v is not None}


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
        "usage": None,
        "subtree_usage": None,
    }
    if result is not None:
        error = result.error
        row["result"] = {
            "status": result.status.value,
            "summary": result.summary,
            "error": None if error is None else {"code": error.code, "message": error.message},
        }
        row["usage"] = usage_json(result.usage or Usage())  # None: it spent nothing
        row["subtree_usage"] = usage_json(result.subtree_usage or Usage())
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
