"""Stuck sessions listed: ``GET /v1/sessions?stuck=true`` and ``sessiontree
sessions ls --stuck`` against a node served for real on 127.0.0.1 (its clock
virtual), and the refusal of ``--stuck`` on a store."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.actors import VirtualClock
from sessiontree.cli import main as cli_main
from sessiontree.supervision import Agent, Node
from tests._served import ServedNode
from tests.conftest import WAIT, settle


def idle_main(session: Any) -> None:
    return None


def waits(session: Any) -> str:
    session.sleep(10_000)
    return "done"


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def served(
    make_node: Any, clock: VirtualClock, gate: threading.Event
) -> Iterator[tuple[ServedNode, dict[str, str]]]:
    """A node holding a main, a sleeping branch, and a branch and a worker
    stuck in a call with no checkpoint for 70 s (``stuck_after`` 60 s); the
    worker returns without another checkpoint once ``gate`` opens."""
    started = {"blocks": threading.Event(), "hangs": threading.Event()}

    def blocks(session: Any) -> str:
        session.checkpoint()
        started["blocks"].set()
        gate.wait(WAIT)
        session.checkpoint()
        return "unblocked"

    def hangs(session: Any) -> str:
        started["hangs"].set()
        gate.wait(WAIT)
        return "late"

    agent = Agent("agent", {"main": idle_main, "waits": waits, "blocks": blocks, "hangs": hangs})
    node: Node = make_node(agent, grace=1.0, stuck_after=60.0, check_interval=10.0)
    main = node.main("agent")
    ids = {"main": str(main.session_id)}
    for name, kind, skill in (
        ("sleeping", "branch", "waits"),
        ("blocked", "branch", "blocks"),
        ("hung", "worker", "hangs"),
    ):
        ref = main.spawn(kind=kind, skill=skill).ref
        assert ref is not None
        ids[name] = str(ref.session_id)
    assert started["blocks"].wait(WAIT)
    assert started["hangs"].wait(WAIT)
    clock.advance(70.0)
    with ServedNode(node) as server:
        yield server, ids


def listed(server: ServedNode, **params: Any) -> set[str]:
    return {info["session_id"] for info in server.get("/v1/sessions", **params)["items"]}


def test_the_api_lists_only_stuck_sessions_when_asked(
    served: tuple[ServedNode, dict[str, str]], gate: threading.Event
) -> None:
    server, ids = served
    assert listed(server, stuck="true") == {ids["blocked"], ids["hung"]}
    assert listed(server, stuck="true", kind="worker") == {ids["hung"]}
    assert listed(server, stuck="true", state="completed") == set()
    assert listed(server, stuck="false") == set(ids.values())
    assert listed(server) == set(ids.values())
    page = server.get("/v1/sessions", stuck="true", limit=1)
    assert len(page["items"]) == 1
    assert page["next_cursor"] is not None
    rest = server.get("/v1/sessions", stuck="true", cursor=page["next_cursor"])
    assert {page["items"][0]["session_id"], rest["items"][0]["session_id"]} == {
        ids["blocked"],
        ids["hung"],
    }
    gate.set()  # both end; the worker never checkpointed again, and is no longer listed
    assert server.node.wait(ids["hung"], WAIT).summary == "late"
    assert server.node.wait(ids["blocked"], WAIT).summary == "unblocked"
    settle(server.node)
    assert listed(server, stuck="true") == set()


def test_a_bad_stuck_value_is_a_400_naming_the_parameter(
    served: tuple[ServedNode, dict[str, str]],
) -> None:
    server, _ = served
    answer = server.http.get("/v1/sessions", params={"stuck": "perhaps"})
    assert answer.status_code == 400
    assert "stuck" in answer.text


def test_sessions_ls_stuck_lists_what_the_node_flagged(
    served: tuple[ServedNode, dict[str, str]],
) -> None:
    server, ids = served
    runner = CliRunner()
    result = runner.invoke(cli_main, ["sessions", "ls", "--node", server.url, "--stuck", "--json"])
    assert result.exit_code == 0, result.output
    assert {info["session_id"] for info in json.loads(result.stdout)["items"]} == {
        ids["blocked"],
        ids["hung"],
    }
    result = runner.invoke(
        cli_main, ["sessions", "ls", "--node", server.url, "--stuck", "--kind", "branch"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        line for line in result.stdout.splitlines() if ids["blocked"][:8] in line
    ]
    assert len(result.stdout.splitlines()) == 1
    assert result.stdout.startswith("branch active")


def test_sessions_ls_stuck_on_a_store_is_refused_as_a_live_node_notion(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli_main, ["sessions", "ls", "--store", str(tmp_path / "store"), "--stuck"]
    )
    assert result.exit_code == 2
    assert "--stuck needs --node" in result.output
    assert "running node" in result.output
