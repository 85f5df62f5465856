"""A session's conversation tree under ``/v1/sessions/{id}/conversation``:
branches, the active context, fork, checkout, merge, two-step deletion, and
the tree as JSON, text, HTML or a JSONL transcript.

The conversation's operations are synchronous (they wait for durable
writes), so every handler runs in a worker thread. An unknown session is a
404 ``unknown_session``; an unknown message or branch a 404 naming the
field; a name taken, the current branch named where another is needed, or a
deletion token that no longer matches a 409; a write to a Worker's
conversation (read-only) a 403 ``not_allowed``.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from litestar import Response, get, post
from litestar.datastructures import State
from litestar.params import JSONBody, QueryParameter

from sessiontree.cli._wire import BranchRequest, ConfirmDeleteRequest, ForkRequest
from sessiontree.cli.server._errors import ERRORS
from sessiontree.cli.server._shared import Sid, node_of
from sessiontree.conversations import render_html
from sessiontree.protocol import BranchInfo, DeletePlan, Merged, Message, SessionTreeError
from sessiontree.supervision import Node

__all__ = ["CONVERSATION_ROUTES"]

#: What every route here shares: its OpenAPI tag and errors, and a worker thread.
_get = functools.partial(get, tags=["conversation"], responses=ERRORS, sync_to_thread=True)
_post = functools.partial(
    post, tags=["conversation"], status_code=200, responses=ERRORS, sync_to_thread=True
)


@_get("/sessions/{session_id:uuid}/conversation/branches")
def branches(state: State, session_id: Sid) -> list[BranchInfo]:
    """The conversation's branches (``current`` marks the active one)."""
    return node_of(state).conversation(session_id).branches()


@_get("/sessions/{session_id:uuid}/conversation/context")
def context(
    state: State, session_id: Sid, limit: Annotated[int, QueryParameter(ge=0, le=10_000)] = 100
) -> list[Message]:
    """The active path, oldest first, at most ``limit`` messages."""
    return node_of(state).conversation(session_id).context(limit)


@_post("/sessions/{session_id:uuid}/conversation/fork", status_code=201)
def fork(state: State, session_id: Sid, data: JSONBody[ForkRequest]) -> BranchInfo:
    """Start a branch from a message; it becomes current.

    An unknown message is a 404; a name already taken a 409 ``branch_exists``."""
    return node_of(state).conversation(session_id).fork(data.from_message_id, data.name)


@_post("/sessions/{session_id:uuid}/conversation/checkout")
def checkout(state: State, session_id: Sid, data: JSONBody[BranchRequest]) -> BranchInfo:
    """Switch to a branch (number, name, or a message id).

    A branch or message that does not exist is a 404."""
    return node_of(state).conversation(session_id).checkout(data.branch)


@_post("/sessions/{session_id:uuid}/conversation/merge")
def merge(state: State, session_id: Sid, data: JSONBody[BranchRequest]) -> Merged:
    """Copy a branch's own messages onto the current branch (both stay).

    An unknown branch is a 404 ``unknown_branch``; the current branch itself a
    409 ``current_branch``."""
    return node_of(state).conversation(session_id).merge(data.branch)


@_post("/sessions/{session_id:uuid}/conversation/delete-branch")
def delete_branch(state: State, session_id: Sid, data: JSONBody[BranchRequest]) -> DeletePlan:
    """Step one of a deletion: what would go, and the token that confirms it.

    Nothing is deleted yet; the current branch is a 409 ``current_branch``."""
    return node_of(state).conversation(session_id).delete_branch(data.branch)


@_post("/sessions/{session_id:uuid}/conversation/delete-branch/confirm")
def confirm_delete(
    state: State, session_id: Sid, data: JSONBody[ConfirmDeleteRequest]
) -> DeletePlan:
    """Step two: delete the branch the token was issued for.

    A token of a plan that no longer holds (the branch changed since), or not
    of ``branch``, is a 409 ``confirmation_mismatch`` and deletes nothing."""
    return node_of(state).conversation(session_id).confirm_delete(data.token, data.branch)


@_get("/sessions/{session_id:uuid}/conversation/tree")
def conversation_tree(state: State, session_id: Sid) -> dict[str, Any]:
    """The whole message tree as nested JSON."""
    return node_of(state).conversation(session_id).tree()


@_get("/sessions/{session_id:uuid}/conversation/tree.txt", media_type="text/plain")
def conversation_tree_text(state: State, session_id: Sid) -> Response[str]:
    """The message tree drawn as text."""
    content = node_of(state).conversation(session_id).export_tree("text")
    return Response(content, media_type="text/plain")


@_get("/sessions/{session_id:uuid}/conversation/tree.html", media_type="text/html")
def conversation_tree_html(state: State, session_id: Sid) -> Response[str]:
    """The message tree as one self-contained interactive HTML page; a message a
    sub-agent wrote, or one reporting its result, names that session (kind,
    skill, state) and links to its page."""
    node = node_of(state)
    tree = node.conversation(session_id).tree()
    tree["sessions"] = _sessions_in(node, tree)
    content = render_html(tree, title=f"Conversation {tree['sessionId']}")
    return Response(content, media_type="text/html")


def _sessions_in(node: Node, tree: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The sub-agents ``tree`` names (its branches' and its result messages'),
    as the page shows them; one the node no longer knows is left out."""
    named = {b["sessionId"] for b in tree["branches"] if "sessionId" in b}
    stack = list(tree["root"]["children"])
    while stack:  # without recursion: a conversation may be deep
        message = stack.pop()
        if "sessionId" in message:
            named.add(message["sessionId"])
        stack.extend(message["children"])
    sessions = {}
    for sid in sorted(named):
        try:
            info = node.get(sid)
        except SessionTreeError:
            continue
        sessions[sid] = {
            "kind": info.kind.value,
            "skill": info.skill,
            "state": info.state.value,
            "url": f"../../{sid}/tree.html",
        }
    return sessions


@_get("/sessions/{session_id:uuid}/conversation/transcript", media_type="application/x-ndjson")
def transcript(state: State, session_id: Sid) -> Response[str]:
    """The transcript as JSONL, one message a line, in the order written."""
    text = "".join(node_of(state).conversation(session_id).transcript())
    return Response(text, media_type="application/x-ndjson")


CONVERSATION_ROUTES = (
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
)
"""Served under ``/v1``, in the order they are registered."""
