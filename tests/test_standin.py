"""The chat-completions stand-in, proven against the official ``openai`` SDK.

Every test talks to a real ``StandinServer`` on 127.0.0.1 over real sockets
with ``openai.OpenAI`` or ``openai.AsyncOpenAI`` (``max_retries=0``, so each
fault reaches the test as the SDK's own exception). Every server is closed
and every thread the test started is joined (bounded) before the test ends.
Nothing sleeps to order events: a test waits on the server's counters.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from sessiontree.testing import (
    Fault,
    FaultKind,
    Reply,
    StandinServer,
    ToolCall,
    completion_tokens,
    count_tokens,
    prompt_tokens,
)

WAIT = 5.0  # real seconds any bounded wait may take before the test fails
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Every thread started during the test has ended by its end (bounded join)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + WAIT
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not left, f"threads left behind: {left}"


@pytest.fixture
def server(no_thread_left: None) -> Iterator[StandinServer]:
    with StandinServer(max_body_bytes=64 * 1024) as standin:
        yield standin


@pytest.fixture
def client(server: StandinServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0, timeout=WAIT) as sdk:
        yield sdk


def async_client(server: StandinServer, **options: Any) -> openai.AsyncOpenAI:
    options.setdefault("timeout", WAIT)
    return openai.AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0, **options)


# --- plain and scripted replies ---------------------------------------------------


def test_plain_completion_echoes_and_reports_usage(
    server: StandinServer, client: openai.OpenAI
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is a session tree"},
    ]
    reply = client.chat.completions.create(model="standin-small", messages=messages)

    assert reply.model == "standin-small"
    assert reply.choices[0].message.content == "echo what is a session tree"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == (1 + 2) + (1 + 5) == prompt_tokens(messages)
    assert reply.usage.completion_tokens == 6
    assert reply.usage.total_tokens == 15
    assert server.stats().requests_received == 1
    assert server.completions_served == 1
    assert server.tokens_served == 15
    assert server.requests[0]["messages"] == messages


def test_scripted_replies_are_served_in_order_then_the_echo(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.script("first answer", Reply("second"))
    texts = [
        client.chat.completions.create(model="m", messages=user("q")).choices[0].message.content
        for _ in range(3)
    ]
    assert texts == ["first answer", "second", "echo q"]


def test_token_counts_are_words_per_message_and_reply() -> None:
    assert count_tokens("  two   words ") == 2
    messages: list[Any] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    assert prompt_tokens(messages) == (1 + 3) + (1 + 1 + 2) + (1 + 1)
    assert completion_tokens("x y", [ToolCall("f", {"a": 1})]) == 2 + 1 + 2


def test_max_tokens_cuts_the_reply_with_finish_reason_length(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.script("one two three four five")
    reply = client.chat.completions.create(model="m", messages=user("q"), max_tokens=3)
    assert reply.choices[0].message.content == "one two three"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 3


def test_models_are_listed(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["standin-small", "standin-large"]


# --- streaming --------------------------------------------------------------------


def test_stream_assembles_the_text_and_ends_with_a_usage_chunk(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.script("the tree has four levels")
    with client.chat.completions.create(
        model="m", messages=user("depth?"), stream=True, stream_options={"include_usage": True}
    ) as stream:
        chunks = list(stream)

    *content, last = chunks
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert text == "the tree has four levels"
    assert len([c for c in content if c.choices[0].delta.content]) == 5
    assert content[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in content)
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (2, 5)
    assert server.completions_served == 1
    assert server.tokens_served == 7


def test_stream_without_include_usage_sends_no_usage_and_counts_none(
    server: StandinServer, client: openai.OpenAI
) -> None:
    with client.chat.completions.create(model="m", messages=user("a b"), stream=True) as stream:
        chunks = list(stream)
    assert all(c.choices and c.usage is None for c in chunks)
    assert server.completions_served == 1
    assert server.tokens_served == 0


# --- tool calls -------------------------------------------------------------------


def test_tool_calls_are_returned_when_the_request_offers_tools(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.script(Reply(tool_calls=(ToolCall("get_weather", {"city": "Paris"}),)))
    reply = client.chat.completions.create(model="m", messages=user("weather?"), tools=TOOLS)

    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 1 + 2


def test_streamed_tool_calls_assemble_from_their_deltas(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.script(
        Reply(
            "checking",
            (ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Oslo"})),
        )
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    with client.chat.completions.create(
        model="m", messages=user("weather?"), tools=TOOLS, stream=True
    ) as stream:
        for chunk in stream:
            choice = chunk.choices[0]
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                assert delta.function is not None
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""

    assert finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_weather"]
    assert [json.loads(c["arguments"]) for c in calls.values()] == [
        {"city": "Paris"},
        {"city": "Oslo"},
    ]
    assert calls[0]["id"] != calls[1]["id"]


def test_tool_calls_are_not_sent_without_tools_in_the_request(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.script(Reply("plain", (ToolCall("get_weather", {"city": "Paris"}),)))
    reply = client.chat.completions.create(model="m", messages=user("q"))
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


# --- faults -----------------------------------------------------------------------


def test_rate_limit_is_a_rate_limit_error_with_retry_after(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.RATE_LIMIT, retry_after=7)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=user("q"))
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.code == "rate_limit_exceeded"
    # the fault was for one request: the next is served
    assert client.chat.completions.create(model="m", messages=user("q")).choices
    assert (server.requests_received, server.completions_served) == (2, 1)


def test_server_error_is_an_internal_server_error(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next("server_error", times=2)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="m", messages=user("q"))
        assert caught.value.status_code == 500
    assert server.completions_served == 0


def test_a_slow_reply_past_the_client_timeout_is_an_api_timeout_error(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.SLOW, delay=2.0)
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.2).chat.completions.create(model="m", messages=user("q"))
    # the client gave up and closed its connection; the server saw it go
    assert server.wait_for_disconnects(1, WAIT)
    assert server.completions_served == 0


def test_a_stream_stalling_past_the_read_timeout_is_an_api_timeout_error(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.SLOW, chunk_delay=2.0)
    received = []
    with (
        pytest.raises(openai.APITimeoutError),
        client.with_options(timeout=0.3).chat.completions.create(
            model="m", messages=user("a b c"), stream=True
        ) as stream,
    ):
        received.extend(stream)
    assert len(received) == 1  # the first chunk comes at once, then the stall
    assert server.wait_for_disconnects(1, WAIT)


def test_a_slow_reply_within_the_timeout_is_served(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.SLOW, delay=0.05, chunk_delay=0.01)
    start = time.monotonic()
    with client.chat.completions.create(model="m", messages=user("a b"), stream=True) as stream:
        text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == "echo a b"
    assert time.monotonic() - start >= 0.05
    assert server.completions_served == 1


def test_a_connection_dropped_before_the_headers_is_an_api_connection_error(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.DROP)
    with pytest.raises(openai.APIConnectionError) as caught:
        client.chat.completions.create(model="m", messages=user("q"))
    assert not isinstance(caught.value, openai.APITimeoutError)
    assert server.requests_received == 1
    assert server.completions_served == 0
    assert server.disconnects == 0  # the server dropped it: not a client disconnect


def test_a_connection_dropped_mid_body_is_an_api_connection_error(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.DROP_MID_REPLY)
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=user("q"))
    assert server.completions_served == 0


def test_a_connection_dropped_mid_stream_is_an_api_connection_error(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.DROP_MID_REPLY, after_chunks=2)
    received = []
    with (
        pytest.raises(openai.APIConnectionError),
        client.chat.completions.create(model="m", messages=user("a b c"), stream=True) as stream,
    ):
        received.extend(stream)
    assert len(received) == 2
    assert server.completions_served == 0
    assert server.tokens_served == 0


def test_an_invalid_json_body_raises_json_decode_error_not_an_openai_error(
    server: StandinServer, client: openai.OpenAI
) -> None:
    """The SDK parses a JSON content type with ``response.json()`` unguarded, so
    the caller gets ``json.JSONDecodeError`` (a ``ValueError``), streamed or not."""
    server.fail_next(FaultKind.INVALID_JSON, times=2)
    with pytest.raises(json.JSONDecodeError):
        client.chat.completions.create(model="m", messages=user("q"))
    with (
        pytest.raises(json.JSONDecodeError),
        client.chat.completions.create(model="m", messages=user("q"), stream=True) as stream,
    ):
        list(stream)


def test_a_body_without_choices_is_constructed_loosely_or_refused_when_strict(
    server: StandinServer, client: openai.OpenAI
) -> None:
    """Without strict validation the SDK builds the model unvalidated (``choices``
    is None); with ``_strict_response_validation`` it raises."""
    server.fail_next(FaultKind.MISSING_CHOICES, times=3)
    assert client.chat.completions.create(model="m", messages=user("q")).choices is None
    with client.chat.completions.create(model="m", messages=user("q"), stream=True) as stream:
        assert [chunk.choices for chunk in stream] == [None]
    with (
        openai.OpenAI(
            base_url=server.url, api_key="test", max_retries=0, _strict_response_validation=True
        ) as strict,
        pytest.raises(openai.APIResponseValidationError),
    ):
        strict.chat.completions.create(model="m", messages=user("q"))


def test_a_reply_without_usage_reports_none_and_counts_none(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.NO_USAGE, times=2)
    reply = client.chat.completions.create(model="m", messages=user("q"))
    assert reply.choices[0].message.content == "echo q"
    assert reply.usage is None
    with client.chat.completions.create(
        model="m", messages=user("q"), stream=True, stream_options={"include_usage": True}
    ) as stream:
        assert all(chunk.usage is None and chunk.choices for chunk in stream)
    assert server.completions_served == 2
    assert server.tokens_served == 0


def test_a_fault_header_applies_to_its_request_and_leaves_the_queue(
    server: StandinServer, client: openai.OpenAI
) -> None:
    server.fail_next(FaultKind.SERVER_ERROR)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model="m",
            messages=user("q"),
            extra_headers={"x-standin-fault": "rate_limit;retry_after=3"},
        )
    assert caught.value.response.headers["retry-after"] == "3"
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=user("q"))


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="boom"):
        Fault.parse("rate_limit;boom=1")
    with pytest.raises(ValueError, match="meteor"):
        FaultKind("meteor")
    server = StandinServer()
    with pytest.raises(ValueError, match=">= 0"):
        server.fail_next(FaultKind.SLOW, delay=-1)


# --- cancellation and concurrency -------------------------------------------------


def test_a_cancelled_task_awaiting_a_slow_stream_closes_its_connection(
    server: StandinServer,
) -> None:
    server.fail_next(FaultKind.SLOW, chunk_delay=2.0)

    async def scenario() -> None:
        first_chunk = asyncio.Event()

        async def consume(sdk: openai.AsyncOpenAI) -> None:
            stream = await sdk.chat.completions.create(
                model="m", messages=user("a b c d"), stream=True
            )
            async for _ in stream:
                first_chunk.set()

        async with async_client(server) as sdk:
            task = asyncio.create_task(consume(sdk))
            await asyncio.wait_for(first_chunk.wait(), WAIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert server.wait_for_disconnects(1, WAIT)
    assert server.completions_served == 0


def test_fifty_concurrent_calls_through_one_async_client_are_all_served(
    server: StandinServer,
) -> None:
    async def scenario() -> list[Any]:
        async with async_client(server) as sdk:
            return await asyncio.gather(
                *(
                    sdk.chat.completions.create(model="m", messages=user(f"call {i}"))
                    for i in range(50)
                )
            )

    replies = asyncio.run(scenario())
    assert [r.choices[0].message.content for r in replies] == [f"echo call {i}" for i in range(50)]
    assert len({r.id for r in replies}) == 50
    assert server.requests_received == server.completions_served == 50
    assert server.tokens_served == sum(r.usage.total_tokens for r in replies) == 50 * (3 + 3)


# --- the HTTP surface -------------------------------------------------------------


def _post(server: StandinServer, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        conn.request("POST", path, body, {"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_body_that_is_not_json_gets_400_with_an_openai_error(server: StandinServer) -> None:
    status, body = _post(server, "/v1/chat/completions", b"{not json")
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "invalid_json"
    assert server.completions_served == 0


def test_a_request_without_messages_is_a_bad_request_naming_the_field(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=[])
    assert caught.value.param == "messages"


def test_an_oversized_body_gets_413_and_the_server_goes_on(
    server: StandinServer, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="m", messages=user("x " * 40_000))
    assert caught.value.status_code == 413
    assert server.requests_received == 0
    assert client.chat.completions.create(model="m", messages=user("q")).choices


def test_an_unknown_path_gets_404(server: StandinServer) -> None:
    status, body = _post(server, "/v1/embeddings", b"{}")
    assert status == 404
    assert body["error"]["code"] == "not_found"


def test_it_listens_on_loopback_and_its_url_ends_in_v1(server: StandinServer) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}/v1"
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT):
        pass


def test_close_cuts_off_a_reply_in_progress_and_joins_its_thread(
    no_thread_left: None,
) -> None:
    standin = StandinServer().start()
    standin.fail_next(FaultKind.SLOW, delay=30.0)
    body = json.dumps({"model": "m", "messages": user("q")}).encode()
    with socket.create_connection(("127.0.0.1", standin.port), timeout=WAIT) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert standin.wait_for_requests(1, WAIT)
        start = time.monotonic()
        standin.close()
        assert time.monotonic() - start < WAIT
        assert sock.recv(1024) == b""  # closed without a reply
    standin.close()  # a second close does nothing


def test_waits_are_bounded_and_start_is_once(server: StandinServer) -> None:
    assert server.wait_for_requests(1, 0.05) is False
    assert server.wait_for_completions(1, 0.0) is False
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    with pytest.raises(RuntimeError, match="not started"):
        _ = StandinServer().url
