"""How a failure becomes an answer: the HTTP status of each ``ErrorCode``, the
error responses every operation documents, and the app's exception handlers.

Every failure is answered with an ``ErrorBody``: a refusal the node returned
or raised (``RefusedError``, ``SessionTreeError``) gets the status of its
code and names its field and session; a mistake the framework caught (a bad
query parameter, an unknown route, a body over the cap) is a
``rejected_input`` with the framework's status; anything else is logged and
answered 500 ``internal_error`` without a word of the exception's text.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from typing import Any

from litestar import Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import ResponseSpec
from litestar.types import ExceptionHandlersMap

from sessiontree.cli._wire import ApiError, ErrorBody
from sessiontree.cli.server._shared import count_rejected
from sessiontree.protocol import ErrorCode, ErrorInfo, SessionTreeError

__all__ = ["ERRORS", "EXCEPTION_HANDLERS", "RefusedError", "refuse", "status_for"]

log = logging.getLogger("sessiontree.api")

_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.UNKNOWN_AGENT: 404,
    ErrorCode.UNKNOWN_MESSAGE: 404,
    ErrorCode.UNKNOWN_BRANCH: 404,
    ErrorCode.UNKNOWN_SKILL: 404,
    ErrorCode.UNKNOWN_BACKEND: 404,
    ErrorCode.NOT_ALLOWED: 403,
    ErrorCode.CAPACITY_EXCEEDED: 429,
    ErrorCode.NODE_CLOSED: 503,
    ErrorCode.STORE_FULL: 503,
    ErrorCode.STORE_FAILED: 503,
    ErrorCode.STORE_LOCKED: 503,
    ErrorCode.STORE_DAMAGED: 503,
    ErrorCode.STORE_FENCED: 503,
    ErrorCode.CORRUPT_RECORD: 503,
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
        ErrorCode.BACKEND_UNAVAILABLE,  # the node's setup, not the request, refuses it
        ErrorCode.SLOT_MOVED,  # its tree lives on another node now: detail names the owner
        ErrorCode.SLOT_FROZEN,  # its tree is being moved: retry, then its owner answers
        ErrorCode.SLOT_CONFLICT,
    }
)
# the field an error names when its detail names none
_FIELDS = {ErrorCode.INVALID_TTL: "ttl", ErrorCode.UNKNOWN_SKILL: "skill"}
# Python names of parameters whose public name differs ("state" is reserved; a header).
_QUERY_NAMES = {"session_state": "state", "last_event_id": "Last-Event-ID"}

ERRORS = {
    status: ResponseSpec(ErrorBody, description=text)
    for status, text in (
        (400, "A client mistake: the field is named"),
        (401, "No bearer token, or not the node's (a node started with --token-file)"),
        (
            403,
            "Not allowed on this session (a message to anything but a Main, a write "
            "to a Worker's conversation)",
        ),
        (404, "Unknown session, agent, skill, backend, message or branch"),
        (
            409,
            "The tree's rules or the session's state refuse it, or its slot moved to "
            "another node (slot_moved: detail names the owner) or is being moved",
        ),
        (413, "The body is over the size cap"),
        (429, "The node is at capacity"),
        (503, "The node is closing, or its store failed or holds a damaged record"),
    )
}
"""The error responses every operation documents (all ``ErrorBody``)."""


def status_for(code: ErrorCode) -> int:
    """The HTTP status of an error code: 404 unknown things (a session, an
    agent, a skill of the parent's agent, a backend…), 409 conflicts with the
    tree's rules, a session's state or the node's setup (a slot moved away or
    being moved included), 429 capacity, 503 a closed node or failing
    store, 400 any other client mistake."""
    if code in _CONFLICTS:
        return 409
    return _STATUS.get(code, 400)


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


def refuse(error: ErrorInfo | None, session_id: uuid.UUID | None = None) -> None:
    """Raise ``RefusedError`` for ``error`` (about ``session_id``) when there is
    one; return quietly when the node accepted (``error`` is None)."""
    if error is not None:
        raise RefusedError(error, session_id=session_id)


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
    """A refusal: the status of its code; the field from the handler, the
    error's detail or the code; the session from the handler or the detail."""
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
    """A library error the node raised, answered as the refusal it carries."""
    info = exc.to_info()
    field = getattr(exc, "field", None)
    if exc.session_id is not None:
        info.detail.setdefault("session_id", str(exc.session_id))
    return _problem(request, RefusedError(info, field=field))


def _http_error(request: Request[Any, Any, State], exc: HTTPException) -> Response[ErrorBody]:
    """A mistake the framework caught: its status, ``rejected_input`` (or
    ``node_closed`` for a 503), the parameter it names, its headers kept."""
    status = exc.status_code
    field = None
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict):
            key = first.get("key")
            field = _QUERY_NAMES.get(str(key), key)
        count_rejected(request, "invalid_field")
    elif status == 413:
        count_rejected(request, "too_large")
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    code = ErrorCode.NODE_CLOSED if status == 503 else ErrorCode.REJECTED_INPUT
    if status == 413:
        detail = f"the request body is over the cap of {request.app.state.max_body} bytes"
    elif status == 404 and field is None:
        code, field, detail = _not_found(request.url.path)
    elif status == 405 and field is None:
        detail = f"{detail}: {request.method} {request.url.path}"
    message = detail if field is None else f"{detail}: {field}"
    if isinstance(exc.extra, list) and exc.extra and isinstance(exc.extra[0], dict):
        message = f"{message} ({exc.extra[0].get('message', '')})"
    # keep the framework's headers: a 405 must say what is Allowed (RFC 9110)
    return _body(status, ApiError(code=code, message=message, field=field), exc.headers)


#: Path segments an id follows, and the code and field a malformed one is answered with.
_ID_AFTER = {
    "sessions": (ErrorCode.UNKNOWN_SESSION, "session_id"),
    "wedged": (ErrorCode.UNKNOWN_SESSION, "wedged_id"),
}


def _not_found(path: str) -> tuple[ErrorCode, str | None, str]:
    """What a 404 the router gave means: an id that is not one, where a session's
    (or a held-back item's) goes, is ``unknown_session`` naming its field;
    anything else is a route that does not exist (``not_found``)."""
    parts = path.strip("/").split("/")
    if parts[0] != "v1":
        return ErrorCode.NOT_FOUND, None, f"no route {path[:200]}"
    for before, segment in itertools.pairwise(parts):
        known = _ID_AFTER.get(before)
        if known is not None:
            try:
                uuid.UUID(segment)
            except ValueError:
                code, field = known
                return code, field, f"not an id: {segment[:64]!r}"
    return ErrorCode.NOT_FOUND, None, f"no route {path[:200]}"


def _unexpected(_: Request[Any, Any, State], exc: Exception) -> Response[ErrorBody]:
    """A bug: logged with its traceback, answered 500 naming only its type."""
    log.exception("unexpected error in the HTTP API", exc_info=exc)
    return _body(
        500,
        ApiError(code=ErrorCode.INTERNAL_ERROR, message=f"internal error: {type(exc).__name__}"),
    )


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    RefusedError: _problem,
    SessionTreeError: _tree_error,
    HTTPException: _http_error,
    Exception: _unexpected,
}
"""The app's exception handlers, the most specific first."""
