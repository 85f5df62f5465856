"""The built-in assistant on a real node, backed by a model: ``node start
--model-url URL --model NAME`` against a chat-completions stand-in on
127.0.0.1 (as if it were a provider), and without a provider (typed errors,
never a crash)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.cli import main as cli_main
from sessiontree.testing import StandinServer
from tests._running_node import RunningNode

pytestmark = pytest.mark.timeout(120)

WAIT = 20.0  # real seconds a bounded wait may take
MODEL = "node-model"
KEY = "sk-node-test-key"


@pytest.fixture
def endpoint() -> Iterator[StandinServer]:
    with StandinServer(models=(MODEL,)) as server:
        yield server


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    return path


@pytest.fixture
def modelled(store: Path, endpoint: StandinServer, key_file: Path) -> Iterator[RunningNode]:
    running = RunningNode(
        store,
        "--model-url",
        endpoint.url,
        "--model",
        MODEL,
        "--api-key-file",
        str(key_file),
        "--model-price",
        "0.15,0.60",
    )
    yield running
    if running.proc.poll() is None:
        running.kill()


def post(node: RunningNode, path: str, body: Any) -> Any:
    answer = node.http.post(path, json=body)
    assert answer.status_code < 300, answer.text
    return answer.json()


def open_main(node: RunningNode) -> str:
    return str(post(node, "/v1/sessions", {"agent_id": "assistant"})["info"]["session_id"])


def run_model_worker(node: RunningNode, task: str) -> dict[str, Any]:
    """Spawn a worker running the ``model`` skill on ``task`` and wait for its result."""
    made = post(
        node,
        f"/v1/sessions/{open_main(node)}/children",
        {"kind": "worker", "skill": "model", "task": task},
    )
    child = made["info"]["session_id"]
    waited = node.http.get(f"/v1/sessions/{child}/result", params={"timeout": WAIT}).json()
    assert waited["done"] is True, waited
    result: dict[str, Any] = waited["result"]
    return result


def chat(node: RunningNode, text: str) -> str:
    routed = post(
        node,
        "/v1/route",
        {"provider": "telegram", "chat_type": "dm", "chat_id": "1", "sender_id": "2", "text": text},
    )
    return str(routed["session_id"])


def wait_for(check: Callable[[], Any], what: str) -> Any:
    """Poll ``check`` until it returns something truthy (bounded)."""
    paused = threading.Event()
    for _ in range(int(WAIT / 0.05)):
        found = check()
        if found:
            return found
        paused.wait(0.05)
    raise AssertionError(f"{what} never happened")


def context_of(node: RunningNode, main: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = node.http.get(
        f"/v1/sessions/{main}/conversation/context"
    ).json()
    return messages


# -- with a provider --------------------------------------------------------------------


def test_the_model_skill_returns_the_models_text_or_a_typed_error(
    modelled: RunningNode, endpoint: StandinServer
) -> None:
    result = run_model_worker(modelled, "what is a session tree")
    assert result["status"] == "completed"
    assert result["summary"] == "echo what is a session tree"
    assert result["artifacts"] == {"model": MODEL, "finish_reason": "stop"}
    used = result["usage"]
    stats = endpoint.stats()
    assert used["calls"] == stats.completions_served == 1
    assert used["prompt_tokens"] == stats.prompt_tokens_served
    assert used["completion_tokens"] == stats.completion_tokens_served
    expected = (used["prompt_tokens"] * 0.15 + used["completion_tokens"] * 0.60) / 1e6
    assert used["cost"] == pytest.approx(expected)
    assert [body["model"] for body in endpoint.requests] == [MODEL]

    endpoint.fail_next("missing_choices")  # not transient: no retry
    failed = run_model_worker(modelled, "anything")
    assert failed["status"] == "completed"  # a typed error, not a crash
    error = failed["artifacts"]["error"]
    assert error["code"] == "model_error"
    assert error["detail"]["field"] == "choices"
    assert failed["summary"].startswith("model_error: ")
    assert modelled.http.get("/readyz").status_code == 200


def test_chat_messages_are_answered_by_the_model_with_the_earlier_turns(
    modelled: RunningNode, endpoint: StandinServer, key_file: Path
) -> None:
    (shown,) = modelled.config["node"]["providers"]  # the provider, never its key
    assert shown["base_url"] == endpoint.url
    assert shown["api_key_file"] == str(key_file)
    assert shown["prices"] == {MODEL: {"prompt": 0.15e-6, "completion": 0.60e-6}}
    assert modelled.sources["model_url"] == "flag"
    assert KEY not in json.dumps(modelled.config)
    assert KEY not in modelled.http.get("/v1/node").text

    main = chat(modelled, "hello there")
    wait_for(lambda: len(context_of(modelled, main)) == 2, "the first answer")
    child = run_model_worker(modelled, "a side question")  # a child of the same Main
    assert child["parent_id"] == main
    chat(modelled, "and again")
    context = wait_for(
        lambda: (found := context_of(modelled, main)) and len(found) == 5 and found,
        "the second answer",
    )
    assert [(m["role"], m["content"]) for m in context] == [
        ("user", "hello there"),
        ("assistant", "echo hello there"),
        # the child's result landed on the Main's branch (it used its context)
        ("system", "[worker model completed] echo a side question"),
        ("user", "and again"),
        ("assistant", "echo and again"),
    ]
    assert context[2]["session_id"] == child["session_id"]
    assert context[-1]["usage"]["calls"] == 1
    second = endpoint.requests[-1]["messages"]
    note = f"child {child['session_id']} ended completed: echo a side question"
    assert [(m["role"], m["content"]) for m in second] == [
        ("user", "hello there"),
        ("assistant", "echo hello there"),
        ("system", note),  # the child's result, as text a chat model accepts
        ("user", "and again"),
    ]


# -- without one ------------------------------------------------------------------------


def test_without_a_provider_the_model_skill_answers_with_a_typed_error(store: Path) -> None:
    running = RunningNode(store)
    try:
        result = run_model_worker(running, "what is a session tree")
        assert result["status"] == "completed"
        error = result["artifacts"]["error"]
        assert error["code"] == "model_error"
        assert error["detail"] == {"field": "providers"}
        assert "no model provider" in result["summary"]
        assert result["usage"] is None  # nothing was sent, nothing spent
        main = chat(running, "hi")  # and the Main still echoes
        context = wait_for(
            lambda: (
                (found := context_of(running, main)) and found[-1]["role"] == "assistant" and found
            ),
            "the echo",
        )
        assert [m["content"] for m in context][-2:] == ["hi", "echo: hi"]
        # the worker's result landed on the Main's branch before it (it used its context)
        assert context[0]["content"].startswith("[worker model completed] model_error")
    finally:
        assert running.stop() == 0


def test_model_options_without_a_provider_are_usage_errors(store: Path, tmp_path: Path) -> None:
    def start(*args: str) -> Any:
        return CliRunner().invoke(cli_main, ["node", "start", "--store", str(store), *args])

    alone = start("--model", MODEL)
    assert alone.exit_code == 2
    assert "--model goes with --model-url" in alone.output
    url = ["--model-url", "http://127.0.0.1:9/v1"]
    priced_nothing = start(*url, "--model-price", "1,2")
    assert priced_nothing.exit_code == 2
    assert "give --model NAME" in priced_nothing.output
    bad_price = start(*url, "--model", MODEL, "--model-price", "cheap")
    assert bad_price.exit_code == 2
    assert "PROMPT,COMPLETION" in bad_price.output
    not_http = start("--model-url", "ftp://example/v1")
    assert not_http.exit_code == 2
    assert "base_url must be an http(s) URL" in not_http.output
    missing = start(*url, "--api-key-file", str(tmp_path / "nowhere"))
    assert missing.exit_code == 2
    empty = tmp_path / "empty"
    empty.write_text("\n")
    unreadable = start(*url, "--api-key-file", str(empty))
    assert unreadable.exit_code == 1
    assert "is empty" in unreadable.output


def test_the_provider_can_come_from_the_config_file(
    store: Path, tmp_path: Path, endpoint: StandinServer, key_file: Path
) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        f'model_url = "{endpoint.url}"\nmodel = "{MODEL}"\napi_key_file = "{key_file}"\n'
    )
    running = RunningNode(store, "--config", str(config))
    try:
        assert running.sources["model_url"] == "file"
        assert run_model_worker(running, "from the file")["summary"] == "echo from the file"
    finally:
        assert running.stop() == 0
