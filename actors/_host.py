"""What a running session needs from the runtime around it (wired by supervision),
and how a skill run ends (:class:`RunEnd`, what it reports to that runtime)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sessiontree.protocol import ErrorInfo, Outcome, PatternCall, SpawnSpec

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures
    from collections.abc import Callable, Sequence

    from sessiontree.actors._compaction import Compaction
    from sessiontree.actors._conversing import ConversationLike, LinkedContext
    from sessiontree.actors._core import SessionCore
    from sessiontree.protocol import Completion

__all__ = ["ModelCall", "RunEnd", "SessionHost", "SpawnedLike"]


@dataclass(frozen=True)
class RunEnd:
    """How one skill run ended: a value, a crash, or ``Cancelled`` escaping it.

    ``fatal`` holds a ``KeyboardInterrupt``/``SystemExit`` the skill raised:
    the session fails and the node shuts down in order. ``store_refused``: a
    Main's cycle ended by the store refusing one of its writes (``error``
    says which): its message or result is kept and the cycle runs again.
    """

    outcome: Outcome | None = None
    error: ErrorInfo | None = None
    cancelled: bool = False
    fatal: BaseException | None = None
    cycle: int = 0
    store_refused: bool = False


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call as a session asks for it: the chat ``messages`` to send,
    the SDK's ``options`` passed through (``tools``, ``tool_choice``,
    ``response_format``, sampling), the completion tokens it asks for at
    most, a ``model`` that overrides its tier's, and whether to stream;
    ``hedge_after``: clock seconds after which a duplicate request goes out
    if the first has not answered (None: none)."""

    messages: tuple[dict[str, Any], ...]
    options: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    model: str | None = None
    stream: bool = False
    hedge_after: float | None = None


class SpawnedLike(Protocol):
    """The answer to a spawn: the child's id, or why there is none."""

    @property
    def session_id(self) -> uuid.UUID | None: ...

    @property
    def error(self) -> ErrorInfo | None: ...

    @property
    def ok(self) -> bool: ...


class SessionHost(Protocol):
    """The supervisor side of a session, as its ``Session`` handle sees it.

    Every method may be called from a skill thread or the event loop thread.
    """

    def spawn(self, parent: SessionCore, spec: SpawnSpec) -> SpawnedLike:
        """Ask the supervisor for a child; blocks the calling thread (bounded)."""
        ...

    async def spawn_async(self, parent: SessionCore, spec: SpawnSpec) -> SpawnedLike:
        """``spawn`` without blocking the event loop."""
        ...

    def spawn_many(
        self, parent: SessionCore, specs: tuple[SpawnSpec, ...]
    ) -> Sequence[SpawnedLike]:
        """``spawn`` for a batch (one answer per spec, in order); blocks (bounded)."""
        ...

    async def spawn_many_async(
        self, parent: SessionCore, specs: tuple[SpawnSpec, ...]
    ) -> Sequence[SpawnedLike]:
        """``spawn_many`` without blocking the event loop."""
        ...

    def model_call(
        self, core: SessionCore, call: ModelCall
    ) -> concurrent.futures.Future[Completion]:
        """Start a model call for a sync skill (reserved, sent, settled: the
        future never fails for what the provider or a budget does); cancel
        the future to abandon the call."""
        ...

    def amodel_call(self, core: SessionCore, call: ModelCall) -> asyncio.Future[Completion]:
        """``model_call`` for an async skill: a task on the running loop."""
        ...

    def memory_put(self, core: SessionCore, key: str, value: Any) -> str:
        """Write shared memory; returns the memory id once the write is durable."""
        ...

    async def memory_put_async(self, core: SessionCore, key: str, value: Any) -> str:
        """``memory_put`` without blocking the event loop."""
        ...

    def memory_get(self, core: SessionCore, key: str) -> Any:
        """Read shared memory (``KeyError`` when absent)."""
        ...

    def progress(self, core: SessionCore, note: str, data: dict[str, Any]) -> None:
        """Record a progress report."""
        ...

    def cancel(self, core: SessionCore, child_id: uuid.UUID) -> ErrorInfo | None:
        """Cancel one of ``core``'s children (and its subtree); None when accepted."""
        ...

    def send_to_parent(self, core: SessionCore, message: Any) -> None:
        """Hand ``message`` to the parent (its ``updates()``); dropped if it has ended."""
        ...

    def run_pattern(self, session: Any, call: PatternCall) -> Any:
        """Run the coordination pattern ``call`` names for a sync ``Session``."""
        ...

    async def arun_pattern(self, session: Any, call: PatternCall) -> Any:
        """Run the coordination pattern ``call`` names for an ``AsyncSession``."""
        ...

    def conversation(self, core: SessionCore, guard: Callable[[str], None]) -> ConversationLike:
        """The session's conversation tree; ``guard(what)`` runs before every call on it."""
        ...

    def compaction(self, core: SessionCore) -> Compaction | None:
        """The session's agent's ``Compaction`` (None: contexts are not compacted)."""
        ...

    def linked_context(
        self, core: SessionCore, guard: Callable[[str], None]
    ) -> LinkedContext | None:
        """A spawned session's context branch (what ``complete`` sends and records);
        None for a Main, whose model calls use its working context."""
        ...

    def parked(self, core: SessionCore) -> None:
        """Tell the supervisor the skill parked for a suspension."""
        ...

    def run_ended(self, core: SessionCore, end: RunEnd) -> None:
        """Tell the supervisor a skill run (or a Main's message cycle) ended."""
        ...

    def cycle_traced(
        self, core: SessionCore, cycle: int, parent: str | None, cut_off: str | None
    ) -> str | None:
        """A Main's cycle ``cycle`` starts: on a traced node, its span's
        ``traceparent`` (a child of ``parent``, linked to ``cut_off``), told to
        the supervisor; None on a node that is not traced."""
        ...

    def record_input(self, core: SessionCore, message: Any) -> None:
        """A Main's cycle for ``message`` begins (on the thread that runs it):
        record what it received where it keeps it, once per input also across a
        rerun. Raises ``StoreError`` when the store refuses the write."""
        ...

    async def arecord_input(self, core: SessionCore, message: Any) -> None:
        """``record_input`` for an async skill's cycle (the loop is never blocked)."""
        ...

    def cycle_starting(
        self,
        core: SessionCore,
        seq: int | None,
        child_id: uuid.UUID | None,
        attempt: int,
        message: Any = None,
    ) -> concurrent.futures.Future[None] | None:
        """A Main is about to run a cycle for inbox message ``seq`` or child
        ``child_id``'s result (attempt ``attempt``; ``message``: what the cycle
        runs for): None to run it now (its start is queued, and commits before
        anything the cycle writes), or, while the store refuses writes, a
        future that finishes (on another thread) once the start is durable (it
        may write the user's turn with it: see ``record_input``); it fails with
        the store's error."""
        ...

    def refused(self, core: SessionCore, what: str) -> None:
        """Count something a fenced session tried to do."""
        ...
