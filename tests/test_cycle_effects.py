"""Effects inside the store happen once per cycle, and conversations keep both
sides: a Main's cycle records the user's turn and its conversation appends
under keys of its input, so a rerun after kill -9 replaces what the cut-off
run wrote instead of answering twice; every path that hands a Main a
message (the HTTP API, the CLI, ``Node.send``, ``route``) leaves the user's
turn in its conversation once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.cli import main as cli_main
from sessiontree.cli._agents import builtin_agents
from sessiontree.supervision import Agent, Event, EventKind, Node, NodeConfig
from tests._running_node import RunningNode
from tests._served import ServedNode
from tests.conftest import WAIT, settle

pytestmark = pytest.mark.timeout(240)

PARKING = "tests.node_agents:parking_assistant"
ROUNDS = 3
SETTLE = 60.0  # real seconds a restarted node may take to answer what it replays


def transcript(node: RunningNode | ServedNode, main: str) -> list[tuple[str, Any]]:
    """(role, content) of every message of the Main's conversation, in the order written."""
    answer = node.http.get(f"/v1/sessions/{main}/conversation/transcript")
    assert answer.status_code == 200, answer.text
    lines = [json.loads(line) for line in answer.text.splitlines() if line]
    return [(line["role"], line["content"]) for line in lines]


def answered(node: RunningNode, main: str, texts: list[str]) -> list[tuple[str, Any]]:
    """The conversation once each of ``texts`` has its echo (bounded: another
    process answers them, there is nothing to wait on but its API)."""
    deadline = time.monotonic() + SETTLE
    while True:
        said = transcript(node, main)
        if all(("assistant", f"echo: {text}") in said for text in texts):
            return said
        assert time.monotonic() < deadline, f"unanswered after {SETTLE} s: {said}\n{node.log()}"
        time.sleep(0.1)  # another process: a short real pause between looks


def test_kill_9_rounds_leave_each_message_answered_once(tmp_path: Path) -> None:
    """Each round sends the built-in assistant's Main messages, one of which
    parks its cycle after the reply is appended (the window the bug lived in),
    kills the node with SIGKILL there, and starts it again: the rerun (attempt
    2) replaces the reply, and the messages behind it run once."""
    store = tmp_path / "store"
    sent: list[str] = []
    main = ""
    for round_ in range(ROUNDS):
        node = RunningNode(store, "--grace", "1", agents=PARKING)
        try:
            if not main:
                created = node.http.post("/v1/sessions", json={"agent_id": "assistant"})
                main = created.json()["info"]["session_id"]
            texts = [f"r{round_}-a", f"r{round_}-b", f"park r{round_}", f"r{round_}-c"]
            for text in texts:
                answer = node.http.post(f"/v1/sessions/{main}/messages", json={"message": text})
                assert answer.status_code == 202, answer.text
                sent.append(text)
            node.wait_log(f"parked after answering park r{round_}")
            assert ("assistant", f"echo: park r{round_}") in transcript(node, main)
        finally:
            node.kill()
        assert node.proc.returncode == -9
    last = RunningNode(store, "--grace", "1", agents=PARKING)
    try:
        said = answered(last, main, sent)
        for text in sent:
            assert said.count(("user", text)) == 1, (text, said)
            assert said.count(("assistant", f"echo: {text}")) == 1, (text, said)
        # the order of the turns is the order of the messages
        assert [c for r, c in said if r == "user"] == sent
        decisions = last.http.get("/v1/recovery").json()
        assert decisions is not None
    finally:
        assert last.stop() == 0, last.log()[-3000:]


# -- both sides, through every path ----------------------------------------------------


class Cycles:
    """Counts the node's ended Main cycles; ``wait(n)`` until ``n`` ended (bounded).
    (The built-in assistant's model call leaves its skill blocked, so an idle
    node is no sign its reply is written.)"""

    def __init__(self, node: Node) -> None:
        self.ended = 0
        self.cond = threading.Condition()
        node.subscribe(self._seen)

    def _seen(self, event: Event) -> None:
        if event.kind is EventKind.CYCLE_ENDED:
            with self.cond:
                self.ended += 1
                self.cond.notify_all()

    def wait(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.ended >= count, WAIT), self.ended


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServedNode]:
    node = Node(builtin_agents(), NodeConfig(), store=tmp_path / "store")
    serving = ServedNode(node)
    yield serving
    serving.close()
    node.shutdown(grace=0, timeout=5.0)


def test_the_http_api_and_the_cli_leave_both_sides_in_the_conversation(
    served: ServedNode,
) -> None:
    cycles = Cycles(served.node)
    created = served.http.post("/v1/sessions", json={"agent_id": "assistant"})
    main = created.json()["info"]["session_id"]
    answer = served.http.post(f"/v1/sessions/{main}/messages", json={"message": "over http"})
    assert answer.status_code == 202, answer.text
    cycles.wait(1)
    sent = CliRunner().invoke(
        cli_main,
        ["sessions", "send", "--node", served.url, main, "from the cli"],
        catch_exceptions=False,
    )
    assert sent.exit_code == 0, sent.output
    cycles.wait(2)
    structured = CliRunner().invoke(
        cli_main,
        ["sessions", "send", "--node", served.url, main, '{"text": "as json"}'],
        catch_exceptions=False,
    )
    assert structured.exit_code == 0, structured.output
    cycles.wait(3)
    assert transcript(served, main) == [
        ("user", "over http"),
        ("assistant", "echo: over http"),
        ("user", "from the cli"),
        ("assistant", "echo: from the cli"),
        ("user", {"text": "as json"}),
        ("assistant", "echo: as json"),
    ]
    # the CLI reads it back the same way
    shown = CliRunner().invoke(
        cli_main, ["conv", "context", "--node", served.url, "--session", main, "--json"]
    )
    assert shown.exit_code == 0, shown.output
    assert [m["role"] for m in json.loads(shown.output)] == ["user", "assistant"] * 3


def test_a_routed_chat_message_is_recorded_once(served: ServedNode) -> None:
    inbound = {
        "provider": "telegram",
        "chat_type": "dm",
        "chat_id": "7",
        "sender_id": "7",
        "text": "hello",
        "message_id": "tg-1",
    }
    cycles = Cycles(served.node)
    routed = served.http.post("/v1/route", json=inbound)
    assert routed.status_code == 200, routed.text
    cycles.wait(1)
    again = served.http.post("/v1/route", json=inbound)  # a gateway's retry
    assert again.json()["duplicate"] is True
    main = routed.json()["session_id"]
    assert transcript(served, main) == [("user", "hello"), ("assistant", "echo: hello")]


class Opaque:
    """A value with no JSON form."""


def test_an_embedded_send_records_the_turn_and_a_value_that_is_not_json_is_left_out(
    make_node: Any,
) -> None:
    seen: list[Any] = []

    def main(session: Any) -> None:
        seen.append(session.message)
        session.conversation.append("assistant", f"got {type(session.message).__name__}")

    node = make_node(Agent("agent", {"main": main}))
    ref = node.main("agent")
    assert ref.send({"order": 66}) is None
    assert ref.send(Opaque()) is None  # no store: any value is taken
    assert ref.send("plain text") is None
    settle(node)
    assert len(seen) == 3
    said = [(m.role.value, m.content) for m in node.conversation(ref).context(10)]
    assert said == [
        ("user", {"order": 66}),
        ("assistant", "got dict"),
        ("assistant", "got Opaque"),  # not a JSON value: no user turn, the cycle ran
        ("user", "plain text"),
        ("assistant", "got str"),
    ]
    assert node.wait_idle(WAIT)
