"""JSON values: what a message, a progress note or conversation content may carry."""

from __future__ import annotations

from typing import Any

import msgspec

from sessiontree.protocol._conversation import MAX_CONTENT_BYTES
from sessiontree.protocol._errors import RejectedInputError

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_REQUEST_ID_CHARS",
    "as_json",
    "check_message",
    "check_request_id",
    "check_text",
]

#: A Main's inbound message, in characters (a structured message: of its JSON
#: text), named as a spawn's task is (``MAX_TASK_CHARS``, a quarter of it): a
#: message may carry a pasted document, and at most 4 bytes a character it
#: still fits a conversation message's content (``MAX_CONTENT_BYTES``).
MAX_MESSAGE_CHARS = 1 << 18

_ENCODER = msgspec.json.Encoder()


def as_json(name: str, value: Any) -> Any:
    """``value`` as its JSON form (what every backend keeps: a tuple becomes a
    list), or ``RejectedInputError`` naming ``name`` when it has none or is too big."""
    if value is None or type(value) is bool:
        return value
    if type(value) is str and len(value) <= MAX_CONTENT_BYTES // 4:  # cannot be over the cap
        check_text(value, name)
        return value
    try:
        encoded = _ENCODER.encode(value)
    except (TypeError, msgspec.EncodeError, RecursionError, UnicodeEncodeError) as exc:
        msg = f"{name} must be a JSON value: {exc}"
        raise RejectedInputError(msg, field=name) from None
    if len(encoded) > MAX_CONTENT_BYTES:
        msg = f"{name} is {len(encoded)} bytes encoded; at most {MAX_CONTENT_BYTES}"
        raise RejectedInputError(msg, field=name)
    return msgspec.json.decode(encoded)


def check_message(message: Any) -> None:
    """``RejectedInputError`` naming ``message`` when it is over
    ``MAX_MESSAGE_CHARS``. A value JSON cannot hold is left to whatever keeps it
    (an embedding's own object, on a node without a store)."""
    if type(message) is str:
        size = len(message)
    else:
        try:
            encoded = _ENCODER.encode(message)
        except (TypeError, msgspec.EncodeError, RecursionError, UnicodeEncodeError):
            return
        size = len(encoded)
        if size > MAX_MESSAGE_CHARS:  # bytes; the characters may be fewer
            size = len(encoded.decode())
    if size > MAX_MESSAGE_CHARS:
        msg = f"a message is at most {MAX_MESSAGE_CHARS} characters; this one is {size}"
        raise RejectedInputError(msg, field="message")


MAX_REQUEST_ID_CHARS = 255


def check_request_id(request_id: object) -> None:
    """``RejectedInputError`` naming ``request_id`` unless it is None or a string
    of 1 to ``MAX_REQUEST_ID_CHARS`` characters UTF-8 can hold."""
    if request_id is None:
        return
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
        msg = f"request_id must be a string of 1 to {MAX_REQUEST_ID_CHARS} characters"
        raise RejectedInputError(msg, field="request_id")
    check_text(request_id, "request_id")


def check_text(text: str, field: str) -> None:
    """``RejectedInputError`` naming ``field`` for text UTF-8 cannot hold (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = f"{field} is not valid text: {exc.reason} at character {exc.start}"
        raise RejectedInputError(msg, field=field) from None
