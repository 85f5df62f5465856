"""The node's HTTP API (Litestar, in process): every operation, every client
mistake as a 4xx naming the field and an ErrorCode, and schemathesis against
the API's own OpenAPI schema."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from sessiontree.actors import VirtualClock
from sessiontree.cli._agents import builtin_agents
from sessiontree.cli.server import create_app
from sessiontree.protocol import MAX_MESSAGE_CHARS, RejectedInputError
from sessiontree.supervision import Agent, Node
from tests._fakes import FakeMetrics
from tests.conftest import settle

Client = TestClient[Any]
JSON = {"content-type": "application/json"}  # a client that sends raw bytes says they are JSON


async def sleeper(session: Any) -> str:
    """Sleeps on the test's virtual clock until it is cancelled or the clock moves."""
    await session.sleep(3600)
    return "woke"


def agents() -> list[Agent]:
    (assistant,) = builtin_agents()
    skills = {**assistant.skills, "sleep": sleeper}
    return [
        Agent("assistant", skills=skills, main_skill="chat", default_skill="work", max_children=4)
    ]


@pytest.fixture
def metrics() -> FakeMetrics:
    return FakeMetrics()


@pytest.fixture
def api(make_node: Callable[..., Node], metrics: FakeMetrics) -> Iterator[tuple[Client, Node]]:
    node = make_node(*agents(), grace=5.0, max_sessions=50)
    app = create_app(node, metrics, max_body=4096, max_wait=0.2)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, node


def main_of(client: Client) -> str:
    answer = client.post("/v1/sessions", json={"agent_id": "assistant"})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["info"]["session_id"])


def spawn(client: Client, parent: str, **spec: Any) -> Any:
    return client.post(f"/v1/sessions/{parent}/children", json={"kind": "worker", **spec})


