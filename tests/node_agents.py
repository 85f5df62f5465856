"""Agents for the standalone-node tests (loaded by ``--agents tests.node_agents:agents``)."""

from __future__ import annotations

import threading
from typing import Any

from sessiontree.actors import Cancelled
from sessiontree.cli._agents import builtin_agents
from sessiontree.supervision import Agent


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
