"""A spawn's structured input: carried to the session, bounded, stored with
branches (not workers), and accepted over HTTP, on the CLI and by fan_out."""

from __future__ import annotations

import json
import pathlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from sessiontree.actors.backends import ProcessBackend
from sessiontree.cli import main as cli_main
from sessiontree.protocol import (
    MAX_INPUT_BYTES,
    MAX_INPUT_NESTING,
    RejectedInputError,
    SessionKind,
    SessionState,
    SpawnSpec,
    make_spec,
    spawn_batch,
)
from sessiontree.store import Store
from sessiontree.supervision import Agent, Node
from tests import _remote_skills as remote_skills
from tests._served import ServedNode
from tests.conftest import WAIT, settle


class Point(msgspec.Struct):
    x: int
    y: int


INPUT = {"rows": [1, 2.5, "three", None, True], "point": Point(1, 2), "pair": (3, 4)}
# what the session reads: JSON data (a Struct is a dict, a tuple a list)
PLAIN = {"rows": [1, 2.5, "three", None, True], "point": {"x": 1, "y": 2}, "pair": [3, 4]}


def idle(session: Any) -> None:
    return None


def echo(session: Any) -> dict[str, Any]:
    return {"input": session.input}


async def echo_async(session: Any) -> dict[str, Any]:
    await session.checkpoint()
    return {"input": session.input}


def fans_out(session: Any) -> dict[str, Any]:
    gathered = session.fan_out(
        [{"task": "a", "input": {"n": 1}}, {"task": "b", "input": [2]}, "c"], skill="echo"
    )
    return {"inputs": [r.result.artifacts["input"] for r in gathered.reports if r.result]}


def parks(gate: threading.Event) -> Callable[[Any], Any]:
    def branch(session: Any) -> Any:
        if session.resumed:
            return {"input": session.input, "resumed": True}
        gate.set()
        session.sleep(10_000)  # parks here when the node shuts down
        return "finished without a restart"

    return branch


def agent(**more: Any) -> Agent:
    skills = {"main": idle, "echo": echo, "echo_async": echo_async, "fans_out": fans_out}
    return Agent("agent", {**skills, **more})


# -- carried to the session ------------------------------------------------------------------


@pytest.mark.parametrize("skill", ["echo", "echo_async"])
@pytest.mark.parametrize("kind", ["worker", "branch"])
def test_a_spawns_input_reaches_its_session_as_json_data(
    make_node: Any, skill: str, kind: str
) -> None:
    node: Node = make_node(agent())
    main = node.main("agent")
    result = main.run(kind=kind, skill=skill, task="look", input=INPUT, timeout=WAIT)
    assert result is not None
    assert result.artifacts == {"input": PLAIN}
    spawned = main.spawn(SpawnSpec(kind=SessionKind(kind), skill=skill, input=INPUT)).ref
    assert spawned is not None
    assert spawned.info().input == PLAIN
    assert spawned.wait(WAIT).artifacts == {"input": PLAIN}
    # no input: None
    assert main.run(kind=kind, skill=skill, timeout=WAIT).artifacts == {"input": None}


def test_the_session_reads_a_copy_made_at_the_spawn(make_node: Any) -> None:
    node: Node = make_node(agent())
    given = {"items": [1, 2]}
    spec = make_spec(kind="worker", skill="echo", input=given)
    given["items"].append(3)  # the caller's later change does not reach the child
    result = node.main("agent").run(spec, timeout=WAIT)
    assert result is not None
    assert result.artifacts == {"input": {"items": [1, 2]}}


def test_fan_out_tasks_given_as_mappings_carry_their_input(make_node: Any) -> None:
    node: Node = make_node(agent())
    result = node.main("agent").run(kind="branch", skill="fans_out", timeout=WAIT)
    assert result is not None
    assert result.artifacts == {"inputs": [{"n": 1}, [2], None]}


