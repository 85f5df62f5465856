"""What a spawn asks for (``SpawnSpec``) and what a session is (``SessionInfo``)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec

from sessiontree.protocol._conversation import ContextScope
from sessiontree.protocol._states import SessionKind, SessionState
from sessiontree.protocol._usage import Budget

__all__ = ["MAX_REASON_CHARS", "MAX_TASK_CHARS", "SessionInfo", "SpawnSpec"]

MAX_TASK_CHARS = 65_536
MAX_REASON_CHARS = 1024  # a cancel's or a termination's reason (who or why)
MAX_NAME_CHARS = 128

Task = Annotated[str, msgspec.Meta(max_length=MAX_TASK_CHARS)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]
Metadata = Annotated[dict[str, Any], msgspec.Meta(max_length=64)]
TraceParent = Annotated[str, msgspec.Meta(max_length=512)]  # a W3C header's worth


class SpawnSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request for a new child session.

    ``skill`` names one of the owning agent's skills (``None``: the agent's
    default); ``ttl`` ``None`` takes the kind's default; ``model_tier`` ``None``
    lets a branch inherit its parent's tier and gives a worker the agent's
    cheapest; a repeated ``request_id`` under the same parent returns the first
    session instead of creating a second. The child always inherits the
    parent's ``agent_id``. ``backend`` says where its skill runs (``inline``,
    ``process``, ``ray``); ``None`` takes the node's backend for a worker and
    ``inline`` for a branch. ``budget`` bounds what the child's subtree may
    spend; it can only narrow what its parent has left (a wider one is
    clamped, and the spawn's answer says so); ``None`` takes the agent's
    default, or what the parent has left. ``input`` is structured data for
    the child besides its task text (``session.input``): any value msgspec
    encodes as JSON, at most ``MAX_INPUT_BYTES`` encoded and nested
    ``MAX_INPUT_NESTING`` deep; the child reads it as JSON data (a Struct
    becomes a dict, a tuple a list) and it is stored with the session
    (workers' records keep none). ``make_spec`` refuses anything else with
    ``RejectedInputError`` naming ``input``. ``trace`` is a W3C
    ``traceparent``: on a traced node the child's span continues that span
    (a malformed one is ignored, as the W3C specification says); ``None``
    continues the spawning session's span, or starts a new trace.

    The child's context is a branch of its root Main's conversation, forked at
    ``fork_at`` (a message of that conversation; ``None``: the spawning
    session's own tip at the spawn). ``context`` says what its model sees
    of the conversation above the fork: nothing (``own``, the default), the
    branch it forks from (``branch``: continuing a sub-agent) or the path
    from the root (``path``). A skill on the ``process`` or ``ray`` backend
    keeps its own context for its step.

    ``record``: record the run of the child's subtree (every input that is
    not a pure function of its code) so ``Node.replay`` can run it again.

    ``optional``: a child the parent can do without (a hedge's duplicate, a
    speculative attempt). A budget that cannot fit it refuses it with
    ``budget_exhausted`` and nothing more; any other refused spawn reaches the
    hard limit of the budget it did not fit (its subtree is cancelled).
    """

    kind: SessionKind
    task: Task = ""
    context_summary: Task = ""
    skill: Name | None = None
    ttl: float | None = None
    model_tier: Name | None = None
    request_id: Name | None = None
    metadata: Metadata = msgspec.field(default_factory=dict)
    backend: Name | None = None
    budget: Budget | None = None
    input: Any = None
    trace: TraceParent | None = None
    fork_at: uuid.UUID | None = None
    context: ContextScope = ContextScope.OWN
    record: bool = False
    optional: bool = False


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A snapshot of one session's identity and state.

    Timestamps are float seconds since the epoch (UTC); ``deadline`` is the
    wall-clock instant the TTL runs out (``None``: no TTL). ``backend`` is where
    its skill runs (``inline``, ``process``, ``ray``); ``budget`` what its
    subtree may spend (a Main's: per message cycle), after narrowing.
    ``input`` is the structured input its spawn carried (JSON data, or None).
    ``trace``: on a traced node, the W3C ``traceparent`` of a Branch's or
    Worker's span (a Main's cycles each have their own: ``session.traceparent``);
    ``trace_parent`` the span it continues (None: it began its trace).
    ``conversation`` is the conversation its context is a branch of (its root
    Main's session id; a Main's own), ``fork_at`` and ``context`` what its
    spawn asked (see ``SpawnSpec``).
    """

    session_id: uuid.UUID
    agent_id: str
    parent_id: uuid.UUID | None
    kind: SessionKind
    state: SessionState
    depth: int
    created_at: float
    ttl: float | None
    deadline: float | None
    task: str = ""
    context_summary: str = ""
    model_tier: str | None = None
    skill: str = ""
    key: str | None = None
    request_id: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    backend: str = "inline"
    budget: Budget | None = None
    input: Any = None
    trace: str | None = None
    trace_parent: str | None = None
    conversation: uuid.UUID | None = None
    fork_at: uuid.UUID | None = None
    context: ContextScope = ContextScope.OWN
