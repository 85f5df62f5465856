"""``GET /v1/events`` and ``sessiontree events`` against a node served for real on
127.0.0.1: every transition once and in order, resuming without a gap,
filters, a consumer that stops reading cut off while memory stays bounded,
bad filters named, the command line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from sessiontree.cli import main as cli_main
from sessiontree.cli._agents import builtin_agents
from sessiontree.cli.commands._events import SseMessage, render_event, sse_messages
from sessiontree.cli.server import create_app
from sessiontree.cli.server._event_hub import EventHub
from sessiontree.supervision import Agent, Event, Node
from tests._fakes import FakeMetrics
from tests._running_node import ROOT
from tests._served import ServedNode
from tests.conftest import WAIT, settle

SPAM_PAD = 16_384  # bytes of each progress note the spamming skill sends
SPAM_MAX = 20_000  # progress notes it sends at most


async def sleeper(session: Any) -> str:
    """Sleeps on the test's virtual clock until it is cancelled."""
    await session.sleep(3600)
    return "woke"


async def reporter(session: Any) -> str:
    await session.progress("half way", done=1)
    return "reported"


def agents(stop: threading.Event | None = None) -> list[Agent]:
    def spammer(session: Any) -> int:
        sent = 0
        while stop is not None and not stop.is_set() and sent < SPAM_MAX:
            session.progress("tick", i=sent, pad="x" * SPAM_PAD)
            sent += 1
        return sent

    (assistant,) = builtin_agents()
    skills = {**assistant.skills, "sleep": sleeper, "report": reporter, "spam": spammer}
    return [
        Agent("assistant", skills=skills, main_skill="chat", default_skill="work"),
        Agent("other", skills=skills, main_skill="chat", default_skill="work"),
    ]


@pytest.fixture
def served(make_node: Callable[..., Node]) -> Iterator[ServedNode]:
    with ServedNode(make_node(*agents(), grace=5.0)) as node:
        yield node


def open_main(served: ServedNode, agent: str = "assistant") -> str:
    answer = served.http.post("/v1/sessions", json={"agent_id": agent})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["info"]["session_id"])


def spawn(served: ServedNode, parent: str, kind: str = "worker", **spec: Any) -> str:
    answer = served.http.post(f"/v1/sessions/{parent}/children", json={"kind": kind, **spec})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["info"]["session_id"])


@contextmanager
def stream(
    served: ServedNode,
    headers: dict[str, str] | None = None,
    client: httpx.Client | None = None,
    **params: Any,
) -> Iterator[Iterator[SseMessage]]:
    """The messages of ``/v1/events`` (comments left out), once the node has
    registered the subscriber (its opening comment has arrived)."""
    http = client or httpx.Client(timeout=WAIT)
    try:
        with http.stream("GET", f"{served.url}/v1/events", params=params, headers=headers) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            messages = sse_messages(r.iter_lines())
            opening = next(messages)
            assert opening.comment is not None
            assert opening.comment.startswith("events after")
            yield (m for m in messages if m.comment is None)
    finally:
        http.close()


def ring(served: ServedNode, **params: Any) -> list[SseMessage]:
    """What the ring holds now (``follow=false``), comments left out."""
    answer = served.http.get("/v1/events", params={"since": 0, "follow": "false", **params})
    assert answer.status_code == 200, answer.text
    return [m for m in sse_messages(answer.text.split("\n")) if m.comment is None]


def seen(message: SseMessage) -> tuple[Any, ...]:
    data = message.json()
    assert message.event == data["type"]
    assert message.id == str(data["seq"])
    return (data["type"], data["session_id"], data["state"], data["code"])


def expected(event: Event) -> tuple[Any, ...]:
    sid = None if event.session_id is None else str(event.session_id)
    return (event.kind.value, sid, event.state, event.code)


def hub_of(served: ServedNode) -> EventHub:
    hub: EventHub = served.app.state.events
    return hub


