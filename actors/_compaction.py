"""Compaction: a long context's oldest messages replaced by one summary.

An agent's ``Compaction`` says when (a model call of a spawned session's
context sent ``at_tokens`` prompt tokens or more) and how (a function of the
old messages, or by default a model call that summarises them). The
session runs it before its next model call; the summary is a message on
its branch that stands for everything up to the message it ``compacts``,
and the context walk starts at it. The originals stay in the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessiontree.protocol import Completion

__all__ = ["SUMMARY_REQUEST", "Compaction", "summary_call"]

#: What the default compactor asks the model, after the messages to summarise.
SUMMARY_REQUEST = (
    "Summarise the conversation above in a few sentences for whoever continues "
    "it: keep the facts, the decisions and the open questions."
)


@dataclass(frozen=True, slots=True)
class Compaction:
    """When and how a Branch's or Worker's context is compacted (``Agent.compaction``).

    Once a model call sends ``at_tokens`` prompt tokens or more, the session's
    next call first replaces every message of its context but the last
    ``keep`` by one summary: ``summarise(messages)`` when given (a function
    of the chat messages, run on the skill's thread or loop, returning the
    summary's text; a raise fails the call like any skill error), else a
    model call that asks for one, budgeted like any call (a refused or
    failed one leaves the context as it was). ``ValueError`` names a bad
    field.
    """

    at_tokens: int
    keep: int = 4
    summarise: Callable[[list[dict[str, Any]]], str] | None = None

    def __post_init__(self) -> None:
        if type(self.at_tokens) is not int or self.at_tokens < 1:
            msg = f"Compaction.at_tokens must be an integer >= 1, got {self.at_tokens!r}"
            raise ValueError(msg)
        if type(self.keep) is not int or self.keep < 0:
            msg = f"Compaction.keep must be an integer >= 0, got {self.keep!r}"
            raise ValueError(msg)
        if self.summarise is not None and not callable(self.summarise):
            msg = f"Compaction.summarise must be callable, got {self.summarise!r}"
            raise ValueError(msg)

    def due(self, completion: Completion) -> bool:
        """Whether ``completion``'s call was long enough to compact before the next."""
        return completion.usage.prompt_tokens >= self.at_tokens


def summary_call(old: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages the default compactor sends: the old ones, then the request."""
    return [*old, {"role": "user", "content": SUMMARY_REQUEST}]
