"""What recovery decided, under ``/v1/recovery``, and the work it held back
(wedged or stale), under ``/v1/wedged``: listed, read, requeued, dropped.

An id no held item has is a 404 ``unknown_session`` naming it; a requeue the
node refuses (its Main ended, the spawn of a fresh branch refused) answers
with that refusal's code and status.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from typing import Annotated, Any

import msgspec
from litestar import delete, get, post
from litestar.datastructures import State
from litestar.params import PathParameter

from sessiontree.cli.server._errors import ERRORS, refuse
from sessiontree.cli.server._shared import node_of
from sessiontree.protocol import ErrorCode, ErrorInfo, SessionResult
from sessiontree.store import WedgedRecord

__all__ = ["RECOVERY_ROUTES", "RecoveryView", "WedgedView", "wedged_view"]

#: What every route here shares: its OpenAPI tag and errors, and a worker thread.
_get = functools.partial(get, tags=["recovery"], responses=ERRORS, sync_to_thread=True)
_post = functools.partial(
    post, tags=["recovery"], status_code=200, responses=ERRORS, sync_to_thread=True
)
_delete = functools.partial(delete, tags=["recovery"], responses=ERRORS, sync_to_thread=True)

Wid = Annotated[uuid.UUID, PathParameter(description="The held-back item's id.")]


class WedgedView(msgspec.Struct, frozen=True, kw_only=True):
    """Work recovery held back: a Main's ``message`` or child ``result``, or a
    ``branch`` (``session_id``: the Main, or the branch)."""

    wedged_id: uuid.UUID
    kind: str
    session_id: uuid.UUID
    agent_id: str
    attempts: int
    reason: str
    at: float
    seq: int | None = None
    message: Any = None
    received_at: float | None = None
    result: SessionResult | None = None


class RecoveryView(msgspec.Struct, frozen=True, kw_only=True):
    """What recovery found at the node's start, each decision beyond a plain
    first run, and why replay is held (None: it is not)."""

    figures: dict[str, int]
    decisions: list[dict[str, Any]]
    replay_held: str | None
    wedged: int


class Released(msgspec.Struct, frozen=True, kw_only=True):
    released: int


class RequeuedView(msgspec.Struct, frozen=True, kw_only=True):
    """The session that runs the work again (the Main, or a fresh branch)."""

    session_id: uuid.UUID | None


def wedged_view(record: WedgedRecord) -> WedgedView:
    return WedgedView(
        wedged_id=record.wedged_id,
        kind=record.kind,
        session_id=record.session_id,
        agent_id=record.agent_id,
        attempts=record.attempts,
        reason=record.reason,
        at=record.at,
        seq=record.seq,
        message=record.message,
        received_at=record.received_at,
        result=record.result,
    )


def _unknown(wedged_id: uuid.UUID) -> ErrorInfo:
    return ErrorInfo(code=ErrorCode.UNKNOWN_SESSION, message=f"no held-back item {wedged_id}")


@_get("/recovery")
def recovery(state: State) -> RecoveryView:
    """What recovery found and decided when the node started."""
    node = node_of(state)
    return RecoveryView(
        figures=dict(node.recovery.figures),
        decisions=[msgspec.to_builtins(dataclasses.asdict(d)) for d in node.recovery.decisions],
        replay_held=node.recovery.replay_held,
        wedged=len(node.recovery.wedged()),
    )


@_post("/recovery/release")
def release(state: State) -> Released:
    """Run what a held replay kept back (the node had kept crashing), and retry
    at once the Main cycles a store refusal kept."""
    return Released(released=node_of(state).recovery.release_replay())


@_get("/wedged")
def list_wedged(state: State) -> list[WedgedView]:
    """Work recovery held back, oldest first."""
    return [wedged_view(record) for record in node_of(state).recovery.wedged()]


@_get("/wedged/{wedged_id:uuid}")
def show_wedged(state: State, wedged_id: Wid) -> WedgedView:
    """One held-back item."""
    record = node_of(state).recovery.wedged_item(wedged_id)
    if record is None:
        refuse(_unknown(wedged_id))
    assert record is not None
    return wedged_view(record)


@_post("/wedged/{wedged_id:uuid}/requeue", status_code=202)
def requeue(state: State, wedged_id: Wid) -> RequeuedView:
    """Run held-back work again, as a first attempt (a wedged branch: a fresh
    session under its parent)."""
    requeued = node_of(state).recovery.requeue(wedged_id)
    refuse(requeued.error, requeued.session_id)
    return RequeuedView(session_id=requeued.session_id)


@_delete("/wedged/{wedged_id:uuid}")
def drop(state: State, wedged_id: Wid) -> None:
    """Forget a held-back item for good."""
    if not node_of(state).recovery.drop_wedged(wedged_id):
        refuse(_unknown(wedged_id))


RECOVERY_ROUTES = (recovery, release, list_wedged, show_wedged, requeue, drop)
"""Served under ``/v1``."""
