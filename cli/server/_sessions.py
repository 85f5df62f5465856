"""Sessions under ``/v1/sessions``: open a Main, list, spawn, read, control,
message, and wait for results.

An unknown session id is a 404 ``unknown_session`` naming it; a refusal the
node returns (a spawn past the tree's limits, a transition the session's
state forbids, a node at capacity or closing) is raised as ``RefusedError``
and answered with its code's status (see ``_errors.status_for``).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import Body, HeaderParameter, JSONBody, QueryParameter

from sessiontree.cli._wire import (
    CancelRequest,
    MainRequest,
    SendRequest,
    SessionPage,
    SessionView,
    Spawn,
    TerminateRequest,
    TreeView,
    WaitResult,
    session_view,
    tree_view,
)
from sessiontree.cli.server._errors import ERRORS, refuse
from sessiontree.cli.server._listing import every_session
from sessiontree.cli.server._shared import MAX_WAIT, Sid, node_of
from sessiontree.cli.server._tree_page import session_tree_html, session_tree_svg
from sessiontree.protocol import (
    RejectedInputError,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    SpawnSpec,
    parse_traceparent,
)
from sessiontree.supervision import Node

__all__ = ["SESSION_ROUTES"]

#: What every route here shares: its OpenAPI tag and errors.
_get = functools.partial(get, tags=["sessions"], responses=ERRORS)
_post = functools.partial(post, tags=["sessions"], status_code=202, responses=ERRORS)

MAX_PAGE = 1000
_CANCEL_BODY = (
    "Optional: this cancel's grace in seconds (absent: the node's grace) and its reason "
    "(who or why: on the subtree's cancel_requested events and in their results' error detail)."
)
_TERMINATE_BODY = "Optional: the reason (who or why), recorded as a cancel's is."
# a created_at as Python's repr writes it (maybe with an exponent), "_", a session id
_CURSOR = (
    r"^[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,3})?"
    r"_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
)


async def _view(node: Node, session_id: uuid.UUID) -> SessionView:
    """A session, its accounts and, once it ended, its result
    (``UnknownSessionError`` for an unknown id)."""
    info = await node.aget(session_id)
    result = await node.aresult(session_id) if info.state.is_terminal else None
    return session_view(info, result, await node.aspending(session_id))


def _cursor(raw: str | None) -> tuple[float, str] | None:
    """The position a page's ``next_cursor`` names; ``RejectedInputError``
    naming ``cursor`` for one this API did not write."""
    if raw is None:
        return None
    stamp, _, sid = raw.partition("_")
    try:
        return float(stamp), str(uuid.UUID(sid))
    except ValueError:
        msg = f"cursor {raw[:64]!r} is not one this API returned"
        raise RejectedInputError(msg, field="cursor") from None


def _sort_key(info: SessionInfo) -> tuple[float, str]:
    return info.created_at, str(info.session_id)


#: Marks a live node sets on sessions, each a boolean query parameter of
#: ``GET /v1/sessions`` that narrows the listing to the sessions so marked
#: (several: those marked all of them), and how to ask the node for them.
MARKS: dict[str, Callable[[Node], Awaitable[list[SessionInfo]]]] = {
    "stuck": Node.astuck,
    "wedged": lambda node: node.recovery.awedged_sessions(),
}


async def _candidates(
    node: Node, state: SessionState | None, kind: SessionKind | None, marks: dict[str, bool]
) -> list[SessionInfo]:
    """The sessions of ``state`` and ``kind`` carrying every mark set true in ``marks``."""
    wanted = [name for name, on in marks.items() if on]
    if not wanted:
        return await every_session(node, state, kind)
    chosen: dict[uuid.UUID, SessionInfo] | None = None
    for name in wanted:
        marked = {info.session_id: info for info in await MARKS[name](node)}
        chosen = marked if chosen is None else {s: i for s, i in chosen.items() if s in marked}
    assert chosen is not None
    return [
        info
        for info in chosen.values()
        if (state is None or info.state is state) and (kind is None or info.kind is kind)
    ]


# GET and POST /v1/sessions share a path: its OPTIONS answer lists both once
# ``_contract.fix_allow`` has run (whatever the order they are registered in).


@_get("/sessions")
async def list_sessions(
    request: Request[Any, Any, State],
    session_state: Annotated[SessionState | None, QueryParameter(name="state")] = None,
    kind: Annotated[SessionKind | None, QueryParameter()] = None,
    agent: Annotated[str | None, QueryParameter(max_length=128)] = None,
    skill: Annotated[
        str | None,
        QueryParameter(max_length=128, description="Only sessions this skill runs."),
    ] = None,
    key: Annotated[str | None, QueryParameter(max_length=1024)] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = 100,
    cursor: Annotated[str | None, QueryParameter(pattern=_CURSOR)] = None,
    prefix: Annotated[
        str | None,
        QueryParameter(
            pattern=r"^[0-9a-f-]{1,36}$",
            description="Only sessions whose id starts with this (lowercase hex and "
            "hyphens, as the id is written): how a short id is resolved to one session.",
        ),
    ] = None,
    stuck: Annotated[
        bool,
        QueryParameter(
            description="Only sessions flagged as stuck: a running skill with no checkpoint "
            "for the node's stuck_after (flagged, never killed)."
        ),
    ] = False,
    wedged: Annotated[
        bool,
        QueryParameter(
            description="Only sessions holding work recovery held back after repeated "
            "crashes (a Main's wedged message or result, a wedged branch): see /v1/wedged."
        ),
    ] = False,
) -> SessionPage:
    """Sessions oldest first, filtered by state, kind, agent, skill, key, id prefix
    and marks (``stuck=true``, ``wedged=true``); paginated: ``limit`` items,
    and ``next_cursor`` (null on the last page) to pass as ``cursor`` for
    the next, in a stable order (created_at, then id).

    A bad filter, limit or cursor is a 400 naming the parameter."""
    node = node_of(request.app.state)
    after = _cursor(cursor)
    infos = [
        info
        for info in await _candidates(node, session_state, kind, {"stuck": stuck, "wedged": wedged})
        if (agent is None or info.agent_id == agent)
        and (skill is None or info.skill == skill)
        and (key is None or info.key == key)
        and (prefix is None or str(info.session_id).startswith(prefix))
        and (after is None or _sort_key(info) > after)
    ]
    infos.sort(key=_sort_key)
    page = infos[:limit]
    more = len(infos) > limit
    last = page[-1] if page else None
    next_cursor = f"{last.created_at!r}_{last.session_id}" if more and last else None
    return SessionPage(items=page, next_cursor=next_cursor)


@_post("/sessions", status_code=200)
async def open_main(state: State, data: JSONBody[MainRequest]) -> SessionView:
    """Get or create the one Main of an agent for a session key.

    An unknown agent is a 404 ``unknown_agent`` naming ``agent_id``."""
    node = node_of(state)
    ref = await node.amain(data.agent_id, data.key)
    return await _view(node, ref.session_id)


#: A W3C ``traceparent`` header: on a traced node, the spans a request starts continue it.
TraceParent = Annotated[
    str | None,
    HeaderParameter(
        name="traceparent",
        required=False,
        description="W3C trace context: on a traced node the spawned session's span "
        "(or the message cycle's) continues this span; a malformed value is ignored",
    ),
]
IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        required=False,
        max_length=255,
        description="An idempotency key (1 to 255 characters): a message sent again with "
        "the same key while the first is in the Main's inbox (accepted, its cycle not yet "
        "run; across a restart too) queues nothing and is answered as the first was",
    ),
]


@_post("/sessions/{session_id:uuid}/children", status_code=201)
async def spawn_child(
    state: State, session_id: Sid, data: JSONBody[SpawnSpec], traceparent: TraceParent = None
) -> Spawn:
    """Spawn a child under a session (a repeated request_id returns the first).

    A refused spawn is answered with its code's status and names the parent
    (404 unknown, 409 the tree's rules, 400 a bad ``ttl`` or ``skill``)."""
    node = node_of(state)
    trace = parse_traceparent(traceparent)
    if trace is not None and data.trace is None:
        data = msgspec.structs.replace(data, trace=trace)
    spawned = await node.aspawn(session_id, data)
    if spawned.ref is None:
        refuse(spawned.error, session_id)  # the refusal is about the parent
        raise AssertionError  # a refusal always carries its error
    return Spawn(info=await node.aget(spawned.ref.session_id), existing=spawned.existing)


@_get("/sessions/{session_id:uuid}")
async def get_session(state: State, session_id: Sid) -> SessionView:
    """One session, its usage and budget and, once it ended, its result.

    ``usage`` is what its own model calls spent, ``subtree_usage`` that and
    its descendants'; ``budget_left`` what its budget still allows (null
    without one); ``budget_exhausted`` the dimension that ran out."""
    return await _view(node_of(state), session_id)


@_get("/sessions/{session_id:uuid}/tree")
async def session_tree(state: State, session_id: Sid) -> TreeView:
    """The subtree under a session: each session as ``GET /sessions/{id}`` shows
    it (identity, result, usage and budget), with its ``children``."""
    return tree_view(await node_of(state).atree(session_id))


@_get("/sessions/{session_id:uuid}/tree.html", media_type="text/html")
async def session_tree_page(state: State, session_id: Sid) -> Response[str]:
    """The subtree under a session as an interactive HTML page: each session's
    kind, skill, state, age, usage and result, with links to its conversation
    and its own subtree; filter, expand, SVG export, print to PDF."""
    node = node_of(state)
    page = session_tree_html(tree_view(await node.atree(session_id)), node.clock.time())
    return Response(page, media_type="text/html")


@_get("/sessions/{session_id:uuid}/tree.svg", media_type="image/svg+xml")
async def session_tree_image(state: State, session_id: Sid) -> Response[str]:
    """The subtree under a session drawn as an SVG image."""
    image = session_tree_svg(tree_view(await node_of(state).atree(session_id)))
    return Response(image, media_type="image/svg+xml")


@_post("/sessions/{session_id:uuid}/cancel")
async def cancel_session(
    state: State,
    session_id: Sid,
    data: Annotated[CancelRequest | None, Body(description=_CANCEL_BODY)] = None,
) -> SessionView:
    """Cancel a session and its subtree (one deadline: now + grace).

    The optional body ``{"grace": S}`` sets this cancel's grace in seconds
    (finite, >= 0; a bad one is a 400 naming ``grace``); without it the
    node's grace applies, and 0 ends what still runs at once
    (``terminated_by_force``). A session that already ended is a 409
    ``invalid_transition``; a second cancel of one still stopping may bring
    its deadline closer, never push it back."""
    node = node_of(state)
    grace, reason = (None, None) if data is None else (data.grace, data.reason)
    refuse(await node.acancel(session_id, grace, reason=reason), session_id)
    return await _view(node, session_id)


@_post("/sessions/{session_id:uuid}/terminate")
async def terminate_session(
    state: State,
    session_id: Sid,
    data: Annotated[TerminateRequest | None, Body(description=_TERMINATE_BODY)] = None,
) -> SessionView:
    """Terminate a session and its subtree at once: a cancel with no grace;
    what still runs ends ``cancelled`` with ``terminated_by_force``.

    The optional body ``{"reason": TEXT}`` is recorded as a cancel's is.
    A session that already ended is a 409 ``invalid_transition``."""
    node = node_of(state)
    reason = None if data is None else data.reason
    refuse(await node.aterminate(session_id, reason=reason), session_id)
    return await _view(node, session_id)


@_post("/sessions/{session_id:uuid}/suspend")
async def suspend_session(state: State, session_id: Sid) -> SessionView:
    """Suspend a Branch at its next checkpoint.

    Anything but an active inline Branch is a 409 ``invalid_transition``."""
    node = node_of(state)
    refuse(await node.asuspend(session_id), session_id)
    return await _view(node, session_id)


@_post("/sessions/{session_id:uuid}/resume")
async def resume_session(state: State, session_id: Sid) -> SessionView:
    """Resume a suspended Branch.

    Anything but a Branch suspended (or asked to) is a 409
    ``invalid_transition``; a closing node is a 503 ``node_closed``."""
    node = node_of(state)
    refuse(await node.aresume(session_id), session_id)
    return await _view(node, session_id)


@_post("/sessions/{session_id:uuid}/messages")
async def send_message(
    state: State,
    session_id: Sid,
    data: JSONBody[SendRequest],
    traceparent: TraceParent = None,
    idempotency_key: IdempotencyKey = None,
) -> SessionView:
    """Send a Main an inbound message (one message cycle).

    Anything but a Main is a 403 ``not_allowed``; a Main stopping or ended a
    409 ``session_not_active``; a closing node a 503 ``node_closed``. With an
    ``Idempotency-Key`` header, a repeat while the first message is in the
    inbox is answered as the first was and queues nothing."""
    node = node_of(state)
    trace = parse_traceparent(traceparent)
    answer = await node.asend(session_id, data.message, trace=trace, request_id=idempotency_key)
    refuse(answer, session_id)
    return await _view(node, session_id)


@_get("/sessions/{session_id:uuid}/result")
async def wait_result(
    state: State,
    session_id: Sid,
    timeout: Annotated[float, QueryParameter(ge=0, le=MAX_WAIT)] = 30.0,
) -> WaitResult:
    """Long-poll: the result once the session ends, or ``done: false`` after
    ``timeout`` seconds (clamped to the node's maximum wait).

    An unknown id is a 404 at once, not a wait."""
    node = node_of(state)
    await node.aget(session_id)  # unknown ids are a 404, not a wait
    result = await node.await_result(session_id, min(timeout, state.max_wait))
    return WaitResult(done=result is not None, result=result)


@_get("/sessions/{session_id:uuid}/results")
async def child_results(state: State, session_id: Sid) -> list[SessionResult]:
    """The results a session received from its children."""
    return await node_of(state).aresults(session_id)


SESSION_ROUTES = (
    list_sessions,
    open_main,
    spawn_child,
    get_session,
    session_tree,
    session_tree_page,
    session_tree_image,
    cancel_session,
    terminate_session,
    suspend_session,
    resume_session,
    send_message,
    wait_result,
    child_results,
)
"""Served under ``/v1``, in the order they are registered."""
