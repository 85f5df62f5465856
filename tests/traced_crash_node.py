"""A traced node whose Main's cycle blocks, to be killed with SIGKILL by
``tests/test_traces.py``: the rerun of that cycle after the restart must
link to the span the crash cut off.

Run as ``python -m tests.traced_crash_node STORE_DIR SPAN_FILE``. It sends
its Main the message ``block``; the cycle writes its own traceparent to
SPAN_FILE (the cycle's mark, with that span, is durable before the skill
runs) and waits at a checkpoint until the process is killed (it gives up
by itself after ``RUN_FOR`` seconds).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sessiontree.supervision import Agent, Node, NodeConfig, Tracing

RUN_FOR = 60.0  # real seconds; the test kills the process long before


def make_agent(span_file: Path | None = None) -> Agent:
    async def inbox(session: Any) -> None:
        if session.message != "block" or session.attempt > 1:
            return  # after the restart the cycle ends at once
        assert span_file is not None
        written = span_file.with_suffix(".tmp")
        written.write_text(session.traceparent or "", encoding="utf-8")
        os.replace(written, span_file)
        await session.sleep(RUN_FOR)

    return Agent("crashing", {"inbox": inbox}, main_skill="inbox")


def config() -> NodeConfig:
    return NodeConfig(tracing=Tracing(exporter=InMemorySpanExporter(), schedule_delay=0.05))


def main(store: str, span_file: str) -> None:
    node = Node([make_agent(Path(span_file))], config(), store=store)
    error = node.main("crashing").send("block")
    assert error is None, error
    threading.Event().wait(RUN_FOR)  # killed long before: never a clean shutdown
    node.shutdown(grace=0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
