"""``sessiontree top``: its data layer against a node served on 127.0.0.1 (rows,
filter, sort, follow, rates, actions, a node that does not answer), and the
Textual app driven with keys through its pilot, as a person would."""

from __future__ import annotations

import asyncio
import http.server
import itertools
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from textual import events

from sessiontree.actors import AsyncSession, VirtualClock
from sessiontree.cli import main as cli_main
from sessiontree.cli._agents import builtin_agents
from sessiontree.cli._client import NodeRefused, NodeUnreachable
from sessiontree.cli.top._app import ConfirmScreen, TopApp
from sessiontree.cli.top._data import (
    Counters,
    RateMeter,
    Rates,
    build_rows,
    counters_of,
    header_text,
    human_duration,
    parent_of,
)
from sessiontree.cli.top._source import ACTIONS, TopSource
from sessiontree.supervision import Agent, Node, Price, Provider
from sessiontree.testing import StandinServer
from tests._served import ServedNode
from tests.conftest import WAIT, settle

pytestmark = pytest.mark.timeout(120)


async def sleeper(session: AsyncSession) -> str:
    """Sleeps on the test's virtual clock until it is cancelled."""
    await session.sleep(3600)
    return "woke"


def agent(asked: threading.Event) -> Agent:
    """The built-in assistant, with ``sleep`` and ``ask`` (one model call, then
    sleeps like ``sleeper``: a running session with usage; sets ``asked`` once
    its call's usage is on the books)."""

    async def asker(session: AsyncSession) -> str:
        reply = await session.complete("how many tokens is this")
        assert reply.error is None, reply.error
        asked.set()
        await session.sleep(3600)
        return "woke"

    (assistant,) = builtin_agents()
    skills = {**assistant.skills, "sleep": sleeper, "ask": asker}
    return Agent(
        "assistant",
        skills=skills,
        main_skill="chat",
        default_skill="work",
        models={"small": "m", "large": "m"},
    )


# -- a node with a running tree ----------------------------------------------------------


@pytest.fixture
def asked() -> threading.Event:
    return threading.Event()


@pytest.fixture
def node(make_node: Callable[..., Node], asked: threading.Event) -> Iterator[Node]:
    with StandinServer() as standin:
        provider = Provider(base_url=standin.url, prices={"m": Price(0.001, 0.002)}, max_retries=0)
        yield make_node(agent(asked), providers=(provider,), grace=5.0)


@pytest.fixture
def served(node: Node) -> Iterator[ServedNode]:
    with ServedNode(node) as server:
        yield server


def spawn(served: ServedNode, parent: str, kind: str, skill: str, task: str = "") -> str:
    body = {"kind": kind, "skill": skill, "task": task}
    answer = served.http.post(f"/v1/sessions/{parent}/children", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["info"]["session_id"])


@pytest.fixture
def tree(served: ServedNode, node: Node, asked: threading.Event) -> dict[str, str]:
    """A running Main → Branch → two Workers (one has spent tokens), all waiting."""
    answer = served.http.post("/v1/sessions", json={"agent_id": "assistant"})
    assert answer.status_code == 200, answer.text
    main = str(answer.json()["info"]["session_id"])
    branch = spawn(served, main, "branch", "sleep")
    asking = spawn(served, branch, "worker", "ask")
    sleeping = spawn(served, branch, "worker", "sleep")
    assert asked.wait(WAIT), "the asking worker's model call never returned"
    settle(node)
    assert served.get(f"/v1/sessions/{asking}")["usage"]["calls"] == 1
    return {"main": main, "branch": branch, "asking": asking, "sleeping": sleeping}


def source_of(served: ServedNode, node: Node) -> TopSource:
    return TopSource(served.url, clock=node.clock.time)


def ids(rows: list[Any]) -> list[str]:
    return [row.session_id for row in rows]


# -- the data layer on a real node -------------------------------------------------------


