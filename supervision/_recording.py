"""Recording a subtree's run (issue 26).

A spawn with ``record=True`` starts a recording: its session and every
descendant get a tape (``SessionTape``) that their handles and the node
write to as inputs arrive — clock readings and the random seed on the
skill's thread, model replies on the event loop where the call goes out,
spawns and takes of children's results on the skill's thread — and each
session's compared events and its result on the Cortex's thread. Once
every session of it has ended, the recording is complete and goes to the
store in one write (a header goes there when it starts, so a run the node
never finished is known as ``incomplete``). Without a store, the node keeps
its last ``KEPT`` recordings in memory.

The cost of a recorded session is an append per input; a session outside
a recording pays an attribute read (``core.tape`` in its handle, its
``watchers`` in the kernel) at each hook, and each spawn a call of
``Recorder.created`` (the node's extension: see ``_extension``).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import secrets
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import msgspec

from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    Recording,
    RecordingError,
    SessionInfo,
    SessionResult,
    SessionState,
    SpawnSpec,
    StoreError,
    TapeCancel,
    TapeClock,
    TapedEvent,
    TapedSession,
    TapeEntry,
    TapeInterrupt,
    TapeModel,
    TapeSeed,
    TapeSpawn,
    TapeTake,
)
from sessiontree.store import RecordingRecord
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._extension import Extension
from sessiontree.supervision._models import Reply

if TYPE_CHECKING:
    from sessiontree.actors import Clock
    from sessiontree.actors.runtime import SessionCore
    from sessiontree.store import Store
    from sessiontree.supervision._entry import TreeEntry
    from sessiontree.supervision._providers import Provider

__all__ = [
    "COMPARED_EVENTS",
    "Recorder",
    "Reel",
    "SessionTape",
    "reply_of",
    "request_digest",
    "said_of",
    "spec_of",
]

log = logging.getLogger("sessiontree.recording")

#: The events of a session a replay compares (those a session's run decides;
#: not its timing, zombies or refused calls after its end).
# A spawn and a delivery are on the parent's tape (its spawn, its results'
# arrival and takes), so their events add nothing to compare.
COMPARED_EVENTS = frozenset(
    {
        EventKind.TRANSITION,
        EventKind.CANCEL_REQUESTED,
        EventKind.PROGRESS,
        EventKind.CHILD_UPDATE,
        EventKind.BUDGET_EXHAUSTED,
    }
)

KEPT = 64
"""Complete recordings a node without a store keeps in memory (oldest dropped)."""

_SAID_CHARS = 120


def request_digest(model: str, request: Mapping[str, Any]) -> str:
    """A hash of what one model request sends (its model, messages and options)."""
    body = dict(request, model=model)
    try:
        raw = msgspec.json.encode(body, order="sorted")
    except (TypeError, msgspec.EncodeError):  # an SDK object among the options
        raw = repr(sorted(body.items(), key=lambda kv: kv[0])).encode()
    return hashlib.sha256(raw).hexdigest()[:32]


def said_of(request: Mapping[str, Any]) -> str:
    """The start of a request's last message, to name it in a report."""
    messages = request.get("messages") or [{}]
    content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
    text = content if isinstance(content, str) else repr(content)
    return text[:_SAID_CHARS]


def reply_of(entry: TapeModel) -> Reply | ErrorInfo:
    """The reply a tape's model entry recorded."""
    if entry.error is not None:
        return entry.error
    return Reply(
        text=entry.text,
        tool_calls=tuple(entry.tool_calls),
        finish_reason=entry.finish_reason,
        model=entry.reply_model,
        usage=entry.usage,
    )


def _tape_model(
    model: str,
    request: Mapping[str, Any],
    reply: Reply | ErrorInfo | None,
    pieces: list[str],
    took: float = 0.0,
) -> TapeModel:
    """A reply on a tape, ``took`` clock seconds after the request (None: the
    call was closed before it came)."""
    asked = TapeModel(
        model=model, digest=request_digest(model, request), said=said_of(request), pieces=pieces
    )
    if reply is None:
        closed = ErrorInfo(code=ErrorCode.CANCELLED, message="the call was closed")
        return msgspec.structs.replace(asked, error=closed, cut=True)
    if isinstance(reply, ErrorInfo):
        return msgspec.structs.replace(asked, error=reply, took=took)
    return msgspec.structs.replace(
        asked,
        text=reply.text,
        tool_calls=list(reply.tool_calls),
        finish_reason=reply.finish_reason,
        reply_model=reply.model,
        usage=reply.usage,
        took=took,
    )


