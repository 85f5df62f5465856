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

from sessiontree.protocol import (
    Budget,
    ErrorCode,
    RejectedInputError,
    SessionKind,
    make_spec,
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
