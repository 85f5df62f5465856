"""``sessiontree top``'s Textual app: the node's header, its session tree as a
table, a filter, a status line and the footer of keys.

It polls a ``TopSource`` every ``interval`` seconds on a worker thread (the
event loop never waits on the network) and draws what ``_data`` makes of
the answer. A node that does not answer or refuses is shown on the status
line, in red, and the app keeps polling: the view comes back with the node.
Every action on a session asks first (``ConfirmScreen``).

What the node says (names, states, agents, skills, error messages) is shown
as ``rich.text.Text`` of escaped text (``_text.shown``): never parsed as
markup, no control character reaching the terminal.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import click
import httpx
from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Footer, Label, Static

from sessiontree.cli._client import NodeRefused
from sessiontree.cli._text import shown
from sessiontree.cli._words import money, plural
from sessiontree.cli.top._data import (
    SORTS,
    RateMeter,
    Rates,
    Row,
    build_rows,
    header_text,
    parent_of,
)
from sessiontree.cli.top._data import human_duration as dur
from sessiontree.cli.top._source import Snapshot, TopSource

__all__ = ["ConfirmScreen", "TopApp"]

# What a poll can meet besides an answer: the node unreachable or refusing
# (click exceptions from the client), or an answer this view cannot read.
_POLL_ERRORS = (click.ClickException, httpx.HTTPError, ValueError, KeyError, TypeError)
_REFUSED_FOR_GOOD = (401, 403)  # the token: no later poll would be let in
_STATE_STYLE = {
    "active": "green",
    "pending": "cyan",
    "suspended": "yellow",
    "completed": "dim",
    "failed": "bold red",
    "expired": "red",
    "cancelled": "magenta",
}
_COLUMNS = ("session", "kind", "state", "agent/skill", "age", "ttl", "tok", "cost", "Σtok", "Σcost")


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question over the view: ``y`` or Yes confirms, ``n``, Escape or
    No declines (dismissed with True or False)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Grid {
        grid-size: 2; grid-gutter: 1 2; grid-rows: auto 3; padding: 1 2;
        width: 64; height: auto; border: thick $warning; background: $surface;
    }
    ConfirmScreen Label { column-span: 2; width: 100%; }
    ConfirmScreen Button { width: 100%; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # Enter alone never confirms

    def compose(self) -> ComposeResult:
        with Grid():
            yield Label(Text(shown(self.question)), id="question")
            yield Button("Yes (y)", variant="error", id="yes")
            yield Button("No (n)", variant="primary", id="no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class TopApp(App[None]):
    """The live view of the node behind ``source``, polled every ``interval``
    seconds, showing the subtree under ``root`` (every Main's when None).

    A node that does not answer is polled again; one that refuses the token
    (401, 403) would refuse every poll: the view exits, ``stopped`` saying why."""

    TITLE = "sessiontree top"
    CSS = """
    #header { height: 2; background: $boost; padding: 0 1; }
    #filter { display: none; height: 1; padding: 0 1; background: $primary-background; }
    #sessions { height: 1fr; }
    #where { height: 1; padding: 0 1; background: $boost; }
    #message { height: 1; padding: 0 1; }
    #message.error { color: $error; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("f", "follow", "Follow"),
        Binding("b,backspace", "up", "Up"),
        Binding("c", "control('cancel')", "Cancel"),
        Binding("t", "control('terminate')", "Terminate"),
        Binding("p", "control('suspend')", "Suspend"),
        Binding("r", "control('resume')", "Resume"),
        Binding("escape", "clear_filter", "Clear filter"),
    ]

    def __init__(self, source: TopSource, *, interval: float = 1.0, root: str | None = None):
        super().__init__()
        self.source = source
        self.interval = interval
        self.root = root
        self.sort = SORTS[0]
        self.filter_text = ""
        self.filtering = False  # the keys type the filter
        self.rows: list[Row] = []
        self.polls = 0  # successful polls drawn, for whoever waits on the view
        self.stopped: str | None = None  # why the view exited by itself
        self._snapshot: Snapshot | None = None
        self._meter = RateMeter()
        self._rates: Rates | None = None
        self._polling = False
        self._poll_failed = False  # the status line shows a failed poll
        self._select_next: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(Text(shown(f"node {self.source.url}: connecting…")), id="header")
        yield Static(id="filter")
        table: DataTable[Any] = DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
        table.add_columns(*_COLUMNS)
        yield table
        yield Static(id="where")
        yield Static(id="message")
        yield Footer()

    def on_mount(self) -> None:
        self._show_where()
        self.query_one(DataTable).focus()
        self.set_interval(self.interval, self.poll)
        self.run_worker(self.poll(), group="poll")

    @property
    def selected(self) -> str | None:
        """The id of the session under the cursor (None for an empty table)."""
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    # -- polling and drawing -------------------------------------------------------------

    async def poll(self) -> None:
        """Take one snapshot and draw it; a failure is shown, never raised. A
        snapshot of a root left while it was taken is taken again."""
        if self._polling:
            return
        self._polling = True
        try:
            while True:
                root = self.root
                try:
                    snapshot = await asyncio.to_thread(self.source.fetch, root)
                    rows = self._rows_of(snapshot)  # an answer it cannot read fails here
                except _POLL_ERRORS as exc:
                    self._poll_failed_with(exc)
                    return
                if root == self.root:
                    break
        finally:
            self._polling = False
        if self._poll_failed:
            self.say("")  # the node answers again
        if snapshot.counters is not None:
            self._rates = self._meter.update(snapshot.counters, snapshot.taken_at)
        self._snapshot = snapshot
        self.query_one("#header", Static).update(Text(header_text(snapshot.node, self._rates)))
        self._draw(rows)
        self.polls += 1

    def _poll_failed_with(self, exc: Exception) -> None:
        text = exc.format_message() if isinstance(exc, click.ClickException) else repr(exc)
        if isinstance(exc, NodeRefused) and exc.status in _REFUSED_FOR_GOOD:
            self.stopped = (
                f"top stopped: {self.source.url} refused the request ({exc.status} {text}); "
                "give the node's token with --token-file FILE (or SESSIONTREE_TOKEN_FILE)"
            )
            self.exit(return_code=1)
            return
        self.say(f"poll failed: {text} (retrying every {self.interval:g} s)", error=True)
        self._poll_failed = True

    def _rows_of(self, snapshot: Snapshot) -> list[Row]:
        return build_rows(snapshot.trees, snapshot.taken_at, text=self.filter_text, sort=self.sort)

    def _draw(self, rows: list[Row] | None = None) -> None:
        """Fill the table with ``rows`` (the last snapshot's, filtered and sorted
        anew, when None), the cursor kept on its session."""
        if self._snapshot is None:
            return
        table = self.query_one(DataTable)
        keep = self._select_next or self.selected
        self._select_next = None
        self.rows = self._rows_of(self._snapshot) if rows is None else rows
        table.clear()
        for row in self.rows:
            table.add_row(*_cells(row), key=row.session_id)
        ids = [row.session_id for row in self.rows]
        if keep in ids:
            table.move_cursor(row=ids.index(keep), animate=False)
        self._show_where()

    def _show_where(self) -> None:
        where = "all mains" if self.root is None else f"subtree of {self.root[:8]} (b: up)"
        count = plural(len(self.rows), "session") if self._snapshot is not None else "no answer yet"
        filt = f" · filter {self.filter_text!r}" if self.filter_text else ""
        line = f"{where} · sort {self.sort}{filt} · {count}"
        self.query_one("#where", Static).update(Text(shown(line)))

    def say(self, message: str, *, error: bool = False) -> None:
        """Put ``message`` on the status line (in red when ``error``)."""
        self._poll_failed = False
        line = self.query_one("#message", Static)
        line.update(Text(shown(message)))
        line.set_class(error, "error")

    # -- filter, sort, follow ------------------------------------------------------------
    # The filter is typed while the table keeps the focus: a key already queued
    # behind "/" still reaches the table, so moving the focus to an input would
    # lose a fast typist's (or a paste's) first letters, or run them as keys.

    def action_filter(self) -> None:
        self.filtering = True
        self._show_filter()
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a filter is typed only Escape (clear) acts: letters are its text."""
        return not self.filtering or action == "clear_filter"

    def on_key(self, event: events.Key) -> None:
        if not self.filtering:
            return
        if event.key == "backspace":
            self.filter_text = self.filter_text[:-1]
        elif event.is_printable and event.character:
            self.filter_text += event.character
        else:
            return
        event.stop()
        self._show_filter()
        self._draw()

    def _end_filter(self) -> None:
        self.filtering = False
        self._show_filter()
        self.refresh_bindings()

    def _show_filter(self) -> None:
        line = self.query_one("#filter", Static)
        line.display = self.filtering or bool(self.filter_text)
        hint = " (Enter: done, Esc: clear)" if self.filtering else ""
        text = f"filter: {shown(self.filter_text)}{'▏' if self.filtering else ''}{hint}"
        line.update(Text(text))

    def action_clear_filter(self) -> None:
        self.filter_text = ""
        self._end_filter()
        self._draw()

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self._draw()

    @on(DataTable.RowSelected)
    def _row_chosen(self) -> None:
        if self.filtering:  # Enter ends the filter's typing
            self._end_filter()
        else:
            self.action_follow()

    def action_follow(self) -> None:
        chosen = self.selected
        if chosen is None or chosen == self.root:
            return
        self.root = chosen
        self._select_next = chosen
        self._show_where()
        self.run_worker(self.poll(), group="poll")

    def action_up(self) -> None:
        if self.root is None:
            self.say("showing every main already")
            return
        trees = self._snapshot.trees if self._snapshot is not None else []
        parent = parent_of(trees, self.root)  # None: a Main, or not in view
        self._select_next = self.root
        self.root = None if parent is None else str(parent)
        self._show_where()
        self.run_worker(self.poll(), group="poll")

    # -- actions on the selected session -------------------------------------------------

    def action_control(self, action: str) -> None:
        chosen = self.selected
        row = next((r for r in self.rows if r.session_id == chosen), None)
        if row is None:
            self.say(f"no session selected to {action}", error=True)
            return
        what = {
            "cancel": "Cancel it and its subtree (with the node's grace)?",
            "terminate": "Terminate it and its subtree now, without grace?",
            "suspend": "Suspend it at its next checkpoint?",
            "resume": "Resume it?",
        }[action]
        question = f"{row.kind} {row.short_id} ({row.skill or row.agent}, {row.state}). {what}"

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._act(action, row.session_id), group="act")
            else:
                self.say(f"{action} {row.short_id}: not confirmed")

        self.push_screen(ConfirmScreen(question), answered)

    async def _act(self, action: str, session_id: str) -> None:
        outcome = await asyncio.to_thread(self.source.act, action, session_id)
        self.say(outcome.message, error=not outcome.ok)
        await self.poll()


def _cells(row: Row) -> tuple[Text, ...]:
    """The row's cells, each a ``Text``: a string cell would be parsed as markup."""
    who = f"{row.agent}/{row.skill}" if row.skill else row.agent
    return (
        Text(shown(f"{row.prefix}{row.short_id}")),
        Text(shown(row.kind)),
        Text(shown(row.state), style=_STATE_STYLE.get(row.state, "")),
        Text(shown(who)),
        Text(dur(row.age_s)),
        Text(dur(row.ttl_left_s)),
        Text(str(row.tokens) if row.tokens else "-"),
        Text(money(row.cost) if row.cost else "-"),
        Text(str(row.subtree_tokens) if row.subtree_tokens else "-"),
        Text(money(row.subtree_cost) if row.subtree_cost else "-"),
    )
