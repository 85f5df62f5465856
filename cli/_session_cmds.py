"""``sessiontree sessions ls|show|tree|results|spawn|send|cancel|terminate|suspend|resume|wait``.

Read commands (``ls``, ``show``, ``tree``, ``results``) work against a
running node or read-only straight from a store directory (also while a
node runs); commands that change something need a node. Where they read is
decided by ``_client.resolve_source``: ``--node``/``--store`` flags, then
``SESSIONTREE_NODE``/``SESSIONTREE_STORE``, then the node at
``http://127.0.0.1:8470``. A session is named by its id or a unique prefix
of it (``_ids``). ``--json`` prints only JSON on stdout (instants as ISO
8601 in UTC); logs and progress go to stderr.

Exit codes: 0 done; 1 the node or store refused (one line on stderr names
the code and field), or ``wait`` timed out; 2 a usage error (an id prefix
that matches no session or several); 69 no node answered.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from sessiontree.cli._client import NODE_OPTION, STORE_OPTION, resolve_source
from sessiontree.cli._exits import failure
from sessiontree.cli._ids import node_candidates, resolve_id, store_candidates
from sessiontree.cli._paging import page_of
from sessiontree.cli._times import ago, iso_times, local, until
from sessiontree.cli._wire import SessionView, TreeView, session_view
from sessiontree.protocol import (
    RejectedInputError,
    SessionKind,
    SessionState,
    SessionTreeError,
    plain_input,
)
from sessiontree.store import SessionRecord, Store
from sessiontree.supervision import stored_spending

__all__ = ["draw_tree", "sessions"]

F = TypeVar("F", bound=Callable[..., Any])

_JSON = click.option(
    "--json", "as_json", is_flag=True, help="Only JSON on stdout (times as ISO 8601, UTC)."
)
_SESSION = click.argument("session")


def _read_source(func: F) -> F:
    return NODE_OPTION(STORE_OPTION(func))


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, sort_keys=True))


# -- reading a store ---------------------------------------------------------------------


@contextlib.contextmanager
def _reading(store_dir: Path) -> Iterator[Store]:
    """The store opened read-only (beside a running node too); errors exit 1."""
    try:
        with Store(store_dir, readonly=True) as store:
            yield store
    except (SessionTreeError, OSError) as exc:
        raise failure(exc, f"cannot read store {store_dir}: ") from None


def _row(record: SessionRecord) -> dict[str, Any]:
    return {"info": msgspec.to_builtins(record.info), "result": msgspec.to_builtins(record.result)}


def _stored_rows(store_dir: Path) -> list[dict[str, Any]]:
    with _reading(store_dir) as store:
        return [_row(r) for r in store.sessions() if not isinstance(r, SessionTreeError)]


def _stored_wedged(store_dir: Path) -> set[str]:
    """The ids of the sessions holding held-back work in a store."""
    with _reading(store_dir) as store:
        return {str(item.session_id) for item in store.wedged_list()}


def _stored(store: Store, session_id: uuid.UUID) -> SessionRecord:
    record = store.session(session_id)
    if record is None:
        raise click.ClickException(f"unknown_session: no session {session_id} in {store.path}")
    return record


def _record_view(store: Store, record: SessionRecord) -> SessionView:
    """A stored session as the API's ``GET /v1/sessions/{id}`` shows it: its
    usage from its usage record (calls may settle after its result was sent),
    or from its result where it has none."""
    spent = store.usage(record.info.session_id)
    return session_view(record.info, record.result, stored_spending(record, spent))


def _stored_view(store: Store, session_id: str) -> dict[str, Any]:
    view: dict[str, Any] = msgspec.to_builtins(
        _record_view(store, _stored(store, uuid.UUID(session_id)))
    )
    return view


def _stored_tree(store: Store, session_id: str) -> dict[str, Any]:
    """The subtree under ``session_id`` as the API's ``tree`` gives it, children
    oldest first, read through the store's parent index."""

    def build(record: SessionRecord) -> TreeView:
        kids = [store.session(c) for c in store.children(record.info.session_id)]
        ordered = sorted((k for k in kids if k is not None), key=lambda k: k.info.created_at)
        view = msgspec.structs.asdict(_record_view(store, record))
        return TreeView(**view, children=[build(k) for k in ordered])

    tree: dict[str, Any] = msgspec.to_builtins(build(_stored(store, uuid.UUID(session_id))))
    return tree


