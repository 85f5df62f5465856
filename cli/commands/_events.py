"""``sessiontree events``: a node's events, as they come (``--follow``) or what
its ring holds now.

Reads ``GET /v1/events`` (server-sent events). A line each: the time, the
type, the session's kind, its short id, its agent, the code and the key data;
``--json`` prints each event's JSON object on a line of its own. With
``--follow`` a stream cut off for falling behind resumes at once from the
last event seen (the node says how many it no longer held); the end of the
node's stream ends the command (exit 0), and so does Ctrl-C. A node that
cannot be reached exits 69, a refused filter 1.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import click
import httpx

from sessiontree.cli._client import NODE_OPTION, NodeClient, resolve_source
from sessiontree.cli._ids import resolve_session
from sessiontree.cli._text import echo, shown

__all__ = ["SseMessage", "events_cmd", "render_event", "sse_messages"]

_KINDS = ("main", "branch", "worker")


@dataclass(frozen=True, slots=True)
class SseMessage:
    """One server-sent-events message (``comment`` set for a comment line)."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    comment: str | None = None

    def json(self) -> Any:
        return json.loads(self.data)


def sse_messages(lines: Iterable[str]) -> Iterator[SseMessage]:
    """The messages of a server-sent-events stream, given its lines (without
    their line ends); a comment is a message of its own. A field it does not
    know is ignored, as the format says."""
    event, ident = "message", None
    data: list[str] = []
    for line in lines:
        if not line:
            if data or ident is not None or event != "message":
                yield SseMessage(event=event, data="\n".join(data), id=ident)
            event, data, ident = "message", [], None
            continue
        if line.startswith(":"):
            yield SseMessage(comment=line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            ident = value


def _when(at: Any) -> str:
    try:
        moment = datetime.datetime.fromtimestamp(float(at)).astimezone()
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"
    return moment.strftime("%H:%M:%S.%f")[:-3]


def _key_data(event: dict[str, Any]) -> str:
    data: dict[str, Any] = event.get("data") or {}
    kind = event.get("type")
    if kind == "transition":
        return f"{event.get('previous')} -> {event.get('state')}"
    if kind == "spawned":
        return f"skill={data.get('skill')} under {str(event.get('parent_id') or '-')[:8]}"
    if kind == "progress":
        rest = {k: v for k, v in data.items() if k != "note"}
        return f"{data.get('note', '')} {json.dumps(rest)}" if rest else str(data.get("note", ""))
    if kind == "rejected":
        return f"{data.get('kind', '?')} under {str(event.get('parent_id'))[:8]}: " + str(
            data.get("message", "")
        )
    return " ".join(f"{k}={v}" for k, v in data.items()) if data else ""


def render_event(event: dict[str, Any]) -> str:
    """One readable line: time, type, kind, short session id, agent, code, key data."""
    sid = event.get("session_id")
    line = "  ".join(
        [
            _when(event.get("at")),
            f"{event.get('type', '?'):<17}",
            f"{event.get('kind') or '-':<6}",
            str(sid)[:8] if sid else "node    ",
            f"{event.get('agent') or '-':<10}",
            f"{event.get('code') or '-':<12}",
            _key_data(event),
        ]
    ).rstrip()
    return shown(line)  # one line, whatever the event's data holds


class _CutOffError(Exception):
    """The node cut this stream off; ``last_id`` is where to resume."""

    def __init__(self, last_id: int) -> None:
        super().__init__(last_id)
        self.last_id = last_id


def _read(
    client: NodeClient, params: dict[str, Any], last_id: int | None, as_json: bool
) -> int | None:
    """Print one stream's events; returns the last id seen (raises ``_CutOffError``)."""
    headers = None if last_id is None else {"Last-Event-ID": str(last_id)}
    with client.stream("/v1/events", params, headers) as response:
        try:
            for message in sse_messages(response.iter_lines()):
                if message.comment is not None:
                    continue
                if message.id is not None:
                    last_id = int(message.id)
                body = message.json()
                if message.event == "overflow":
                    echo(f"events: {shown(body['message'])}", err=True)
                    raise _CutOffError(int(body["last_id"]))
                if message.event in ("missed", "closed"):
                    echo(f"events: {shown(body['message'])}", err=True)
                    continue
                echo(json.dumps(body) if as_json else render_event(body))
                sys.stdout.flush()
        except httpx.TransportError as exc:
            echo(f"events: the node ended the stream ({shown(exc)})", err=True)
    return last_id


@click.command("events")
@NODE_OPTION
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they come.")
@click.option("--root", default=None, metavar="ID", help="Only this session and its descendants.")
@click.option("--agent", default=None, help="Only this agent's sessions.")
@click.option("--kind", type=click.Choice(_KINDS), default=None, help="Only this kind of session.")
@click.option(
    "--type",
    "types",
    multiple=True,
    metavar="TYPE",
    help="Only these event types (repeat, or separate with commas): spawned, transition, "
    "progress, cancel_requested, result_delivered, …",
)
@click.option(
    "--since",
    type=click.IntRange(0),
    default=None,
    metavar="ID",
    help="Start after this event number (default: the ring's oldest; with --follow: now).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def events_cmd(
    node_url: str | None,
    follow: bool,
    root: str | None,
    agent: str | None,
    kind: str | None,
    types: tuple[str, ...],
    since: int | None,
    as_json: bool,
) -> None:
    """Print a node's events: what its ring holds now, or (--follow) as they come.

    A line each: time, type, kind, short session id, agent, code, key data.
    A bad filter is refused by the node (exit 1, naming it); Ctrl-C ends it."""
    source = resolve_source(node_url)
    if root is not None:
        root = resolve_session(source, root, hint="--root")
    params: dict[str, Any] = {
        "root": root,
        "agent": agent,
        "kind": kind,
        "type": ",".join(types) or None,
        "follow": "true" if follow else "false",
    }
    if not follow:
        params["since"] = 0 if since is None else since
    last_id = None if since is None or not follow else since
    try:
        with source.client() as client:
            while True:
                try:
                    _read(client, params, last_id, as_json)
                    return
                except _CutOffError as cut:
                    last_id = cut.last_id  # resume from the ring where the cut came
    except KeyboardInterrupt:
        return
