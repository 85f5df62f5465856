"""Embedding sessiontree in an asyncio application, with no threads of your own.

    python examples/asyncio_app.py

A Main receives a chat message, fans a question out to three async workers,
one of which crashes; the Main hears each result as a message cycle. The
application awaits everything through the node's awaitable twins.
"""

from __future__ import annotations

import asyncio

from sessiontree.actors import AsyncSession
from sessiontree.protocol import SessionResult
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig

HEARD: list[str] = []


async def lead(session: AsyncSession) -> None:
    """One message cycle per inbound message or child result."""
    if isinstance(session.message, SessionResult):
        result = session.message
        HEARD.append(f"{result.status}: {result.summary or result.error.code}")
        return
    for source in ("docs", "issues", "a flaky mirror"):
        await session.spawn(kind="worker", task=f"{session.message} in {source}", skill="look")


async def look(session: AsyncSession) -> str:
    await session.sleep(0.05)  # stands in for a model or a search call
    if "flaky" in session.task:
        raise ConnectionError("mirror unreachable")
    return f"found {session.task!r}"


async def main() -> None:
    agent = Agent("helper", {"lead": lead, "look": look}, main_skill="lead")
    node = Node([agent], NodeConfig(grace=2.0))
    loop = asyncio.get_running_loop()
    heard_all = asyncio.Event()

    def on_event(event: Event) -> None:  # runs on the Cortex thread: hand over, return
        if event.kind is EventKind.CYCLE_ENDED and len(HEARD) == 3:
            loop.call_soon_threadsafe(heard_all.set)

    node.subscribe(on_event)
    try:
        chat = await node.amain("helper", "telegram:dm:42")
        await chat.asend("how do supervisors restart children?")
        await asyncio.wait_for(heard_all.wait(), timeout=10.0)
        for line in sorted(HEARD):
            print(line)
    finally:
        await node.ashutdown(grace=0)


if __name__ == "__main__":
    asyncio.run(main())
