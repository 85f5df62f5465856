"""The HTTP API of a standalone node: Litestar on uvicorn, msgspec on the wire.

Root: ``/healthz``, ``/readyz``, ``/metrics`` and ``/schema/openapi.json``;
everything else is versioned under ``/v1``. Every request body is decoded by
our strict codec (byte cap, nesting cap, unknown fields refused, nothing
coerced) in a ``before_request`` hook, before the framework's own decoding
sees it; a body over the cap is refused from its ``Content-Length`` or while
it streams, never decoded. Every client mistake is a 4xx ``ErrorBody``
naming the field or session and an ``ErrorCode``; an unexpected exception is
logged and answered 500 without touching the node.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from importlib import metadata
from typing import Annotated, Any, Protocol

import msgspec
from litestar import Controller, Litestar, Request, Response, Router, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import Schema
from litestar.params import JSONBody, PathParameter, QueryParameter

from sessiontree.cli._wire import (
    ApiError,
    BranchRequest,
    ConfirmDeleteRequest,
    ErrorBody,
    ForkRequest,
    MainRequest,
    NodeStatus,
    SendRequest,
    SessionPage,
    SessionView,
    Spawn,
    WaitResult,
    plain_figures,
    settings_of,
)
from sessiontree.protocol import (
    MAX_CONTROL_BYTES,
    BranchInfo,
    DeletePlan,
    ErrorCode,
    ErrorInfo,
    Inbound,
    Merged,
    Message,
    RejectedInputError,
    Routed,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
    SessionTreeError,
    SpawnSpec,
    decode_strict,
)
from sessiontree.supervision import Node

__all__ = ["MAX_BODY_BYTES", "MAX_WAIT", "create_app", "status_for"]

log = logging.getLogger("sessiontree.api")

MAX_BODY_BYTES = MAX_CONTROL_BYTES
MAX_WAIT = 60.0  # the longest a result long-poll may wait, in seconds
MAX_PAGE = 1000

_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.UNKNOWN_AGENT: 404,
    ErrorCode.UNKNOWN_MESSAGE: 404,
    ErrorCode.UNKNOWN_BRANCH: 404,
    ErrorCode.NOT_ALLOWED: 403,
    ErrorCode.CAPACITY_EXCEEDED: 429,
    ErrorCode.NODE_CLOSED: 503,
    ErrorCode.STORE_FULL: 503,
    ErrorCode.STORE_FAILED: 503,
    ErrorCode.STORE_LOCKED: 503,
    ErrorCode.CORRUPT_RECORD: 500,
    ErrorCode.INTERNAL_ERROR: 500,
}
_CONFLICTS = frozenset(
    {
        ErrorCode.DEPTH_EXCEEDED,
        ErrorCode.CHILDREN_EXCEEDED,
        ErrorCode.WORKER_CANNOT_SPAWN,
        ErrorCode.PARENT_NOT_ACTIVE,
        ErrorCode.SESSION_NOT_ACTIVE,
        ErrorCode.INVALID_TRANSITION,
        ErrorCode.BRANCH_EXISTS,
        ErrorCode.CURRENT_BRANCH,
        ErrorCode.CONFIRMATION_MISMATCH,
    }
)
_FIELDS = {ErrorCode.INVALID_TTL: "ttl", ErrorCode.UNKNOWN_SKILL: "skill"}
# Python names of query parameters whose public name differs ("state" is reserved).
_QUERY_NAMES = {"session_state": "state"}


def status_for(code: ErrorCode) -> int:
    """The HTTP status of an error code: 404 unknown things, 409 conflicts with
    the tree's rules or state, 429 capacity, 503 a closed node or failing
    store, 400 any other client mistake."""
    if code in _CONFLICTS:
        return 409
    return _STATUS.get(code, 400)


class Metrics(Protocol):
    """What the API needs of the node's metrics (``supervision.NodeMetrics``)."""

    content_type: str

    def exposition(self) -> bytes: ...

    def rejected_input(self, reason: str) -> None: ...


class RefusedError(SessionTreeError):
    """Raised inside a handler to answer with an ``ErrorInfo`` the node
    returned (a refused spawn, cancel, send…) and its status."""

    def __init__(
        self,
        error: ErrorInfo,
        *,
        field: str | None = None,
        session_id: uuid.UUID | None = None,
    ) -> None:
        super().__init__(error.message, session_id=session_id)
        self.error = error
        self.field = field


def _body(
    status: int, error: ApiError, headers: dict[str, str] | None = None
) -> Response[ErrorBody]:
    return Response(ErrorBody(status=status, error=error), status_code=status, headers=headers)


