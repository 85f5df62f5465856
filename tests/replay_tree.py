"""The tree ``tests/test_replay.py`` records and replays, modelled on the demo's
first branches: a research Branch draws a random number and reads the
clock, fans out three reading Workers (each draws its own number and asks
the stand-in model; one's notes are short) and one that crashes on a
corrupt PDF, then a deeper Branch that asks three more with a quorum of two
(the third is cancelled in grace), and finally asks the model to combine
what came back.

Run as ``python -m tests.replay_tree STORE_DIR MODEL_URL`` it records that
tree on a node with a store, prints the root's id once the recording is
durable and blocks until it is killed with SIGKILL. With ``--cut`` it
prints the id as soon as the recording's header is durable, while the
tree still runs (a run the kill cuts off).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from sessiontree.actors import AsyncSession, Cancelled, Session
from sessiontree.protocol import SessionKind, SpawnSpec
from sessiontree.supervision import Agent, Node, NodeConfig, Provider

MODELS = {"small": "m-small", "large": "m-large"}
GRACE = 5.0  # clock seconds a cancelled child has to wrap up


def lead(session: Session) -> None:
    return None


def research(session: Session) -> dict[str, Any]:
    pick = session.random.randint(1, 6)
    started = session.clock.monotonic()
    session.progress("planning", pick=pick)
    readers = [
        SpawnSpec(kind=SessionKind.WORKER, skill="read", task=f"paper {i}", input={"pick": pick})
        for i in range(3)
    ]
    corrupt = SpawnSpec(kind=SessionKind.WORKER, skill="corrupt", task="paper x")
    session.spawn_many([*readers, corrupt])
    got = session.collect()
    deep = session.spawn(kind=SessionKind.BRANCH, skill="trace", task="trace the method")
    assert deep.session_id is not None
    traced = session.wait(deep.session_id)
    summaries = [c.result.summary for c in got if c.result is not None and c.result.ok]
    combined = session.complete("combine: " + "; ".join(summaries))
    return {
        "pick": pick,
        "statuses": [c.result.status.value for c in got if c.result is not None],
        "combined": combined.text,
        "traced": None if traced is None else traced.summary,
        "elapsed": session.clock.monotonic() - started,
    }


async def read(session: AsyncSession) -> str:
    roll = session.random.random()
    reply = await session.complete(f"notes on {session.task} ({roll:.4f})")
    if roll < 0.5:
        await session.progress("short notes")
    return f"{session.task}: {reply.text}"


def corrupt(session: Session) -> str:
    session.complete("open the pdf")
    raise ValueError("corrupt PDF")


async def trace(session: AsyncSession) -> str:
    gathered = await session.fan_out(
        ["source a", "source b", "source c"], skill="slow_read", quorum=2
    )
    counted = sorted(r.result.summary for r in gathered.children if r.counted and r.result)
    return "; ".join(counted)


async def slow_read(session: AsyncSession) -> str:
    """The third source waits on the clock, and is cancelled by the quorum."""
    if session.task == "source c":
        try:
            await session.sleep(600.0)
        except Cancelled:
            return "source c: cut short"
    reply = await session.complete(f"read {session.task}")
    return f"{session.task}: {reply.text}"


SKILLS = {
    "lead": lead,
    "research": research,
    "read": read,
    "corrupt": corrupt,
    "trace": trace,
    "slow_read": slow_read,
}


def make_agent(**changed: Any) -> Agent:
    """The agent (with some skills replaced by ``changed``: code changed since)."""
    return Agent("agent", {**SKILLS, **changed}, main_skill="lead", models=MODELS)


def agents() -> list[Agent]:
    """For ``sessiontree replay --agents tests.replay_tree:agents``."""
    return [make_agent()]


async def read_differently(session: AsyncSession) -> str:
    """``read`` as changed since the recording: it asks for a summary."""
    roll = session.random.random()
    reply = await session.complete(f"a summary of {session.task} ({roll:.4f})")
    return f"{session.task}: {reply.text}"


def changed_agents() -> list[Agent]:
    """The agents with ``read`` changed (``--agents tests.replay_tree:changed_agents``)."""
    return [make_agent(read=read_differently)]


def config(url: str) -> NodeConfig:
    provider = Provider(base_url=url, retry_wait=0.01, retry_wait_max=0.05)
    return NodeConfig(grace=GRACE, providers=(provider,))


def gate(session: Session) -> str:
    """A Branch that waits until it is killed (the ``--cut`` run)."""
    session.complete("begin")
    session.sleep(600.0)
    return "never"


def main(store: str, url: str, cut: bool) -> None:
    node = Node([make_agent(gate=gate)], config(url), store=store)
    parent = node.main("agent").session_id
    if cut:
        spawned = node.spawn(parent, kind="branch", skill="gate", task="wait", record=True)
        assert spawned.session_id is not None
        node.wait_idle(30.0)
        assert node.store is not None
        node.store.flush()  # the recording's header is durable
        print(spawned.session_id, flush=True)
    else:
        result = node.run(parent, kind="branch", skill="research", task="agents", record=True)
        assert result is not None, result
        assert result.ok, result
        node.recordings.recording(result.session_id)  # complete and durable
        print(result.session_id, flush=True)
    threading.Event().wait(60.0)  # killed long before


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--cut" in sys.argv[3:])