def _stored_results(store: Store, session_id: str) -> list[dict[str, Any]]:
    """The results a stored session received from its children."""
    _stored(store, uuid.UUID(session_id))
    found: list[dict[str, Any]] = msgspec.to_builtins(store.received(uuid.UUID(session_id)))
    return found


def _fetch(
    node_url: str | None,
    store_dir: Path | None,
    session: str,
    tail: str,
    stored: Callable[[Store, str], Any],
) -> Any:
    """What a read command shows of ``session`` (an id or a unique prefix):
    ``GET /v1/sessions/{id}{tail}`` on the node, or ``stored(store, id)``."""
    source = resolve_source(node_url, store_dir)
    if source.node_url is not None:
        with source.client() as client:
            sid = resolve_id(session, node_candidates(client))
            return client.get(f"/v1/sessions/{sid}{tail}")
    assert source.store_dir is not None
    with _reading(source.store_dir) as store:
        return stored(store, resolve_id(session, store_candidates(store)))


def _act(node_url: str | None, session: str, action: str, body: Any = None) -> Any:
    """``POST /v1/sessions/{id}/{action}`` on the node, ``session`` an id or a
    unique prefix."""
    with resolve_source(node_url).client() as client:
        sid = resolve_id(session, node_candidates(client))
        return client.post(f"/v1/sessions/{sid}/{action}", body)


# -- drawing -----------------------------------------------------------------------------


def _figure(value: float) -> str:
    return f"{value:.6g}"


def _count(value: float, noun: str) -> str:
    """``1 call``, ``3 calls`` (``noun`` is the plural)."""
    return f"{_figure(value)} {noun[:-1] if value == 1 else noun}"


def usage_text(usage: dict[str, Any]) -> str:
    """A ``Usage`` (as JSON) in words: tokens, calls, cost."""
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    text = (
        f"{_count(prompt + completion, 'tokens')} ({prompt} prompt, {completion} completion), "
        f"{_count(usage.get('calls', 0), 'calls')}, cost {_figure(usage.get('cost', 0.0))}"
    )
    if usage.get("unpriced_calls"):
        text += f" ({usage['unpriced_calls']} unpriced)"
    if usage.get("descendants"):
        text += f", {_count(usage['descendants'], 'descendants')}"
    return text


def budget_text(budget: dict[str, Any]) -> str:
    """A ``Budget`` (as JSON) in words: each bounded dimension, or ``unbounded``."""
    bounds = [
        f"cost {_figure(budget[name])}" if name == "cost" else _count(budget[name], name)
        for name in ("tokens", "cost", "calls", "descendants")
        if budget.get(name) is not None
    ]
    return ", ".join(bounds) or "unbounded"


def _short_usage(view: dict[str, Any]) -> str:
    """What a tree line says of a session's accounts: its subtree's tokens,
    calls and cost, what its budget has left; empty when it spent nothing and
    has no budget."""
    used = view.get("subtree_usage") or {}
    tokens = used.get("prompt_tokens", 0) + used.get("completion_tokens", 0)
    parts = []
    if tokens or used.get("calls") or used.get("cost"):
        cost = _figure(used.get("cost", 0.0))
        parts.append(f"{tokens} tok, {_count(used.get('calls', 0), 'calls')}, cost {cost}")
    left = view.get("budget_left")
    if left is not None:
        parts.append(f"left {budget_text(left)}")
    if view.get("budget_exhausted"):
        parts.append(f"exhausted: {view['budget_exhausted']}")
    return f"  ({'; '.join(parts)})" if parts else ""