def _session_of(detail: dict[str, Any]) -> uuid.UUID | None:
    raw = detail.get("session_id")
    try:
        return uuid.UUID(str(raw)) if raw else None
    except ValueError:
        return None


def _problem(_: Request[Any, Any, State], exc: RefusedError) -> Response[ErrorBody]:
    error = exc.error
    field = exc.field or error.detail.get("field") or _FIELDS.get(error.code)
    return _body(
        status_for(error.code),
        ApiError(
            code=error.code,
            message=error.message,
            field=field,
            session_id=exc.session_id or _session_of(error.detail),
            detail=error.detail,
        ),
    )


def _tree_error(request: Request[Any, Any, State], exc: SessionTreeError) -> Response[ErrorBody]:
    info = exc.to_info()
    field = getattr(exc, "field", None)
    if exc.session_id is not None:
        info.detail.setdefault("session_id", str(exc.session_id))
    return _problem(request, RefusedError(info, field=field))


def _http_error(request: Request[Any, Any, State], exc: HTTPException) -> Response[ErrorBody]:
    status = exc.status_code
    field = None
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict):
            key = first.get("key")
            field = _QUERY_NAMES.get(str(key), key)
        _count(request, "invalid_field")
    elif status == 413:
        _count(request, "too_large")
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if status == 413:
        detail = f"the request body is over the cap of {request.app.state.max_body} bytes"
    elif status in (404, 405) and field is None:
        detail = f"{detail}: {request.method} {request.url.path}"
    message = detail if field is None else f"{detail}: {field}"
    if isinstance(exc.extra, list) and exc.extra and isinstance(exc.extra[0], dict):
        message = f"{message} ({exc.extra[0].get('message', '')})"
    code = ErrorCode.NODE_CLOSED if status == 503 else ErrorCode.REJECTED_INPUT
    # keep the framework's headers: a 405 must say what is Allowed (RFC 9110)
    return _body(status, ApiError(code=code, message=message, field=field), exc.headers)


def _unexpected(_: Request[Any, Any, State], exc: Exception) -> Response[ErrorBody]:
    log.exception("unexpected error in the HTTP API", exc_info=exc)
    return _body(
        500,
        ApiError(code=ErrorCode.INTERNAL_ERROR, message=f"internal error: {type(exc).__name__}"),
    )


def _count(request: Request[Any, Any, State], reason: str) -> None:
    metrics: Metrics | None = request.app.state.get("metrics")
    if metrics is not None:
        metrics.rejected_input(reason)


# -- strict bodies --------------------------------------------------------------------

_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


async def _strict_body(request: Request[Any, Any, State]) -> None:
    """Decode the body strictly before Litestar does (which would coerce)."""
    data = request.route_handler.parsed_fn_signature.parameters.get("data")
    if data is None:
        return
    target = data.annotation
    decoder = _DECODERS.get(target)
    if decoder is None:
        decoder = _DECODERS[target] = msgspec.json.Decoder(target)
    raw = await request.body()
    try:
        decode_strict(raw, decoder, max_bytes=request.app.state.max_body)
    except RejectedInputError as exc:
        # counted here, where the API refuses it; what the node itself refuses
        # (Node.route, Node.control) the node counts
        _count(request, exc.reason)
        raise


# -- helpers --------------------------------------------------------------------------


def _node(state: State) -> Node:
    node: Node = state.node
    return node


def _raise(error: ErrorInfo | None, session_id: uuid.UUID | None = None) -> None:
    """Answer with ``error`` (about ``session_id``) when there is one."""
    if error is not None:
        raise RefusedError(error, session_id=session_id)


async def _view(node: Node, session_id: uuid.UUID) -> SessionView:
    info = await node.aget(session_id)
    result = await node.aresult(session_id) if info.state.is_terminal else None
    return SessionView(info=info, result=result)


def _cursor(raw: str | None) -> tuple[float, str] | None:
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


_ERRORS = {
    status: ResponseSpec(ErrorBody, description=text)
    for status, text in (
        (400, "A client mistake: the field is named"),
        (404, "Unknown session, agent, message or branch"),
        (409, "The tree's rules or the session's state refuse it"),
        (413, "The body is over the size cap"),
        (429, "The node is at capacity"),
        (503, "The node is closing or its store failed"),
    )
}
# a created_at as Python's repr writes it (maybe with an exponent), "_", a session id
_CURSOR = (
    r"^[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,3})?"
    r"_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
)
_Sid = Annotated[uuid.UUID, PathParameter(description="The session's id.")]


# -- root -----------------------------------------------------------------------------


