"""Slotted session ids: a slot in the top 14 bits of a version 8 UUID.

The layout is what a cluster routes on, so it is pinned here: a slot is one
contiguous range of ids, a key's slot is the same in every process, and an
unslotted (version 4) id says so.
"""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from typing import Any

import pytest

from sessiontree.protocol import (
    SLOTS,
    SessionKind,
    SessionResult,
    new_session_id,
    slot_for,
    slot_of,
)
from sessiontree.supervision import Agent, Node, NodeConfig
from tests.conftest import settle


def test_a_slotted_id_carries_its_slot_and_stays_a_valid_uuid() -> None:
    for slot in (0, 1, 8191, SLOTS - 1):
        ids = [new_session_id(slot) for _ in range(50)]
        assert {slot_of(i) for i in ids} == {slot}
        assert {i.version for i in ids} == {8}
        assert {i.variant for i in ids} == {uuid.RFC_4122}
        assert len(set(ids)) == 50
        assert uuid.UUID(str(ids[0])) == ids[0]


def test_one_slot_is_one_contiguous_range_of_ids() -> None:
    low, high = new_session_id(7), new_session_id(8)
    assert low.bytes < high.bytes
    assert all(new_session_id(7).bytes < high.bytes for _ in range(100))


def test_an_unslotted_id_has_no_slot() -> None:
    assert slot_of(new_session_id()) is None
    assert slot_of(uuid.uuid4()) is None
    assert new_session_id().version == 4


@pytest.mark.parametrize("slot", [-1, SLOTS, 10**9])
def test_a_slot_out_of_range_is_refused(slot: int) -> None:
    with pytest.raises(ValueError, match=f"slot {slot} is outside"):
        new_session_id(slot)


def test_a_keys_slot_is_stable_across_processes() -> None:
    here = [slot_for("assistant", f"telegram:dm:{n}") for n in range(20)]
    code = (
        "from sessiontree.protocol import slot_for;"
        "print([slot_for('assistant', f'telegram:dm:{n}') for n in range(20)])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert str(here) == there.strip()
    assert all(0 <= s < SLOTS for s in here)
    assert len(set(here)) > 15  # spread, not one hot slot
    assert slot_for("a", "k") != slot_for("b", "k")


# -- on a node: every id of a tree carries its root's slot ------------------------------------

SHAPES: dict[str, list[int]] = {}  # a Main's message -> its branches' fan-outs


def main_cycle(session: Any) -> None:
    if isinstance(session.message, SessionResult):
        return
    for width in SHAPES[session.message]:
        session.spawn(kind="branch", skill="fan", task=str(width))


def fan(session: Any) -> str:
    memory_id = session.broadcast("seen", session.task)
    for n in range(int(session.task)):
        session.spawn(kind="worker", skill="leaf", task=str(n))
    session.collect(timeout=30)
    return f"{session.memory_get('seen')} {memory_id}"


def leaf(session: Any) -> str:
    return session.task


def agent() -> Agent:
    return Agent("slotted", {"main": main_cycle, "fan": fan, "leaf": leaf}, main_skill="main")


def test_every_id_minted_in_a_random_tree_has_its_roots_slot(make_node: Any) -> None:
    draw = random.Random(20261128)
    node: Node = make_node(agent())
    keys = [f"telegram:dm:{n}" for n in range(6)]
    for n, key in enumerate(keys):
        message = f"m{n}"
        SHAPES[message] = [draw.randrange(0, 4) for _ in range(draw.randrange(1, 4))]
        node.main("slotted", key).send(message)
    settle(node)
    sessions = node.sessions()
    assert len(sessions) == len(keys) + sum(len(s) + sum(s) for s in SHAPES.values())
    mains = {s.session_id: s for s in sessions if s.kind is SessionKind.MAIN}
    for info in sessions:
        root = info if info.kind is SessionKind.MAIN else mains[info.conversation]
        assert slot_of(info.session_id) == slot_for("slotted", root.key)
    branches = [s for s in sessions if s.kind is SessionKind.BRANCH]
    for info in branches:  # a memory id carries the slot of the session that wrote it
        result = node.result(info.session_id)
        assert result is not None
        memory_id = result.summary.split()[1]
        assert slot_of(uuid.UUID(memory_id.removeprefix("mem-"))) == slot_of(info.session_id)


def test_memory_scoped_to_the_tree_is_shared_by_one_tree_only(make_node: Any) -> None:
    node: Node = make_node(agent(), memory_scope="tree")
    SHAPES["one"] = [0]
    node.main("slotted", "telegram:dm:1").send("one")
    SHAPES["two"] = [0]
    node.main("slotted", "telegram:dm:2").send("two")
    settle(node)
    branches = [s for s in node.sessions() if s.kind is SessionKind.BRANCH]
    assert len(branches) == 2
    for info in branches:  # each read its own tree's write, never the other's
        result = node.result(info.session_id)
        assert result is not None
        assert result.summary.split()[0] == "0"
        assert node.memory.get(f"tree:{info.conversation}", "seen") == "0"
    with pytest.raises(KeyError):
        node.memory.get("slotted", "seen")


def test_memory_scope_names_its_choices() -> None:
    with pytest.raises(ValueError, match=r"memory_scope must be one of \['agent', 'tree'\]"):
        NodeConfig(memory_scope="node")
