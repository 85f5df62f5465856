"""One validation for every way in (issue 37): a ``Budget``, a quorum and a
spawn's ``input`` refuse a bad value with ``RejectedInputError`` naming the
field whether built directly, given as a mapping, sent over HTTP or from the
CLI. A bool is not a number; NaN and infinity are refused, never turned into
None. (A ``Hedge`` given each way: tests/test_hedging.py.)"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from sessiontree.cli import main as cli_main
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    RejectedInputError,
    SessionKind,
    SpawnSpec,
    decode_control,
    make_spec,
    plain_input,
    spawn_batch,
)
from sessiontree.supervision import Agent, Node
from sessiontree.supervision._engine import Quorum
from sessiontree.supervision._patterns import collect, fan_out
from sessiontree.supervision._retry import Restarts
from tests._served import ServedNode
from tests.conftest import WAIT, settle

NAN, INF = math.nan, math.inf

BAD_BUDGETS = [
    ("calls", True),  # a bool is not the count 1
    ("calls", 1.5),
    ("calls", -1),
    ("calls", "3"),
    ("tokens", 10**13),
    ("descendants", INF),
    ("cost", NAN),
    ("cost", False),
    ("cost", -0.5),
    ("soft", True),
    ("soft", 0),
    ("soft", 1.5),
]

BAD_INPUTS = [
    ({"rows": [1, NAN]}, "input.rows[1]"),
    ({"a": {"b": INF}}, "input.a.b"),
    ([-INF], "input[0]"),
    (NAN, "input"),
    ({"odd key": (1, NAN)}, "input['odd key'][1]"),
]


def idle(session: Any) -> None:
    return None


def echo(session: Any) -> dict[str, Any]:
    return {"input": session.input}


@pytest.fixture
def node(make_node: Any) -> Node:
    made: Node = make_node(Agent("agent", {"main": idle, "echo": echo}))
    return made


@pytest.fixture
def served(node: Node) -> Iterator[ServedNode]:
    with ServedNode(node) as server:
        yield server


def spawned_workers(node: Node) -> list[Any]:
    settle(node)
    return node.sessions(kind=SessionKind.WORKER)


# -- a budget ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), BAD_BUDGETS)
def test_a_bad_budget_is_refused_alike_built_directly_or_as_a_mapping(
    field: str, value: object
) -> None:
    with pytest.raises(RejectedInputError) as built:
        Budget(**{field: value})  # at construction, not at the spawn
    with pytest.raises(RejectedInputError) as mapped:
        make_spec(kind="worker", budget={field: value})
    assert built.value.field == mapped.value.field == f"budget.{field}"
    assert built.value.code is mapped.value.code is ErrorCode.REJECTED_INPUT


def test_a_good_budget_is_taken_each_way_and_a_whole_float_is_a_count() -> None:
    direct = Budget(tokens=100, cost=2, calls=3.0, descendants=0, soft=1)
    assert type(direct.calls) is int
    mapped = make_spec(kind="worker", budget={"tokens": 100, "cost": 2, "calls": 3.0}).budget
    assert mapped is not None
    assert (mapped.tokens, mapped.cost, mapped.calls) == (100, 2, 3)
    assert msgspec.json.decode(msgspec.json.encode(direct), type=Budget) == direct


def test_a_skill_spawning_with_a_bad_budget_mapping_gets_the_refusal_naming_it(
    make_node: Any,
) -> None:
    seen: list[str | None] = []

    def spawns(session: Any) -> str:
        for budget in ({"calls": True}, {"cost": NAN}):
            try:
                session.spawn(kind="worker", skill="echo", budget=budget)
            except RejectedInputError as exc:
                seen.append(exc.field)
        return "done"

    node: Node = make_node(Agent("agent", {"main": idle, "echo": echo, "spawns": spawns}))
    assert node.main("agent").run(kind="branch", skill="spawns", timeout=WAIT) is not None
    assert seen == ["budget.calls", "budget.cost"]
    assert spawned_workers(node) == []


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        (b'{"calls": true}', "budget.calls"),
        (b'{"calls": 1.5}', "budget.calls"),
        (b'{"calls": -1}', "budget.calls"),
        (b'{"tokens": "5"}', "budget.tokens"),
        (b'{"cost": NaN}', "budget.cost"),
        (b'{"cost": 1e400}', "budget.cost"),
        (b'{"soft": 0}', "budget.soft"),
    ],
)
def test_a_bad_budget_over_http_is_a_400_naming_the_field(
    served: ServedNode, budget: bytes, field: str
) -> None:
    main = served.node.main("agent").session_id
    body = b'{"kind": "worker", "skill": "echo", "budget": ' + budget + b"}"
    refused = served.http.post(
        f"/v1/sessions/{main}/children",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("rejected_input", field)
    assert spawned_workers(served.node) == []


# -- a quorum ----------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [True, 0, 2.0, "2"])
def test_a_bad_quorum_is_refused_naming_it_by_a_pattern_or_built_directly(k: Any) -> None:
    with pytest.raises(RejectedInputError) as built:
        Quorum(k)
    with pytest.raises(RejectedInputError) as by_fan_out:
        next(fan_out(uuid.uuid4(), Restarts(), ["a", "b"], quorum=k))
    with pytest.raises(RejectedInputError) as by_collect:
        next(collect(uuid.uuid4(), Restarts(), [uuid.uuid4(), uuid.uuid4()], quorum=k))
    assert built.value.field == by_fan_out.value.field == by_collect.value.field == "quorum"


# -- a spawn's input ---------------------------------------------------------------------------


class Point(msgspec.Struct):
    x: float
    y: float


@pytest.mark.parametrize(("value", "field"), BAD_INPUTS)
def test_nan_or_infinity_in_an_input_is_refused_naming_its_path(
    node: Node, value: Any, field: str
) -> None:
    with pytest.raises(RejectedInputError) as refused:
        make_spec(kind="worker", input=value)
    assert refused.value.field == field
    with pytest.raises(RejectedInputError) as refused:
        make_spec(SpawnSpec(kind=SessionKind.WORKER, input=value))
    assert refused.value.field == field
    with pytest.raises(RejectedInputError) as refused:
        node.main("agent").spawn(kind="worker", skill="echo", input=value)
    assert refused.value.field == field
    with pytest.raises(RejectedInputError) as refused:
        spawn_batch([make_spec(kind="worker"), SpawnSpec(kind=SessionKind.WORKER, input=value)])
    assert refused.value.field == f"specs[1].{field}"
    assert spawned_workers(node) == []


def test_nan_inside_a_struct_or_a_fan_out_task_mapping_is_refused_too() -> None:
    with pytest.raises(RejectedInputError) as refused:
        plain_input({"at": Point(1.0, NAN)})
    assert refused.value.field == "input.at.y"
    tasks = ["fine", {"task": "bad", "input": {"scores": [0.5, INF]}}]
    with pytest.raises(RejectedInputError) as refused:
        next(fan_out(uuid.uuid4(), Restarts(), tasks))
    assert refused.value.field == "input.scores[1]"


def test_an_input_with_null_and_finite_numbers_still_arrives_whole(node: Node) -> None:
    value = {"none": None, "text": "null", "big": 1e308, "tiny": -5e-324}
    result = node.main("agent").run(kind="worker", skill="echo", input=value, timeout=WAIT)
    assert result is not None
    assert result.artifacts == {"input": value}


def test_a_control_spawn_refuses_nan_in_its_input_naming_the_path(node: Node) -> None:
    parent = str(node.main("agent").session_id)
    spec = {"kind": "worker", "skill": "echo", "input": {"x": [1.0, NAN]}}
    command = msgspec.msgpack.encode({"type": "spawn", "parent_id": parent, "spec": spec})
    with pytest.raises(RejectedInputError) as refused:
        decode_control(command, fmt="msgpack")
    assert refused.value.field == "spec.input.x[1]"
    json_command = (
        b'{"type": "spawn", "parent_id": "' + parent.encode() + b'", '
        b'"spec": {"kind": "worker", "input": {"x": Infinity}}}'
    )
    with pytest.raises(RejectedInputError) as refused:
        node.control(json_command)
    assert refused.value.field == "spec.input.x"
    assert spawned_workers(node) == []


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"rows": [1, NaN]}', "input.rows[1]"),
        (b'{"a": {"b": Infinity}}', "input.a.b"),
        (b"-Infinity", "input"),
        (b'{"far": 1e400}', "input.far"),
    ],
)
def test_nan_or_infinity_in_an_http_spawn_is_a_400_naming_its_path(
    served: ServedNode, raw: bytes, field: str
) -> None:
    main = served.node.main("agent").session_id
    refused = served.http.post(
        f"/v1/sessions/{main}/children",
        content=b'{"kind": "worker", "skill": "echo", "input": ' + raw + b"}",
        headers={"content-type": "application/json"},
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("rejected_input", field)
    assert spawned_workers(served.node) == []


def test_a_json_body_malformed_otherwise_is_still_malformed(served: ServedNode) -> None:
    main = served.node.main("agent").session_id
    refused = served.http.post(
        f"/v1/sessions/{main}/children",
        content=b'{"kind": "worker", "input": [1, ]}',
        headers={"content-type": "application/json"},
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["field"] is None


@pytest.mark.parametrize(
    ("text", "field"),
    [('{"rows": [1, NaN]}', "input.rows[1]"), ('{"far": 1e400}', "input.far")],
)
def test_sessions_spawn_refuses_nan_in_its_input_naming_the_path(
    served: ServedNode, text: str, field: str
) -> None:
    main = str(served.node.main("agent").session_id)
    at = ["--node", served.url]
    refused = CliRunner().invoke(
        cli_main, ["sessions", "spawn", *at, "--parent", main, "--skill", "echo", "--input", text]
    )
    assert refused.exit_code == 1, refused.output
    assert refused.output.startswith("Error: rejected_input: ")
    assert f"(field {field})" in refused.output
    assert spawned_workers(served.node) == []