@get("/healthz", tags=["node"], responses=_ERRORS, sync_to_thread=False)
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@get("/readyz", tags=["node"], responses=_ERRORS, sync_to_thread=False)
def readyz(state: State) -> dict[str, str]:
    """Readiness: 200 while the node takes work, 503 once it is closing or failed."""
    node = _node(state)
    if node.closed:
        raise HTTPException(status_code=503, detail="the node is not taking work")
    return {"status": "ready"}


@get("/metrics", tags=["node"], media_type="text/plain", sync_to_thread=True)
def metrics_page(state: State) -> Response[bytes]:
    """The node's metrics in the Prometheus text format."""
    metrics: Metrics = state.metrics
    return Response(metrics.exposition(), media_type=metrics.content_type)


# -- /v1: the node and its sessions -------------------------------------------------------


@get("/node", tags=["node"], responses=_ERRORS)
async def node_status(state: State) -> NodeStatus:
    """What this node runs: agents, counters, configuration, store."""
    node = _node(state)
    if node.closed:  # the awaitable twins refuse a closing node; read it off the loop
        stats = await asyncio.to_thread(node.stats)
        sessions = await asyncio.to_thread(node.sessions)
    else:
        stats, sessions = await node.astats(), await node.asessions()
    by_state: dict[str, int] = {s.value: 0 for s in SessionState}
    for info in sessions:
        by_state[info.state.value] += 1
    store = plain_figures(node.store.stats()) if node.store is not None else None
    return NodeStatus(
        node=state.name,
        version=metadata.version("sessiontree"),
        state="closing" if node.closed else "open",
        uptime_s=node.clock.time() - state.started_at,
        agents=sorted(node.agents),
        sessions=by_state,
        stats=stats,
        config=settings_of(node.config),
        store=store,
    )


class Sessions(Controller):
    """``/v1/sessions``: open a Main, list sessions (one route, so that its
    OPTIONS answer allows both methods)."""

    path = "/sessions"
    tags = ["sessions"]

    @post(status_code=200, responses=_ERRORS)
    async def open_main(self, state: State, data: JSONBody[MainRequest]) -> SessionView:
        """Get or create the one Main of an agent for a session key."""
        node = _node(state)
        ref = await node.amain(data.agent_id, data.key)
        return await _view(node, ref.session_id)

    @get(responses=_ERRORS)
    async def list_sessions(
        self,
        request: Request[Any, Any, State],
        session_state: Annotated[SessionState | None, QueryParameter(name="state")] = None,
        kind: Annotated[SessionKind | None, QueryParameter()] = None,
        agent: Annotated[str | None, QueryParameter(max_length=128)] = None,
        key: Annotated[str | None, QueryParameter(max_length=1024)] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = 100,
        cursor: Annotated[str | None, QueryParameter(pattern=_CURSOR)] = None,
    ) -> SessionPage:
        """Sessions oldest first, filtered by state, kind, agent and key; paginated."""
        node = _node(request.app.state)
        after = _cursor(cursor)
        infos = [
            info
            for info in await node.asessions(session_state, kind)
            if (agent is None or info.agent_id == agent)
            and (key is None or info.key == key)
            and (after is None or _sort_key(info) > after)
        ]
        infos.sort(key=_sort_key)
        page = infos[:limit]
        more = len(infos) > limit
        last = page[-1] if page else None
        next_cursor = f"{last.created_at!r}_{last.session_id}" if more and last else None
        return SessionPage(items=page, next_cursor=next_cursor)


@post("/sessions/{session_id:uuid}/children", tags=["sessions"], status_code=201, responses=_ERRORS)
async def spawn_child(state: State, session_id: _Sid, data: JSONBody[SpawnSpec]) -> Spawn:
    """Spawn a child under a session (a repeated request_id returns the first)."""
    node = _node(state)
    spawned = await node.aspawn(session_id, data)
    if spawned.ref is None:
        _raise(spawned.error, session_id)  # the refusal is about the parent
        raise AssertionError  # a refusal always carries its error
    return Spawn(info=await node.aget(spawned.ref.session_id), existing=spawned.existing)


@get("/sessions/{session_id:uuid}", tags=["sessions"], responses=_ERRORS)
async def get_session(state: State, session_id: _Sid) -> SessionView:
    """One session and, once it ended, its result."""
    return await _view(_node(state), session_id)


@get("/sessions/{session_id:uuid}/tree", tags=["sessions"], responses=_ERRORS)
async def session_tree(state: State, session_id: _Sid) -> dict[str, Any]:
    """The subtree under a session: ``{info, result, children: [...]}``."""
    return await _node(state).atree(session_id)