def build_tree(served: ServedNode) -> dict[str, str]:
    """A Main, a sleeping branch under it and four workers under the branch: one
    completes, one crashes, one is cancelled, one reports progress."""
    main = open_main(served)
    branch = spawn(served, main, kind="branch", skill="sleep")
    ids = {
        "main": main,
        "branch": branch,
        "done": spawn(served, branch, skill="work", task="0"),
        "crashed": spawn(served, branch, skill="crash"),
        "cancelled": spawn(served, branch, skill="sleep"),
        "reported": spawn(served, branch, skill="report"),
    }
    settle(served.node)
    assert served.http.post(f"/v1/sessions/{ids['cancelled']}/cancel").status_code == 202
    settle(served.node)
    return ids


# -- following --------------------------------------------------------------------------


def test_a_follower_sees_every_transition_once_and_in_order(served: ServedNode) -> None:
    recorded: list[Event] = []
    with stream(served) as messages:
        unsubscribe = served.node.subscribe(recorded.append)
        ids = build_tree(served)
        unsubscribe()
        got = [next(messages) for _ in recorded]
    assert [seen(m) for m in got] == [expected(e) for e in recorded]
    numbers = [int(m.id or 0) for m in got]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    ends = {
        (data["session_id"], data["state"], data["code"])
        for data in (m.json() for m in got)
        if data["type"] == "transition" and data["state"] in ("failed", "cancelled")
    }
    assert (ids["crashed"], "failed", "crashed") in ends
    assert (ids["cancelled"], "cancelled", "cancelled") in ends
    transitions = [
        (d["session_id"], d["previous"], d["state"])
        for d in (m.json() for m in got)
        if d["type"] == "transition"
    ]
    assert len(transitions) == len(set(transitions)), "a transition came twice"
    notes = [m.json() for m in got if m.event == "progress"]
    assert [(n["session_id"], n["data"]["note"], n["agent"]) for n in notes] == [
        (ids["reported"], "half way", "assistant")
    ]


def test_a_reconnect_with_last_event_id_resumes_without_a_gap(served: ServedNode) -> None:
    recorded: list[Event] = []
    with stream(served) as messages:
        unsubscribe = served.node.subscribe(recorded.append)
        main = open_main(served)
        spawn(served, main, task="0")
        settle(served.node)
        first = [next(messages) for _ in recorded]
    spawn(served, main, skill="crash")  # while nobody follows
    settle(served.node)
    last = first[-1].id
    assert last is not None
    with stream(served, headers={"Last-Event-ID": last}) as messages:
        spawn(served, main, task="0")
        settle(served.node)
        unsubscribe()
        rest = [next(messages) for _ in recorded[len(first) :]]
    both = first + rest
    assert [seen(m) for m in both] == [expected(e) for e in recorded]
    numbers = [int(m.id or 0) for m in both]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    # ``since`` says the same for clients that cannot set headers
    assert [seen(m) for m in ring(served, since=last)] == [seen(m) for m in rest]


def test_a_resume_older_than_the_ring_says_how_many_were_missed(
    make_node: Callable[..., Node],
) -> None:
    with ServedNode(make_node(*agents()), event_ring=4) as served:
        main = open_main(served)
        for _ in range(3):
            spawn(served, main, task="0")
        settle(served.node)
        latest = hub_of(served).last_seq
        assert latest > 4
        missed, *held = ring(served)
        assert (missed.event, missed.id) == ("missed", None)
        assert missed.json()["missed"] == latest - 4
        assert [int(m.id or 0) for m in held] == list(range(latest - 3, latest + 1))
        future, *again = ring(served, since=latest + 100)  # from before a restart
        assert (future.event, future.json()["missed"]) == ("missed", None)
        assert [m.id for m in again] == [m.id for m in held]
        assert hub_of(served).stats()["ring"] == 4


