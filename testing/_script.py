"""What a stand-in reply is made of: token counting, scripted replies and tool
calls, faults, and the snapshot of what the server counted.

Everything here is plain data and pure functions, safe from any thread.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# --- tokens ------------------------------------------------------------------------


def count_tokens(text: str) -> int:
    """The stand-in's token count of ``text``: its whitespace-separated words."""
    return len(text.split())


def content_text(content: object) -> str:
    """A message's text: a string, or the ``text`` of each part of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _tool_call_words(calls: object) -> int:
    """Words of the names and arguments of chat-format ``tool_calls``."""
    if not isinstance(calls, list):
        return 0
    total = 0
    for call in calls:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        if isinstance(function, Mapping):
            total += count_tokens(str(function.get("name", "")))
            total += count_tokens(str(function.get("arguments", "")))
    return total


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The ``prompt_tokens`` the stand-in reports for ``messages``: per message
    1 + the words of its text + the words of its tool calls."""
    return sum(
        1 + count_tokens(content_text(m.get("content"))) + _tool_call_words(m.get("tool_calls"))
        for m in messages
    )


def completion_tokens(text: str, tool_calls: Sequence[ToolCall] = ()) -> int:
    """The ``completion_tokens`` of a reply: the words of its text and of each
    tool call's name and arguments."""
    return count_tokens(text) + sum(call.tokens for call in tool_calls)


# --- replies and faults ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call a scripted reply makes: the function's name and its arguments
    (a mapping is sent as compact JSON with sorted keys, a string as it is)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        """The arguments as the wire carries them (a JSON string)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments), sort_keys=True, separators=(", ", ": "))

    @property
    def tokens(self) -> int:
        """This call's share of ``completion_tokens``."""
        return count_tokens(self.name) + count_tokens(self.arguments_json)


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted reply: its text and, if the request offers ``tools``, the tool
    calls it makes (its finish reason is then ``"tool_calls"``)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class FaultKind(enum.StrEnum):
    """What a :class:`Fault` does to one chat-completions request."""

    RATE_LIMIT = "rate_limit"  # 429 with Retry-After: <retry_after> seconds
    SERVER_ERROR = "server_error"  # 500 with an error body
    SLOW = "slow"  # wait <delay> s before the headers, <chunk_delay> s between chunks
    DROP = "drop"  # read the request, close the connection without a byte
    DROP_MID_REPLY = "drop_mid_reply"  # headers and <after_chunks> chunks, then close
    INVALID_JSON = "invalid_json"  # 200, application/json, a body that is not JSON
    MISSING_CHOICES = "missing_choices"  # 200, valid JSON without `choices`
    NO_USAGE = "no_usage"  # a normal reply that reports no usage


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault for one request. ``retry_after`` (seconds) is for ``RATE_LIMIT``;
    ``delay`` and ``chunk_delay`` (seconds) for ``SLOW``; ``after_chunks`` (how
    many stream chunks, or for a non-streamed reply whether half the body, go
    out before the close) for ``DROP_MID_REPLY``."""

    kind: FaultKind
    retry_after: int = 1
    delay: float = 0.0
    chunk_delay: float = 0.0
    after_chunks: int = 1

    @classmethod
    def parse(cls, header: str) -> Fault:
        """A fault from an ``x-standin-fault`` header: ``kind[;name=value]...``.

        Raises ``ValueError`` naming the part that is not understood."""
        kind, *params = (part.strip() for part in header.split(";"))
        values: dict[str, Any] = {}
        for param in params:
            name, sep, value = param.partition("=")
            if not sep or name not in {"retry_after", "delay", "chunk_delay", "after_chunks"}:
                raise ValueError(f"x-standin-fault: unknown parameter {param!r}")
            values[name] = float(value) if "delay" in name else int(value)
        return cls(FaultKind(kind), **values)


@dataclass(frozen=True, slots=True)
class StandinStats:
    """A consistent snapshot of what a :class:`StandinServer` counted."""

    requests_received: int
    completions_served: int
    prompt_tokens_served: int
    completion_tokens_served: int
    disconnects: int

    @property
    def tokens_served(self) -> int:
        """Prompt plus completion tokens of every reply that reported usage."""
        return self.prompt_tokens_served + self.completion_tokens_served