def _line(info: dict[str, Any], result: dict[str, Any] | None, now: float) -> str:
    text = (
        f"{info['kind']:<6} {info['state']:<9} {info['session_id'][:8]}  "
        f"{info.get('skill', ''):<10} created {ago(info['created_at'], now)}"
    )
    deadline = info.get("deadline")
    if deadline is not None and info["state"] in ("pending", "active", "suspended"):
        text += f", ttl {until(deadline, now)}"
    if info.get("task"):
        task = info["task"] if len(info["task"]) <= 40 else info["task"][:39] + "~"
        text += f'  "{task}"'
    error = (result or {}).get("error")
    if error:
        text += f"  [{error['code']}]"
    return text


def draw_tree(tree: dict[str, Any], now: float) -> list[str]:
    """A session tree as ASCII lines: kind, state, short id, skill, when it
    was created, time left to its TTL,
    and the subtree's usage and what its budget has left."""
    lines: list[str] = []

    def walk(node: dict[str, Any], prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("`-- " if last else "|-- ")
        line = _line(node["info"], node.get("result"), now) + _short_usage(node)
        lines.append(f"{prefix}{branch}{line}")
        kids = node.get("children", [])
        deeper = prefix if root else prefix + ("    " if last else "|   ")
        for i, child in enumerate(kids):
            walk(child, deeper, i == len(kids) - 1, root=False)

    walk(tree, "", last=True, root=True)
    return lines


# -- commands ------------------------------------------------------------------------------


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
        held = _stored_wedged(source.store_dir) if wedged else None
        matching = (
            row["info"]
            for row in _stored_rows(source.store_dir)
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
        click.echo(_line(info, None, now))
    more = f"; more after: --cursor {next_cursor}" if next_cursor else ""
    click.echo(f"{len(infos)} sessions{more}", err=True)


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
    """One session: identity, state, result, usage and what its budget has left."""
    view = _fetch(node_url, store_dir, session, "", _stored_view)
    if as_json:
        _echo_json(iso_times(view))
        return
    now = time.time()
    for name, value in view["info"].items():
        shown = value
        if name in ("created_at", "deadline") and isinstance(value, int | float):
            when = ago(value, now) if name == "created_at" else until(value, now)
            shown = f"{local(value)} ({when})"
        click.echo(f"{name:>16}: {shown}")
    if view.get("result") is not None:
        click.echo(f"{'result':>16}: {json.dumps(iso_times(view['result']), sort_keys=True)}")
    for line in _accounts_lines(view):
        click.echo(line)


def _accounts_lines(view: dict[str, Any]) -> list[str]:
    """``sessions show``'s lines on usage and budget."""
    lines = [
        f"{'usage':>16}: {usage_text(view.get('usage') or {})}",
        f"{'subtree usage':>16}: {usage_text(view.get('subtree_usage') or {})}",
    ]
    reserved = view.get("reserved") or {}
    if reserved.get("calls"):
        lines.append(f"{'reserved':>16}: {usage_text(reserved)}")
    budget = view.get("budget")
    if budget is None:
        lines.append(f"{'budget':>16}: none")
        return lines
    clamped = " (clamped to what its parent had left)" if view.get("budget_clamped") else ""
    lines.append(f"{'budget':>16}: {budget_text(budget)}{clamped}")
    lines.append(f"{'budget left':>16}: {budget_text(view.get('budget_left') or {})}")
    if view.get("budget_exhausted"):
        lines.append(f"{'budget exhausted':>16}: {view['budget_exhausted']}")
    return lines


@sessions.command("tree")
@_read_source
@_SESSION
@_JSON
def tree_cmd(node_url: str | None, store_dir: Path | None, session: str, as_json: bool) -> None:
    """Draw the subtree under SESSION: kind, state, short id, when each was
    created and the time left to its TTL."""
    tree = _fetch(node_url, store_dir, session, "/tree", _stored_tree)
    if as_json:
        _echo_json(iso_times(tree))
        return
    for line in draw_tree(tree, time.time()):
        click.echo(line)


@sessions.command("results")
@_read_source
@_SESSION
@_JSON
def results_cmd(node_url: str | None, store_dir: Path | None, session: str, as_json: bool) -> None:
    """The results SESSION received from its children, oldest first."""
    found = _fetch(node_url, store_dir, session, "/results", _stored_results)
    if as_json:
        _echo_json(iso_times(found))
        return
    if not found:
        click.echo("no results received")
    for result in found:
        error = result.get("error")
        tail = f"  [{error['code']}]" if error else ""
        summary = f"  {result['summary']}" if result.get("summary") else ""
        head = f"{result['kind']:<6} {result['status']:<9} {result['session_id'][:8]}"
        click.echo(f"{head}{tail}{summary}")


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
    as_json: bool,
) -> None:
    """Open a Main (--agent) or spawn a child (--parent); prints the new session."""
    if (agent is None) == (parent is None):
        raise click.UsageError("give exactly one of --agent (a Main) or --parent (a child)")
    if input_json is not None and parent is None:
        raise click.UsageError("--input goes with --parent (a child's input)")
    child_input = None if input_json is None else _input_option(input_json)
    with resolve_source(node_url).client() as client:
        if agent is not None:
            made = client.post("/v1/sessions", {"agent_id": agent, "key": key})
        else:
            spec: dict[str, Any] = {"kind": kind, "task": task, "context_summary": context_summary}
            optional = {"skill": skill, "ttl": ttl, "request_id": request_id, "input": child_input}
            spec.update({k: v for k, v in optional.items() if v is not None})
            sid = resolve_id(str(parent), node_candidates(client), hint="--parent")
            made = client.post(f"/v1/sessions/{sid}/children", spec)
    if as_json:
        _echo_json(iso_times(made))
        return
    info = made["info"]
    click.echo(f"{info['kind']} {info['session_id']} {info['state']}")


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
        click.echo(f"sent to {view['info']['session_id']} ({view['info']['state']})")


def _done(name: str, view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _echo_json(iso_times(view))
        return
    info = view["info"]
    error = (view.get("result") or {}).get("error")
    ended = f", {error['code']}" if error else ""
    click.echo(f"{name}: {info['session_id']} ({info['state']}{ended})")


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
@_JSON
def cancel_cmd(node_url: str | None, session: str, grace: float | None, as_json: bool) -> None:
    """Cancel SESSION and its subtree (one grace deadline for all)."""
    body = {} if grace is None else {"grace": grace}
    _done("cancel requested", _act(node_url, session, "cancel", body), as_json)


@sessions.command("terminate")
@NODE_OPTION
@_SESSION
@_JSON
def terminate_cmd(node_url: str | None, session: str, as_json: bool) -> None:
    """End SESSION and its subtree at once, with no grace: what still runs ends
    cancelled with terminated_by_force."""
    _done("terminated", _act(node_url, session, "terminate"), as_json)


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
                    click.echo("", err=True)
                raise click.ClickException(f"session {sid} still runs after {timeout:g} s")
            if not quiet:
                state = client.get(f"/v1/sessions/{sid}")["info"]["state"]
                elapsed = time.monotonic() - started
                click.echo(f"\rwaiting for {sid[:8]}: {state}, {elapsed:.0f} s", err=True, nl=False)
    if not quiet and time.monotonic() - started > 10.0:
        click.echo("", err=True)
    result = answer["result"]
    if as_json:
        _echo_json(iso_times(result))
        return
    error = result.get("error")
    tail = f" [{error['code']}] {error['message']}" if error else ""
    click.echo(f"{result['status']}{tail}")
    if result.get("summary"):
        click.echo(result["summary"])
