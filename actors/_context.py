"""A session's working context: the messages its model calls send, the tool
results, its system prompt (what ``complete`` sends and records)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sessiontree.protocol import chat_message

__all__ = ["ContextMessage", "SessionContext", "copy_context"]


@dataclass
class ContextMessage:
    """One entry of a session's working context, as a chat-completions message
    has it: an assistant's ``tool_calls``, a tool result's ``tool_call_id``."""

    role: str
    content: Any
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def as_chat(self) -> dict[str, Any]:
        """This message in the chat-completions format."""
        return chat_message(
            self.role,
            self.content,
            name=self.name,
            tool_calls=self.tool_calls,
            tool_call_id=self.tool_call_id,
        )


@dataclass
class SessionContext:
    """A session's working context: its messages, tool results and system prompt."""

    system_prompt: str = ""
    messages: list[ContextMessage] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)


def copy_context(context: SessionContext) -> SessionContext:
    """A copy of ``context`` that later appends to ``context`` do not reach (its
    messages are shared: the runtime only ever appends to a context)."""
    return SessionContext(
        system_prompt=context.system_prompt,
        messages=list(context.messages),
        tool_results=list(context.tool_results),
    )
