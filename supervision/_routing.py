"""Routing an inbound chat message to its Main (``Node.route``).

The agent is the one named (or the only one registered); the session key
comes from its ``dm_scope``; the Main of (agent, key) is got or created; the
text is appended to the Main's conversation once per platform message id and
handed to it as a ``ChatMessage`` — or, for a chat command, answered in
``Routed.reply`` instead. When a person checked out a sub-agent's branch,
a message there continues that sub-agent instead: it is appended to the
branch and a fresh session of the same skill forks at it, seeing the
branch (``Routed.continued``); while that sub-agent still runs, the message
is refused (``Routed.error``: ``invalid_transition``) and nothing is
appended. Bad input raises ``RejectedInputError`` naming the field, counted
in the node's ``rejected_input``.
"""

from __future__ import annotations

import uuid

import msgspec

from sessiontree.protocol import (
    TERMINAL_STATES,
    ChatMessage,
    ContextScope,
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    Routed,
    SessionInfo,
    SessionKind,
    SessionTreeError,
    SpawnSpec,
    UnknownAgentError,
    decode_inbound,
    session_key_for,
)
from sessiontree.supervision._chat import chat_command, is_command
from sessiontree.supervision._config import Agent
from sessiontree.supervision._node_core import NodeCore

__all__ = ["pick_agent", "route_inbound"]

# a conversation's field names, as the inbound message calls them
_INBOUND_FIELDS = {"content": "text", "platform_id": "message_id"}


def route_inbound(node: NodeCore, inbound: object, agent_id: str | None) -> Routed:
    """``Node.route``: see there."""
    try:
        message = decode_inbound(inbound)
        agent = pick_agent(node._runtime.agents, agent_id)
        key = str(session_key_for(message, agent.dm_scope))
    except RejectedInputError:
        node._count_rejected()
        raise
    main = node.main(agent.agent_id, key)
    conversation = node.conversations.get(main.session_id)
    routed = Routed(agent_id=agent.agent_id, key=key, session_id=main.session_id)
    if is_command(message.text):
        reply = chat_command(
            conversation,
            message.text,
            reply_to=message.reply_to,
            sessions=lambda sid: session_or_none(node, sid),
        )
        return msgspec.structs.replace(routed, reply=reply)
    owner = conversation.current_branch.session_id  # a sub-agent's branch checked out
    sub_agent = None if owner is None else session_or_none(node, owner)
    if sub_agent is not None and sub_agent.state not in TERMINAL_STATES:
        text = (
            f"sub-agent {owner} ({sub_agent.skill}) is still {sub_agent.state.value}: wait "
            "for it to end, or /checkout another branch"
        )
        busy = ErrorInfo(code=ErrorCode.INVALID_TRANSITION, message=text)
        return msgspec.structs.replace(routed, error=busy)
    try:
        if message.message_id is None:
            appended, fresh = conversation.append("user", message.text), True
        else:
            appended, fresh = conversation.append_once(
                "user", message.text, platform_id=message.message_id
            )
    except RejectedInputError as exc:
        node._count_rejected()
        field = _INBOUND_FIELDS.get(exc.field or "", exc.field)
        raise RejectedInputError(str(exc), field=field) from None
    if not fresh:  # a gateway's retry: stored and handed over once already
        return msgspec.structs.replace(routed, message_id=appended.id, duplicate=True)
    if sub_agent is not None and sub_agent.kind is not SessionKind.MAIN:
        return _continue(node, routed, appended.id, message.text, sub_agent)
    chat = ChatMessage(key=key, message_id=appended.id, inbound=message)
    error = node.send(main, chat.to_message())
    return msgspec.structs.replace(routed, message_id=appended.id, error=error)


def _continue(
    node: NodeCore, routed: Routed, at: uuid.UUID, text: str, sub_agent: SessionInfo
) -> Routed:
    """A fresh session continuing ``sub_agent``: its skill, kind and tier, the
    message as its task, forked at the message and seeing the sub-agent's
    branch."""
    spec = SpawnSpec(
        kind=sub_agent.kind,
        skill=sub_agent.skill,
        task=text,
        model_tier=sub_agent.model_tier,
        fork_at=at,
        context=ContextScope.BRANCH,
    )
    spawned = node.spawn(routed.session_id, spec)
    continued = None if spawned.ref is None else spawned.ref.session_id
    return msgspec.structs.replace(routed, message_id=at, continued=continued, error=spawned.error)


def session_or_none(node: NodeCore, session_id: uuid.UUID) -> SessionInfo | None:
    """The session's info, or None if the node cannot say (unknown, closing)."""
    try:
        return node.get(session_id)
    except SessionTreeError:
        return None


def pick_agent(agents: dict[str, Agent], agent_id: str | None) -> Agent:
    """The agent named ``agent_id``, or the only one when it is None.

    ``RejectedInputError`` (field ``agent_id``) when None is ambiguous;
    ``UnknownAgentError`` for an id no agent has.
    """
    if agent_id is None:
        if len(agents) != 1:
            msg = f"agent_id is needed: this node has {len(agents)} agents"
            raise RejectedInputError(msg, field="agent_id")
        return next(iter(agents.values()))
    agent = agents.get(agent_id)
    if agent is None:
        msg = f"no agent {agent_id!r} on this node"
        raise UnknownAgentError(msg, field="agent_id")
    return agent
