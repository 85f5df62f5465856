"""What ``session.complete`` sends and what it records (issue 20).

By default a call sends the session's context as chat messages: one system
message (the system prompt and the ``context_summary``), then the context's
messages, then the prompt as a user message. The prompt and the reply
(with its tool calls) are recorded in the context, so the next call sees
them and a skill can run a tool-calling loop with ``add_tool_result``.

Both an inline session (its ``SessionCore``) and a remote step (its
``RemoteSession``, whose context is its own, for the step) build their calls
here: anything with a ``context`` and an ``info`` (:class:`Caller`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import msgspec

from sessiontree.actors._context import ContextMessage, SessionContext
from sessiontree.actors._conversing import ContextEntry, LinkedContext
from sessiontree.actors._host import ModelCall
from sessiontree.protocol import Completion, RejectedInputError, Role, SessionInfo, as_json

__all__ = ["Caller", "as_entries", "exchanged", "model_call", "record_exchange", "tool_result"]


class Caller(Protocol):
    """Whose call it is: a working context and the session's identity."""

    @property
    def context(self) -> SessionContext: ...

    @property
    def info(self) -> SessionInfo: ...


#: Request fields the runtime sets itself: a skill's value would be ignored or unsafe.
_OWN = frozenset({"messages", "model", "stream", "max_tokens", "max_completion_tokens", "n"})


def model_call(
    core: Caller,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    max_tokens: int | None,
    model: str | None,
    stream: bool,
    options: dict[str, Any],
    history: LinkedContext | None = None,
) -> ModelCall:
    """The call to send; ``RejectedInputError`` naming the field for a bad
    argument (nothing is sent or recorded then). ``history``: the session's
    context branch, sent in place of its working context's messages."""
    if prompt is not None and not isinstance(prompt, str):
        msg = f"prompt must be a string, got {type(prompt).__name__}"
        raise RejectedInputError(msg, field="prompt")
    if max_tokens is not None and (
        type(max_tokens) is not int or max_tokens < 0  # bool is not a count
    ):
        msg = f"max_tokens must be None or an integer >= 0, got {max_tokens!r}"
        raise RejectedInputError(msg, field="max_tokens")
    if model is not None and (not isinstance(model, str) or not model):
        msg = f"model must be None or a model name, got {model!r}"
        raise RejectedInputError(msg, field="model")
    hedge_after = options.pop("hedge_after", None)
    if hedge_after is not None and (
        not isinstance(hedge_after, int | float)
        or isinstance(hedge_after, bool)
        or not math.isfinite(hedge_after)
        or hedge_after < 0
    ):
        msg = f"hedge_after must be None or a number of seconds >= 0, got {hedge_after!r}"
        raise RejectedInputError(msg, field="hedge_after")
    if hedge_after is not None and stream:
        msg = "a streamed call cannot be hedged (two streams would reach the progress)"
        raise RejectedInputError(msg, field="hedge_after")
    for name in options:
        if name in _OWN:
            msg = f"complete() sets {name!r} itself; pass it as its own argument"
            raise RejectedInputError(msg, field=name)
    sent = {name: as_json(name, value) for name, value in options.items() if value is not None}
    if messages is None:
        chat = _context(core, history)
    elif not isinstance(messages, list):
        raise RejectedInputError("messages must be a list of chat messages", field="messages")
    else:
        chat = [_checked(i, m) for i, m in enumerate(as_json("messages", messages))]
    if prompt is not None:
        chat.append({"role": "user", "content": prompt})
    if not chat:
        raise RejectedInputError("nothing to send: no prompt and no context", field="prompt")
    after = None if hedge_after is None else float(hedge_after)
    return ModelCall(tuple(chat), sent, max_tokens, model, bool(stream), after)


def _context(core: Caller, history: LinkedContext | None) -> list[dict[str, Any]]:
    context = core.context
    system = "\n\n".join(
        part for part in (context.system_prompt, core.info.context_summary) if part
    )
    chat = [{"role": "system", "content": system}] if system else []
    if history is not None:
        chat.extend(history.history())
    else:
        chat.extend(m.as_chat() for m in context.messages)
    return chat


def _checked(index: int, message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        msg = f"messages[{index}] must be a chat message with a 'role', got {message!r}"
        raise RejectedInputError(msg, field=f"messages[{index}]")
    return message


def exchanged(prompt: str | None, completion: Completion) -> list[ContextMessage]:
    """The prompt and the reply as context messages (none when there is no
    reply: a refused or failed call leaves the context as it was)."""
    if completion.text is None and not completion.tool_calls:
        return []
    messages = [] if prompt is None else [ContextMessage("user", prompt)]
    calls = [dict(call) for call in completion.tool_calls] or None
    messages.append(ContextMessage("assistant", completion.text, tool_calls=calls))
    return messages


def record_exchange(core: Caller, prompt: str | None, completion: Completion) -> None:
    """Append the prompt and the reply to the working context."""
    core.context.messages.extend(exchanged(prompt, completion))


def as_entries(messages: list[ContextMessage]) -> list[ContextEntry]:
    """Context messages as a context branch writes them; ``RejectedInputError``
    naming ``role`` for a role a conversation does not know."""
    entries: list[ContextEntry] = []
    for m in messages:
        if m.role not in _ROLES:
            msg = f"role {m.role!r} must be one of {', '.join(_ROLES)}"
            raise RejectedInputError(msg, field="role")
        entries.append((Role(m.role), m.content, m.tool_calls, m.name, m.tool_call_id))
    return entries


_ROLES = tuple(role.value for role in Role)


def tool_result(tool_call_id: str, content: Any, name: str | None) -> ContextMessage:
    """A tool's answer to one tool call, as the context records it (content
    that is not a string is sent as its JSON text)."""
    if not isinstance(tool_call_id, str) or not tool_call_id:
        msg = f"tool_call_id must be the id of a tool call, got {tool_call_id!r}"
        raise RejectedInputError(msg, field="tool_call_id")
    if not isinstance(content, str):
        content = msgspec.json.encode(as_json("content", content)).decode()
    return ContextMessage("tool", content, name, tool_call_id=tool_call_id)