def test_a_snapshot_shows_the_running_tree_with_kinds_states_ttls_and_usage(
    served: ServedNode, node: Node, tree: dict[str, str], clock: VirtualClock
) -> None:
    clock.advance(30)
    source = source_of(served, node)
    try:
        snapshot = source.fetch()
    finally:
        source.close()
    rows = build_rows(snapshot.trees, snapshot.taken_at)
    assert ids(rows) == [tree["main"], tree["branch"], tree["asking"], tree["sleeping"]]
    main, branch, asking, sleeping = rows
    assert [r.kind for r in rows] == ["main", "branch", "worker", "worker"]
    assert {r.state for r in rows} == {"active"}
    assert [r.prefix for r in rows] == ["", "└─ ", "   ├─ ", "   └─ "]
    assert [r.skill for r in rows] == ["chat", "sleep", "ask", "sleep"]
    assert main.ttl_left_s is None  # a Main has no TTL
    assert branch.ttl_left_s == pytest.approx(30 * 60 - 30)  # Branch TTL 30 min
    assert asking.ttl_left_s == pytest.approx(5 * 60 - 30)  # Worker TTL 5 min
    assert asking.age_s == pytest.approx(30)
    assert asking.tokens > 0
    assert asking.cost > 0
    assert sleeping.tokens == 0
    assert branch.tokens == 0
    assert branch.subtree_tokens == main.subtree_tokens == asking.tokens
    assert main.subtree_cost == pytest.approx(asking.cost)
    header = header_text(snapshot.node, None)
    assert "sessions: active 4" in header
    assert "spawns - /s" in header


def test_following_a_subtree_fetches_only_that_subtree(
    served: ServedNode, node: Node, tree: dict[str, str]
) -> None:
    source = source_of(served, node)
    try:
        snapshot = source.fetch(tree["branch"])
        with pytest.raises(NodeRefused) as refused:
            source.fetch("00000000-0000-4000-8000-000000000000")
    finally:
        source.close()
    rows = build_rows(snapshot.trees, snapshot.taken_at)
    assert ids(rows) == [tree["branch"], tree["asking"], tree["sleeping"]]
    assert rows[0].prefix == ""
    assert refused.value.status == 404
    assert refused.value.error["code"] == "unknown_session"


def test_the_filter_keeps_the_matches_and_their_ancestors(
    served: ServedNode, node: Node, tree: dict[str, str]
) -> None:
    source = source_of(served, node)
    try:
        snapshot = source.fetch()
    finally:
        source.close()

    def shown(text: str) -> list[str]:
        return ids(build_rows(snapshot.trees, snapshot.taken_at, text=text))

    assert shown(tree["sleeping"][:8].upper()) == [tree["main"], tree["branch"], tree["sleeping"]]
    assert shown("ask") == [tree["main"], tree["branch"], tree["asking"]]
    assert shown("assistant") == ids(build_rows(snapshot.trees, snapshot.taken_at))
    assert shown("ACTIVE") == shown("")
    assert shown("cancelled") == []


def test_rates_come_from_the_counters_of_successive_polls(
    served: ServedNode, node: Node, tree: dict[str, str]
) -> None:
    ticks = itertools.count(1000.0, 2.0)  # each poll 2 s after the last
    source = TopSource(served.url, clock=lambda: next(ticks))
    meter = RateMeter()
    try:
        first = source.fetch()
        assert first.counters is not None
        assert first.counters.spawned == 4
        assert meter.update(first.counters, first.taken_at) is None  # nothing to compare yet
        for skill in ("work", "work", "crash"):
            spawn(served, tree["branch"], "worker", skill, task="0")
        settle(node)
        second = source.fetch()
    finally:
        source.close()
    assert second.counters is not None
    rates = meter.update(second.counters, second.taken_at)
    assert rates == Rates(spawns=1.5, endings=1.5, failures=0.5)
    assert "spawns 1.5/s  endings 1.5/s  failures 0.5/s" in header_text(second.node, rates)
    # the two that completed and the one that failed are in the tree, ended
    states = [r.state for r in build_rows(second.trees, second.taken_at, sort="state")]
    assert states == ["active", "active", "active", "active", "completed", "completed", "failed"]


def test_cancel_from_the_source_ends_the_session_and_a_second_is_refused(
    served: ServedNode, node: Node, tree: dict[str, str]
) -> None:
    source = source_of(served, node)
    try:
        done = source.act("cancel", tree["sleeping"])
        settle(node)
        again = source.act("cancel", tree["sleeping"])
        unknown = source.act("cancel", "00000000-0000-4000-8000-000000000000")
    finally:
        source.close()
    assert done.ok
    assert done.message == f"{tree['sleeping'][:8]}: cancel requested"
    assert served.get(f"/v1/sessions/{tree['sleeping']}")["info"]["state"] == "cancelled"
    assert not again.ok
    assert "refused: invalid_transition" in again.message
    assert not unknown.ok
    assert "refused: unknown_session" in unknown.message
    assert "no cancel route" not in unknown.message