def test_a_keep_alive_comment_goes_out_when_quiet(make_node: Callable[..., Node]) -> None:
    with (
        ServedNode(make_node(*agents()), event_heartbeat=0.05) as served,
        httpx.stream("GET", f"{served.url}/v1/events", timeout=WAIT) as answer,
    ):
        comments = (m.comment for m in sse_messages(answer.iter_lines()))
        assert (next(comments) or "").startswith("events after")
        assert next(comments) == "keep-alive"


# -- filters ----------------------------------------------------------------------------


def test_filters_pick_subtree_agent_kind_and_type(served: ServedNode) -> None:
    recorded: list[Event] = []
    served.node.subscribe(recorded.append)
    ids = build_tree(served)
    other_main = open_main(served, "other")
    spawn(served, other_main, task="0")
    spawn(served, ids["main"], task="0")  # beside the branch, not under it
    settle(served.node)
    subtree = {ids[name] for name in ("branch", "done", "crashed", "cancelled", "reported")}

    def want(pick: Callable[[Event], bool]) -> list[tuple[Any, ...]]:
        return [expected(e) for e in recorded if pick(e)]

    assert [seen(m) for m in ring(served, root=ids["branch"])] == want(
        lambda e: str(e.session_id) in subtree
    )
    assert [seen(m) for m in ring(served, agent="other")] == want(lambda e: e.agent_id == "other")
    assert [seen(m) for m in ring(served, kind="worker")] == want(
        lambda e: e.session_kind == "worker"
    )
    types = {"transition", "progress"}
    assert [seen(m) for m in ring(served, type="transition,progress")] == want(
        lambda e: e.kind.value in types
    )
    repeated = served.http.get(
        "/v1/events",
        params=[("since", 0), ("follow", "false"), ("type", "transition"), ("type", "progress")],
    )
    assert [seen(m) for m in sse_messages(repeated.text.split("\n")) if m.comment is None] == want(
        lambda e: e.kind.value in types
    )


def test_a_live_subtree_follows_children_spawned_after_it_began(served: ServedNode) -> None:
    main = open_main(served)
    branch = spawn(served, main, kind="branch", skill="sleep")
    settle(served.node)
    recorded: list[Event] = []
    with stream(served, root=branch, type="spawned,transition") as messages:
        served.node.subscribe(recorded.append)
        child = spawn(served, branch, task="0")
        spawn(served, main, task="0")  # a sibling of the branch: left out
        settle(served.node)
        wanted = [
            expected(e)
            for e in recorded
            if str(e.session_id) in {branch, child} and e.kind.value in {"spawned", "transition"}
        ]
        got = [seen(next(messages)) for _ in wanted]
    assert got == wanted
    assert {g[1] for g in got} == {child}


