"""Continuation tokens: a finished run named by what ran and what it concluded.

Every run is a fresh session, so continuing a sub-agent's work passes an
explicit token and explicit context, never the old session itself. A token is a
versioned msgpack body in URL-safe base64: the run's session id, its kind,
skill and task, its result's summary, and (version 2) the conversation and
the last message of its context branch, so a continuation forks from the
tip of that branch and sees it whole, also after a restart. ``continue_run``
(in ``_patterns``) starts a fresh session from one; every completed task of
a pattern carries one in its ``ChildReport``. Version 1 tokens still parse.
"""

from __future__ import annotations

import base64
import uuid

import msgspec

from sessiontree.protocol import (
    MAX_TASK_CHARS,
    RejectedInputError,
    SessionKind,
    SessionResult,
    SpawnSpec,
)

__all__ = ["continuation_token", "parse_continuation"]


class _Continuation(msgspec.Struct, frozen=True):
    """The body of a continuation token (version ``v`` 1 or 2; 2 adds the
    conversation and the message its context branch ended at)."""

    v: int
    session_id: uuid.UUID
    kind: SessionKind
    skill: str | None
    task: str
    summary: str
    conversation: uuid.UUID | None = None
    message: uuid.UUID | None = None


def continuation_token(spec: SpawnSpec, result: SessionResult) -> str:
    """A token naming a finished run: what ran (kind, skill, task), what it
    said, and where its context branch ended. Never raises for a valid spec
    and result."""
    body = _Continuation(
        2,
        result.session_id,
        spec.kind,
        spec.skill,
        spec.task,
        result.summary,
        result.conversation,
        result.context_leaf,
    )
    return base64.urlsafe_b64encode(msgspec.msgpack.encode(body)).decode()


def parse_continuation(token: object) -> _Continuation:
    """Decode a continuation token; ``RejectedInputError`` (field ``token``) if it is
    not a string, is too long, does not decode, or has an unknown version."""
    if not isinstance(token, str) or len(token) > 4 * MAX_TASK_CHARS:
        raise RejectedInputError("token must be a continuation token string", field="token")
    try:
        raw = base64.urlsafe_b64decode(token.encode())
        body = msgspec.msgpack.decode(raw, type=_Continuation)
    except (ValueError, msgspec.DecodeError) as exc:
        msg = f"token is not a continuation token: {exc}"
        raise RejectedInputError(msg, field="token") from None
    if body.v not in (1, 2):
        raise RejectedInputError(f"continuation token version {body.v} is unknown", field="token")
    return body
