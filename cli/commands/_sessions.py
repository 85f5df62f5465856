"""``sessiontree sessions ls|show|tree|results|spawn|send|cancel|terminate|suspend|resume|wait``.

Read commands (``ls``, ``show``, ``tree``, ``results``) work against a
running node or read-only straight from a store directory (also while a
node runs); commands that change something need a node. Where they read is
decided by ``_client.resolve_source``: ``--node``/``--store`` flags, then
``SESSIONTREE_NODE``/``SESSIONTREE_STORE``, then the node at
``http://127.0.0.1:8470``. A session is named by its id or a unique prefix
of it (``_ids``). ``--json`` prints only JSON on stdout (instants as ISO
8601 in UTC); logs and progress go to stderr. What sessions hold (tasks,
summaries, errors, keys) is printed escaped (``_text.shown``): one line
each, no control character reaching the terminal.

Exit codes: 0 done; 1 the node or store refused (one line on stderr names
the code and field), or ``wait`` timed out; 2 a usage error (an id prefix
that matches no session or several); 69 no node answered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from sessiontree.cli._client import NODE_OPTION, STORE_OPTION, resolve_source
from sessiontree.cli._describe import describe, draw_tree, session_line
from sessiontree.cli._ids import node_candidates, resolve_id
from sessiontree.cli._paging import page_of
from sessiontree.cli._text import echo, shown, shown_block
from sessiontree.cli._times import iso_times
from sessiontree.cli._words import plural
from sessiontree.protocol import (
    MAX_REASON_CHARS,
    Budget,
    RejectedInputError,
    SessionKind,
    SessionState,
    plain_input,
)

__all__ = ["sessions"]

F = TypeVar("F", bound=Callable[..., Any])

_JSON = click.option(
    "--json", "as_json", is_flag=True, help="Only JSON on stdout (times as ISO 8601, UTC)."
)
_SESSION = click.argument("session")


def _read_source(func: F) -> F:
    return NODE_OPTION(STORE_OPTION(func))


def _echo_json(value: Any) -> None:
    echo(json.dumps(value, sort_keys=True))


def _fetch(node_url: str | None, store_dir: Path | None, session: str, tail: str) -> Any:
    """What a read command shows of ``session`` (an id or a unique prefix):
    ``GET /v1/sessions/{id}{tail}`` on the node, or the same read from the store."""
    source = resolve_source(node_url, store_dir)
    if source.node_url is not None:
        with source.client() as client:
            sid = resolve_id(session, node_candidates(client))
            return client.get(f"/v1/sessions/{sid}{tail}")
    assert source.store_dir is not None
    from sessiontree.cli import _stored  # noqa: PLC0415 - the store and runtime, only here

    read = {"": _stored.stored_view, "/tree": _stored.stored_tree}.get(tail, _stored.stored_results)
    return _stored.fetch_stored(source.store_dir, session, read)


def _act(node_url: str | None, session: str, action: str, body: Any = None) -> Any:
    """``POST /v1/sessions/{id}/{action}`` on the node, ``session`` an id or a
    unique prefix."""
    with resolve_source(node_url).client() as client:
        sid = resolve_id(session, node_candidates(client))
        return client.post(f"/v1/sessions/{sid}/{action}", body)


@click.group("sessions")
def sessions() -> None:
    """List, inspect, draw, spawn, message, cancel, terminate, suspend, resume and wait
    on sessions.

    SESSION is a session's id or a unique prefix of it (the short ids 'ls' and
    'tree' print). Reads go to --node URL or --store DIR, else SESSIONTREE_NODE,
    else SESSIONTREE_STORE, else the node at http://127.0.0.1:8470.
    """


@sessions.command("ls")
@_read_source
@click.option(
    "--state",
    type=click.Choice([s.value for s in SessionState]),
    default=None,
    help="Only sessions in this state.",
)
@click.option(
    "--kind",
    type=click.Choice([k.value for k in SessionKind]),
    default=None,
    help="Only sessions of this kind.",
)
@click.option("--agent", default=None, help="Only this agent's sessions.")
@click.option("--skill", default=None, help="Only sessions this skill runs.")
@click.option("--key", default=None, help="Only sessions with this session key.")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="At most this many sessions (one page).",
)
@click.option(
    "--cursor",
    default=None,
    metavar="CURSOR",
    help="Start after this cursor (the one the previous page printed).",
)
@click.option(
    "--stuck",
    is_flag=True,
    help="Only sessions the node flagged as stuck (no checkpoint for stuck_after); needs a node.",
)
@click.option(
    "--wedged",
    is_flag=True,
    help="Only sessions holding work recovery held back (see 'sessiontree wedged ls').",
)
@_JSON
def ls_cmd(
    node_url: str | None,
    store_dir: Path | None,
    state: str | None,
    kind: str | None,
    agent: str | None,
    skill: str | None,
    key: str | None,
    limit: int,
    cursor: str | None,
    stuck: bool,
    wedged: bool,
    as_json: bool,
) -> None:
    """One page of sessions, oldest first (by creation, then id).

    When more follow, the cursor of the next page is printed on stderr (with
    --json: "next_cursor" in the object, null on the last page).
    """
    source = resolve_source(node_url, store_dir)
    marks = {"stuck": stuck, "wedged": wedged}
    if source.node_url is not None:
        with source.client() as client:
            page = client.get(
                "/v1/sessions",
                state=state,
                kind=kind,
                agent=agent,
                skill=skill,
                key=key,
                limit=limit,
                cursor=cursor,
                **{name: "true" for name, on in marks.items() if on},
            )
        infos, next_cursor = page["items"], page["next_cursor"]
    else:
        assert source.store_dir is not None
        _store_marks(marks)
        from sessiontree.cli._stored import stored_rows, stored_wedged  # noqa: PLC0415

        held = stored_wedged(source.store_dir) if wedged else None
        matching = (
            row["info"]
            for row in stored_rows(source.store_dir)
            if (held is None or row["info"]["session_id"] in held)
            and (state is None or row["info"]["state"] == state)
            and (kind is None or row["info"]["kind"] == kind)
            and (agent is None or row["info"]["agent_id"] == agent)
            and (skill is None or row["info"]["skill"] == skill)
            and (key is None or row["info"]["key"] == key)
        )
        infos, next_cursor = page_of(matching, limit, cursor)
    if as_json:
        _echo_json({"items": iso_times(infos), "next_cursor": next_cursor})
        return
    now = time.time()
    for info in infos:
        echo(shown(session_line(info, None, now)))
    more = f"; more after: --cursor {shown(next_cursor)}" if next_cursor else ""
    echo(f"{plural(len(infos), 'session')}{more}", err=True)


#: Marks ``ls`` filters on (``--stuck``: the API's ``stuck=true``) that only a
#: running node knows, with why a store cannot answer them.
_LIVE_MARKS = {
    "stuck": "stuck is what a running node sees (a skill with no checkpoint for its "
    "stuck_after) and no store records it",
}


def _store_marks(marks: dict[str, bool]) -> None:
    """Refuse (a usage error) a mark ``ls --store`` cannot read from a store."""
    for name, on in marks.items():
        if on and name in _LIVE_MARKS:
            msg = f"--{name} needs --node: {_LIVE_MARKS[name]}"
            raise click.UsageError(msg)


@sessions.command("show")
@_read_source
@_SESSION
@_JSON
def show_cmd(node_url: str | None, store_dir: Path | None, session: str, as_json: bool) -> None:
    """One session: who it is and where it stands, its result and failure (with
    its stack trace), its usage and its budget."""
    view = _fetch(node_url, store_dir, session, "")
    if as_json:
        _echo_json(iso_times(view))
        return
    for line in describe(view, time.time()):
        echo(line)


@sessions.command("tree")
@_read_source
@_SESSION
@_JSON
def tree_cmd(node_url: str | None, store_dir: Path | None, session: str, as_json: bool) -> None:
    """Draw the subtree under SESSION: kind, state, short id, when each was
    created and the time left to its TTL."""
    tree = _fetch(node_url, store_dir, session, "/tree")
    if as_json:
        _echo_json(iso_times(tree))
        return
    for line in draw_tree(tree, time.time()):
        echo(line)


@sessions.command("results")
@_read_source
@_SESSION
@_JSON
def results_cmd(node_url: str | None, store_dir: Path | None, session: str, as_json: bool) -> None:
    """The results SESSION received from its children, oldest first."""
    found = _fetch(node_url, store_dir, session, "/results")
    if as_json:
        _echo_json(iso_times(found))
        return
    if not found:
        echo("no results received")
    for result in found:
        error = result.get("error")
        tail = f"  [{error['code']}]" if error else ""
        summary = f"  {result['summary']}" if result.get("summary") else ""
        head = f"{result['kind']:<6} {result['status']:<9} {result['session_id'][:8]}"
        echo(shown(f"{head}{tail}{summary}"))


@sessions.command("spawn")
@NODE_OPTION
@click.option("--agent", default=None, help="Open (get or create) this agent's Main.")
@click.option(
    "--key",
    default="internal:main:main",
    show_default=True,
    help="With --agent: the Main's session key.",
)
@click.option(
    "--parent",
    default=None,
    metavar="SESSION",
    help="Spawn a child under this session (an id or a unique prefix) instead.",
)
@click.option(
    "--kind",
    type=click.Choice(["branch", "worker"]),
    default="worker",
    show_default=True,
    help="With --parent: the child's kind.",
)
@click.option("--task", default="", help="The child's task.")
@click.option("--context", "context_summary", default="", help="The child's context_summary.")
@click.option("--skill", default=None, help="Which of the agent's skills runs it.")
@click.option("--ttl", type=float, default=None, help="Seconds (default: the kind's).")
@click.option("--request-id", default=None, help="Idempotency key under the parent.")
@click.option(
    "--input",
    "input_json",
    default=None,
    metavar="JSON",
    help="Structured input for the child (session.input), as a JSON document.",
)
@click.option(
    "--budget",
    default=None,
    metavar="NAME=N,...",
    help="What the child's subtree may spend: any of tokens, cost, calls, descendants "
    "(and soft, the fraction that warns), e.g. calls=5,tokens=20000,cost=0.5.",
)
@click.option(
    "--tier",
    default=None,
    metavar="TIER",
    help="The child's model tier (default: a branch inherits its parent's, a worker "
    "takes the agent's default).",
)
@_JSON
def spawn_cmd(
    node_url: str | None,
    agent: str | None,
    key: str,
    parent: str | None,
    kind: str,
    task: str,
    context_summary: str,
    skill: str | None,
    ttl: float | None,
    request_id: str | None,
    input_json: str | None,
    budget: str | None,
    tier: str | None,
    as_json: bool,
) -> None:
    """Open a Main (--agent) or spawn a child (--parent); prints the new session."""
    if (agent is None) == (parent is None):
        raise click.UsageError("give exactly one of --agent (a Main) or --parent (a child)")
    for name, given in (("--input", input_json), ("--budget", budget), ("--tier", tier)):
        if given is not None and parent is None:
            raise click.UsageError(f"{name} goes with --parent (it is a child's)")
    child_input = None if input_json is None else _input_option(input_json)
    bounds = None if budget is None else parse_budget(budget)
    with resolve_source(node_url).client() as client:
        if agent is not None:
            made = client.post("/v1/sessions", {"agent_id": agent, "key": key})
        else:
            spec: dict[str, Any] = {"kind": kind, "task": task, "context_summary": context_summary}
            optional = {
                "skill": skill,
                "ttl": ttl,
                "request_id": request_id,
                "input": child_input,
                "budget": bounds,
                "model_tier": tier,
            }
            spec.update({k: v for k, v in optional.items() if v is not None})
            sid = resolve_id(str(parent), node_candidates(client), hint="--parent")
            made = client.post(f"/v1/sessions/{sid}/children", spec)
    if as_json:
        _echo_json(iso_times(made))
        return
    info = made["info"]
    echo(shown(f"{info['kind']} {info['session_id']} {info['state']}"))


#: The dimensions of a ``Budget`` and the type of each bound.
_BUDGET_FIELDS: dict[str, type[int] | type[float]] = {
    "tokens": int,
    "cost": float,
    "calls": int,
    "descendants": int,
    "soft": float,
}


def parse_budget(text: str) -> dict[str, int | float]:
    """``--budget calls=5,tokens=20000`` as the API's ``budget`` object, checked
    as the node checks a ``Budget`` (no negative, NaN or infinite bound).
    ``click.BadParameter`` (exit 2) naming ``--budget`` and the part at fault."""
    bounds: dict[str, int | float] = {}
    for part in text.split(","):
        name, sep, value = (p.strip() for p in part.partition("="))
        kind = _BUDGET_FIELDS.get(name)
        if not sep or kind is None:
            known = ", ".join(_BUDGET_FIELDS)
            msg = f"{part.strip()!r} is not NAME=NUMBER with NAME one of {known}"
            raise click.BadParameter(msg, param_hint="--budget")
        if name in bounds:
            raise click.BadParameter(f"{name} is given twice", param_hint="--budget")
        try:
            number = kind(value)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            msg = f"{name}={value!r}: {name} must be {what}"
            raise click.BadParameter(msg, param_hint="--budget") from None
        bounds[name] = number
    try:
        msgspec.convert(bounds, Budget)
    except (msgspec.ValidationError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--budget") from None
    return bounds


def _json_option(name: str, text: str) -> Any:
    """The JSON document an option holds; a usage error naming the option if it is not one."""
    try:
        return json.loads(text)
    except ValueError as exc:
        msg = f"{name} must be a JSON document: {exc}"
        raise click.BadParameter(msg, param_hint=name) from exc


def _input_option(text: str) -> Any:
    """``--input``'s JSON document, checked as the node checks a spawn's input
    (a NaN or infinity, which JSON cannot carry, is refused here): one line
    naming the field, as the node's refusal reads, and exit 1."""
    value = _json_option("--input", text)
    try:
        plain_input(value)
    except RejectedInputError as exc:
        raise click.ClickException(f"{exc.code.value}: {exc} (field {exc.field})") from exc
    return value


