"""What a skill gets as ``session.conversation``, as the session runtime declares it.

The conversation tree is its own package (``sessiontree.conversations``),
which the session runtime does not import: ``supervision`` hands the real
``Conversation`` to the session through ``SessionHost.conversation``, and
mypy checks that it has every method declared here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from sessiontree.protocol import BranchInfo, DeletePlan, Merged, Message, Role

__all__ = ["BranchRef", "ContextEntry", "ConversationLike", "LinkedContext"]

BranchRef = int | str | uuid.UUID

#: One message a session writes to its context: role, content, tool calls,
#: name, tool call id.
ContextEntry = tuple[Role, Any, list[Any] | None, str | None, str | None]


class LinkedContext(Protocol):
    """A spawned session's context as its model calls use it: a branch of its
    root Main's conversation (``sessiontree.conversations.SessionBranch``).
    ``compact_due``: its last model call was long enough to compact before
    the next (see ``Compaction``)."""

    compact_due: bool

    def compactable(self, keep: int) -> list[Message]:
        """The context's messages a summary would replace: all but the last ``keep``
        (and the answers of a tool call they end on); none if only a summary."""
        ...

    def compact(self, summary: str, old: list[Message]) -> Message:
        """Write ``summary`` as the message that stands for ``old``."""
        ...

    async def acompact(self, summary: str, old: list[Message]) -> Message:
        """Awaitable ``compact``."""
        ...

    def history(self) -> list[dict[str, Any]]:
        """The messages its model sees, as chat-completions messages, oldest first."""
        ...

    async def settled(self) -> None:
        """Wait for the writes ``history`` must see (children's results landing)."""
        ...

    def write(
        self, entries: list[ContextEntry], usage: dict[str, Any] | None = None
    ) -> list[Message]:
        """Append ``entries`` in one write; durable when it returns (a worker's:
        in memory). Raises ``StoreError`` when the write fails (nothing written)."""
        ...

    async def awrite(
        self, entries: list[ContextEntry], usage: dict[str, Any] | None = None
    ) -> list[Message]:
        """Awaitable ``write``."""
        ...


class ConversationLike(Protocol):
    """One session's conversation tree: messages in numbered, named branches.

    Every call is a checkpoint of the session; a worker may read but a write
    raises ``NotAllowedError``. Writes have awaitable twins (``aappend``…).
    """

    @property
    def session_id(self) -> uuid.UUID: ...

    @property
    def active_leaf(self) -> uuid.UUID | None:
        """The message the next ``append`` hangs under."""
        ...

    @property
    def current_branch(self) -> BranchInfo:
        """The branch ``append`` writes to."""
        ...

    def context(self, limit: int = 100) -> list[Message]:
        """The last ``limit`` messages of the active path, oldest first."""
        ...

    def message(self, message_id: uuid.UUID | str) -> Message:
        """One message of this conversation."""
        ...

    def by_platform_id(self, platform_id: str) -> Message | None:
        """The message a chat platform's id was recorded for, or None."""
        ...

    def branches(self) -> list[BranchInfo]:
        """Every branch, by number; one is current."""
        ...

    def __len__(self) -> int:
        """Messages in the conversation."""
        ...

    def append(
        self,
        role: Role | str,
        content: Any,
        *,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
        platform_id: str | None = None,
    ) -> Message:
        """Append at the active leaf of the current branch; returns it once durable."""
        ...

    def append_once(
        self,
        role: Role | str,
        content: Any,
        *,
        platform_id: str,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> tuple[Message, bool]:
        """``append`` unless ``platform_id`` was appended already (then that one, False)."""
        ...

    async def aappend(
        self,
        role: Role | str,
        content: Any,
        *,
        tool_calls: list[Any] | None = None,
        usage: dict[str, Any] | None = None,
        platform_id: str | None = None,
    ) -> Message:
        """Awaitable ``append``."""
        ...

    def link_platform_id(self, message_id: uuid.UUID | str, platform_id: str) -> Message:
        """Record the chat platform's id of a message sent out."""
        ...

    def fork(self, from_message_id: uuid.UUID | str, name: str | None = None) -> BranchInfo:
        """A new, current branch whose next message hangs under ``from_message_id``."""
        ...

    def checkout(self, target: BranchRef) -> BranchInfo:
        """Make a branch current: by number, name, or message id."""
        ...

    def merge(self, source: BranchRef) -> Merged:
        """Copy the source branch's own messages onto the current branch."""
        ...

    def delete_branch(self, branch: BranchRef) -> DeletePlan:
        """Step one of deleting a branch: what would go, and the token."""
        ...

    def confirm_delete(self, token: str, branch: BranchRef | None = None) -> DeletePlan:
        """Step two: delete what the token's plan names."""
        ...

    def tree(self) -> dict[str, Any]:
        """The whole tree, nested, in the specification's keys."""
        ...

    def export_tree(self, fmt: str = "json") -> str:
        """The tree as ``json``, ``text`` or ``html``."""
        ...

    def transcript(self) -> Iterator[str]:
        """The transcript as JSONL lines."""
        ...

    async def afork(self, from_message_id: uuid.UUID | str, name: str | None = None) -> BranchInfo:
        """Awaitable ``fork``."""
        ...

    async def acheckout(self, target: BranchRef) -> BranchInfo:
        """Awaitable ``checkout``."""
        ...

    async def amerge(self, source: BranchRef) -> Merged:
        """Awaitable ``merge``."""
        ...

    async def aconfirm_delete(self, token: str, branch: BranchRef | None = None) -> DeletePlan:
        """Awaitable ``confirm_delete``."""
        ...

    async def alink_platform_id(self, message_id: uuid.UUID | str, platform_id: str) -> Message:
        """Awaitable ``link_platform_id``."""
        ...
