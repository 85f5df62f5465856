"""Conversation trees: messages, branches, and what the operations return.

A conversation is a tree of messages (``parent_id`` links, ``None`` for a
root) with named, numbered branches; the current branch's tip is the
active leaf. Python names are snake_case; ``to_spec`` gives a message in
the specification's own JSON keys (``id``, ``parentId``, ``role``,
``content``, ``timestamp`` as ISO 8601, ``branchId``) for every export.
"""

from __future__ import annotations

import datetime
import enum
import uuid
from typing import Any

import msgspec

__all__ = [
    "MAX_BRANCH_NAME_CHARS",
    "MAX_CONTENT_BYTES",
    "Branch",
    "BranchInfo",
    "ContextScope",
    "ConversationState",
    "DeletePlan",
    "Merged",
    "Message",
    "Role",
    "chat_message",
    "iso_timestamp",
]

MAX_BRANCH_NAME_CHARS = 64
MAX_CONTENT_BYTES = 1 << 20  # one message's content, encoded


class Role(enum.StrEnum):
    """Who wrote a message."""

    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"


class ContextScope(enum.StrEnum):
    """What a spawned session's model sees of the conversation it was forked from.

    ``own``: its system prompt, its ``context_summary`` and its own messages
    (the specification's rule: context never flows automatically);
    ``branch``: also the messages of the branch it was forked from, up to the
    fork point (continuing a sub-agent: its whole branch, and the branches
    that one continued in turn);
    ``path``: also every message on the path from the root to its fork point.
    """

    OWN = "own"
    BRANCH = "branch"
    PATH = "path"


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of a conversation tree.

    ``seq`` is its place in the order of appends (0, 1, 2… per conversation);
    ``depth`` its place on the path from the root (a root is 1).
    ``merged_from`` names the message a merge copied it from.
    ``session_id`` is set on a sub-agent's result, which lands on its parent's
    branch: the sub-agent it reports; ``link`` is that sub-agent's branch id
    (None for a worker, whose branch lived in memory only). ``name`` and
    ``tool_call_id`` are a chat message's own (a tool's answer to one call).
    ``compacts`` is set on a summary that compaction wrote: the newest message
    it stands for (a context walk starts at the summary).
    """

    id: uuid.UUID
    parent_id: uuid.UUID | None
    role: Role
    content: Any
    timestamp: float
    branch_id: str
    seq: int = 0
    depth: int = 1
    tool_calls: list[Any] | None = None
    usage: dict[str, Any] | None = None
    merged_from: uuid.UUID | None = None
    platform_id: str | None = None
    session_id: uuid.UUID | None = None
    link: str | None = None
    name: str | None = None
    tool_call_id: str | None = None
    compacts: uuid.UUID | None = None

    def as_chat(self) -> dict[str, Any]:
        """This message as a chat-completions request has it (content that is
        not a string is sent as its JSON text)."""
        content = self.content
        if content is not None and not isinstance(content, str):
            content = msgspec.json.encode(content).decode()
        return chat_message(
            self.role.value,
            content,
            name=self.name,
            tool_calls=self.tool_calls,
            tool_call_id=self.tool_call_id,
        )

    def to_spec(self) -> dict[str, Any]:
        """This message in the specification's JSON keys (``parentId``, ``branchId``…)."""
        out: dict[str, Any] = {
            "id": str(self.id),
            "parentId": None if self.parent_id is None else str(self.parent_id),
            "role": self.role.value,
            "content": self.content,
            "timestamp": iso_timestamp(self.timestamp),
            "branchId": self.branch_id,
        }
        if self.tool_calls is not None:
            out["toolCalls"] = self.tool_calls
        if self.usage is not None:
            out["usage"] = self.usage
        if self.merged_from is not None:
            out["mergedFrom"] = str(self.merged_from)
        if self.platform_id is not None:
            out["platformId"] = self.platform_id
        if self.session_id is not None:
            out["sessionId"] = str(self.session_id)
        if self.link is not None:
            out["link"] = self.link
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["toolCallId"] = self.tool_call_id
        if self.compacts is not None:
            out["compacts"] = str(self.compacts)
        return out


class Branch(msgspec.Struct, frozen=True, kw_only=True):
    """A branch as stored: a linear run of messages hanging under ``base_id``.

    ``leaf_id`` is its last own message (None while it has none: then its tip
    is ``base_id``, or the empty root). Numbers are stable and never reused.
    ``depth`` is the depth of its tip (0 at the empty root).
    ``session_id`` names the spawned session whose context the branch is
    (None for a branch a person made); ``continues`` the branch whose work
    it picks up (a continued sub-agent sees that branch as its context).
    """

    number: int
    id: str
    name: str
    base_id: uuid.UUID | None
    leaf_id: uuid.UUID | None = None
    count: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    depth: int = 0
    session_id: uuid.UUID | None = None
    continues: str | None = None

    @property
    def tip(self) -> uuid.UUID | None:
        """Where the branch's next message hangs: its leaf, else its fork point."""
        return self.leaf_id if self.leaf_id is not None else self.base_id


class ConversationState(msgspec.Struct, kw_only=True):
    """A conversation's bookkeeping, stored beside its messages.

    ``current`` is the current branch's id; ``next_seq`` the ``seq`` of the next
    message; ``messages`` how many it holds now; ``pending_deletes`` maps a branch
    number to the confirmation token the chat's ``/delete-branch N`` issued;
    ``rev`` counts the writes.
    """

    session_id: uuid.UUID
    branches: list[Branch]
    current: str
    next_seq: int = 0
    messages: int = 0
    next_number: int = 2
    created_at: float = 0.0
    updated_at: float = 0.0
    pending_deletes: dict[str, str] = msgspec.field(default_factory=dict)
    rev: int = 0


class BranchInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``branches()``: a branch with its tip, last message and age.

    ``message_count``: messages on its path from the root (what its context
    can see); ``own_messages``: messages appended on it; ``age_s``: seconds
    since it last changed.
    """

    number: int
    id: str
    name: str
    current: bool
    base_id: uuid.UUID | None
    leaf_id: uuid.UUID | None
    last_message: Message | None
    message_count: int
    own_messages: int
    age_s: float
    session_id: uuid.UUID | None = None


class DeletePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What ``delete_branch`` would do; ``confirm_delete(token)`` carries it out.

    ``count``: messages that go; ``kept``: messages of the branch that stay
    because another branch hangs under them; ``preview``: the first few that
    go. The token is bound to this exact plan: if the branch changes before
    the confirmation, the confirmation is refused.
    """

    number: int
    branch_id: str
    name: str
    count: int
    kept: int
    preview: list[str]
    token: str


class Merged(msgspec.Struct, frozen=True, kw_only=True):
    """What ``merge`` appended to the current branch (copies of the source's own messages)."""

    source_number: int
    source_name: str
    into_number: int
    into_name: str
    messages: list[Message]


def chat_message(
    role: str,
    content: Any,
    *,
    name: str | None = None,
    tool_calls: list[Any] | None = None,
    tool_call_id: str | None = None,
) -> dict[str, Any]:
    """A chat-completions message: its role and content, and each other field
    that is set."""
    chat: dict[str, Any] = {"role": role, "content": content}
    if name is not None:
        chat["name"] = name
    if tool_calls is not None:
        chat["tool_calls"] = tool_calls
    if tool_call_id is not None:
        chat["tool_call_id"] = tool_call_id
    return chat


def iso_timestamp(seconds: float) -> str:
    """``seconds`` since the epoch as ISO 8601 UTC with milliseconds (``…T12:00:00.000Z``)."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
