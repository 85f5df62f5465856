"""Loading agents by import path (``module:object``), and the built-in agent.

A standalone node runs the agents ``--agents module:object`` names, the
convention of uvicorn and celery: the object is an ``Agent``, an iterable of
them, or a callable taking no arguments that returns either. Without
``--agents`` the node runs the built-in ``assistant`` agent, so a fresh node
can be driven (and watched) at once.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from sessiontree.actors import AsyncSession
from sessiontree.protocol import SessionResult, SessionTreeError
from sessiontree.supervision import Agent

__all__ = ["AgentLoadError", "builtin_agents", "load_agents"]

BUILTIN = "sessiontree.cli._agents:builtin_agents"


class AgentLoadError(SessionTreeError):
    """Raised when ``module:object`` cannot be imported or is not agents; the
    message names the part that failed."""


def load_agents(path: str) -> list[Agent]:
    """The agents ``path`` (``module:object``, the object may be dotted) names."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        msg = f"--agents {path!r} must look like module:object"
        raise AgentLoadError(msg)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        msg = f"--agents {path!r}: cannot import {module_name!r}: {exc}"
        raise AgentLoadError(msg) from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            msg = f"--agents {path!r}: {module_name!r} has no attribute {attr!r}"
            raise AgentLoadError(msg) from None
    if callable(target) and not isinstance(target, Agent):
        target = target()
    agents = [target] if isinstance(target, Agent) else target
    if not isinstance(agents, Iterable) or isinstance(agents, str | bytes):
        msg = f"--agents {path!r} is a {type(target).__name__}, not Agents"
        raise AgentLoadError(msg)
    found = list(agents)
    bad = [a for a in found if not isinstance(a, Agent)]
    if bad or not found:
        what = type(bad[0]).__name__ if bad else "nothing"
        msg = f"--agents {path!r} must give Agent objects, got {what}"
        raise AgentLoadError(msg)
    return found


# -- the built-in agent ------------------------------------------------------------------


def _seconds(task: str) -> float:
    try:
        value = float(task)
    except ValueError:
        return 0.0
    return value if 0.0 <= value <= 3600.0 else 0.0


async def _chat(session: AsyncSession) -> None:
    """A Main's cycle: a chat message is answered in its conversation (an echo);
    children's results are noted in the working context."""
    message = session.message
    if isinstance(message, SessionResult):
        await session.add_message(
            "tool", {"child": str(message.session_id), "status": message.status}
        )
        return
    inbound = message.get("inbound") if isinstance(message, dict) else None
    text = inbound.get("text") if isinstance(inbound, dict) else message
    await session.conversation.aappend("assistant", f"echo: {text}")


async def _work(session: AsyncSession) -> str:
    """Sleep for the task's number of seconds (0 if it is not a number), checkpointing."""
    await session.sleep(_seconds(session.task))
    return f"done: {session.task}"


async def _fan_out(session: AsyncSession) -> str:
    """Run the task's number of ``work`` workers (at most 8) and report them."""
    try:
        count = max(0, min(8, int(session.task or "0")))
    except ValueError:
        count = 0
    gathered = await session.fan_out(["0"] * count, kind="worker", skill="work")
    return f"{len(gathered.results)} of {count} workers completed"


def _crash(session: AsyncSession) -> None:
    msg = f"the crash skill always fails (task {session.task!r})"
    raise RuntimeError(msg)


def builtin_agents() -> list[Agent]:
    """The ``assistant`` agent: ``chat`` (its Main echoes chat messages),
    ``work`` (sleeps the task's seconds), ``fan_out`` (a branch running
    workers) and ``crash`` (always fails)."""
    return [
        Agent(
            "assistant",
            skills={"chat": _chat, "work": _work, "fan_out": _fan_out, "crash": _crash},
            main_skill="chat",
            default_skill="work",
        )
    ]
