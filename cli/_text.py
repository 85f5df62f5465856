"""Text from outside made safe to print on a terminal (issue 38).

Tasks, summaries, error messages, session keys, branch names, message
contents — whatever a node or a store holds came from a client or a model,
and a terminal acts on control characters: ``\\x1b]0;…\\x07`` retitles its
window, ``\\x1b[31m`` colours what follows, ``\\r`` and newlines forge
lines and break tables. So the CLI prints such text through these:

- ``shown(value)``: one line, for a field of a table or a sentence: every
  control character (C0, DEL, C1) written visibly as ``\\x1b``, ``\\x07``…
  (``\\n``, ``\\r``, ``\\t`` as those two characters), and the Unicode
  bidirectional controls and line separators as ``\\u202e``…;
- ``shown_block(text)``: the same with newlines and tabs kept, for text
  printed on lines of its own (a reply, a summary, an export);
- ``echo``: what every command prints goes through it (``click.echo`` is
  banned elsewhere in ``cli``): a control character still left is written
  as a JSON escape (``\\u001b``), so a JSON document stays exact and no
  text reaches the terminal raw, whatever a command forgot; newlines and
  tabs are kept;
- ``SafeFormatter``: the same for log records on stderr.

Markup is the other half on ``sessiontree top`` (Rich, Textual): its
strings go into ``rich.text.Text`` objects, never parsed as markup.
"""

from __future__ import annotations

import logging
from typing import Any

import click

__all__ = ["SafeFormatter", "echo", "shown", "shown_block", "terminal_safe"]

_CONTROLS = [*range(0x20), *range(0x7F, 0xA0)]  # C0, DEL, C1
# bidirectional embeddings, overrides, isolates and marks; line and paragraph separators
_FORMATS = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
_NAMED = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}

_ONE_LINE = {
    **{c: f"\\x{c:02x}" for c in _CONTROLS},
    **_NAMED,
    **{c: f"\\u{c:04x}" for c in _FORMATS},
}
_BLOCK = {c: text for c, text in _ONE_LINE.items() if c not in (0x0A, 0x09)}
_SAFETY = {c: f"\\u{c:04x}" for c in (*_CONTROLS, *_FORMATS) if c not in (0x0A, 0x09)}


def shown(value: Any) -> str:
    """``value`` as text on one line, every control character visible (see the
    module's docstring); None is ``""``."""
    return "" if value is None else str(value).translate(_ONE_LINE)


def shown_block(value: Any) -> str:
    """``value`` as text whose newlines and tabs are kept, every other control
    character visible; None is ``""``."""
    return "" if value is None else str(value).translate(_BLOCK)


def terminal_safe(text: str) -> str:
    """``text`` with every control character but newline and tab written as a
    JSON escape (``\\u001b``): what ``echo`` prints."""
    return text.translate(_SAFETY)


def echo(message: Any = "", *, err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of ``message`` made terminal-safe (``terminal_safe``)."""
    click.echo(terminal_safe(str(message)), err=err, nl=nl)  # noqa: TID251 - the one place


class SafeFormatter(logging.Formatter):
    """A log record's line (and its traceback) made terminal-safe: a task or a
    message quoted in a log line cannot drive the terminal either."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))
