"""A node killed with SIGKILL by ``tests/test_settling.py`` while model calls
are in flight below a branch that has already ended (issue 37).

Run as ``python -m tests.settle_crash_node STORE_DIR MODEL_URL ACK_FILE``
from the repository root, against a chat stand-in that holds its requests.
It runs one branch of the Main under a budget of ``BRANCH_CALLS`` calls that
fans out ``WORKERS`` workers, one model call each: the budget lets
``BRANCH_CALLS`` through (held by the stand-in), refuses the next and cancels
the branch, whose skill returns at once. Once the branch's result is back
(its terminal record durable), ``{"branch": id}`` is written to ACK_FILE and
the process waits to be killed (it exits by itself after ``RUN_FOR`` seconds).
"""

from __future__ import annotations

import json
import sys
import threading

from sessiontree.actors import Cancelled, Session
from sessiontree.protocol import Budget, SessionKind, SpawnSpec
from sessiontree.supervision import Agent, Node, NodeConfig, Provider

AGENT_ID = "settler"
BRANCH_CALLS = 5
WORKERS = 8
RUN_FOR = 60.0  # real seconds; the test kills the process long before


def ask(session: Session) -> str:
    return session.complete(session.task).text or ""


def quick(session: Session) -> str:
    session.spawn_many(
        SpawnSpec(kind=SessionKind.WORKER, task=f"q {i}", skill="ask") for i in range(WORKERS)
    )
    try:
        session.collect(timeout=60)
    except Cancelled:
        return "wrapped up at once"
    return "all in"


def lead(session: Session) -> None:
    return None


def make_agent() -> Agent:
    return Agent(
        AGENT_ID,
        {"lead": lead, "quick": quick, "ask": ask},
        main_skill="lead",
        models={"small": "m", "large": "m"},
    )


def node_config(url: str) -> NodeConfig:
    return NodeConfig(grace=30.0, providers=(Provider(base_url=url, retry_wait=0.01),))


def main() -> None:
    store, url, ack = sys.argv[1:4]
    with Node([make_agent()], node_config(url), store=store) as node:
        result = node.main(AGENT_ID).run(
            kind="branch", skill="quick", budget=Budget(calls=BRANCH_CALLS), timeout=30
        )
        if result is None:
            sys.exit("the branch did not end in time")
        with open(ack, "w", encoding="utf-8") as out:
            out.write(json.dumps({"branch": str(result.session_id)}) + "\n")
        threading.Event().wait(RUN_FOR)


if __name__ == "__main__":
    main()