@pytest.mark.parametrize(
    ("params", "headers", "field"),
    [
        ({"type": "bogus"}, {}, "type"),
        ({"type": "transition,nope"}, {}, "type"),
        ({"kind": "leaf"}, {}, "kind"),
        ({"root": "not-a-uuid"}, {}, "root"),
        ({"since": "-1"}, {}, "since"),
        ({"since": "soon"}, {}, "since"),
        ({"follow": "maybe"}, {}, "follow"),
        ({}, {"Last-Event-ID": "abc"}, "Last-Event-ID"),
        ({"agent": "x" * 200}, {}, "agent"),
    ],
)
def test_a_bad_filter_is_a_400_naming_the_parameter(
    served: ServedNode, params: dict[str, str], headers: dict[str, str], field: str
) -> None:
    answer = served.http.get("/v1/events", params=params, headers=headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "rejected_input"
    assert error["field"] == field


def test_an_unknown_root_or_agent_is_a_404(served: ServedNode) -> None:
    nobody = "00000000-0000-4000-8000-000000000000"
    answer = served.http.get("/v1/events", params={"root": nobody})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_session"
    answer = served.http.get("/v1/events", params={"agent": "nobody"})
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert (error["code"], error["field"]) == ("unknown_agent", "agent")


# -- a consumer that stops reading ------------------------------------------------------


def test_a_consumer_that_stops_reading_is_cut_off_and_memory_stays_bounded(
    make_node: Callable[..., Node], release: threading.Event
) -> None:
    node = make_node(*agents(release))
    with ServedNode(node, event_queue=8, event_ring=64) as served:
        main = open_main(served)
        hub = hub_of(served)
        before = hub.last_seq
        slow = httpx.Client(
            timeout=WAIT,
            transport=httpx.HTTPTransport(
                socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)]
            ),
        )
        with stream(served, client=slow) as messages:
            assert hub.stats()["subscribers"] == 1
            spawn(served, main, skill="spam")  # and the test reads nothing meanwhile
            assert hub.wait_cut_off(1, WAIT), hub.stats()
            release.set()
            stats = hub.stats()
            assert stats["subscribers"] == 0
            assert stats["most_queued"] <= 8
            assert stats["ring"] <= 64
            rest = list(messages)  # reading again: what the socket held, then the end
        final = rest[-1]
        assert (final.event, final.id) == ("overflow", None)
        body = final.json()
        assert body["queue_size"] == 8
        # the last event it was sent (none, when it was cut before its first write)
        assert body["last_id"] == (int(rest[-2].id or 0) if len(rest) > 1 else before)
        assert "Last-Event-ID" in body["message"]
        numbers = [int(m.id or 0) for m in rest[:-1]]
        assert numbers == sorted(set(numbers))
        settle(node)
        # a second consumer that keeps up is not affected
        assert [m.event for m in ring(served, type="transition")][-1] == "transition"


# -- the schema ---------------------------------------------------------------------------


def test_the_schema_documents_the_stream(make_node: Callable[..., Node]) -> None:
    app = create_app(make_node(*agents()), FakeMetrics())
    operation = app.openapi_schema.to_schema()["paths"]["/v1/events"]["get"]
    assert "text/event-stream" in operation["responses"]["200"]["content"]
    names = {p["name"] for p in operation["parameters"]}
    assert {"root", "agent", "kind", "type", "since", "follow", "Last-Event-ID"} <= names
    assert {"400", "404"} <= set(operation["responses"])


# -- the command line ---------------------------------------------------------------------


def test_events_prints_the_ring_as_lines_or_json(served: ServedNode) -> None:
    ids = build_tree(served)
    runner = CliRunner()
    result = runner.invoke(cli_main, ["events", "--node", served.url, "--json"])
    assert result.exit_code == 0, result.output
    objects = [json.loads(line) for line in result.output.splitlines()]
    assert [o["seq"] for o in objects] == list(range(1, hub_of(served).last_seq + 1))
    result = runner.invoke(
        cli_main,
        ["events", "--node", served.url, "--type", "transition", "--root", ids["branch"]],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(ids["crashed"][:8] in line and "crashed" in line for line in lines)
    assert all(" transition " in f" {line} " for line in lines)
    assert render_event(objects[0]).split()[1] == objects[0]["type"]


def test_events_refuses_a_bad_type_naming_it(served: ServedNode) -> None:
    result = CliRunner().invoke(cli_main, ["events", "--node", served.url, "--type", "bogus"])
    assert result.exit_code == 1
    assert "(field type)" in result.output
    assert "bogus" in result.output


def test_events_follow_prints_as_they_come_and_ends_on_ctrl_c(served: ServedNode) -> None:
    main = open_main(served)
    since = hub_of(served).last_seq
    command = [sys.executable, "-m", "sessiontree.cli", "events", "--follow", "--json"]
    command += ["--node", served.url, "--root", main, "--since", str(since)]
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        worker = spawn(served, main, skill="crash")
        assert proc.stdout is not None
        lines: list[dict[str, Any]] = []
        while not any(line["session_id"] == worker and line["state"] == "failed" for line in lines):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            lines.append(json.loads(line))
        assert lines[0]["seq"] == since + 1
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
