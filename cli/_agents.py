"""Loading agents by import path (``module:object``), and the built-in agent.

A standalone node runs the agents ``--agents module:object`` names, the
convention of uvicorn and celery: the object is an ``Agent``, an iterable of
them, or a callable taking no arguments that returns either. A module that
cannot be found otherwise is looked for in the current folder, so
``--agents myagents:agents`` started beside ``myagents.py`` needs no
``PYTHONPATH``; but the folder is on ``sys.path`` for that import only (an
installed module, or a part of sessiontree, is imported without it). So a
file lying in the folder a node starts in (an ``httptools.py`` that uvicorn
would import lazily) is never imported in its place. The node's worker
processes (the process backend) find such a module through a private folder
holding a link to it alone. Without ``--agents`` the node runs the built-in
``assistant`` agent, so a fresh node can be driven (and watched) at once.

The assistant is model-backed once the node has a model provider
(``node start --model-url URL --model NAME``): its Main answers chat
messages with the model, and its ``model`` skill asks the model a branch's
or worker's task. Without a provider the Main echoes, and the ``model``
skill completes with a typed ``model_error`` in its artifacts (never a
crash).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

from sessiontree.actors import AsyncSession
from sessiontree.protocol import (
    ChatMessage,
    Completion,
    ErrorCode,
    ErrorInfo,
    Outcome,
    SessionResult,
    SessionTreeError,
)
from sessiontree.supervision import Agent

__all__ = ["AgentLoadError", "builtin_agents", "load_agents", "with_model"]

BUILTIN = "sessiontree.cli._agents:builtin_agents"


class AgentLoadError(SessionTreeError):
    """Raised when ``module:object`` cannot be imported or is not agents; the
    message names the part that failed."""


def load_agents(path: str) -> list[Agent]:
    """The agents ``path`` (``module:object``, the object may be dotted) names,
    the module imported from the current folder if it is not found elsewhere
    (see the module's docstring); ``AgentLoadError`` naming the part that
    failed."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        msg = f"--agents {path!r} must look like module:object"
        raise AgentLoadError(msg)
    try:
        target: Any = _import(module_name)
    except ImportError as exc:
        msg = f"--agents {path!r}: cannot import {module_name!r}: {exc}"
        raise AgentLoadError(msg) from exc
    except (ValueError, TypeError) as exc:  # an Agent(...) refused at import
        msg = f"--agents {path!r}: {module_name!r} raised while importing: {exc}"
        raise AgentLoadError(msg) from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            msg = f"--agents {path!r}: {module_name!r} has no attribute {attr!r}"
            raise AgentLoadError(msg) from None
    if callable(target) and not isinstance(target, Agent):
        try:
            target = target()
        except (ValueError, TypeError) as exc:  # an Agent(...) it made was refused
            msg = f"--agents {path!r}: {attr!r} raised: {exc}"
            raise AgentLoadError(msg) from exc
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


def _import(module_name: str) -> ModuleType:
    """``module_name`` imported as ``sys.path`` finds it, else with the current
    folder first on ``sys.path`` for this import only (then reachable by the
    node's worker processes through ``_link_for_workers``)."""
    top = module_name.partition(".")[0]
    if top == "sessiontree" or importlib.util.find_spec(top) is not None:
        return importlib.import_module(module_name)
    here = os.getcwd()
    sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    finally:
        with contextlib.suppress(ValueError):  # the module may have taken it off itself
            sys.path.remove(here)  # the first one: the entry put there above
    _link_for_workers(top, here)
    return module


def _link_for_workers(top: str, here: str) -> None:
    """Let the node's worker processes, which start with this ``sys.path``,
    import ``top`` (a module or package in ``here``) too: through a private
    folder (removed at exit) holding a link to it alone, so nothing else of
    ``here`` becomes importable. Nothing is done for a module that is not a
    file or folder there."""
    spec = importlib.machinery.PathFinder.find_spec(top, [here])
    if spec is None:
        return
    if spec.submodule_search_locations is not None:
        target = Path(here, top)  # a package, or a namespace package
    elif spec.origin is not None and Path(spec.origin).parent == Path(here):
        target = Path(spec.origin)
    else:
        return
    folder = Path(tempfile.mkdtemp(prefix="sessiontree-agents-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / target.name).symlink_to(target)
    sys.path.append(str(folder))


def with_model(agents: Iterable[Agent], model: str) -> list[Agent]:
    """``agents``, each that maps no tier to a model of its own now calling
    ``model`` at every tier (``node start --model``); the others as they are."""
    return [
        agent
        if agent.models
        else dataclasses.replace(agent, models=dict.fromkeys(agent.model_tiers, model))
        for agent in agents
    ]


# -- the built-in agent ------------------------------------------------------------------


def _seconds(task: str) -> float:
    try:
        value = float(task)
    except ValueError:
        return 0.0
    return value if 0.0 <= value <= 3600.0 else 0.0


def _no_provider(reply: Completion) -> bool:
    """Whether ``reply`` failed because the node has no model provider."""
    error = reply.error
    return (
        error is not None
        and error.code is ErrorCode.MODEL_ERROR
        and error.detail.get("field") == "providers"
    )


def _error(error: ErrorInfo) -> dict[str, Any]:
    """A model call's error as a JSON value: its code, message and detail."""
    return {"code": error.code.value, "message": error.message, "detail": dict(error.detail)}


def _text_of(message: Any) -> str:
    """What a Main's inbound message says: a routed chat message's text, a
    mapping's ``text``, a string as it is, anything else as its JSON."""
    chat = ChatMessage.of(message)
    if chat is not None:
        return chat.inbound.text
    if isinstance(message, dict) and isinstance(message.get("text"), str):
        return str(message["text"])
    if isinstance(message, str):
        return message
    return msgspec.json.encode(message).decode()


async def _chat(session: AsyncSession) -> None:
    """A Main's cycle: a chat message is answered in its conversation by the
    node's model (with the Main's working context: earlier turns are sent
    too), or echoed when the node has no model provider; a failed call is
    answered with a ``system`` message holding its typed error. Children's
    results are noted in the working context (as ``system`` text, which a
    chat model accepts between turns), so the model hears of them.

    Both sides stay in the conversation once: the runtime records the user's
    turn as the cycle begins, and the reply is the cycle's append, so a
    rerun after a crash (``session.attempt`` 2, …) replaces it rather than
    answering twice."""
    message = session.message
    if isinstance(message, SessionResult):
        note = f"child {message.session_id} ended {message.status.value}"
        await session.add_message(
            "system", f"{note}: {message.summary}" if message.summary else note
        )
        return
    text = _text_of(message)
    reply = await session.complete(text)
    if _no_provider(reply):
        await session.conversation.aappend("assistant", f"echo: {text}")
    elif reply.error is not None:
        await session.conversation.aappend("system", {"error": _error(reply.error)})
    else:
        await session.conversation.aappend(
            "assistant",
            reply.text or "",
            tool_calls=[dict(call) for call in reply.tool_calls] or None,
            usage=msgspec.to_builtins(reply.usage),
        )


async def _model(session: AsyncSession) -> Outcome:
    """Ask the node's model the task (with the session's context: its
    ``context_summary``); the reply's text is the summary. A call that fails,
    or a node without a model provider, completes with the typed error in
    ``artifacts["error"]`` (``code``, ``message``, ``detail``) and says so in
    the summary. The result's ``usage`` is what the call spent."""
    reply = await session.complete(session.task)
    if reply.error is not None:
        error = reply.error
        return Outcome(
            summary=f"{error.code.value}: {error.message}", artifacts={"error": _error(error)}
        )
    artifacts: dict[str, Any] = {"model": reply.model, "finish_reason": reply.finish_reason}
    if reply.tool_calls:
        artifacts["tool_calls"] = [dict(call) for call in reply.tool_calls]
    return Outcome(summary=reply.text or "", artifacts=artifacts)


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
    done = len(gathered.results)
    return f"{done} of {count} {'worker' if count == 1 else 'workers'} completed"


def _crash(session: AsyncSession) -> None:
    msg = f"the crash skill always fails (task {session.task!r})"
    raise RuntimeError(msg)


def builtin_agents() -> list[Agent]:
    """The ``assistant`` agent: ``chat`` (its Main answers chat messages with
    the node's model, or echoes them without one), ``model`` (asks the model
    the task), ``work`` (sleeps the task's seconds), ``fan_out`` (a branch
    running workers) and ``crash`` (always fails). It maps no tier to a
    model: ``node start --model NAME`` gives it one."""
    return [
        Agent(
            "assistant",
            skills={
                "chat": _chat,
                "model": _model,
                "work": _work,
                "fan_out": _fan_out,
                "crash": _crash,
            },
            main_skill="chat",
            default_skill="work",
        )
    ]