def _control(name: str, doc: str) -> Any:
    async def handler(state: State, session_id: _Sid) -> SessionView:
        node = _node(state)
        _raise(await getattr(node, f"a{name}")(session_id), session_id)
        return await _view(node, session_id)

    handler.__doc__ = doc
    handler.__name__ = f"{name}_session"
    return post(
        f"/sessions/{{session_id:uuid}}/{name}",
        tags=["sessions"],
        status_code=202,
        responses=_ERRORS,
    )(handler)


cancel_session = _control("cancel", "Cancel a session and its subtree (one deadline).")
suspend_session = _control("suspend", "Suspend a Branch at its next checkpoint.")
resume_session = _control("resume", "Resume a suspended Branch.")


@post("/sessions/{session_id:uuid}/messages", tags=["sessions"], status_code=202, responses=_ERRORS)
async def send_message(state: State, session_id: _Sid, data: JSONBody[SendRequest]) -> SessionView:
    """Send a Main an inbound message (one message cycle)."""
    node = _node(state)
    _raise(await node.asend(session_id, data.message), session_id)
    return await _view(node, session_id)


@get("/sessions/{session_id:uuid}/result", tags=["sessions"], responses=_ERRORS)
async def wait_result(
    state: State,
    session_id: _Sid,
    timeout: Annotated[float, QueryParameter(ge=0, le=MAX_WAIT)] = 30.0,
) -> WaitResult:
    """Long-poll: the result once the session ends, or ``done: false`` after
    ``timeout`` seconds (clamped to the node's maximum wait)."""
    node = _node(state)
    await node.aget(session_id)  # unknown ids are a 404, not a wait
    result = await node.await_result(session_id, min(timeout, state.max_wait))
    return WaitResult(done=result is not None, result=result)


@get("/sessions/{session_id:uuid}/results", tags=["sessions"], responses=_ERRORS)
async def child_results(state: State, session_id: _Sid) -> list[SessionResult]:
    """The results a session received from its children."""
    return await _node(state).aresults(session_id)


@post("/route", tags=["chat"], status_code=200, responses=_ERRORS)
async def route_inbound(
    state: State,
    data: JSONBody[Inbound],
    agent_id: Annotated[str | None, QueryParameter(max_length=128)] = None,
) -> Routed:
    """Route an inbound chat message to its Main by per-sender session key;
    chat commands (``/branches``…) are answered in ``reply``."""
    return await _node(state).aroute(data, agent_id)


# -- /v1: conversations -----------------------------------------------------------------

_CONV = "/sessions/{session_id:uuid}/conversation"


@get(f"{_CONV}/branches", tags=["conversation"], responses=_ERRORS, sync_to_thread=True)
def branches(state: State, session_id: _Sid) -> list[BranchInfo]:
    """The conversation's branches (``current`` marks the active one)."""
    return _node(state).conversation(session_id).branches()


@get(f"{_CONV}/context", tags=["conversation"], responses=_ERRORS, sync_to_thread=True)
def context(
    state: State, session_id: _Sid, limit: Annotated[int, QueryParameter(ge=0, le=10_000)] = 100
) -> list[Message]:
    """The active path, oldest first, at most ``limit`` messages."""
    return _node(state).conversation(session_id).context(limit)


@post(
    f"{_CONV}/fork", tags=["conversation"], status_code=201, responses=_ERRORS, sync_to_thread=True
)
def fork(state: State, session_id: _Sid, data: JSONBody[ForkRequest]) -> BranchInfo:
    """Start a branch from a message; it becomes current."""
    return _node(state).conversation(session_id).fork(data.from_message_id, data.name)


@post(
    f"{_CONV}/checkout",
    tags=["conversation"],
    status_code=200,
    responses=_ERRORS,
    sync_to_thread=True,
)
def checkout(state: State, session_id: _Sid, data: JSONBody[BranchRequest]) -> BranchInfo:
    """Switch to a branch (number, name, or a message id)."""
    return _node(state).conversation(session_id).checkout(data.branch)


@post(
    f"{_CONV}/merge", tags=["conversation"], status_code=200, responses=_ERRORS, sync_to_thread=True
)
def merge(state: State, session_id: _Sid, data: JSONBody[BranchRequest]) -> Merged:
    """Copy a branch's own messages onto the current branch (both stay)."""
    return _node(state).conversation(session_id).merge(data.branch)


@post(
    f"{_CONV}/delete-branch",
    tags=["conversation"],
    status_code=200,
    responses=_ERRORS,
    sync_to_thread=True,
)
def delete_branch(state: State, session_id: _Sid, data: JSONBody[BranchRequest]) -> DeletePlan:
    """Step one of a deletion: what would go, and the token that confirms it."""
    return _node(state).conversation(session_id).delete_branch(data.branch)


