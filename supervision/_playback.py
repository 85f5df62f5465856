"""The tapes a replay plays (``_replay`` runs it): a ``PlayTape`` a session,
handing its skill what its recorded namesake met, in order, and holding its
children's run ends and results to their recorded turns; the ``Player``,
in place of a node's ``Recorder``, reports the first divergence and, once
the replay ran through, compares it with the recording (``ReplayReport``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from sessiontree.actors import VirtualClock
from sessiontree.protocol import (
    Divergence,
    ErrorCode,
    ErrorInfo,
    Recording,
    ReplayReport,
    SessionResult,
    SpawnSpec,
    TapeCancel,
    TapeClock,
    TapedSession,
    TapeEntry,
    TapeInterrupt,
    TapeModel,
    TapeSeed,
    TapeSpawn,
    TapeTake,
)
from sessiontree.supervision._call_hold import HOLD
from sessiontree.supervision._models import Reply
from sessiontree.supervision._recording import (
    Recorder,
    Reel,
    SessionTape,
    reply_of,
    request_digest,
    said_of,
)
from sessiontree.supervision._requests import Call, Cancel, Interrupt

if TYPE_CHECKING:
    from sessiontree.actors.runtime import SessionCore

__all__ = ["PlayTape", "Player", "describe"]

_FENCES = frozenset({ErrorCode.TTL_EXPIRED, ErrorCode.TERMINATED_BY_FORCE})


def describe(entry: TapeEntry) -> str:
    """One tape entry in words, for a report."""
    match entry:
        case TapeClock(which=which, value=value):
            return f"a {which} clock reading ({value!r})"
        case TapeSeed():
            return "a random seed drawn"
        case TapeModel(model=model, said=said, cut=cut):
            return f"a call to {model}: {said!r}" + (" (closed before its reply)" if cut else "")
        case TapeSpawn(skills=skills, tasks=tasks, children=children, refused=refused):
            parts = [
                f"{skill or 'default'}({task!r}) -> {child if code is None else code}"
                for skill, task, child, code in zip(skills, tasks, children, refused, strict=True)
            ]
            return "a spawn of " + ", ".join(parts)
        case TapeTake(children=children):
            return f"taking the results of children {children}" if children else "a take: none"
        case TapeCancel(child=child):
            return f"cancelling child {child}"
        case TapeInterrupt(code=code, call=call):
            return f"Cancelled({code}) raised into the skill at its call {call}"
    return repr(entry)  # pragma: no cover - the union is closed


class PlayTape(SessionTape):
    """A replayed session's tape: what its recorded namesake met, handed out
    in order (see the module's docstring)."""

    replaying = True
    __slots__ = (
        "arrived",
        "came",
        "core",
        "deferred",
        "ending",
        "group",
        "groups",
        "held",
        "lock",
        "offset",
        "pos",
        "rank",
        "recorded",
        "released",
        "steps",
    )

    def __init__(
        self,
        tapes: Player,
        reel: Reel,
        taped: TapedSession,
        number: int,
        core: SessionCore,
        recorded: TapedSession | None,
    ) -> None:
        super().__init__(tapes, reel, taped, number)
        self.core = core
        self.recorded = recorded
        self.steps: list[TapeEntry] = [] if recorded is None else recorded.tape
        self.pos = 0
        self.deferred: ErrorCode | None = None
        self.groups = [e.children for e in self.steps if isinstance(e, TapeTake)]
        self.group = 0
        self.released = False
        self.held: dict[int, SessionResult] = {}
        arrivals = [] if recorded is None else recorded.arrivals
        self.rank = {n: i for i, n in enumerate(arrivals)}  # a child's place among arrivals
        self.came: set[int] = set()  # children whose results arrived
        self.arrived = 0  # how many of the recorded arrivals have come, in order
        self.ending: dict[int, Callable[[], None]] = {}  # children's run ends held back
        self.lock = threading.Lock()
        self.offset = 0.0  # the replay's clock less the recorded one, at the last reading

    @property
    def player(self) -> Player:
        assert isinstance(self.tapes, Player)
        return self.tapes

    def _next(self, kind: type[Any], happened: str) -> Any:
        """The next entry if it is a ``kind``; else the divergence (None). Past
        a fence (the session ended under its skill) nothing was taped: None."""
        player = self.player
        with self.lock:
            if player.divergence is not None or self.fence_taped:
                return None
            step = self.pos
            entry = self.steps[step] if step < len(self.steps) else None
            if entry is not None and isinstance(entry, kind):
                self.pos = step + 1
                return entry
            if _is_fence(entry) and kind is not TapeInterrupt:
                return None  # the node ended it between its calls: it meets that next
        was = "the end of its run" if entry is None else describe(entry)
        player.diverge(self, str(step), was, happened)
        return None

    def _expect(self, made: TapeEntry) -> bool:
        """Whether the next entry is ``made``, what the skill just did (else
        the divergence)."""
        entry = self._next(type(made), describe(made))
        if entry is not None and entry != made:
            self._unlike(entry, describe(made))
        return bool(entry == made)

    def _unlike(self, entry: TapeEntry, happened: str) -> None:
        """The entry just taken is not what happened: the divergence."""
        self.player.diverge(self, str(self.pos - 1), describe(entry), happened)

    def _due_interrupt(self) -> ErrorCode | None:
        """The code of a cancellation recorded at the skill's present call."""
        entry = self.steps[self.pos] if self.pos < len(self.steps) else None
        if isinstance(entry, TapeInterrupt) and entry.call == self.calls:
            return ErrorCode(entry.code)
        return None

    def _apply_interrupt(self) -> bool:
        """A cancellation recorded at this call reaches the skill now: the one
        the node asked for meanwhile or, when none came, the recorded one
        made now (a parent's end is never made: it comes as the parent ends).
        False when none is due here."""
        code = self._due_interrupt()
        core = self.core
        if code is None:
            return False
        if core.fence_code is not None or self.player.divergence is not None:
            return True
        if code in _FENCES:
            core.fence(code)
        else:
            with core.cond:
                if core.cancel_code is not None:
                    return True  # already through
                deferred = self.deferred
                if deferred is None and code is ErrorCode.PARENT_TERMINATED:
                    return True  # on its way: it goes through when the parent ends
                core.cancel_code = code if deferred is None else deferred
                core.wake()
            if deferred is not None:
                return True
        self.player.tell(Call(Interrupt(core.session_id, code)))
        return True

    # -- what the handle asks ------------------------------------------------------------

    def read(self, which: str, value: Callable[[], float]) -> float:
        entry = self._next(TapeClock, f"a {which} clock reading")
        if entry is None:
            return value()
        if entry.which != which:
            self._unlike(entry, f"a {which} clock reading")
            return value()
        if which == "monotonic":
            self.offset = self.player.clock.monotonic() - entry.value
        return float(entry.value)

    def at(self, when: float) -> float:
        return when + self.offset

    def seed(self) -> int:
        entry = self._next(TapeSeed, "a random seed drawn")
        return 0 if entry is None else int(entry.seed)

    def checkpoint(self, again: bool) -> None:
        if not again:
            self.calls += 1
        self._apply_interrupt()

    def defer_cancel(self, code: ErrorCode) -> bool:
        """Keep ``code`` back, unless the skill is at the call where the
        recording met a cancellation (or the replay diverged): then it goes
        through and wakes the skill, as it did."""
        core = self.core
        with core.cond:
            if core.cancel_code is not None:
                return False  # through already: the first reason stays
            if self._due_interrupt() is not None or self.player.divergence is not None:
                return False
            if self.deferred is None:
                self.deferred = code
            return True

    def interrupted(self, code: ErrorCode, *, fenced: bool) -> None:
        happened = describe(TapeInterrupt(code.value, self.calls))
        entry = self._next(TapeInterrupt, happened)  # nothing once fenced: taped once
        if entry is not None and (entry.code, entry.call) != (code.value, self.calls):
            self._unlike(entry, happened)
        self.fence_taped = self.fence_taped or fenced

    def fenced(self, code: ErrorCode, inside: bool) -> None:
        return None  # the skill meets it: ``interrupted`` takes it off the tape

    def spawned(
        self,
        specs: Sequence[SpawnSpec],
        children: Sequence[uuid.UUID | None],
        refused: Sequence[ErrorInfo | None],
    ) -> None:
        self._expect(self.player.spawn_entry(specs, children, refused))

    def cancelled_child(self, child: uuid.UUID) -> None:
        self._expect(TapeCancel(self.player.numbers([child])[0]))

    def took(self, children: Sequence[uuid.UUID]) -> None:
        if not self._expect(TapeTake(self.player.numbers(children))):
            return
        with self.lock:
            self.group += 1
            self.released = False
        self._release()

    def holds(self, result: SessionResult) -> bool:
        (number,) = self.player.numbers([result.session_id])
        with self.lock:
            self.held[number] = result
            self.came.add(number)
            order = self.recorded.arrivals if self.recorded is not None else []
            while self.arrived < len(order) and order[self.arrived] in self.came:
                self.arrived += 1
            due = [n for n in self.ending if self._in_turn(n)]
            reports = [self.ending.pop(n) for n in due]
        for report in reports:
            report()
        self._release()
        return True

    def _in_turn(self, number: int) -> bool:
        """Whether child ``number`` may end: every child whose result arrived
        before its own in the recording has arrived (call with ``lock`` held)."""
        rank = self.rank.get(number)
        return rank is None or rank <= self.arrived

    def end_run(self, report: Callable[[], None]) -> None:
        """``report`` the run's end in its recorded turn among its siblings (so
        their results land on the parent as they did)."""
        parent = self.parent
        if not isinstance(parent, PlayTape):
            report()
            return
        with parent.lock:
            if not parent._in_turn(self.number):
                parent.ending[self.number] = report
                return
        report()

    def _release(self) -> None:
        """File the results of the next take the recording made, once all are
        here (none for a take that found nothing: the wait times out)."""
        with self.lock:
            if self.released or self.group >= len(self.groups):
                return
            wanted = self.groups[self.group]
            if not all(n in self.held for n in wanted):
                return
            results = [self.held.pop(n) for n in wanted]
            self.released = True
        if results:
            self.core.file_results(results)

    # -- what the node asks --------------------------------------------------------------

    async def model(
        self,
        model: str,
        request: Mapping[str, Any],
        on_delta: Callable[[str], None] | None,
        send: Callable[[Callable[[str], None] | None], Awaitable[Reply | ErrorInfo]],
    ) -> Reply | ErrorInfo:
        said = said_of(request)
        happened = f"a call to {model}: {said!r}"
        entry = self._next(TapeModel, happened)
        if entry is not None and entry.digest != request_digest(model, request):
            self._unlike(entry, happened)
            entry = None
        if entry is not None and on_delta is not None:
            for piece in entry.pieces:
                on_delta(piece)
        if entry is not None and entry.cut:  # a cancellation recorded next closes it
            if self._apply_interrupt():
                await self._idle(None)  # until the cancellation closes it
            self._unlike(entry, f"{happened}, and no cancellation to close it")
            entry = None
        if entry is None:
            return ErrorInfo(code=ErrorCode.MODEL_ERROR, message="the replay diverged")
        if entry.took > 0:
            await self._idle(entry.took)
        return reply_of(entry)

    async def _idle(self, seconds: float | None) -> None:
        """Wait ``seconds`` on the replay's clock, as long as the call took (None:
        until the call is cancelled). The call is idle meanwhile, so the
        replay may move the clock, and running again from the instant its
        timer fires (on the thread that moves the clock) until it ends."""
        loop = asyncio.get_running_loop()
        due: asyncio.Future[None] = loop.create_future()
        hold = HOLD.get()

        def fire() -> None:
            if hold is not None:
                hold.take()
            loop.call_soon_threadsafe(_resolve, due)

        timer = None if seconds is None else self.player.clock.call_later(seconds, fire)
        if hold is not None:
            hold.drop()
        try:
            await due
        finally:
            if timer is not None:
                timer.cancel()
            if hold is not None:
                hold.take()


class Player(Recorder):
    """The tapes of one replay (in place of a node's ``Recorder``)."""

    def __init__(self, recording: Recording, node: Any, clock: VirtualClock) -> None:
        super().__init__(None, clock, recording.grace, ())
        self.clock: VirtualClock = clock  # the Recorder's, as the replay moves it
        self.run = recording
        self.node = node
        self.recorded = {s.path: s for s in recording.sessions}
        self.played: dict[str, PlayTape] = {}
        self.divergence: Divergence | None = None
        self.root_id: uuid.UUID | None = None
        self.stopped = threading.Event()
        self._diverging = threading.Lock()

    def tell(self, message: object) -> None:
        self.node._tell(message)

    def root(self, core: SessionCore) -> SessionTape:
        self.root_id = core.session_id
        return super().root(core)

    def _write(self, reel: Reel) -> None:  # a replay keeps nothing
        if reel.recording.complete:
            reel.done.set()
            self.stopped.set()

    def make_tape(
        self, reel: Reel, taped: TapedSession, number: int, core: SessionCore
    ) -> SessionTape:
        tape = PlayTape(self, reel, taped, number, core, self.recorded.get(taped.path))
        self.played[taped.path] = tape
        return tape

    def diverge(self, tape: PlayTape, step: str, recorded: str, happened: str) -> None:
        """Report the first divergence and end the replay's subtree by force."""
        namesake = tape.recorded
        found = Divergence(
            session=tape.taped.path,
            session_id=None if namesake is None else namesake.session_id,
            skill=tape.taped.skill,
            step=step,
            recorded=recorded,
            happened=happened,
        )
        self._first(found)

    def _first(self, divergence: Divergence) -> None:
        with self._diverging:
            if self.divergence is not None:
                return
            self.divergence = divergence
        if self.root_id is not None:
            self.tell(Call(Cancel(self.root_id, grace=0.0)))
        self.stopped.set()

    def stall(self, why: str) -> None:
        """The replay cannot go on (``why``: nothing left to wait for, the real
        time ran out, a spawn was refused): the divergence."""
        live = [t for t in self.played.values() if t.taped.result is None]
        live = live or [t for t in self.played.values() if t.taped.path == "0"]
        if live:  # the deepest: what the rest wait for
            tape = max(live, key=lambda t: t.taped.path.count("."))
            self.diverge(tape, str(tape.pos), "its run going on", why)
        else:  # the root was never made (a refused spawn)
            self._first(_divergence(self.recorded["0"], "spawn", "it ran", why))

    def report(self) -> ReplayReport:
        """What the replay found (see ``ReplayReport``)."""
        divergence = self.divergence or self._compare()
        root = self.played.get("0")
        result = None if root is None else root.taped.result
        recorded = self.recorded["0"].result
        return ReplayReport(
            recording_id=self.run.recording_id,
            identical=divergence is None,
            divergence=divergence,
            sessions=len(self.played),
            steps=sum(t.pos for t in self.played.values()),
            result=result,
            recorded_s=_lasted(recorded),
            replayed_s=_lasted(result),
        )

    def _compare(self) -> Divergence | None:
        names = {str(s.session_id): s.path for s in self.run.sessions}
        names.update((str(t.core.session_id), path) for path, t in self.played.items())
        for recorded in self.run.sessions:
            tape = self.played.get(recorded.path)
            if tape is None:
                return _divergence(recorded, "spawn", "it ran", "it was never spawned")
            if tape.pos < len(recorded.tape):
                entry = describe(recorded.tape[tape.pos])
                return _divergence(recorded, str(tape.pos), entry, "its run ended before it")
            events = tape.taped.events
            for i, (was, now) in enumerate(zip(recorded.events, events, strict=False)):
                if was != now:
                    return _divergence(recorded, f"event {i}", _said(was), _said(now))
            if len(events) != len(recorded.events):
                i = min(len(events), len(recorded.events))
                more = [
                    _said(e[i]) if i < len(e) else "no more events"
                    for e in (recorded.events, events)
                ]
                return _divergence(recorded, f"event {i}", *more)
            was_result = _outcome(recorded.result, names)
            now_result = _outcome(tape.taped.result, names)
            if was_result != now_result:
                return _divergence(recorded, "result", was_result, now_result)
        return None


def _lasted(result: SessionResult | None) -> float | None:
    timings = None if result is None else result.timings
    if timings is None or timings.ended_at is None:
        return None
    return round(timings.ended_at - timings.created_at, 6)


def _is_fence(entry: TapeEntry | None) -> bool:
    return isinstance(entry, TapeInterrupt) and ErrorCode(entry.code) in _FENCES


def _resolve(due: asyncio.Future[None]) -> None:
    if not due.done():
        due.set_result(None)


def _divergence(recorded: TapedSession, step: str, was: str, now: str) -> Divergence:
    """What ``recorded`` did at ``step`` (``was``) and what its replay did (``now``)."""
    return Divergence(
        session=recorded.path,
        session_id=recorded.session_id,
        skill=recorded.skill,
        step=step,
        recorded=was,
        happened=now,
    )


def _said(event: Any) -> str:
    return " ".join(str(part) for part in msgspec.structs.astuple(event) if part is not None)


def _outcome(result: SessionResult | None, names: Mapping[str, str]) -> str:
    """A result as a replay compares it: without ids and timings, each session
    id named by its place."""
    if result is None:
        return "no result"
    data = msgspec.to_builtins(result)
    for key in ("session_id", "parent_id", "timings", "context_leaf", "conversation"):
        data.pop(key, None)
    data["memory_ids"] = len(data.get("memory_ids", ()))  # made fresh by every write
    text = msgspec.json.encode(data, order="sorted").decode()
    for sid, path in names.items():
        text = text.replace(sid, f"<session {path}>")
    return text
