"""A refusal sent straight over ASGI, before any route runs: the node's guards
(the bearer token, cross-site requests, the connection cap) answer with the
same ``ErrorBody`` as the routes' own errors."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Send

from sessiontree.cli._wire import ApiError, ErrorBody
from sessiontree.protocol import ErrorCode

__all__ = ["error_body", "send_refusal"]


def error_body(status: int, code: ErrorCode, message: str, field: str | None = None) -> bytes:
    """The JSON ``ErrorBody`` of a refusal."""
    error = ApiError(code=code, message=message, field=field)
    return msgspec.json.encode(ErrorBody(status=status, error=error))


async def send_refusal(
    send: Send,
    status: int,
    code: ErrorCode,
    message: str,
    *,
    field: str | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Answer the request with ``status`` and its ``ErrorBody`` (``headers``
    added to the content type and length)."""
    body = error_body(status, code, message, field)
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
    }
    await send(start)
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(end)
