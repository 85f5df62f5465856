"""Skills the backend tests run in worker processes and Ray actors.

They live in a module of their own, importable by reference in a worker
(which never imports pytest or the test modules). A step that a test must
catch running writes ``<info.metadata["dir"]>/<session id>.started`` holding its
process id (see ``started``), which the test waits for with a bounded wait.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from sessiontree.actors import Cancelled


def quiet_ray() -> None:
    """Environment for a Ray started by a test: no usage report, no token
    written to ~/.ray, nothing printed for errors provoked on purpose."""
    for name, value in (
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("RAY_AUTH_MODE", "disabled"),
        ("RAY_IGNORE_UNHANDLED_ERRORS", "1"),
    ):
        os.environ.setdefault(name, value)


def started_pid(directory: Path, session_id: Any, timeout: float) -> int | None:
    """Wait (bounded, real time) for a step's start marker; its process id, or
    None if it never appeared."""
    marker = directory / f"{session_id}.started"
    ticks = threading.Event()
    for _ in range(int(timeout * 100)):
        if marker.exists():
            return int(marker.read_text())
        ticks.wait(0.01)
    return None


def started(session: Any) -> None:
    """Tell the test this step runs, and in which process."""
    marker = Path(session.info.metadata["dir"]) / f"{session.session_id}.started"
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(str(os.getpid()))
    tmp.rename(marker)  # the test never reads half a file


def answer(session: Any) -> dict[str, Any]:
    """Return who ran the step and what it was given."""
    return {"task": session.task, "pid": os.getpid(), "backend": session.info.backend}


def crash(session: Any) -> None:
    raise ValueError(f"bad input in {session.task}")


def wraps_up(session: Any) -> str:
    """Report started, then take checkpoints until cancelled; answer a partial result."""
    started(session)
    try:
        for _ in range(100_000):  # bounded: about 1,000 s at most
            session.sleep(0.01)
    except Cancelled as exc:
        return f"partial after {exc.code}"
    return "never cancelled"


def ignores_cancel(session: Any) -> None:
    """Report started, then append to the file named by the task forever, never
    taking a checkpoint (only a kill stops it)."""
    path = Path(session.task)
    started(session)
    n = 0
    while True:
        n += 1
        with path.open("a") as out:
            out.write(f"{n}\n")


def dies(session: Any) -> None:
    """The step's own process is killed (SIGKILL) under it."""
    started(session)
    os.kill(os.getpid(), signal.SIGKILL)


def leaves_traces(session: Any) -> dict[str, Any]:
    """Dirty every piece of per-session state a handle has, then report what it
    found at the start: a later session on the same worker must find it clean."""
    found = {
        "pid": os.getpid(),
        "cancel_pending": session.cancel_pending,
        "messages": len(session.context.messages),
        "system_prompt": session.context.system_prompt,
        "task": session.task,
    }
    session.context.system_prompt = f"secret of {session.task}"
    session.context.tool_results.append({"secret": session.task})
    return found


def cancelled_while_dirty(session: Any) -> str:
    """Dirty the context, then wait to be cancelled (the cancel flag is set)."""
    session.context.system_prompt = "left behind?"
    started(session)
    try:
        for _ in range(100_000):
            session.sleep(0.01)
    except Cancelled:
        return "cancelled"
    return "never cancelled"


def spawns(session: Any) -> None:
    session.spawn(kind="worker", task="grandchild")


def reports(session: Any) -> str:
    session.progress("halfway", done=1)
    session.send_to_parent({"note": "from the step"})
    return "reported"


async def async_answer(session: Any) -> str:
    await session.checkpoint()
    return f"async {session.task} in {os.getpid()}"


def burn(session: Any) -> str:
    """Pure-Python CPU work: ``session.task`` is the number of loop turns."""
    total = 0
    for i in range(int(session.task)):
        total += i * i % 7
    return str(total)


class Unhashable:
    """A picklable callable that cannot be hashed (a skill need not be)."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unhashable)

    def __call__(self, session: Any) -> str:
        return "unhashable ran"


unhashable = Unhashable()


def asks_model(session: Any) -> dict[str, Any]:
    """Call the model with the task (streamed when ``metadata["stream"]``), then
    once more (that call sends the first exchange too); answer what came back."""
    first = session.complete(session.task, stream=bool(session.metadata.get("stream")))
    second = session.complete("and again")
    return {
        "texts": [first.text, second.text],
        "recorded": [m.role for m in session.context.messages],
        "errors": [c.error.code.value for c in (first, second) if c.error is not None],
        "pid": os.getpid(),
    }


async def async_asks_model(session: Any) -> dict[str, Any]:
    """``asks_model`` for an async skill: one streamed call."""
    reply = await session.complete(session.task, stream=True)
    return {"text": reply.text, "tokens": reply.usage.tokens, "pid": os.getpid()}


def asks_model_once(session: Any) -> dict[str, Any]:
    """Call the model once and answer the reply's text and error code."""
    reply = session.complete(session.task)
    return {"text": reply.text, "error": None if reply.error is None else reply.error.code.value}


def waits_on_model(session: Any) -> str:
    """Report started, then wait on one model call; a cancellation while it
    waits is wrapped up as a partial result."""
    started(session)
    try:
        reply = session.complete(session.task)
    except Cancelled as exc:
        return f"partial after {exc.code}"
    return f"answered {reply.text}"


async def async_waits_on_model(session: Any) -> str:
    """``waits_on_model`` for an async skill."""
    started(session)
    try:
        reply = await session.complete(session.task)
    except Cancelled as exc:
        return f"partial after {exc.code}"
    return f"answered {reply.text}"


def echo_input(session: Any) -> dict[str, Any]:
    """Return the step's structured input and where it ran."""
    return {"input": session.input, "backend": session.info.backend}


def reports_span(session: Any) -> dict[str, Any]:
    """The span current in the worker while the step runs, and the handle's traceparent."""
    from opentelemetry import trace  # noqa: PLC0415 - the API a step's own code uses

    context = trace.get_current_span().get_span_context()
    return {
        "current": f"{context.trace_id:032x}-{context.span_id:016x}" if context.is_valid else None,
        "traceparent": session.traceparent,
        "pid": os.getpid(),
    }