@post(
    f"{_CONV}/delete-branch/confirm",
    tags=["conversation"],
    status_code=200,
    responses=_ERRORS,
    sync_to_thread=True,
)
def confirm_delete(
    state: State, session_id: _Sid, data: JSONBody[ConfirmDeleteRequest]
) -> DeletePlan:
    """Step two: delete the branch the token was issued for."""
    return _node(state).conversation(session_id).confirm_delete(data.token, data.branch)


@get(f"{_CONV}/tree", tags=["conversation"], responses=_ERRORS, sync_to_thread=True)
def conversation_tree(state: State, session_id: _Sid) -> dict[str, Any]:
    """The whole message tree as nested JSON."""
    return _node(state).conversation(session_id).tree()


def _export(fmt: str, media_type: str, doc: str) -> Any:
    def handler(state: State, session_id: _Sid) -> Response[str]:
        content = _node(state).conversation(session_id).export_tree(fmt)
        return Response(content, media_type=media_type)

    handler.__doc__ = doc
    handler.__name__ = f"conversation_tree_{fmt}"
    return get(
        f"{_CONV}/tree.{'txt' if fmt == 'text' else fmt}",
        tags=["conversation"],
        media_type=media_type,
        responses=_ERRORS,
        sync_to_thread=True,
    )(handler)


conversation_tree_text = _export("text", "text/plain", "The message tree drawn as text.")
conversation_tree_html = _export(
    "html", "text/html", "The message tree as one self-contained interactive HTML page."
)


@get(
    f"{_CONV}/transcript",
    tags=["conversation"],
    media_type="application/x-ndjson",
    responses=_ERRORS,
    sync_to_thread=True,
)
def transcript(state: State, session_id: _Sid) -> Response[str]:
    """The transcript as JSONL, one message a line, in the order written."""
    text = "".join(_node(state).conversation(session_id).transcript())
    return Response(text, media_type="application/x-ndjson")


_STRICT_BODIES: tuple[type[msgspec.Struct], ...] = (
    MainRequest,
    SpawnSpec,
    SendRequest,
    Inbound,
    ForkRequest,
    BranchRequest,
    ConfirmDeleteRequest,
)

_V1 = [
    node_status,
    Sessions,
    spawn_child,
    get_session,
    session_tree,
    cancel_session,
    suspend_session,
    resume_session,
    send_message,
    wait_result,
    child_results,
    route_inbound,
    branches,
    context,
    fork,
    checkout,
    merge,
    delete_branch,
    confirm_delete,
    conversation_tree,
    conversation_tree_text,
    conversation_tree_html,
    transcript,
]


def create_app(
    node: Node,
    metrics: Metrics,
    *,
    name: str = "sessiontree",
    max_body: int = MAX_BODY_BYTES,
    max_wait: float = MAX_WAIT,
) -> Litestar:
    """The node's ASGI app. ``max_body`` caps request bodies (413 past it);
    ``max_wait`` caps a long-poll's wait in seconds (at most ``MAX_WAIT``). The
    app never shuts the node down itself: its owner does."""
    app = Litestar(
        route_handlers=[healthz, readyz, metrics_page, Router("/v1", route_handlers=_V1)],
        state=State(
            {
                "node": node,
                "metrics": metrics,
                "name": name,
                "max_body": max_body,
                "max_wait": max_wait,
                "started_at": node.clock.time(),
            }
        ),
        before_request=_strict_body,
        request_max_body_size=max_body,
        exception_handlers={
            RefusedError: _problem,
            SessionTreeError: _tree_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
        openapi_config=OpenAPIConfig(
            title="sessiontree node",
            version="1",
            description="Supervision of AI-agent session trees: sessions, chat routing, "
            "conversation trees.",
        ),
        debug=False,
        logging_config=None,  # the cli configures logging; Litestar's own starts a thread
    )
    _close_request_schemas(app)
    return app


def _close_request_schemas(app: Litestar) -> None:
    """Say ``additionalProperties: false`` for every request Struct that forbids
    unknown fields (Litestar's schema leaves it out), so clients and fuzzers
    know an extra field is refused."""
    components = app.openapi_schema.components
    schemas = components.schemas if components is not None else None
    for struct in _STRICT_BODIES:
        schema = (schemas or {}).get(struct.__name__)
        if isinstance(schema, Schema) and struct.__struct_config__.forbid_unknown_fields:
            schema.additional_properties = False
