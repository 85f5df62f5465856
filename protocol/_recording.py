"""Recordings of a subtree's run, and what replaying one reports (issue 26).

A recording holds every input of a recorded subtree's run that is not a
pure function of its code, one tape per session in the order that session
met them: the seed of its random numbers, the clock readings its skill
made, the model's replies, which children it spawned and in which order it
took their results, and where a cancellation reached it. Beside the tape
each session keeps its events and its result, which a replay compares.

Sessions are named by their place in the subtree, not their ids (a replay
makes new ones): the recorded root is ``"0"``, its third child ``"0.2"``.

On failure: ``load_recording`` and ``Recording.decode`` raise
``RecordingError`` with ``reason`` ``version`` (another format),
``truncated`` or ``malformed`` (naming the field), and ``load_recording``
with ``too_large`` too; ``Node.replay`` raises it with ``not_recorded``,
``incomplete`` (the run never finished recording: the node stopped first)
or ``unknown_agent``.
"""

from __future__ import annotations

import uuid
from typing import Any, NoReturn

import msgspec

from sessiontree.protocol._errors import ErrorCode, ErrorInfo, SessionTreeError
from sessiontree.protocol._results import SessionResult
from sessiontree.protocol._specs import SpawnSpec

__all__ = [
    "RECORDING_FORMAT",
    "Divergence",
    "Recording",
    "RecordingError",
    "ReplayReport",
    "TapeCancel",
    "TapeClock",
    "TapeEntry",
    "TapeInterrupt",
    "TapeModel",
    "TapeSeed",
    "TapeSpawn",
    "TapeTake",
    "TapedEvent",
    "TapedSession",
]

RECORDING_FORMAT = 1
"""The version of a recording's layout; a recording of another is refused."""

_MAGIC = b"sessiontree-recording\n"


class RecordingError(SessionTreeError):
    """A recording cannot be replayed or read; ``reason`` says why
    (``not_recorded``, ``incomplete``, ``version``, ``truncated``, ``malformed``,
    ``too_large``, ``unknown_agent``)."""

    def __init__(self, message: str, *, reason: str, session_id: uuid.UUID | None = None) -> None:
        super().__init__(message, session_id=session_id)
        self.reason = reason


class _Tape(msgspec.Struct, frozen=True, tag_field="t", array_like=True):
    """One input on a session's tape."""


class TapeSeed(_Tape, frozen=True, tag="seed"):
    """The seed of ``session.random``, drawn when the skill first used it."""

    seed: int


class TapeClock(_Tape, frozen=True, tag="clock"):
    """A reading of ``session.clock`` (``which``: ``monotonic`` or ``time``)."""

    which: str
    value: float


class TapeModel(_Tape, frozen=True, tag="model"):
    """A model's reply to one request (``digest``: a hash of what was sent,
    ``said``: the start of its last message, for a report); ``error`` when
    the provider answered with one; ``cut``: the call was closed before its
    reply came (a cancellation reached the skill while it waited, or it was
    a hedged call's losing duplicate);
    ``pieces``: a streamed reply's text as it arrived; ``took``: clock
    seconds from the request to the reply (a replay waits as long)."""

    model: str
    digest: str
    said: str
    text: str | None = None
    tool_calls: list[dict[str, Any]] = msgspec.field(default_factory=list)
    finish_reason: str | None = None
    reply_model: str = ""
    usage: tuple[int, int] | None = None
    error: ErrorInfo | None = None
    cut: bool = False
    pieces: list[str] = msgspec.field(default_factory=list)
    took: float = 0.0


class TapeSpawn(_Tape, frozen=True, tag="spawn"):
    """One spawn call: per spec its skill and task, and the child's place
    (its number under this session) or the code it was refused with."""

    skills: list[str]
    tasks: list[str]
    children: list[int | None]
    refused: list[str | None]


class TapeTake(_Tape, frozen=True, tag="take"):
    """One take of children's results, in the order they were taken
    (children numbered under this session)."""

    children: list[int]


class TapeCancel(_Tape, frozen=True, tag="cancel"):
    """The skill cancelled a child (its number under this session)."""

    child: int


class TapeInterrupt(_Tape, frozen=True, tag="interrupt"):
    """A cancellation (its code) reached the skill here, in its ``call``-th
    call of the session (a checkpoint: spawn, wait, complete, progress…)."""

    code: str
    call: int


TapeEntry = TapeSeed | TapeClock | TapeModel | TapeSpawn | TapeTake | TapeCancel | TapeInterrupt


class TapedEvent(msgspec.Struct, frozen=True, array_like=True):
    """One of a session's events, as a replay compares it."""

    kind: str
    state: str | None = None
    code: str | None = None
    note: str | None = None


