"""Agents for the standalone-node tests (loaded by ``--agents tests.node_agents:agents``)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sessiontree.actors import Cancelled
from sessiontree.cli._agents import builtin_agents
from sessiontree.supervision import Agent

log = logging.getLogger("tests.node_agents")


def stubborn(session: Any) -> str:
    """Ignores cancellation: catches Cancelled and blocks on, until forced."""
    while True:
        try:
            session.sleep(3600)
        except Cancelled:
            threading.Event().wait(3600)  # never checkpoints again


def agents() -> list[Agent]:
    (assistant,) = builtin_agents()
    return [
        Agent(
            "assistant",
            skills={**assistant.skills, "stubborn": stubborn},
            main_skill="chat",
            default_skill="work",
        )
    ]


def parking_assistant() -> list[Agent]:
    """The built-in assistant whose Main, on the first run of a message that
    starts with ``park``, parks after the built-in skill answered it: its
    reply is in the conversation and the cycle has not ended (nor written its
    snapshot), which is where a kill -9 must not make it answer twice."""
    (assistant,) = builtin_agents()
    chat = assistant.skills["chat"]

    async def parks(session: Any) -> None:
        await chat(session)
        message = session.message
        if isinstance(message, str) and message.startswith("park") and session.attempt == 1:
            log.warning("parked after answering %s", message)
            await session.sleep(3600)

    skills = {**assistant.skills, "chat": parks}
    return [Agent("assistant", skills=skills, main_skill="chat", default_skill="work")]