class Reel:
    """One recording being made: the ``Recording`` and how many of its
    sessions are still live; ``done`` is set once it is complete and written."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.live = 0
        self.done = threading.Event()
        self.error: BaseException | None = None  # the store's, if the write failed


class SessionTape:
    """A recorded session's tape (see ``sessiontree.actors.runtime.Tape``):
    every input is appended as the skill meets it, a model reply at the
    place its request took, a fence when the node fences; nothing once the
    session ended or was fenced (what a fenced skill does is not its run's)."""

    replaying = False
    __slots__ = (
        "calls",
        "children",
        "done",
        "fence_taped",
        "number",
        "parent",
        "reel",
        "taped",
        "tapes",
    )

    def __init__(self, tapes: Recorder, reel: Reel, taped: TapedSession, number: int) -> None:
        self.tapes = tapes
        self.reel = reel
        self.taped = taped
        self.number = number  # its place among its parent's children
        self.children = 0  # children made so far (Cortex thread)
        self.calls = 0  # calls of the session its skill made (its thread)
        self.parent: SessionTape | None = None
        self.done = False
        self.fence_taped = False  # the node fenced it: taped then, not when the skill sees it

    def _put(self, entry: TapeEntry) -> None:
        if not (self.done or self.fence_taped):  # what a fenced skill does is not its run's
            self.taped.tape.append(entry)

    # -- what the handle tells ----------------------------------------------------------

    def read(self, which: str, value: Callable[[], float]) -> float:
        reading = value()
        self._put(TapeClock(which, reading))
        return reading

    def at(self, when: float) -> float:
        return when

    def seed(self) -> int:
        drawn = secrets.randbits(63)
        self._put(TapeSeed(drawn))
        return drawn

    def checkpoint(self, again: bool) -> None:
        if not again:
            self.calls += 1

    def defer_cancel(self, code: ErrorCode) -> bool:
        return False

    def interrupted(self, code: ErrorCode, *, fenced: bool) -> None:
        self._put(TapeInterrupt(code.value, self.calls))  # once for a fence: see _put
        self.fence_taped = self.fence_taped or fenced

    def fenced(self, code: ErrorCode, inside: bool) -> None:
        """The node ended the session under its skill (expired, forced; Cortex
        thread): the skill meets it in the call it waits ``inside``, or in its
        next one. Taped now, as the session ends before its skill wakes."""
        self._put(TapeInterrupt(code.value, self.calls if inside else self.calls + 1))
        self.fence_taped = True

    def spawned(
        self,
        specs: Sequence[SpawnSpec],
        children: Sequence[uuid.UUID | None],
        refused: Sequence[ErrorInfo | None],
    ) -> None:
        self._put(self.tapes.spawn_entry(specs, children, refused))

    def took(self, children: Sequence[uuid.UUID]) -> None:
        self._put(TapeTake(self.tapes.numbers(children)))

    def cancelled_child(self, child: uuid.UUID) -> None:
        self._put(TapeCancel(self.tapes.numbers([child])[0]))

    def holds(self, result: SessionResult) -> bool:
        if not self.done:
            self.taped.arrivals.extend(self.tapes.numbers([result.session_id]))
        return False

    def end_run(self, report: Callable[[], None]) -> None:
        """The skill's run ended: ``report`` it (a replay's tape may hold it back)."""
        report()

    # -- what the node tells ------------------------------------------------------------

    def event(
        self, kind: EventKind, state: SessionState, code: ErrorCode | None, data: Any
    ) -> None:
        """One of the session's events (Cortex thread): kept if a replay compares it."""
        if kind in COMPARED_EVENTS and not self.done:
            note = data.get("note") if kind is EventKind.PROGRESS and data else None
            taped = TapedEvent(
                kind.value,
                state.value,
                None if code is None else code.value,
                None if note is None else str(note),
            )
            self.taped.events.append(taped)

    async def model(
        self,
        model: str,
        request: Mapping[str, Any],
        on_delta: Callable[[str], None] | None,
        send: Callable[[Callable[[str], None] | None], Awaitable[Reply | ErrorInfo]],
    ) -> Reply | ErrorInfo:
        """Send a model request (``send``, given what takes its streamed text)
        and tape its reply. Its place on the tape is taken as it goes out (so
        calls in flight at once keep their order), marked closed until the
        reply comes: a call a cancellation closes stays so."""
        pieces: list[str] = []
        taking = None
        if on_delta is not None:
            delta = on_delta

            def taking(text: str) -> None:
                pieces.append(text)
                delta(text)

        held = self._hold_place(_tape_model(model, request, None, pieces))
        clock = self.tapes.clock
        sent = clock.monotonic()
        reply = await send(taking)  # a cancellation leaves the place marked closed
        took = clock.monotonic() - sent
        self._fill(held, _tape_model(model, request, reply, pieces, took))
        return reply

    def _hold_place(self, entry: TapeModel) -> TapeModel | None:
        """Put ``entry`` on the tape (None once the session ended): before a
        cancellation the skill taped at this call already, since the call
        went out before the skill met it."""
        if self.done or self.fence_taped:
            return None
        tape = self.taped.tape
        last = tape[-1] if tape else None
        if isinstance(last, TapeInterrupt) and last.call == self.calls:
            tape.insert(len(tape) - 1, entry)
        else:
            tape.append(entry)
        return entry

    def _fill(self, held: TapeModel | None, entry: TapeModel) -> None:
        """Replace the place ``held`` by the reply's ``entry``."""
        if held is None or self.done or self.fence_taped:
            return
        tape = self.taped.tape
        for i in range(len(tape) - 1, -1, -1):
            if tape[i] is held:
                tape[i] = entry
                return

    def child(self, core: SessionCore) -> SessionTape:
        """The tape of a child this session's run just made (Cortex thread)."""
        number = self.children
        self.children += 1
        tape = self.tapes.attach(self.reel, core, f"{self.taped.path}.{number}", number)
        tape.parent = self
        return tape

    def ended(self, result: SessionResult) -> None:
        """The session ended with ``result`` (Cortex thread)."""
        self.taped.result = result
        self.done = True
        self.tapes.ended(self)

    def discarded(self) -> None:
        """The session was taken out as never made (its record could not be
        written): it leaves the recording (Cortex thread)."""
        self.done = True
        self.reel.recording.sessions.remove(self.taped)
        self.tapes.by_id.pop(self.taped.session_id, None)
        self.tapes.ended(self)


class Recorder(Extension):
    """A node's recordings (see the module's docstring), attached to the
    kernel: ``created`` gives a session its tape when its spawn asks for a
    recording or its parent has one. ``created``, ``root``, ``attach``,
    ``ended`` and ``complete`` run on the Cortex's thread, ``numbers`` and
    ``spawn_entry`` on a skill's, ``recording`` on its caller's."""

    def __init__(
        self, store: Store | None, clock: Clock, grace: float, providers: Sequence[Provider]
    ) -> None:
        self.store = store
        self.clock = clock  # the node's: how long model calls take
        self.grace = grace
        self.prices = {
            p.name: {m: (price.prompt, price.completion) for m, price in p.prices.items()}
            for p in providers
            if p.prices
        }
        self.by_id: dict[uuid.UUID, SessionTape] = {}
        # runs still recording, and (without a store) the last KEPT complete ones
        self.reels: collections.OrderedDict[uuid.UUID, Reel] = collections.OrderedDict()
        self._lock = threading.Lock()  # reels is read by callers of ``recording``

    def created(self, entry: TreeEntry, spec: SpawnSpec, data: dict[str, Any] | None) -> None:
        """A new session is recorded under a recorded parent, or from its own
        spawn on when that asks for it (``record=True``); its tape watches it."""
        core = entry.core
        parent = entry.parent
        if parent is not None and parent.core.tape is not None:
            tape = cast("SessionTape", parent.core.tape).child(core)
        elif spec.record:
            tape = self.root(core)
        else:
            return
        core.tape = tape
        entry.watchers = (*entry.watchers, tape)

    def root(self, core: SessionCore) -> SessionTape:
        """Start a recording at ``core`` (a spawn asked for one)."""
        info = core.info
        recording = Recording(
            recording_id=info.session_id,
            agent_id=info.agent_id,
            depth=info.depth,
            spec=spec_of(info),
            started_at=info.created_at,
            grace=self.grace,
            prices=self.prices,
        )
        reel = Reel(recording)
        with self._lock:
            self.reels[info.session_id] = reel
        self._write(reel)  # the header: a run cut off by a crash is known as incomplete
        return self.attach(reel, core, "0", 0)

    def attach(self, reel: Reel, core: SessionCore, path: str, number: int) -> SessionTape:
        info = core.info
        taped = TapedSession(
            path=path, session_id=info.session_id, kind=info.kind.value, skill=info.skill
        )
        reel.recording.sessions.append(taped)
        reel.live += 1
        tape = self.make_tape(reel, taped, number, core)
        self.by_id[info.session_id] = tape
        return tape

    def make_tape(
        self, reel: Reel, taped: TapedSession, number: int, core: SessionCore
    ) -> SessionTape:
        return SessionTape(self, reel, taped, number)

    def numbers(self, children: Sequence[uuid.UUID]) -> list[int]:
        """Children's places under their parent (-1 for one outside the recording)."""
        by_id = self.by_id
        return [t.number if (t := by_id.get(c)) is not None else -1 for c in children]

    def spawn_entry(
        self,
        specs: Sequence[SpawnSpec],
        children: Sequence[uuid.UUID | None],
        refused: Sequence[ErrorInfo | None],
    ) -> TapeSpawn:
        return TapeSpawn(
            skills=[s.skill or "" for s in specs],
            tasks=[s.task for s in specs],
            children=[None if c is None else self.numbers([c])[0] for c in children],
            refused=[None if e is None else e.code.value for e in refused],
        )

    def ended(self, tape: SessionTape) -> None:
        reel = tape.reel
        reel.live -= 1
        if reel.live == 0:
            self.complete(reel)

    def complete(self, reel: Reel) -> None:
        """Every session of ``reel`` ended: write it whole, forget its tapes."""
        recording = reel.recording
        recording.complete = True
        for taped in recording.sessions:
            self.by_id.pop(taped.session_id, None)
        self._write(reel)

    def _write(self, reel: Reel) -> None:
        """Write ``reel`` (once complete, ``done`` is set when it is durable and
        it leaves ``reels``, or stays among the last ``KEPT`` without a store).
        A write that fails is the reel's ``error``, never the Cortex's."""
        recording = reel.recording
        if self.store is None:
            if recording.complete:
                reel.done.set()
                self._kept()
            return
        try:
            record = RecordingRecord(
                recording_id=recording.recording_id,
                agent_id=recording.agent_id,
                started_at=recording.started_at,
                complete=recording.complete,
                data=recording.encode(),
            )
            future = self.store.submit(self.store.batch().recording(record))
        except Exception as exc:  # noqa: BLE001 - a closed store, an unencodable value
            log.warning("recording %s not written: %s", recording.recording_id, exc)
            if recording.complete:
                self._written(reel, exc)
            return
        if recording.complete:
            future.add_done_callback(lambda done: self._written(reel, done.exception()))

    def _written(self, reel: Reel, error: BaseException | None) -> None:
        reel.error = error
        reel.done.set()
        with self._lock:
            self.reels.pop(reel.recording.recording_id, None)

    def _kept(self) -> None:
        with self._lock:
            done = [rid for rid, reel in self.reels.items() if reel.done.is_set()]
            for rid in done[: max(0, len(done) - KEPT)]:
                del self.reels[rid]

    def recording(self, recording_id: uuid.UUID, timeout: float | None) -> Recording:
        """The complete recording of the run rooted at ``recording_id``, once
        written (waiting up to ``timeout`` real seconds for a run still
        recording). ``RecordingError``: ``not_recorded`` (no such recording),
        ``incomplete`` (still running at the timeout, or cut off by a crash),
        or what decoding a stored one raises; ``StoreError`` if its write failed
        (the reason of one that could not be encoded: ``RecordingError``)."""
        with self._lock:
            reel = self.reels.get(recording_id)
        if reel is not None:
            if not reel.done.wait(timeout):
                msg = f"the run of {recording_id} is still recording"
                raise RecordingError(msg, reason="incomplete", session_id=recording_id)
            if reel.error is not None:
                raise _unwritten(recording_id, reel.error)
            if self.store is None:
                return reel.recording
        if self.store is None:
            msg = f"session {recording_id} was not recorded (or no longer kept in memory)"
            raise RecordingError(msg, reason="not_recorded", session_id=recording_id)
        return stored_recording(self.store, recording_id)


def _unwritten(recording_id: uuid.UUID, error: BaseException) -> BaseException:
    if isinstance(error, StoreError):
        return error
    msg = f"the recording of {recording_id} could not be written: {error}"
    return RecordingError(msg, reason="malformed", session_id=recording_id)


def spec_of(info: SessionInfo) -> SpawnSpec:
    """The recorded spawn that makes a session like ``info`` again: its kind,
    skill, work and the tier, TTL and budget it got."""
    return SpawnSpec(
        kind=info.kind,
        task=info.task,
        context_summary=info.context_summary,
        skill=info.skill,
        ttl=info.ttl,
        model_tier=info.model_tier,
        metadata=dict(info.metadata),
        budget=info.budget,
        input=info.input,
        context=info.context,
        record=True,
    )


def stored_recording(store: Store, recording_id: uuid.UUID) -> Recording:
    """The complete recording ``recording_id`` in ``store``; ``RecordingError``
    (``not_recorded``, ``incomplete``, or a decoding's reason)."""
    record = store.recording(recording_id)
    if record is None:
        msg = f"session {recording_id} was not recorded"
        raise RecordingError(msg, reason="not_recorded", session_id=recording_id)
    recording = Recording.decode(record.data)
    if not recording.complete:
        msg = f"the recording of {recording_id} is incomplete: its node stopped first"
        raise RecordingError(msg, reason="incomplete", session_id=recording_id)
    return recording