def test_a_worker_in_a_process_reads_its_input(make_node: Any, tmp_path: pathlib.Path) -> None:
    worker_agent = Agent("agent", {"main": idle, "echo": remote_skills.echo_input})
    node: Node = make_node(worker_agent, backend="process", process_workers=1)
    pool = node.backends.get("process")
    assert isinstance(pool, ProcessBackend)
    assert pool.wait_ready(60.0), "the process pool did not start"
    result = node.main("agent").run(kind="worker", skill="echo", input=INPUT, timeout=WAIT * 3)
    assert result is not None
    assert result.artifacts["input"] == PLAIN
    assert result.artifacts["backend"] == "process"


# -- bounded -----------------------------------------------------------------------------------


def deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("x" * MAX_INPUT_BYTES, "too_large"),  # two quotes over the cap once encoded
        (deep(MAX_INPUT_NESTING + 1), "too_deep"),
        (deep(5_000), "invalid_field"),  # past msgspec's own recursion limit
        (object(), "invalid_field"),
        ({"fn": print}, "invalid_field"),
        ({"big": 2**70}, "invalid_field"),  # no 64-bit form: the store could not write it
    ],
)
def test_an_input_that_is_too_large_deep_or_not_encodable_is_refused_naming_it(
    make_node: Any, value: Any, reason: str
) -> None:
    with pytest.raises(RejectedInputError) as refused:
        make_spec(kind="worker", input=value)
    assert refused.value.field == "input"
    assert refused.value.reason == reason
    node: Node = make_node(agent())
    main = node.main("agent")
    with pytest.raises(RejectedInputError) as refused:
        main.spawn(kind="worker", skill="echo", input=value)
    assert refused.value.field == "input"
    with pytest.raises(RejectedInputError) as refused:
        spawn_batch([make_spec(kind="worker"), SpawnSpec(kind=SessionKind.WORKER, input=value)])
    assert refused.value.field == "specs[1].input"
    settle(node)
    assert node.sessions(kind=SessionKind.WORKER) == []  # nothing was spawned


def test_an_input_at_the_limits_is_taken(make_node: Any) -> None:
    at_cap = "x" * (MAX_INPUT_BYTES - 2)  # its two quotes make the cap
    assert make_spec(kind="worker", input=at_cap).input == at_cap
    assert make_spec(kind="worker", input=deep(MAX_INPUT_NESTING)).input == deep(MAX_INPUT_NESTING)
    brackets = "[]" * MAX_INPUT_NESTING * 2  # many brackets, all shallow
    assert make_spec(kind="worker", input={"text": brackets, "list": [[]] * 100}).input


def test_a_skill_spawning_with_a_bad_input_gets_the_refusal(make_node: Any) -> None:
    seen: list[Any] = []

    def spawns_badly(session: Any) -> str:
        try:
            session.spawn(kind="worker", skill="echo", input={"when": object()})
        except RejectedInputError as exc:
            seen.append(exc.field)
        return "done"

    node: Node = make_node(agent(spawns_badly=spawns_badly))
    assert node.main("agent").run(kind="branch", skill="spawns_badly", timeout=WAIT)
    assert seen == ["input"]


def test_a_control_spawn_checks_its_input_and_the_child_reads_it(make_node: Any) -> None:
    node: Node = make_node(agent())
    parent = node.main("agent").session_id
    for fmt, encode in (("json", msgspec.json.encode), ("msgpack", msgspec.msgpack.encode)):
        spec = {"kind": "worker", "skill": "echo", "input": {"pair": [1, 2]}}
        command = encode({"type": "spawn", "parent_id": str(parent), "spec": spec})
        answer = node.control(command, fmt=fmt)
        child = answer.session_id  # type: ignore[attr-defined]
        assert node.wait(child, WAIT).artifacts == {"input": {"pair": [1, 2]}}
        spec["input"] = {"big": 2**70} if fmt == "json" else deep(MAX_INPUT_NESTING + 1)
        with pytest.raises(RejectedInputError) as refused:
            node.control(encode({"type": "spawn", "parent_id": str(parent), "spec": spec}), fmt=fmt)
        assert refused.value.field == "spec.input"