@pytest.mark.parametrize(("route", "status"), [("no-such-route", 404), ("result", 405)])
def test_an_action_the_node_has_no_route_for_is_a_clear_message(
    served: ServedNode,
    node: Node,
    tree: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    route: str,
    status: int,
) -> None:
    # what an older node answers for terminate: no route (404), or not for POST (405)
    monkeypatch.setitem(ACTIONS, "terminate", (route, "terminated"))
    source = source_of(served, node)
    try:
        outcome = source.act("terminate", tree["sleeping"])
    finally:
        source.close()
    assert not outcome.ok
    assert f"this node has no terminate route (POST /v1/sessions/{{id}}/{route} answered " in (
        outcome.message
    )
    assert f"answered {status})" in outcome.message
    assert served.get(f"/v1/sessions/{tree['sleeping']}")["info"]["state"] == "active"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_node_that_does_not_answer_is_named_and_never_a_traceback() -> None:
    source = TopSource(f"http://127.0.0.1:{free_port()}", timeout=2.0)
    try:
        with pytest.raises(NodeUnreachable, match=r"is unreachable"):
            source.fetch()
        outcome = source.act("suspend", "00000000-0000-4000-8000-000000000000")
    finally:
        source.close()
    assert not outcome.ok
    assert outcome.message.startswith("suspend 00000000: node http://127.0.0.1:")


# -- the data layer on plain values ------------------------------------------------------


def session(sid: str, kind: str, state: str, created: float, tokens: int = 0, *kids: Any) -> Any:
    usage = {"prompt_tokens": tokens, "completion_tokens": 0, "cost": tokens / 1000}
    return {
        "info": {
            "session_id": sid,
            "parent_id": None,
            "agent_id": "a",
            "kind": kind,
            "state": state,
            "created_at": created,
            "deadline": None,
            "skill": "s",
        },
        "result": None,
        "usage": usage,
        "subtree_usage": usage,
        "children": list(kids),
    }


def test_sorting_orders_siblings_and_keeps_the_tree() -> None:
    trees = [
        session(
            "m",
            "main",
            "active",
            0.0,
            0,
            session("w-old", "worker", "failed", 1.0, 5),
            session("b", "branch", "suspended", 2.0, 50, session("w-in-b", "worker", "active", 3)),
            session("w-new", "worker", "active", 4.0, 500),
        )
    ]

    def order(sort: str) -> list[str]:
        return ids(build_rows(trees, 10.0, sort=sort))

    assert order("age") == ["m", "w-old", "b", "w-in-b", "w-new"]
    assert order("state") == ["m", "w-new", "b", "w-in-b", "w-old"]
    assert order("kind") == ["m", "b", "w-in-b", "w-old", "w-new"]
    assert order("usage") == ["m", "w-new", "b", "w-in-b", "w-old"]
    with pytest.raises(ValueError, match=r"sort 'size' is not one of age, state, kind, usage"):
        build_rows(trees, 10.0, sort="size")


def test_the_parent_of_a_session_is_found_at_any_depth() -> None:
    worker = session("w", "worker", "active", 3.0)
    worker["info"]["parent_id"] = "b"
    branch = session("b", "branch", "active", 2.0, 0, worker)
    branch["info"]["parent_id"] = "m"
    trees = [
        session("other", "main", "active", 0.0),
        session("m", "main", "active", 1.0, 0, branch),
    ]
    assert [parent_of(trees, sid) for sid in ("w", "b", "m", "nobody")] == ["b", "m", None, None]


def test_an_ended_sessions_age_stops_at_its_end_and_it_has_no_ttl_left() -> None:
    ended = session("w", "worker", "completed", 100.0)
    ended["info"]["deadline"] = 400.0
    ended["result"] = {"timings": {"created_at": 100.0, "ended_at": 107.5}}
    (row,) = build_rows([ended], 1000.0)
    assert row.age_s == 7.5
    assert row.ttl_left_s is None


def test_a_tree_without_its_usage_is_a_key_error_naming_it() -> None:
    broken = session("w", "worker", "active", 0.0)
    del broken["subtree_usage"]
    with pytest.raises(KeyError, match="subtree_usage"):
        build_rows([broken], 1.0)


