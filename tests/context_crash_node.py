"""A node whose Branch wrote its context branch, to be killed with SIGKILL by
``tests/test_linked_contexts.py``.

Run as ``python -m tests.context_crash_node STORE_DIR MODEL_URL`` from the
repository root: it runs one ``research`` Branch (two model calls on the
stand-in at MODEL_URL), prints the Branch's ``context_leaf`` once its
result is durable, then blocks until it is killed (or 60 s pass).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from sessiontree.supervision import Agent, Node, NodeConfig, Provider

MODELS = {"small": "m-small", "large": "m-large"}


def lead(session: Any) -> None:
    return None


def research(session: Any) -> str:
    session.complete(session.task)
    return session.complete("and then?").text or ""


def make_agent() -> Agent:
    return Agent("agent", {"lead": lead, "research": research}, main_skill="lead", models=MODELS)


def config(url: str) -> NodeConfig:
    return NodeConfig(providers=(Provider(base_url=url, retry_wait=0.01, retry_wait_max=0.05),))


def main(store: str, url: str) -> None:
    node = Node([make_agent()], config(url), store=store)
    result = node.main("agent").run(kind="branch", skill="research", task="draft", timeout=30)
    assert result is not None
    assert result.ok, result
    print(result.context_leaf, flush=True)
    threading.Event().wait(60.0)  # killed long before


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
