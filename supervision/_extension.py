"""The kernel's seam for features: what a feature (recording, tracing,
budgets, …) may hook into as the Cortex admits, creates, restores and ends
sessions.

A feature subclasses ``Extension`` and overrides only the hooks it needs;
``Extensions`` keeps, per hook, the extensions that override it, so the
kernel pays one empty-tuple check for a hook no feature uses. A feature that
follows one session (a recorded run's tape) gives it a ``SessionWatch``
(``_entry``; ``TreeEntry.watchers``): a session nobody watches costs the
kernel one empty-tuple check per event. A feature that admits a spawn with
something for the child (its budget) returns a ``Grant``, which the kernel
asks to stamp that child's identity and tells once it is made: a spawn
nothing was granted to costs the feature one ``admit`` call.

Every hook runs on the Cortex thread, inside the operation that calls it; a
hook that raises fails that operation as any broken invariant does (the
node fails loudly), so a hook must not raise for anything a user can cause.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from sessiontree.protocol import ErrorInfo, SessionInfo, SessionResult, SpawnSpec
    from sessiontree.supervision._config import Agent
    from sessiontree.supervision._entry import TreeEntry
    from sessiontree.supervision._events import EventKind

__all__ = ["HOOKS", "Extension", "Extensions", "Grant"]

_E = TypeVar("_E", bound="Extension")


class Grant(Protocol):
    """What an extension's ``admit`` gives one new session (a budget): the
    kernel has it ``stamp`` the session's identity, then tells it the session
    was ``made``. Only sessions granted something pay for it."""

    def stamp(self, info: SessionInfo) -> SessionInfo:
        """The session's identity with what was granted (before it is indexed)."""
        ...

    def made(self, entry: TreeEntry) -> None:
        """The session was indexed (before its SPAWNED event and its record)."""
        ...


class Extension:
    """A feature attached to the kernel. Every hook here does nothing; a
    feature overrides the ones it needs (``Extensions`` calls only those).
    ``answers``: the types of the feature's own requests to the Cortex,
    which hands each to ``answer`` on its thread."""

    answers: ClassVar[tuple[type, ...]] = ()

    def bind(self, cortex: Any) -> None:
        """Once, as the node's Cortex is built (before any request): a feature
        that acts on the tree keeps the parts it uses (its ``tree``, …)."""

    def answer(self, request: Any, reply: Any) -> object:
        """The answer to one of the feature's ``answers`` requests, or
        ``DEFERRED`` (``_requests``) when it answers ``reply`` itself; raises
        what the Cortex's own operations raise for a caller's mistake."""
        msg = f"{type(self).__name__} answers no {type(request).__name__}"
        raise NotImplementedError(msg)

    def admit(
        self, parent: TreeEntry | None, spec: SpawnSpec, agent: Agent
    ) -> ErrorInfo | Grant | None:
        """Whether a session of ``spec`` (run by ``agent``) may be made under
        ``parent`` (None: a Main is opened), after the kernel's rules passed
        it: an ``ErrorInfo`` refuses a child (counted and emitted as the rules'
        refusals are; a Main is never refused); None admits it; a ``Grant``
        admits it with something for the new session, and a batch's spawn
        granted something is admitted afresh for each child."""
        return None

    def identity(self, parent: TreeEntry | None, spec: SpawnSpec, info: SessionInfo) -> SessionInfo:
        """A new session's identity, before it is indexed: returned as is or
        changed (tracing gives it its span)."""
        return info

    def restoring(self, parent: TreeEntry | None, info: SessionInfo) -> SessionInfo:
        """A stored session's identity as it comes back (``parent``: its parent,
        back already), before it is indexed: returned as is or changed."""
        return info

    def created(self, entry: TreeEntry, spec: SpawnSpec, data: dict[str, Any] | None) -> None:
        """``entry`` was indexed, made from ``spec`` (a spawn, a Main opened).
        ``data``: its SPAWNED event's data, to add to (None: nobody listens)."""

    def restored(self, entry: TreeEntry, before: SessionInfo, data: dict[str, Any] | None) -> None:
        """``entry`` was indexed, back from the store (``before``: its stored
        identity). ``data``: as for ``created``."""

    def detail(
        self, kind: EventKind, entry: TreeEntry, error: ErrorInfo | None, data: dict[str, Any]
    ) -> None:
        """Add to the data of ``entry``'s ending TRANSITION or a Main's
        CYCLE_ENDED event (``error``: why it failed, if it did)."""

    def result(self, entry: TreeEntry, result: SessionResult) -> SessionResult:
        """``entry``'s one result as it ends, before anyone sees it: returned as
        is or with what the feature adds (contexts: its context branch's leaf)."""
        return result

    def delivered(
        self, entry: TreeEntry, parent: TreeEntry, result: SessionResult, live: bool
    ) -> None:
        """``entry``'s result is being filed on ``parent`` (``live``: it has not
        ended), before the parent's skill or mailbox can see it."""


#: the hooks ``Extensions`` sorts extensions by
HOOKS = (
    "admit",
    "identity",
    "restoring",
    "created",
    "restored",
    "detail",
    "result",
    "delivered",
)


class Extensions:
    """The node's extensions, and per hook (an attribute of that name) the
    ones that override it, in the order they were given. ``replace`` swaps
    one (a replay's tapes for the node's) before the node is used; the Cortex
    is built by then, so the new one is not bound (``Extension.bind``)."""

    __slots__ = ("all", "answering", *HOOKS)

    def __init__(self, extensions: Iterable[Extension] = ()) -> None:
        self.all: tuple[Extension, ...] = tuple(extensions)
        self.answering: dict[type, Extension] = {}
        self.admit: tuple[Extension, ...] = ()
        self.identity: tuple[Extension, ...] = ()
        self.restoring: tuple[Extension, ...] = ()
        self.created: tuple[Extension, ...] = ()
        self.restored: tuple[Extension, ...] = ()
        self.detail: tuple[Extension, ...] = ()
        self.result: tuple[Extension, ...] = ()
        self.delivered: tuple[Extension, ...] = ()
        self._sort()

    def _sort(self) -> None:
        self.answering = {kind: e for e in self.all for kind in e.answers}
        for hook in HOOKS:
            base = getattr(Extension, hook)
            setattr(
                self,
                hook,
                tuple(e for e in self.all if getattr(type(e), hook, base) is not base),
            )

    def find(self, kind: type[_E]) -> _E | None:
        """The extension of type ``kind`` (or a subclass), if the node has one."""
        return next((e for e in self.all if isinstance(e, kind)), None)

    def replace(self, old: Extension, new: Extension) -> None:
        """Put ``new`` in ``old``'s place; ``ValueError`` if ``old`` is not here."""
        extensions = list(self.all)
        if old not in extensions:
            msg = f"{type(old).__name__} is not one of the node's extensions"
            raise ValueError(msg)
        extensions[extensions.index(old)] = new
        self.all = tuple(extensions)
        self._sort()