def test_the_rate_meter_starts_over_when_the_counts_go_down() -> None:
    meter = RateMeter()
    assert meter.update(Counters(10, 5, 1), 0.0) is None
    assert meter.update(Counters(14, 7, 1), 2.0) == Rates(2.0, 1.0, 0.0)
    assert meter.update(Counters(14, 7, 1), 2.0) is None  # no time passed
    assert meter.update(Counters(1, 0, 0), 3.0) is None  # the node restarted
    assert meter.update(Counters(3, 1, 1), 4.0) == Rates(2.0, 1.0, 1.0)


def test_counters_are_read_from_an_exposition_and_garbage_is_a_value_error() -> None:
    text = (
        "# TYPE sessiontree_sessions_spawned counter\n"
        'sessiontree_sessions_spawned_total{kind="main"} 1.0\n'
        'sessiontree_sessions_spawned_total{kind="worker"} 6.0\n'
        "# TYPE sessiontree_sessions_terminated counter\n"
        'sessiontree_sessions_terminated_total{kind="worker",state="completed"} 3.0\n'
        'sessiontree_sessions_terminated_total{kind="worker",state="failed"} 2.0\n'
    )
    assert counters_of(text) == Counters(spawned=7.0, ended=5.0, failed=2.0)
    assert counters_of("") == Counters(0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="invalid metric name"):
        counters_of("<html>not metrics</html>")


def test_durations_read_as_a_person_would() -> None:
    assert [human_duration(s) for s in (None, -3, 42, 185, 7620, 273600)] == [
        "-",
        "0s",
        "42s",
        "3m05s",
        "2h07m",
        "3d04h",
    ]


# -- the app, driven through its pilot ---------------------------------------------------


