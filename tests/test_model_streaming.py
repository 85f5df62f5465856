"""Model calls through sessions, streamed and not, on a real local stand-in:
the text reaches the sessions' progress in order and every call is counted
once, with and without a store (issue 20; the batched path of the models
benchmark)."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiontree.actors import AsyncSession
from sessiontree.protocol import SessionKind, SessionState, SpawnSpec
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig, Provider
from sessiontree.testing import StandinServer
from tests.conftest import WAIT, settle

PROMPT = "one two three four five"
REPLY = "echo " + PROMPT
CALLS = 3  # per session: streamed, whole, streamed


@pytest.fixture
def server() -> Iterator[StandinServer]:
    with StandinServer() as standin:
        yield standin


async def lead(session: AsyncSession) -> None:
    return None


async def talks(session: AsyncSession) -> dict[str, list[str]]:
    texts = []
    for i in range(CALLS):
        completion = await session.complete(PROMPT, stream=i % 2 == 0, record=False)
        assert completion.error is None, completion.error
        texts.append(completion.text or "")
    return {"texts": texts}


def node_for(server: StandinServer, store: Path | None) -> Node:
    agent = Agent(
        "agent",
        {"lead": lead, "talks": talks},
        main_skill="lead",
        models={"small": "m", "large": "m"},
        max_children=16,
    )
    config = NodeConfig(providers=(Provider(base_url=server.url, max_retries=0),))
    return Node([agent], config, store=store)


@pytest.fixture(params=["memory", "store"])
def node(request: pytest.FixtureRequest, server: StandinServer, tmp_path: Path) -> Iterator[Node]:
    built = node_for(server, tmp_path if request.param == "store" else None)
    yield built
    built.shutdown(grace=0, timeout=5.0)


def test_streamed_text_reaches_progress_in_order_and_every_call_counts_once(
    node: Node, server: StandinServer
) -> None:
    deltas: collections.defaultdict[uuid.UUID, list[str]] = collections.defaultdict(list)

    def observe(event: Event) -> None:
        if event.kind is EventKind.PROGRESS and event.session_id is not None:
            deltas[event.session_id].append(event.data["delta"])

    node.subscribe(observe)
    main = node.main("agent")
    spawned = node.spawn_many(main, [SpawnSpec(kind=SessionKind.WORKER, skill="talks")] * 12)
    results = [s.ref.wait(WAIT) for s in spawned if s.ref is not None]
    settle(node)

    assert len(results) == 12
    tokens = 0
    for result in results:
        assert result is not None
        assert result.status is SessionState.COMPLETED, result
        assert result.artifacts == {"texts": [REPLY] * CALLS}
        assert result.usage is not None
        assert result.usage.calls == CALLS
        tokens += result.usage.prompt_tokens + result.usage.completion_tokens
        # two streamed calls, each piece in order, nothing from the whole reply
        assert "".join(deltas[result.session_id]) == REPLY * 2
    assert tokens == server.tokens_served
    assert server.completions_served == 12 * CALLS