def error_of(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["status"] == status
    return dict(body["error"])


# -- sessions ----------------------------------------------------------------------------


def test_a_spawned_worker_runs_and_its_result_is_long_polled(api: tuple[Client, Node]) -> None:
    client, _ = api
    main = main_of(client)
    made = spawn(client, main, task="0", skill="work")
    assert made.status_code == 201
    worker = made.json()["info"]["session_id"]
    waited = client.get(f"/v1/sessions/{worker}/result", params={"timeout": 5})
    assert waited.json()["done"] is True
    assert waited.json()["result"]["summary"] == "done: 0"
    view = client.get(f"/v1/sessions/{worker}").json()
    assert view["info"]["state"] == "completed"
    assert view["result"]["status"] == "completed"
    assert client.get(f"/v1/sessions/{main}/results").json()[0]["session_id"] == worker


def test_opening_a_main_twice_gives_the_same_session(api: tuple[Client, Node]) -> None:
    client, _ = api
    assert main_of(client) == main_of(client)


def test_a_repeated_request_id_returns_the_first_session(api: tuple[Client, Node]) -> None:
    client, _ = api
    main = main_of(client)
    first = spawn(client, main, skill="sleep", request_id="r1").json()
    again = spawn(client, main, skill="sleep", request_id="r1").json()
    assert again["existing"] is True
    assert again["info"]["session_id"] == first["info"]["session_id"]


def test_a_long_poll_that_times_out_says_not_done(api: tuple[Client, Node]) -> None:
    client, _ = api
    worker = spawn(client, main_of(client), skill="sleep").json()["info"]["session_id"]
    waited = client.get(f"/v1/sessions/{worker}/result", params={"timeout": 30})
    assert waited.status_code == 200
    assert waited.json() == {"done": False, "result": None}


def test_cancel_ends_the_session_cancelled(api: tuple[Client, Node]) -> None:
    client, node = api
    worker = spawn(client, main_of(client), skill="sleep").json()["info"]["session_id"]
    settle(node)
    answer = client.post(f"/v1/sessions/{worker}/cancel")
    assert answer.status_code == 202
    settle(node)
    result = client.get(f"/v1/sessions/{worker}").json()["result"]
    assert result["status"] == "cancelled"
    assert result["error"]["code"] == "cancelled"


def test_suspend_and_resume_a_branch(api: tuple[Client, Node], clock: VirtualClock) -> None:
    client, node = api
    branch = spawn(client, main_of(client), kind="branch", skill="sleep").json()["info"]
    settle(node)
    assert client.post(f"/v1/sessions/{branch['session_id']}/suspend").status_code == 202
    clock.advance(1)  # the sleep is a checkpoint: the branch parks there
    settle(node)
    assert client.get(f"/v1/sessions/{branch['session_id']}").json()["info"]["state"] == (
        "suspended"
    )
    assert client.post(f"/v1/sessions/{branch['session_id']}/resume").status_code == 202
    settle(node)
    assert client.get(f"/v1/sessions/{branch['session_id']}").json()["info"]["state"] == "active"


def test_suspending_a_worker_is_a_conflict_naming_the_code(api: tuple[Client, Node]) -> None:
    client, _ = api
    worker = spawn(client, main_of(client), skill="sleep").json()["info"]["session_id"]
    error = error_of(client.post(f"/v1/sessions/{worker}/suspend"), 409)
    assert error["code"] == "invalid_transition"


def test_a_message_to_a_main_starts_a_cycle(api: tuple[Client, Node]) -> None:
    client, node = api
    main = main_of(client)
    answer = client.post(f"/v1/sessions/{main}/messages", json={"message": "hi"})
    assert answer.status_code == 202
    settle(node)
    context = client.get(f"/v1/sessions/{main}/conversation/context").json()
    assert context[-1]["content"] == "echo: hi"


def test_the_tree_nests_children(api: tuple[Client, Node]) -> None:
    client, node = api
    main = main_of(client)
    branch = spawn(client, main, kind="branch", skill="fan_out", task="2").json()
    settle(node)
    tree = client.get(f"/v1/sessions/{main}/tree").json()
    assert tree["info"]["session_id"] == main
    (child,) = tree["children"]
    assert child["info"]["session_id"] == branch["info"]["session_id"]
    assert [g["info"]["kind"] for g in child["children"]] == ["worker", "worker"]
    assert child["result"]["summary"] == "2 of 2 workers completed"


def test_listing_filters_and_pages_through_every_session(api: tuple[Client, Node]) -> None:
    client, node = api
    main = main_of(client)
    made = {
        spawn(client, main, skill="work", task="0").json()["info"]["session_id"] for _ in range(4)
    }
    settle(node)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = client.get(
            "/v1/sessions",
            params={"kind": "worker", "limit": 3, **({"cursor": cursor} if cursor else {})},
        ).json()
        seen += [i["session_id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made)
    assert len(seen) == len(set(seen))
    done = client.get("/v1/sessions", params={"state": "completed", "agent": "assistant"}).json()
    assert {i["session_id"] for i in done["items"]} == made
    keyed = client.get("/v1/sessions", params={"key": "internal:main:main"}).json()
    assert [i["session_id"] for i in keyed["items"]] == [main]
    assert client.get("/v1/sessions", params={"agent": "nobody"}).json()["items"] == []


def test_node_status_counts_sessions(api: tuple[Client, Node]) -> None:
    client, _ = api
    main_of(client)
    status = client.get("/v1/node").json()
    assert status["agents"] == ["assistant"]
    assert status["sessions"]["active"] == 1
    assert status["config"]["grace"] == 5.0
    assert status["state"] == "open"


# -- client mistakes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"kind": "worker", "ttl": "5"}, "ttl", "invalid_field"),
        ({"kind": "worker", "colour": "red"}, "colour", "unknown_field"),
        ({"task": "x"}, "kind", "invalid_field"),
        ({"kind": "emperor"}, "kind", "invalid_field"),
        ({"kind": "worker", "task": "x" * 70_000}, None, "too_large"),
        (
            {"kind": "worker", "metadata": {str(i): i for i in range(65)}},
            "metadata",
            "invalid_field",
        ),
    ],
)
def test_a_bad_spawn_body_is_a_400_naming_the_field(
    api: tuple[Client, Node], metrics: FakeMetrics, body: Any, field: str | None, reason: str
) -> None:
    client, node = api
    main = main_of(client)
    before = len(node.sessions())
    answer = client.post(f"/v1/sessions/{main}/children", json=body)
    status = 413 if reason == "too_large" else 400
    error = error_of(answer, status)
    assert error["code"] == "rejected_input"
    assert error["field"] == field
    assert metrics.rejected == [reason]
    assert len(node.sessions()) == before  # nothing was spawned


def test_a_body_over_the_cap_is_refused_before_it_is_decoded(
    api: tuple[Client, Node], metrics: FakeMetrics
) -> None:
    client, _ = api
    main = main_of(client)
    garbage = b"\xff" * 10_000  # not JSON at all: a decode would say "malformed"
    answer = client.post(f"/v1/sessions/{main}/children", content=garbage, headers=JSON)
    error = error_of(answer, 413)
    assert "over the cap of 4096 bytes" in error["message"]
    assert metrics.rejected == ["too_large"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"[" * 70 + b"]" * 70, "too_deep"),
        (b'{"kind": "worker"', "malformed"),
        (b"", "malformed"),
    ],
)
def test_malformed_and_nested_bodies_are_400s(
    api: tuple[Client, Node], metrics: FakeMetrics, content: bytes, reason: str
) -> None:
    client, _ = api
    main = main_of(client)
    answer = client.post(f"/v1/sessions/{main}/children", content=content, headers=JSON)
    error = error_of(answer, 400)
    assert error["code"] == "rejected_input"
    assert metrics.rejected == [reason]


