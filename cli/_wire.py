"""The HTTP API's request and response bodies (msgspec Structs, strict on the way in).

Requests forbid unknown fields and bound every string and list; the API
decodes them with ``protocol.decode_strict`` (size cap, nesting cap, no
coercion) before the framework sees them. Responses reuse the protocol's
Structs.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Annotated, Any

import msgspec

from sessiontree.protocol import (
    MAIN_KEY,
    MAX_REASON_CHARS,
    Budget,
    ErrorCode,
    SessionInfo,
    SessionResult,
    Spending,
    Usage,
)
from sessiontree.supervision import Provider

__all__ = [
    "ApiError",
    "BranchRequest",
    "CancelRequest",
    "ConfirmDeleteRequest",
    "ErrorBody",
    "ForkRequest",
    "MainRequest",
    "NodeStatus",
    "SendRequest",
    "SessionPage",
    "SessionView",
    "Spawn",
    "TerminateRequest",
    "TreeView",
    "WaitResult",
    "plain_figures",
    "provider_settings",
    "session_view",
    "settings_of",
    "tree_view",
]

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
_Key = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
_Ref = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class MainRequest(_Request, frozen=True):
    """Get or create the one Main of ``agent_id`` for session ``key``."""

    agent_id: _Name
    key: _Key = MAIN_KEY


class SendRequest(_Request, frozen=True):
    """An inbound message for a Main (it starts one message cycle)."""

    message: Any


_Reason = Annotated[str, msgspec.Meta(max_length=MAX_REASON_CHARS)]


class CancelRequest(_Request, frozen=True):
    """A cancel's grace in seconds (finite, >= 0; absent or null: the node's
    grace; 0: what still runs ends ``terminated_by_force`` at once), and its
    ``reason`` (who or why, recorded on the subtree's events and results)."""

    grace: Annotated[float, msgspec.Meta(ge=0)] | None = None
    reason: _Reason | None = None


class TerminateRequest(_Request, frozen=True):
    """A termination's ``reason`` (who or why, recorded on the subtree's events
    and results)."""

    reason: _Reason | None = None


class ForkRequest(_Request, frozen=True):
    """Start a branch at ``from_message_id``; ``name`` defaults to ``branch-N``."""

    from_message_id: uuid.UUID
    name: _Name | None = None


class BranchRequest(_Request, frozen=True):
    """Name a branch: its number, its name, or (checkout only) a message id."""

    branch: _Ref


class ConfirmDeleteRequest(_Request, frozen=True):
    """The second step of a deletion: the token the first step returned."""

    branch: _Ref
    token: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class ApiError(msgspec.Struct, frozen=True, kw_only=True):
    """What went wrong: a machine-readable ``code``, a sentence, and the
    ``field`` (a dotted path into the request) or ``session_id`` it concerns."""

    code: ErrorCode
    message: str
    field: str | None = None
    session_id: uuid.UUID | None = None
    detail: dict[str, Any] = msgspec.field(default_factory=dict)


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every 4xx and 5xx answer of the API."""

    status: int
    error: ApiError


class SessionView(msgspec.Struct, frozen=True, kw_only=True):
    """One session: identity and state, its result once it ended, and its
    accounts (``Spending``): ``usage`` (its own model calls), ``subtree_usage``
    (with every descendant's), ``reserved`` (calls in flight below it), its
    ``budget`` and ``budget_left`` (null without one; a Main's per message
    cycle), ``budget_clamped`` and ``budget_exhausted`` (the dimension that ran
    out, or null). A session that has ended reports its result's usage."""

    info: SessionInfo
    result: SessionResult | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    subtree_usage: Usage = msgspec.field(default_factory=Usage)
    reserved: Usage = msgspec.field(default_factory=Usage)
    budget: Budget | None = None
    budget_left: Budget | None = None
    budget_clamped: bool = False
    budget_exhausted: str | None = None


class TreeView(SessionView, frozen=True, kw_only=True):
    """A session as ``SessionView`` shows it, and its children, oldest first."""

    children: list[TreeView] = msgspec.field(default_factory=list)


def _accounts(spending: Spending) -> dict[str, Any]:
    return {
        "usage": spending.usage,
        "subtree_usage": spending.subtree_usage,
        "reserved": spending.reserved,
        "budget": spending.budget,
        "budget_left": spending.budget_left,
        "budget_clamped": spending.budget_clamped,
        "budget_exhausted": spending.budget_exhausted,
    }


def session_view(
    info: SessionInfo, result: SessionResult | None, spending: Spending
) -> SessionView:
    """The view of one session from its identity, result and accounts."""
    return SessionView(info=info, result=result, **_accounts(spending))


def tree_view(node: dict[str, Any]) -> TreeView:
    """``Node.tree``'s nested dicts (``info``, ``result``, ``spending``,
    ``children``) as a ``TreeView``."""
    return TreeView(
        info=node["info"],
        result=node["result"],
        children=[tree_view(child) for child in node["children"]],
        **_accounts(node["spending"]),
    )


class Spawn(msgspec.Struct, frozen=True, kw_only=True):
    """A created session (``existing``: a repeated request_id returned the first)."""

    info: SessionInfo
    existing: bool = False


class SessionPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of sessions, oldest first; pass ``next_cursor`` for the next page."""

    items: list[SessionInfo]
    next_cursor: str | None = None


class WaitResult(msgspec.Struct, frozen=True, kw_only=True):
    """A long-poll's answer: ``done`` with the result, or not yet (the wait timed out)."""

    done: bool
    result: SessionResult | None = None


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The node at a glance: what it runs, how long, its counters and its store;
    ``skills``: each agent's skill names (by agent id, in registration order);
    ``replay_held``: why its start held replay back (the node kept crashing),
    ``wedged``: work recovery held back and nobody requeued or dropped yet;
    ``recovery``: what recovery did at the start (``recovery_summary``)."""

    node: str
    version: str
    state: str
    uptime_s: float
    agents: list[str]
    sessions: dict[str, int]
    stats: dict[str, int]
    config: dict[str, Any]
    store: dict[str, Any] | None = None
    replay_held: str | None = None
    wedged: int = 0
    recovery: dict[str, int] | None = None
    skills: dict[str, list[str]] = msgspec.field(default_factory=dict)


def settings_of(config: Any) -> dict[str, Any]:
    """A ``NodeConfig``'s fields as plain values (callables, like the memory
    pressure probe, left out; providers as ``provider_settings`` shows them)."""
    settings = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if not callable(getattr(config, f.name))
    }
    if "providers" in settings:
        settings["providers"] = [provider_settings(p) for p in settings["providers"]]
    tracing = settings.get("tracing")
    if tracing is not None:  # header values may be keys: only their names are shown
        settings["tracing"] = {
            "endpoint": tracing.endpoint,
            "headers": sorted(tracing.headers),
            "sampling_ratio": tracing.sampling_ratio,
            "service_name": tracing.service_name,
            "capture_content": tracing.capture_content,
        }
    return settings


def provider_settings(provider: Provider) -> dict[str, Any]:
    """A model provider as plain values, its key left out: ``api_key`` says
    only whether one was given (a key file's path is shown)."""
    return {
        "name": provider.name,
        "base_url": provider.base_url,
        "api_key": "set" if provider.api_key is not None else None,
        "api_key_file": provider.api_key_file,
        "timeout": provider.timeout,
        "connect_timeout": provider.connect_timeout,
        "max_retries": provider.max_retries,
        "retry_wait": provider.retry_wait,
        "retry_wait_max": provider.retry_wait_max,
        "prices": {
            model: {"prompt": price.prompt, "completion": price.completion}
            for model, price in provider.prices.items()
        },
    }


def plain_figures(figures: dict[str, Any]) -> dict[str, Any]:
    """``Store.stats()`` without the values JSON cannot carry."""
    return {k: v for k, v in figures.items() if isinstance(v, int | float | str)}
