"""A node spending on model calls, to be killed with SIGKILL by
``tests/test_model_crash.py`` (issue 20: a crash never loses spend).

Run as ``python -m tests.model_crash_node STORE_DIR MODEL_URL ACK_LOG`` from
the repository root. It opens a ``Node`` on STORE_DIR with the chat stand-in
at MODEL_URL as its provider, and runs rounds until killed: each round is a
branch of the Main that fans out to four workers, each making one model
call. Once a round's branch result is back (its usage written before each
call returned, its terminal record durable), one JSON line is appended to
ACK_LOG: ``{"branch": id, "tokens": n, "calls": n}``. It exits by itself
after ``RUN_FOR`` seconds.
"""

from __future__ import annotations

import json
import sys
import time

from sessiontree.actors import Session
from sessiontree.supervision import Agent, Node, NodeConfig, Provider

AGENT_ID = "spender"
RUN_FOR = 60.0  # real seconds; the test kills the process long before


def ask(session: Session) -> str:
    return session.complete(session.task).text or ""


def fan(session: Session) -> str:
    for i in range(4):
        session.spawn(kind="worker", task=f"round work {i}", skill="ask")
    return "|".join(c.result.summary for c in session.collect(timeout=30) if c.result)


def lead(session: Session) -> None:
    return None


def make_agent() -> Agent:
    return Agent(
        AGENT_ID,
        {"lead": lead, "fan": fan, "ask": ask},
        main_skill="lead",
        models={"small": "m", "large": "m"},
    )


def config(url: str) -> NodeConfig:
    return NodeConfig(grace=0.5, providers=(Provider(base_url=url, retry_wait=0.01),))


def main() -> None:
    store, url, log = sys.argv[1:4]
    deadline = time.monotonic() + RUN_FOR
    with Node([make_agent()], config(url), store=store) as node, open(log, "a") as acks:
        lead_ref = node.main(AGENT_ID)
        while time.monotonic() < deadline:
            result = lead_ref.run(kind="branch", skill="fan", timeout=30)
            if result is None or not result.ok:
                continue
            usage = result.subtree_usage
            line = {"branch": str(result.session_id), "tokens": usage.tokens, "calls": usage.calls}
            acks.write(json.dumps(line) + "\n")
            acks.flush()


if __name__ == "__main__":
    main()
