"""Chat routing under ``/v1/route``: an inbound chat message to its Main.

A bad message is a 400 naming the field; an unknown ``agent_id`` a 404
``unknown_agent``; a node at capacity or closing answers with that code's
status (see ``_errors.status_for``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Request, post
from litestar.datastructures import State
from litestar.params import JSONBody, QueryParameter

from sessiontree.cli.server._errors import ERRORS
from sessiontree.cli.server._shared import node_of
from sessiontree.protocol import Inbound, Routed

__all__ = ["CHAT_ROUTES"]


@post("/route", tags=["chat"], status_code=200, responses=ERRORS)
async def route_inbound(
    request: Request[object, object, State],
    state: State,
    data: JSONBody[Inbound],
    agent_id: Annotated[str | None, QueryParameter(max_length=128)] = None,
) -> Routed:
    """Route an inbound chat message to its Main by per-sender session key;
    chat commands (``/branches``…) are answered in ``reply``. ``/tree html``
    answers with the address of the conversation's page (``data.url``), not
    the page itself: a chat shows a link, not a document.

    A message seen before is answered ``duplicate: true`` and not routed
    again."""
    routed = await node_of(state).aroute(data, agent_id)
    reply = routed.reply
    if reply is None or reply.command != "tree" or reply.data.get("format") != "html":
        return routed
    base = str(request.base_url).rstrip("/")
    url = f"{base}/v1/sessions/{routed.session_id}/conversation/tree.html"
    linked = msgspec.structs.replace(
        reply,
        text=f"🌳 Conversation tree: {url}",
        data={"format": "html", "url": url},
    )
    return msgspec.structs.replace(routed, reply=linked)


CHAT_ROUTES = (route_inbound,)
"""Served under ``/v1``."""
