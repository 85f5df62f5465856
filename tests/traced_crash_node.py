"""A traced node whose Main's cycle blocks, to be killed with SIGKILL by
``tests/test_traces.py``: the rerun of that cycle after the restart must
link to the span the crash cut off.

Run as ``python -m tests.traced_crash_node STORE_DIR``. It sends its Main
the message ``block``; the cycle prints its own traceparent as one line on
stdout (the cycle's mark, with that span, is durable before the skill runs)
and waits at a checkpoint until the process is killed (it gives up by itself
after ``RUN_FOR`` seconds).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sessiontree.supervision import Agent, Node, NodeConfig, Tracing

RUN_FOR = 60.0  # real seconds; the test kills the process long before


def make_agent(report: Callable[[str], None] | None = None) -> Agent:
    async def inbox(session: Any) -> None:
        if session.message != "block" or session.attempt > 1:
            return  # after the restart the cycle ends at once
        assert report is not None
        report(session.traceparent or "")
        await session.sleep(RUN_FOR)

    return Agent("crashing", {"inbox": inbox}, main_skill="inbox")


def config() -> NodeConfig:
    return NodeConfig(tracing=Tracing(exporter=InMemorySpanExporter(), schedule_delay=0.05))


def main(store: str) -> None:
    node = Node([make_agent(lambda line: print(line, flush=True))], config(), store=store)
    error = node.main("crashing").send("block")
    assert error is None, error
    threading.Event().wait(RUN_FOR)  # killed long before: never a clean shutdown
    node.shutdown(grace=0)


if __name__ == "__main__":
    main(sys.argv[1])