@pytest.mark.parametrize(
    ("make_parent", "spec", "status", "code", "field"),
    [
        ("unknown", {}, 404, "unknown_session", None),
        ("worker", {}, 409, "worker_cannot_spawn", None),
        ("main", {"ttl": -1.0}, 400, "invalid_ttl", "ttl"),
        ("main", {"skill": "nope"}, 404, "unknown_skill", "skill"),
    ],
)
def test_a_refused_spawn_names_the_code(
    api: tuple[Client, Node],
    make_parent: str,
    spec: dict[str, Any],
    status: int,
    code: str,
    field: str | None,
) -> None:
    client, _ = api
    main = main_of(client)
    parent = {
        "unknown": str(uuid.uuid4()),
        "main": main,
        "worker": main if make_parent != "worker" else "",
    }[make_parent]
    if make_parent == "worker":
        parent = spawn(client, main, skill="sleep").json()["info"]["session_id"]
    error = error_of(spawn(client, parent, **spec), status)
    assert error["code"] == code
    assert error["field"] == field
    if code in ("unknown_session", "worker_cannot_spawn"):
        assert error["session_id"] == parent


def test_children_past_the_limit_are_a_conflict(api: tuple[Client, Node]) -> None:
    client, _ = api
    main = main_of(client)
    for _ in range(4):
        assert spawn(client, main, skill="sleep").status_code == 201
    assert error_of(spawn(client, main, skill="sleep"), 409)["code"] == "children_exceeded"


def test_an_unknown_session_is_a_404_everywhere(api: tuple[Client, Node]) -> None:
    client, _ = api
    ghost = str(uuid.uuid4())
    for method, path in [
        ("GET", f"/v1/sessions/{ghost}"),
        ("GET", f"/v1/sessions/{ghost}/tree"),
        ("GET", f"/v1/sessions/{ghost}/result"),
        ("POST", f"/v1/sessions/{ghost}/cancel"),
        ("GET", f"/v1/sessions/{ghost}/conversation/branches"),
    ]:
        error = error_of(client.request(method, path), 404)
        assert error["code"] == "unknown_session", path
        assert error["session_id"] == ghost


def test_bad_query_parameters_name_the_parameter(api: tuple[Client, Node]) -> None:
    client, _ = api
    assert error_of(client.get("/v1/sessions", params={"limit": 0}), 400)["field"] == "limit"
    assert error_of(client.get("/v1/sessions", params={"state": "asleep"}), 400)["field"] == "state"
    assert error_of(client.get("/v1/sessions", params={"cursor": "x_y"}), 400)["field"] == "cursor"


def test_unknown_routes_and_methods_get_the_error_body(api: tuple[Client, Node]) -> None:
    client, _ = api
    assert error_of(client.get("/v2/anything"), 404)["code"] == "not_found"
    assert error_of(client.get("/v1/sessions/x/nothing/here"), 404)["field"] == "session_id"
    assert error_of(client.delete("/v1/sessions"), 405)["code"] == "rejected_input"


