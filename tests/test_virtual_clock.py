"""The virtual clock: timers fire in order within an advance, each seeing its
own due time on the advancing thread, while every other thread sees the
advance's end (an actor handling what a timer posted reads one instant,
whatever the threads' timing)."""

from __future__ import annotations

import threading

import pytest

from sessiontree.actors import VirtualClock
from tests.conftest import WAIT


def test_timers_fire_in_order_each_at_its_own_due_time() -> None:
    clock = VirtualClock(start=1000.0)
    seen: list[tuple[str, float, float]] = []
    for name, delay in (("c", 30.0), ("a", 10.0), ("b", 20.0)):
        clock.call_later(delay, lambda n=name: seen.append((n, clock.monotonic(), clock.time())))
    clock.advance(25.0)
    assert seen == [("a", 10.0, 1010.0), ("b", 20.0, 1020.0)]
    assert clock.monotonic() == 25.0
    clock.advance(5.0)
    assert seen[-1] == ("c", 30.0, 1030.0)


def test_a_timer_armed_by_a_firing_timer_fires_within_the_same_advance() -> None:
    clock = VirtualClock()
    fired: list[float] = []

    def again() -> None:
        fired.append(clock.monotonic())
        if len(fired) < 3:
            clock.call_later(10.0, again)

    clock.call_later(10.0, again)
    clock.advance(100.0)
    assert fired == [10.0, 20.0, 30.0]


def test_another_thread_sees_the_end_of_an_advance_while_its_timers_fire() -> None:
    clock = VirtualClock()
    read, go_on = threading.Event(), threading.Event()
    seen: dict[str, float] = {}

    def reader() -> None:
        seen["other"] = clock.monotonic()
        read.set()

    def timer() -> None:
        seen["advancing"] = clock.monotonic()
        thread = threading.Thread(target=reader)
        thread.start()
        assert read.wait(WAIT)
        thread.join(WAIT)
        go_on.set()

    clock.call_later(10.0, timer)
    clock.advance(70.0)
    assert go_on.is_set()
    assert seen == {"advancing": 10.0, "other": 70.0}


def test_a_timer_another_thread_arms_during_an_advance_is_due_after_its_end() -> None:
    """Armed mid-advance from a stale reading it would be due in the past, where
    no advance fires it; it waits for the advance and counts from its end."""
    clock = VirtualClock()
    fired: list[float] = []
    armed = threading.Event()

    def arm() -> None:
        clock.call_later(10.0, lambda: fired.append(clock.monotonic()))
        armed.set()

    def timer() -> None:
        threading.Thread(target=arm).start()  # blocks until the advance is over

    clock.call_later(10.0, timer)
    clock.advance(70.0)
    assert armed.wait(WAIT)
    assert fired == []
    clock.advance(9.0)
    assert fired == []
    clock.advance(1.0)
    assert fired == [80.0]


def test_an_advance_backwards_is_refused_naming_the_seconds() -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError, match=r"backwards \(-1\.0\)"):
        clock.advance(-1.0)


def test_a_wall_jump_moves_only_the_wall_clock() -> None:
    clock = VirtualClock(start=0.0)
    fired: list[float] = []
    clock.call_later(5.0, lambda: fired.append(clock.monotonic()))
    clock.jump_wall(3600.0)
    assert (clock.time(), clock.monotonic(), fired) == (3600.0, 0.0, [])
    clock.advance(5.0)
    assert (clock.time(), fired) == (3605.0, [5.0])


def test_next_timer_names_the_earliest_live_timer_for_a_jump_to_it() -> None:
    clock = VirtualClock()
    assert clock.next_timer is None
    fired: list[str] = []
    late = clock.call_later(5.0, lambda: fired.append("late"))
    early = clock.call_later(2.0, lambda: fired.append("early"))
    assert clock.next_timer == 2.0
    early.cancel()
    assert clock.next_timer == 5.0  # a cancelled timer is skipped
    due = clock.next_timer
    assert due is not None
    clock.advance(due - clock.monotonic())
    assert fired == ["late"]
    assert clock.next_timer is None
    late.cancel()  # already fired: nothing changes
    assert clock.next_timer is None