# -- stored ------------------------------------------------------------------------------------


def test_a_branch_resumed_after_a_restart_still_has_its_input(
    open_node: Callable[..., Node], tmp_path: pathlib.Path
) -> None:
    gate = threading.Event()
    restartable = agent(parks=parks(gate))
    store = tmp_path / "store"
    node = open_node(store, restartable, grace=5.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="parks", input=INPUT, ttl=86_400.0).ref
    worker = main.spawn(kind="worker", skill="echo", input=INPUT).ref
    assert branch is not None
    assert worker is not None
    assert gate.wait(WAIT)
    assert worker.wait(WAIT).artifacts == {"input": PLAIN}
    settle(node)
    node.shutdown(timeout=WAIT)  # the branch parks and is written out with its input
    with Store(store, readonly=True) as stored:
        parked = stored.session(branch.session_id)
        done = stored.session(worker.session_id)
        assert parked is not None
        assert done is not None
        assert parked.info.state is SessionState.SUSPENDED
        assert parked.info.input == PLAIN
        assert done.info.input is None  # a worker's record keeps identity and state only
        assert done.info.task == ""

    node = open_node(store, restartable, grace=5.0)
    result = node.wait(branch.session_id, WAIT)
    assert result is not None
    assert result.artifacts == {"input": PLAIN, "resumed": True}


# -- over HTTP and on the CLI --------------------------------------------------------------------


@pytest.fixture
def served(make_node: Any) -> Iterator[ServedNode]:
    node: Node = make_node(agent())
    with ServedNode(node) as server:
        yield server


def test_the_http_spawn_body_carries_an_input_and_refuses_a_bad_one(served: ServedNode) -> None:
    main = served.node.main("agent").session_id
    body = {"kind": "worker", "skill": "echo", "input": {"a": [1, {"b": None}]}}
    made = served.http.post(f"/v1/sessions/{main}/children", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["info"]["input"] == {"a": [1, {"b": None}]}
    worker = made.json()["info"]["session_id"]
    done = served.http.get(f"/v1/sessions/{worker}/result", params={"timeout": WAIT})
    assert done.json()["result"]["artifacts"] == {"input": {"a": [1, {"b": None}]}}
    assert served.get(f"/v1/sessions/{worker}")["info"]["input"] == {"a": [1, {"b": None}]}

    too_deep = {"kind": "worker", "skill": "echo", "input": deep(MAX_INPUT_NESTING + 1)}
    refused = served.http.post(f"/v1/sessions/{main}/children", json=too_deep)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "rejected_input"
    assert refused.json()["error"]["field"] == "input"
    huge = {"kind": "worker", "input": {"big": 2**70}}
    refused = served.http.post(f"/v1/sessions/{main}/children", json=huge)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["field"] == "input"


def cli(*args: str) -> Any:
    return CliRunner().invoke(cli_main, list(args), catch_exceptions=False)


def test_sessions_spawn_takes_an_input_as_json(served: ServedNode) -> None:
    main = str(served.node.main("agent").session_id)
    at = ["--node", served.url]
    made = cli(
        "sessions", "spawn", *at, "--parent", main, "--skill", "echo", "--json",
        "--input", '{"rows": [1, 2], "note": "hi"}',
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    info = json.loads(made.output)["info"]
    assert info["input"] == {"rows": [1, 2], "note": "hi"}
    result = served.node.wait(uuid.UUID(info["session_id"]), WAIT)
    assert result is not None
    assert result.artifacts == {"input": {"rows": [1, 2], "note": "hi"}}

    bad = CliRunner().invoke(cli_main, ["sessions", "spawn", *at, "--parent", main, "--input", "{"])
    assert bad.exit_code == 2
    assert "--input" in bad.output
    assert "JSON" in bad.output
    alone = CliRunner().invoke(cli_main, ["sessions", "spawn", *at, "--agent", "a", "--input", "1"])
    assert alone.exit_code == 2
    assert "--input goes with --parent" in alone.output