def test_an_id_that_is_not_one_is_a_404_naming_its_field(api: tuple[Client, Node]) -> None:
    client, _ = api
    for method, path, field in [
        ("GET", "/v1/sessions/not-a-uuid", "session_id"),
        ("GET", "/v1/sessions/123/tree", "session_id"),
        ("POST", "/v1/sessions/abc/cancel", "session_id"),
        ("GET", "/v1/sessions/abc/conversation/branches", "session_id"),
        ("GET", "/v1/wedged/zzz", "wedged_id"),
    ]:
        error = error_of(client.request(method, path), 404)
        assert error["code"] == "unknown_session", path
        assert error["field"] == field, path
        assert "not an id" in error["message"], path
    error = error_of(client.get("/v1/nothing-here"), 404)
    assert error["code"] == "not_found"
    assert error["message"] == "no route /v1/nothing-here"


def test_an_unknown_agent_is_a_404_naming_the_field(api: tuple[Client, Node]) -> None:
    client, _ = api
    error = error_of(client.post("/v1/sessions", json={"agent_id": "nobody"}), 404)
    assert error == {**error, "code": "unknown_agent", "field": "agent_id"}


def test_an_unexpected_error_is_a_500_and_the_node_goes_on(
    api: tuple[Client, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, node = api

    async def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(node, "atree", broken)
    error = error_of(client.get(f"/v1/sessions/{uuid.uuid4()}/tree"), 500)
    assert error["code"] == "internal_error"
    assert "a bug" not in error["message"]  # no internals leak to clients
    monkeypatch.undo()
    assert client.get("/readyz").status_code == 200


# -- chat routing and conversations ------------------------------------------------------


def inbound(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "provider": "telegram",
        "chat_type": "dm",
        "chat_id": "7",
        "sender_id": "42",
        "text": text,
        **extra,
    }


def test_routing_a_chat_message_reaches_the_main(api: tuple[Client, Node]) -> None:
    client, node = api
    routed = client.post("/v1/route", json=inbound("hello", message_id="m1")).json()
    assert routed["key"] == "internal:main:main"
    settle(node)
    again = client.post("/v1/route", json=inbound("hello", message_id="m1")).json()
    assert again["duplicate"] is True
    reply = client.post("/v1/route", json=inbound("/branches")).json()["reply"]
    assert reply["command"] == "branches"
    assert reply["ok"] is True
    context = client.get(f"/v1/sessions/{routed['session_id']}/conversation/context").json()
    assert [m["content"] for m in context] == ["hello", "echo: hello"]


def test_a_bad_inbound_message_names_the_field(api: tuple[Client, Node]) -> None:
    client, _ = api
    error = error_of(client.post("/v1/route", json=inbound("x", chat_type="phone")), 400)
    assert error["field"] == "chat_type"
    error = error_of(client.post("/v1/route", params={"agent_id": "x"}, json=inbound("x")), 404)
    assert error == {**error, "code": "unknown_agent", "field": "agent_id"}
    error = error_of(client.post("/v1/route", json=inbound("x", sender_id="a/b")), 400)
    assert error["field"] == "sender_id"


def test_the_conversation_operations(api: tuple[Client, Node]) -> None:
    client, node = api
    main = client.post("/v1/route", json=inbound("one")).json()["session_id"]
    settle(node)
    conv = f"/v1/sessions/{main}/conversation"
    first = client.get(f"{conv}/context").json()[0]
    forked = client.post(f"{conv}/fork", json={"from_message_id": first["id"], "name": "alt"})
    assert forked.status_code == 201
    assert forked.json()["name"] == "alt"
    assert forked.json()["current"] is True
    client.post("/v1/route", json=inbound("two"))
    settle(node)
    names = [b["name"] for b in client.get(f"{conv}/branches").json()]
    assert names == ["main", "alt"]
    assert client.post(f"{conv}/checkout", json={"branch": "1"}).json()["name"] == "main"
    merged = client.post(f"{conv}/merge", json={"branch": "alt"}).json()
    assert merged["source_name"] == "alt"
    assert [m["content"] for m in merged["messages"]] == ["two", "echo: two"]
    plan = client.post(f"{conv}/delete-branch", json={"branch": "alt"}).json()
    mismatch = client.post(
        f"{conv}/delete-branch/confirm", json={"branch": "alt", "token": "wrong"}
    )
    assert error_of(mismatch, 409) == {
        **error_of(mismatch, 409),
        "code": "confirmation_mismatch",
        "field": "token",
    }
    done = client.post(
        f"{conv}/delete-branch/confirm", json={"branch": "alt", "token": plan["token"]}
    ).json()
    assert done["name"] == "alt"
    assert [b["name"] for b in client.get(f"{conv}/branches").json()] == ["main"]
    error = error_of(client.post(f"{conv}/checkout", json={"branch": "alt"}), 404)
    assert error["code"] == "unknown_branch"
    error = error_of(client.post(f"{conv}/fork", json={"from_message_id": str(uuid.uuid4())}), 404)
    assert error["code"] == "unknown_message"


def test_the_tree_exports_as_json_text_html_and_jsonl(api: tuple[Client, Node]) -> None:
    client, node = api
    main = client.post("/v1/route", json=inbound("<b>hi</b>")).json()["session_id"]
    settle(node)
    conv = f"/v1/sessions/{main}/conversation"
    assert client.get(f"{conv}/tree").json()["branches"]
    text = client.get(f"{conv}/tree.txt")
    assert text.headers["content-type"].startswith("text/plain")
    assert "<b>hi</b>" in text.text
    page = client.get(f"{conv}/tree.html")
    assert page.headers["content-type"].startswith("text/html")
    assert "Content-Security-Policy" in page.text
    lines = client.get(f"{conv}/transcript").text.splitlines()
    assert len(lines) == 2


# -- the root ----------------------------------------------------------------------------


def test_health_readiness_metrics_and_schema(api: tuple[Client, Node]) -> None:
    client, node = api
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    schema = client.get("/schema/openapi.json").json()
    paths = set(schema["paths"])
    assert "/v1/sessions/{session_id}/conversation/delete-branch/confirm" in paths
    assert {"/healthz", "/readyz", "/metrics", "/v1/route", "/v1/node"} <= paths
    node.shutdown(grace=0)
    assert error_of(client.get("/readyz"), 503)["code"] == "node_closed"
    error = error_of(client.post("/v1/sessions", json={"agent_id": "assistant"}), 503)
    assert error["code"] == "node_closed"


def test_tree_html_in_a_chat_answers_with_the_pages_address(api: tuple[Client, Node]) -> None:
    client, _ = api
    routed = client.post("/v1/route", json=inbound("one")).json()
    reply = client.post("/v1/route", json=inbound("/tree html")).json()["reply"]
    assert reply["ok"] is True
    url = reply["data"]["url"]
    assert url.endswith(f"/v1/sessions/{routed['session_id']}/conversation/tree.html")
    assert url in reply["text"]
    assert "content" not in reply["data"]  # a link, not the document
    page = client.get(url)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    text = client.post("/v1/route", json=inbound("/tree text")).json()["reply"]
    assert "content" in text["data"]  # other formats still answer with the tree


def test_a_message_is_capped_as_a_task_is(
    make_node: Callable[..., Node], metrics: FakeMetrics
) -> None:
    node = make_node(*agents(), grace=5.0)
    app = create_app(node, metrics, max_wait=0.2)  # the default body cap: 1 MiB
    long = "x" * (MAX_MESSAGE_CHARS + 1)
    with TestClient(app, raise_server_exceptions=False) as client:
        main = main_of(client)
        error = error_of(client.post(f"/v1/sessions/{main}/messages", json={"message": long}), 400)
        assert error["code"] == "rejected_input"
        assert error["field"] == "message"
        structured = {"text": "y" * MAX_MESSAGE_CHARS}  # its JSON text is over the cap
        refused = client.post(f"/v1/sessions/{main}/messages", json={"message": structured})
        assert error_of(refused, 400)["field"] == "message"
        fits = {"message": "x" * MAX_MESSAGE_CHARS}
        assert client.post(f"/v1/sessions/{main}/messages", json=fits).status_code == 202
    with pytest.raises(RejectedInputError) as raised:
        node.send(main, long)
    assert raised.value.field == "message"