@sessions.command("send")
@NODE_OPTION
@_SESSION
@click.argument("message")
@_JSON
def send_cmd(node_url: str | None, session: str, message: str, as_json: bool) -> None:
    """Send a Main MESSAGE (JSON if it parses as JSON, else the text)."""
    try:
        payload: Any = json.loads(message)
    except ValueError:
        payload = message
    view = _act(node_url, session, "messages", {"message": payload})
    if as_json:
        _echo_json(iso_times(view))
    else:
        echo(shown(f"sent to {view['info']['session_id']} ({view['info']['state']})"))


def _done(name: str, view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _echo_json(iso_times(view))
        return
    info = view["info"]
    error = (view.get("result") or {}).get("error")
    ended = f", {error['code']}" if error else ""
    echo(shown(f"{name}: {info['session_id']} ({info['state']}{ended})"))


_REASON = click.option(
    "--reason",
    default=None,
    metavar="TEXT",
    help=f"Who or why (at most {MAX_REASON_CHARS} characters): recorded on the subtree's "
    "cancel_requested events and in their results' error detail.",
)


@sessions.command("cancel")
@NODE_OPTION
@_SESSION
@click.option(
    "--grace",
    type=click.FloatRange(0.0),
    default=None,
    metavar="S",
    help="Seconds the subtree has to wrap up before what still runs is ended by force "
    "(default: the node's grace; 0 is 'terminate'). A second cancel may shorten it.",
)
@_REASON
@_JSON
def cancel_cmd(
    node_url: str | None, session: str, grace: float | None, reason: str | None, as_json: bool
) -> None:
    """Cancel SESSION and its subtree (one grace deadline for all)."""
    body = {k: v for k, v in {"grace": grace, "reason": _reason(reason)}.items() if v is not None}
    _done("cancel requested", _act(node_url, session, "cancel", body), as_json)


@sessions.command("terminate")
@NODE_OPTION
@_SESSION
@_REASON
@_JSON
def terminate_cmd(node_url: str | None, session: str, reason: str | None, as_json: bool) -> None:
    """End SESSION and its subtree at once, with no grace: what still runs ends
    cancelled with terminated_by_force."""
    body = {} if reason is None else {"reason": _reason(reason)}
    _done("terminated", _act(node_url, session, "terminate", body), as_json)


def _reason(text: str | None) -> str | None:
    """``--reason`` as sent; a usage error naming it when it is too long."""
    if text is not None and len(text) > MAX_REASON_CHARS:
        msg = f"{len(text)} characters, more than {MAX_REASON_CHARS}"
        raise click.BadParameter(msg, param_hint="--reason")
    return text


@sessions.command("suspend")
@NODE_OPTION
@_SESSION
@_JSON
def suspend_cmd(node_url: str | None, session: str, as_json: bool) -> None:
    """Suspend a Branch at its next checkpoint."""
    _done("suspend requested", _act(node_url, session, "suspend"), as_json)


@sessions.command("resume")
@NODE_OPTION
@_SESSION
@_JSON
def resume_cmd(node_url: str | None, session: str, as_json: bool) -> None:
    """Resume a suspended Branch."""
    _done("resume requested", _act(node_url, session, "resume"), as_json)


@sessions.command("wait")
@NODE_OPTION
@_SESSION
@click.option(
    "--timeout",
    type=click.FloatRange(0.0),
    default=300.0,
    show_default=True,
    help="Give up (exit 1) after this many seconds.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@_JSON
def wait_cmd(
    node_url: str | None, session: str, timeout: float, quiet: bool, as_json: bool
) -> None:
    """Wait for SESSION to end and print its result (exit 1 if --timeout passes first).

    Progress (elapsed time and state) is shown on stderr while waiting.
    """
    started = time.monotonic()
    with resolve_source(node_url).client() as client:
        sid = resolve_id(session, node_candidates(client))
        while True:
            left = timeout - (time.monotonic() - started)
            answer = client.wait(sid, max(0.0, min(left, 10.0)))
            if answer["done"]:
                break
            if time.monotonic() - started >= timeout:
                if not quiet:
                    echo("", err=True)
                raise click.ClickException(f"session {sid} still runs after {timeout:g} s")
            if not quiet:
                state = client.get(f"/v1/sessions/{sid}")["info"]["state"]
                elapsed = time.monotonic() - started
                line = f"waiting for {sid[:8]}: {shown(state)}, {elapsed:.0f} s"
                # its own carriage return redraws the line: the one raw control character
                click.echo(f"\r{line}", err=True, nl=False)  # noqa: TID251
    if not quiet and time.monotonic() - started > 10.0:
        echo("", err=True)
    result = answer["result"]
    if as_json:
        _echo_json(iso_times(result))
        return
    error = result.get("error")
    tail = f" [{error['code']}] {error['message']}" if error else ""
    echo(shown(f"{result['status']}{tail}"))
    if result.get("summary"):
        echo(shown_block(result["summary"]))