async def until(pilot: Any, done: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Let the app run until ``done()`` holds; fail naming ``what`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done():
        assert loop.time() < deadline, f"the view never showed {what}"
        await pilot.pause(0.02)


def drive(app: TopApp, scenario: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``scenario(pilot)`` on ``app`` in a terminal of 160x40 cells."""

    async def run() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            await scenario(pilot)

    asyncio.run(run())


def shown(app: TopApp) -> list[str]:
    return ids(app.rows)


def cell(app: TopApp, session_id: str, column: int) -> str:
    table = app.query_one("#sessions")
    return str(table.get_row(session_id)[column])  # type: ignore[attr-defined]


def message(app: TopApp) -> str:
    return str(app.query_one("#message").render())


async def select(pilot: Any, app: TopApp, session_id: str) -> None:
    """Move the cursor with the arrow keys to ``session_id``'s row."""
    await pilot.press("home")
    for _ in range(len(app.rows)):
        if app.selected == session_id:
            return
        await pilot.press("down")
    assert app.selected == session_id


def test_top_shows_the_running_tree(served: ServedNode, node: Node, tree: dict[str, str]) -> None:
    polls = itertools.count()  # each poll one second after the last, on the node's clock
    source = TopSource(served.url, clock=lambda: node.clock.time() + next(polls))
    app = TopApp(source, interval=0.2)

    async def scenario(pilot: Any) -> None:
        everyone = [tree["main"], tree["branch"], tree["asking"], tree["sleeping"]]
        await until(pilot, lambda: shown(app) == everyone, "the tree")
        assert [cell(app, sid, 1) for sid in everyone] == ["main", "branch", "worker", "worker"]
        assert {cell(app, sid, 2) for sid in everyone} == {"active"}
        assert cell(app, tree["sleeping"], 0) == f"   └─ {tree['sleeping'][:8]}"
        assert cell(app, tree["sleeping"], 3) == "assistant/sleep"
        assert cell(app, tree["asking"], 6) != "-"  # its tokens
        header = str(app.query_one("#header").render())
        assert "sessions: active 4" in header
        await until(
            pilot, lambda: "spawns 0.0/s" in str(app.query_one("#header").render()), "rates"
        )

    try:
        drive(app, scenario)
    finally:
        app.source.close()


@pytest.mark.parametrize(
    ("key", "answer"), [("c", "cancel requested"), ("t", "termination requested")]
)
def test_cancelling_or_terminating_a_session_from_top_ends_it(
    served: ServedNode, node: Node, tree: dict[str, str], key: str, answer: str
) -> None:
    app = TopApp(source_of(served, node), interval=0.2)
    target = tree["sleeping"]

    async def scenario(pilot: Any) -> None:
        await until(pilot, lambda: target in shown(app), "the worker")
        await select(pilot, app, target)
        await pilot.press(key)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        assert "worker" in str(app.screen.query_one("#question").render())
        await pilot.press("y")
        await until(pilot, lambda: answer in message(app), "the node's answer")
        ended = await asyncio.to_thread(served.get, f"/v1/sessions/{target}/result", timeout=WAIT)
        assert ended["done"] is True
        assert ended["result"]["status"] == "cancelled"
        await until(pilot, lambda: cell(app, target, 2) == "cancelled", "the cancelled state")
        assert app.selected == target  # the cursor stayed on it across polls

    try:
        drive(app, scenario)
    finally:
        app.source.close()
    assert served.get(f"/v1/sessions/{tree['asking']}")["info"]["state"] == "active"


def test_declining_the_confirmation_leaves_the_session_running(
    served: ServedNode, node: Node, tree: dict[str, str]
) -> None:
    app = TopApp(source_of(served, node), interval=0.2)

    async def scenario(pilot: Any) -> None:
        await until(pilot, lambda: tree["branch"] in shown(app), "the branch")
        await select(pilot, app, tree["branch"])
        declined = f"{tree['branch'][:8]}: not confirmed"
        for key, action in (("p", "suspend"), ("t", "terminate"), ("c", "cancel")):
            await pilot.press(key)
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "a confirmation")
            await pilot.press("n")
            await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "no dialog")
            assert message(app) == f"{action} {declined}"

    try:
        drive(app, scenario)
    finally:
        app.source.close()
    assert served.get(f"/v1/sessions/{tree['branch']}")["info"]["state"] == "active"


def test_terminate_on_a_node_without_the_route_is_a_message_that_stays(
    served: ServedNode, node: Node, tree: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ACTIONS, "terminate", ("no-such-route", "terminated"))
    app = TopApp(source_of(served, node), interval=0.1)

    async def scenario(pilot: Any) -> None:
        await until(pilot, lambda: tree["sleeping"] in shown(app), "the worker")
        await select(pilot, app, tree["sleeping"])
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        assert "without grace" in str(app.screen.query_one("#question").render())
        await pilot.press("y")
        await until(pilot, lambda: "has no terminate route" in message(app), "the message")
        polls = app.polls
        await until(pilot, lambda: app.polls >= polls + 2, "two more polls")
        assert "has no terminate route" in message(app)  # a poll does not wipe it
        assert app.query_one("#message").has_class("error")

    try:
        drive(app, scenario)
    finally:
        app.source.close()
    assert served.get(f"/v1/sessions/{tree['sleeping']}")["info"]["state"] == "active"


def test_filter_sort_and_follow_with_the_keys(
    served: ServedNode, node: Node, tree: dict[str, str]
) -> None:
    app = TopApp(source_of(served, node), interval=0.2)
    everyone = [tree["main"], tree["branch"], tree["asking"], tree["sleeping"]]

    async def scenario(pilot: Any) -> None:
        await until(pilot, lambda: shown(app) == everyone, "the tree")
        await pilot.press("slash", "a", "s", "k", "x", "backspace", "enter")
        assert app.filter_text == "ask"
        assert not app.filtering
        assert shown(app) == [tree["main"], tree["branch"], tree["asking"]]
        assert "filter: ask" in str(app.query_one("#filter").render())
        await pilot.press("escape")
        assert shown(app) == everyone

        # typed faster than the app takes keys (or pasted): every letter lands in
        # the filter, none runs as a key (c would ask to cancel, s would sort)
        for key in ("slash", "c", "r", "a", "s", "h"):
            app.post_message(events.Key(key, "/" if key == "slash" else key))
        await until(pilot, lambda: app.filter_text == "crash", "the typed filter")
        assert not isinstance(app.screen, ConfirmScreen)
        assert app.sort == "age"
        assert shown(app) == []
        await pilot.press("escape")
        assert (app.filter_text, app.filtering, shown(app)) == ("", False, everyone)
        await pilot.press("s", "s", "s")  # age → state → kind → usage
        assert app.sort == "usage"
        assert shown(app) == everyone  # the one with tokens was first among its siblings
        await pilot.press("s")
        assert app.sort == "age"

        # up from a session followed a moment ago, before its own tree came:
        # the root goes to its parent, not to the top
        await select(pilot, app, tree["asking"])
        await pilot.press("f", "b")
        assert app.root == tree["branch"]
        await until(pilot, lambda: shown(app) == everyone[1:], "the branch's subtree")
        await pilot.press("b", "b")
        assert app.root is None

        await until(pilot, lambda: shown(app) == everyone, "the tree")
        await select(pilot, app, tree["branch"])
        await pilot.press("f")
        await until(pilot, lambda: shown(app) == everyone[1:], "the branch's subtree")
        assert "subtree of" in str(app.query_one("#where").render())
        await pilot.press("b")  # up to the branch's parent, the Main
        await until(pilot, lambda: app.root == tree["main"] and app.polls > 0, "the main")
        await until(pilot, lambda: shown(app) == everyone, "the main's subtree")
        assert app.selected == tree["branch"]  # the cursor is where we came from
        await pilot.press("b")
        assert app.root is None
        await pilot.press("b")
        assert message(app) == "showing every main already"

    try:
        drive(app, scenario)
    finally:
        app.source.close()


def test_the_view_shows_an_unreachable_node_and_recovers_when_it_is_back(
    node: Node, tree: dict[str, str], served: ServedNode
) -> None:
    port = int(served.url.rsplit(":", 1)[1])
    app = TopApp(source_of(served, node), interval=0.1)

    async def scenario(pilot: Any) -> None:
        await until(pilot, lambda: tree["main"] in shown(app), "the tree")
        await asyncio.to_thread(served.close)
        await until(pilot, lambda: "is unreachable" in message(app), "the outage")
        assert app.query_one("#message").has_class("error")
        assert tree["main"] in shown(app)  # the last tree stays in view
        polls = app.polls
        again = await asyncio.to_thread(ServedNode, node, port)
        try:
            await until(pilot, lambda: app.polls > polls, "a poll after the outage")
            await until(pilot, lambda: message(app) == "", "the error cleared")
            await pilot.press("b")  # the app still takes keys
            assert message(app) == "showing every main already"
        finally:
            await asyncio.to_thread(again.close)

    try:
        drive(app, scenario)
    finally:
        app.source.close()


class NotANode(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a JSON object that is no answer of a node."""

    def do_GET(self) -> None:
        body = b'{"hello": "world"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_that_is_not_a_node_is_shown_as_an_error_not_a_traceback() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotANode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # one poll, at the start: no later one overwrites the status line under the test
    app = TopApp(TopSource(f"http://127.0.0.1:{server.server_address[1]}"), interval=60)

    async def scenario(pilot: Any) -> None:
        await until(
            pilot,
            lambda: message(app) == "poll failed: KeyError('items') (retrying every 60 s)",
            "the error",
        )
        assert app.rows == []
        await pilot.press("c")  # nothing is selected: said so, nothing asked
        assert message(app) == "no session selected to cancel"
        assert not isinstance(app.screen, ConfirmScreen)

    try:
        drive(app, scenario)
    finally:
        app.source.close()
        server.shutdown()
        server.server_close()
        thread.join(WAIT)


def test_top_refuses_a_root_no_session_of_the_node_starts_with(served: ServedNode) -> None:
    result = CliRunner().invoke(cli_main, ["top", "--node", served.url, "--root", "ffff0000"])
    assert result.exit_code == 2
    assert "no session starts with 'ffff0000'" in result.output
    result = CliRunner().invoke(cli_main, ["top", "--interval", "0"])
    assert result.exit_code == 2
    assert "--interval" in result.output


def test_a_node_that_refuses_the_token_stops_the_view_saying_so(node: Node) -> None:
    """A 401 would answer every poll: the view exits at once (no retries for
    ever), and ``sessiontree top`` prints why and exits 1."""
    with ServedNode(node, token="s3cret") as server:
        app = TopApp(TopSource(server.url), interval=0.1)

        async def scenario(pilot: Any) -> None:
            await until(pilot, lambda: app.stopped is not None, "the stop")
            await until(pilot, lambda: not app.is_running, "the exit")

        try:
            drive(app, scenario)
        finally:
            app.source.close()
    assert app.return_code == 1
    assert app.polls == 0
    assert app.stopped is not None
    assert app.stopped.startswith(f"top stopped: {server.url} refused the request (401 ")
    assert "requires a bearer token" in app.stopped
    assert "--token-file FILE" in app.stopped
