"""Idempotent send: a message sent again with the same key while the first is in
the Main's inbox queues nothing and gets the first's answer, in Python and
over HTTP (``Idempotency-Key``), across a restart too."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from sessiontree.actors import VirtualClock
from sessiontree.cli.server import create_app
from sessiontree.protocol import RejectedInputError
from sessiontree.supervision import Agent, Node, NodeConfig
from tests._fakes import FakeMetrics
from tests.conftest import WAIT

pytestmark = pytest.mark.timeout(60)


class Holding:
    """A Main skill that records each message it ran, and holds the cycle of a
    message starting with ``hold`` until ``go`` is set (at a checkpoint)."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.holding = threading.Event()
        self.go = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, session: Any) -> None:
        message = session.message
        if isinstance(message, str) and message.startswith("hold"):
            self.holding.set()
            while not self.go.wait(0.01):  # a bounded poll at checkpoints
                session.checkpoint()
        with self.lock:
            self.ran.append(str(message))


@pytest.fixture
def holding() -> Iterator[Holding]:
    log = Holding()
    yield log
    log.go.set()


def node_on(store: pathlib.Path | None, log: Holding, clock: VirtualClock) -> Node:
    return Node(
        [Agent("agent", {"main": log}, main_skill="main")], NodeConfig(), clock=clock, store=store
    )


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "store"])
def test_a_send_repeated_with_its_key_queues_one_message(
    tmp_path: pathlib.Path, holding: Holding, clock: VirtualClock, durable: bool
) -> None:
    node = node_on(tmp_path / "s" if durable else None, holding, clock)
    try:
        main = node.main("agent")
        assert main.send("hold") is None
        assert holding.holding.wait(WAIT)
        assert main.send("pay 10", request_id="order-7") is None
        assert main.send("pay 10", request_id="order-7") is None  # the first's answer
        assert node.send(main.session_id, "pay 10", request_id="order-7") is None
        assert main.send("pay 10", request_id="order-8") is None  # another key: another one
        holding.go.set()
        assert node.wait_idle(WAIT)
        assert holding.ran == ["hold", "pay 10", "pay 10"]
        # its cycle ran: the key is kept no longer, so a send with it is a new message
        assert main.send("pay 10", request_id="order-7") is None
        assert node.wait_idle(WAIT)
        assert holding.ran.count("pay 10") == 3
    finally:
        node.shutdown(grace=0)


def test_a_repeat_after_a_restart_finds_the_first_still_in_the_inbox(
    tmp_path: pathlib.Path, holding: Holding, clock: VirtualClock
) -> None:
    store = tmp_path / "s"
    node = node_on(store, holding, clock)
    main = node.main("agent")
    assert main.send("hold one") is None
    assert holding.holding.wait(WAIT)
    assert main.send("keyed", request_id="k-1") is None  # behind the held cycle
    node.shutdown(grace=0)
    assert "keyed" not in holding.ran

    again = Holding()
    node = node_on(store, again, clock)  # the held cycle runs again, and holds
    try:
        assert again.holding.wait(WAIT)
        assert node.send(main.session_id, "keyed", request_id="k-1") is None
        again.go.set()
        assert node.wait_idle(WAIT)
        assert again.ran == ["hold one", "keyed"]  # once, not twice
    finally:
        again.go.set()
        node.shutdown(grace=0)


@pytest.mark.parametrize("bad", ["", "x" * 256, 7, "\ud800"])
def test_a_bad_key_is_refused_naming_it_and_nothing_is_queued(
    holding: Holding, clock: VirtualClock, bad: Any
) -> None:
    node = node_on(None, holding, clock)
    try:
        main = node.main("agent")
        with pytest.raises(RejectedInputError) as raised:
            main.send("pay", request_id=bad)
        assert raised.value.field == "request_id"
        assert node.wait_idle(WAIT)
        assert holding.ran == []
    finally:
        node.shutdown(grace=0)


def test_an_idempotency_key_over_http_queues_one_message(
    tmp_path: pathlib.Path, holding: Holding, clock: VirtualClock
) -> None:
    node = node_on(tmp_path / "s", holding, clock)
    try:
        main = node.main("agent")
        with TestClient(create_app(node, FakeMetrics(), max_wait=5.0)) as client:
            url = f"/v1/sessions/{main.session_id}/messages"
            assert client.post(url, json={"message": "hold"}).status_code == 202
            assert holding.holding.wait(WAIT)
            key = {"Idempotency-Key": "req-1"}
            first = client.post(url, json={"message": "pay"}, headers=key)
            second = client.post(url, json={"message": "pay"}, headers=key)
            assert (first.status_code, second.status_code) == (202, 202)
            empty = client.post(url, json={"message": "pay"}, headers={"Idempotency-Key": ""})
            assert empty.status_code == 400, empty.text
            assert "request_id" in empty.text or "Idempotency-Key" in empty.text
        holding.go.set()
        assert node.wait_idle(WAIT)
        assert holding.ran == ["hold", "pay"]
    finally:
        holding.go.set()
        node.shutdown(grace=0)
