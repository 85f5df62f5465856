"""The map-full run through a real ``sessiontree node start``: a 4 MiB map,
worker spawns interleaved with 200 KB messages to the built-in assistant's
Main. Every message answered 202 is answered exactly once — its user turn
and its reply each once in the stored conversation — after the map grows
and the node restarts; every other one was refused (503 ``store_full``),
never acknowledged."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.cli import main as cli_main
from sessiontree.cli._agents import BUILTIN
from tests._running_node import RunningNode

pytestmark = pytest.mark.timeout(240)

MAP = 4 << 20
BIG = 200_000  # characters of each message
SETTLE = 60.0  # real seconds the restarted node may take to answer the kept messages


def turns(node: RunningNode, main: str) -> list[tuple[str, str]]:
    """(role, the message's tag) of every message of the Main's conversation,
    in the order written: the tag is the text before the padding."""
    answer = node.http.get(f"/v1/sessions/{main}/conversation/transcript")
    assert answer.status_code == 200, answer.text
    lines = [json.loads(line) for line in answer.text.splitlines() if line]
    return [(line["role"], str(line["content"]).split("|", 1)[0]) for line in lines]


def answered(node: RunningNode, main: str, tags: list[str]) -> list[tuple[str, str]]:
    """The conversation once every message ``tags`` names has its reply (bounded:
    another process answers them, there is nothing to wait on but its API)."""
    deadline = time.monotonic() + SETTLE
    while True:
        said = turns(node, main)
        if all(("assistant", f"echo: {tag}") in said for tag in tags):
            return said
        assert time.monotonic() < deadline, f"unanswered after {SETTLE} s: {said}\n{node.log()}"
        time.sleep(0.1)  # another process: a short real pause between looks


def test_every_acknowledged_message_is_answered_once_after_the_map_grows(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    small = RunningNode(store, "--map-size", str(MAP), "--grace", "1", agents=BUILTIN)
    acked: list[str] = []
    refused: list[str] = []
    try:
        assert small.config["map_size"] == MAP
        created = small.http.post("/v1/sessions", json={"agent_id": "assistant"})
        assert created.status_code in (200, 201), created.text
        main = created.json()["info"]["session_id"]
        for i in range(30):
            spawned = small.http.post(
                f"/v1/sessions/{main}/children",
                json={"kind": "worker", "skill": "work", "task": "0"},
            )
            assert spawned.status_code in (201, 503, 507), spawned.text
            tag = f"m{i:02d}"
            sent = small.http.post(
                f"/v1/sessions/{main}/messages", json={"message": f"{tag}|{'x' * BIG}"}
            )
            if sent.status_code == 202:
                acked.append(tag)
            else:
                assert sent.status_code == 503, sent.text
                assert sent.json()["error"]["code"] == "store_full"
                refused.append(tag)
        small.wait_log("the store refused a write of Main")
        said = turns(small, main)
        kept = [tag for tag in acked if ("assistant", f"echo: {tag}") not in said]
        assert kept, "no acknowledged message was left unanswered by the full map"
        assert refused, "the map never refused a message"
        log = small.log()
        assert log.count("the store refused a write of Main") == 1  # told once
        assert "--map-size" in log, log
        assert "StoreFullError" not in log  # no failed-cycle traceback: nothing was consumed
    finally:
        assert small.stop() == 0, small.log()[-3000:]

    grown = RunningNode(store, "--grace", "1", agents=BUILTIN)  # the default map: 16 GiB
    try:
        said = answered(grown, main, acked)
        for tag in acked:
            assert said.count(("user", tag)) == 1, (tag, said)
            assert said.count(("assistant", f"echo: {tag}")) == 1, (tag, said)
        for tag in refused:
            assert ("user", tag) not in said
        status: Any = grown.http.get("/v1/node").json()
        assert status["sessions"]["active"] >= 1
    finally:
        assert grown.stop() == 0, grown.log()[-3000:]


def test_a_map_size_out_of_range_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    for size in ("1000", str(1 << 60), "lots"):
        started = CliRunner().invoke(
            cli_main, ["node", "start", "--store", str(tmp_path / "store"), "--map-size", size]
        )
        assert started.exit_code == 2, started.output
        assert "--map-size" in started.output
    config = tmp_path / "node.toml"
    config.write_text(f'store = "{tmp_path / "store"}"\nmap_size = 5\n')
    started = CliRunner().invoke(cli_main, ["node", "start", "--config", str(config)])
    assert started.exit_code == 2, started.output
    assert "map_size" in started.output
    assert not (tmp_path / "store").exists()
