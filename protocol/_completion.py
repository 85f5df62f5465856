"""What a model call answers: ``Completion`` (issue 20).

A refused or failed call is a ``Completion`` too, with ``error`` set
(``budget_exhausted``, ``budget_unenforceable``, ``model_error``…), never an
exception the skill did not ask for. Tool calls keep the chat-completions
format (``{"id", "type": "function", "function": {"name", "arguments"}}``),
so a skill hands them to its tools and answers with ``add_tool_result``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sessiontree.protocol._errors import ErrorInfo
from sessiontree.protocol._usage import Usage

__all__ = ["Completion"]


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """One model call's reply: its ``text`` (None when the model only called
    tools), its ``tool_calls``, why it stopped (``finish_reason``: ``stop``,
    ``length``, ``tool_calls``…), the ``model`` that answered, the ``usage``
    the provider reported (priced), and ``max_tokens``, the completion tokens
    the call was allowed (the skill's, capped to what the budgets left).
    ``error`` says why there is no reply, or why the reply cannot be trusted
    (a reply without usage keeps its text and is counted at its worst case)."""

    text: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    finish_reason: str | None = None
    model: str = ""
    usage: Usage = Usage()
    max_tokens: int | None = None
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        """True when the model replied and the reply was accounted for."""
        return self.error is None

    @property
    def message(self) -> dict[str, Any]:
        """The reply as a chat-completions assistant message."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [dict(call) for call in self.tool_calls]
        return message
