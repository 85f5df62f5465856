"""Slotted session ids: a slot in the top 14 bits of a version 8 UUID.

The layout is what a cluster routes on, so it is pinned here: a slot is one
contiguous range of ids, a key's slot is the same in every process, and an
unslotted (version 4) id says so.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from sessiontree.protocol import SLOTS, new_session_id, slot_for, slot_of


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