class TapedSession(msgspec.Struct, kw_only=True):
    """One session of a recording: its place, its recorded id, its tape, the
    order its children's results arrived in (their numbers), its events and
    its result (None: it had not ended)."""

    path: str
    session_id: uuid.UUID
    kind: str
    skill: str
    tape: list[TapeEntry] = msgspec.field(default_factory=list)
    arrivals: list[int] = msgspec.field(default_factory=list)
    events: list[TapedEvent] = msgspec.field(default_factory=list)
    result: SessionResult | None = None


class Recording(msgspec.Struct, kw_only=True):
    """A recorded subtree: the spawn of its root (``spec``, with the tier,
    TTL and budget it got), at which ``depth``, on which ``agent_id``, when
    it began, the node's ``grace`` and price tables (provider name -> model
    -> prompt and completion price), whether it is ``complete`` (every
    session of it ended), and each session's tape."""

    format: int = RECORDING_FORMAT
    recording_id: uuid.UUID
    agent_id: str
    depth: int
    spec: SpawnSpec
    started_at: float
    grace: float
    prices: dict[str, dict[str, tuple[float, float]]] = msgspec.field(default_factory=dict)
    complete: bool = False
    sessions: list[TapedSession] = msgspec.field(default_factory=list)

    @property
    def root(self) -> TapedSession:
        """The recorded root (place ``"0"``); ``RecordingError`` (``malformed``)
        for a recording that holds none."""
        for taped in self.sessions:
            if taped.path == "0":
                return taped
        msg = "the recording is malformed: sessions holds no root (path '0')"
        raise RecordingError(msg, reason="malformed", session_id=self.recording_id)

    def encode(self) -> bytes:
        """The recording as a file's bytes (a header line, then msgpack)."""
        return _MAGIC + msgspec.msgpack.encode(self)

    @staticmethod
    def decode(data: bytes) -> Recording:
        """A recording from ``encode``'s bytes; ``RecordingError`` (``malformed``,
        ``version``, ``truncated``) for anything else, whatever the bytes make
        the decoder raise (``MemoryError`` aside)."""
        if not data.startswith(_MAGIC):
            msg = "not a sessiontree recording (its first line is not the header)"
            raise RecordingError(msg, reason="malformed")
        body = data[len(_MAGIC) :]
        try:
            version = msgspec.msgpack.decode(body, type=_Version).format
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the bytes (bad UTF-8, too deep)
            raise _unreadable(exc) from None
        if version != RECORDING_FORMAT:
            msg = f"a recording of format {version}; this code reads {RECORDING_FORMAT}"
            raise RecordingError(msg, reason="version")
        try:
            recording = msgspec.msgpack.decode(body, type=Recording)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - as above
            raise _unreadable(exc) from None
        _check(recording)
        return recording


class _Version(msgspec.Struct):
    format: int


_CODES = frozenset(code.value for code in ErrorCode)


def _check(recording: Recording) -> None:
    """What decoding cannot check: ``RecordingError`` (``malformed``) naming the
    field of the first problem."""
    if recording.depth < 1:
        _malformed(f"depth {recording.depth} (a recorded root is spawned: 1 or more)")
    for i, taped in enumerate(recording.sessions):
        for j, entry in enumerate(taped.tape):
            where = f"sessions[{i}].tape[{j}]"
            if isinstance(entry, TapeInterrupt) and entry.code not in _CODES:
                _malformed(f"{where}.code {entry.code!r} is not an error code")
            if isinstance(entry, TapeSpawn):
                lists = (entry.skills, entry.tasks, entry.children, entry.refused)
                if len({len(items) for items in lists}) > 1:
                    _malformed(f"{where}: its lists differ in length")


def _malformed(problem: str) -> NoReturn:
    raise RecordingError(f"the recording is malformed: {problem}", reason="malformed")


def _unreadable(exc: Exception) -> RecordingError:
    reason = "truncated" if "truncated" in str(exc) else "malformed"
    named = "" if isinstance(exc, msgspec.DecodeError) else f"{type(exc).__name__}: "
    return RecordingError(f"the recording does not decode: {named}{exc}", reason=reason)


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replay first did something the recording did not: the session
    (its place and recorded id, its skill), the step of its tape (or of its
    events, or ``result``), what was recorded and what happened."""

    session: str
    session_id: uuid.UUID | None
    skill: str
    step: str
    recorded: str
    happened: str


class ReplayReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a replay found: ``identical`` (every input consumed as recorded,
    every session's events and result the same), or the first ``divergence``;
    how many sessions and tape steps it replayed, the replayed root's
    result, and how long the root ran in clock seconds when recorded and in
    the replay (model calls take there as long as they took, skills' own
    work no time)."""

    recording_id: uuid.UUID
    identical: bool
    divergence: Divergence | None = None
    sessions: int = 0
    steps: int = 0
    result: SessionResult | None = None
    recorded_s: float | None = None
    replayed_s: float | None = None
