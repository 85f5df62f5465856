"""The chat-completions endpoint of the stand-in: validating a request body,
applying its fault, and writing the reply whole or as server-sent events.

``ChatHandler`` is owned by ``StandinServer`` and runs on its event loop; it
takes replies and faults from, and counts into, the server's ``Ledger``. A
request it refuses raises ``HTTPError`` (the caller answers it); a client gone
mid-reply raises ``ClientGoneError`` with nothing counted served.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessiontree.testing._http import (
    CREATED,
    STREAM_HEADERS,
    ClientGoneError,
    Conn,
    HTTPError,
    Request,
    chunked,
    response_head,
    send_raw,
    write,
)
from sessiontree.testing._ledger import Ledger
from sessiontree.testing._script import (
    Fault,
    FaultKind,
    Reply,
    ToolCall,
    completion_tokens,
    content_text,
    prompt_tokens,
)


@dataclass(frozen=True, slots=True)
class _Completion:
    """A reply about to go out: its id, model, text, tool calls, finish reason,
    usage (None under ``NO_USAGE``) and sequence number."""

    ident: str
    model: str
    text: str
    calls: tuple[ToolCall, ...]
    finish: str
    usage: dict[str, int] | None
    index: int


class ChatHandler:
    """Answers ``POST /v1/chat/completions`` for one server: ``words_per_chunk``
    words of text go in each stream chunk."""

    def __init__(self, ledger: Ledger, words_per_chunk: int) -> None:
        self._ledger = ledger
        self._words_per_chunk = words_per_chunk
        # set while requests may be answered (``StandinServer.hold``); made on the
        # server's loop, which alone touches it
        self.gate: asyncio.Event | None = None

    async def handle(self, conn: Conn, request: Request) -> bool:
        """Answer one chat request; False if the connection must close. Raises
        ``HTTPError`` for a request it refuses or a fault that is an error
        status, ``ClientGoneError`` if the client went away mid-reply."""
        try:
            body = json.loads(request.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            self._ledger.count(received=1)
            raise HTTPError(
                400, f"request body is not valid JSON: {err}", code="invalid_json"
            ) from err
        self._ledger.receive(body)
        gate = self.gate
        if gate is not None and not gate.is_set():  # held: received, not yet answered
            await gate.wait()
        messages, model, stream, include_usage, limit = _validate(body)
        fault = self._take_fault(request.headers.get("x-standin-fault"))
        kind = fault.kind if fault else None
        if kind is FaultKind.RATE_LIMIT:
            assert fault is not None
            raise HTTPError(
                429,
                "Rate limit reached for requests (stand-in)",
                kind="requests",
                code="rate_limit_exceeded",
                headers={"retry-after": str(fault.retry_after)},
            )
        if kind is FaultKind.SERVER_ERROR:
            raise HTTPError(500, "The server had an error (stand-in)", kind="server_error")
        if kind is FaultKind.DROP:
            return False
        if kind is FaultKind.SLOW:
            assert fault is not None
            await conn.pause(fault.delay)
        if kind in (FaultKind.INVALID_JSON, FaultKind.MISSING_CHOICES):
            await self._send_malformed(conn, kind is FaultKind.INVALID_JSON, stream)
            return True
        reply, index = self._next_reply(messages)
        tools_offered = bool(body.get("tools"))
        text, calls, finish = _shape(reply, tools_offered, limit)
        usage = None
        if kind is not FaultKind.NO_USAGE:
            p, c = prompt_tokens(messages), completion_tokens(text, calls)
            usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        ident = f"chatcmpl-standin-{index}"
        if stream:
            done = _Completion(ident, model, text, calls, finish, usage, index)
            return await self._stream(conn, fault, done, include_usage)
        message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
        if calls:
            message["tool_calls"] = [_call_json(call, index, i) for i, call in enumerate(calls)]
        payload: dict[str, Any] = {
            "id": ident,
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "standin",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
        }
        if usage is not None:
            payload["usage"] = usage
        data = json.dumps(payload).encode()
        if kind is FaultKind.DROP_MID_REPLY:
            assert fault is not None
            head = response_head(
                200, {"content-type": "application/json", "content-length": str(len(data))}
            )
            cut = data[: len(data) // 2] if fault.after_chunks else b""
            await write(conn, head + cut)
            return False
        head = response_head(
            200, {"content-type": "application/json", "content-length": str(len(data))}
        )
        await self._finish(conn, head + data, usage)
        return True

    async def _stream(
        self,
        conn: Conn,
        fault: Fault | None,
        done: _Completion,
        include_usage: bool,
    ) -> bool:
        """Send a reply as server-sent events (its usage in a last chunk if
        ``include_usage``); False if the connection must close."""
        ident, model, index = done.ident, done.model, done.index
        usage = done.usage if include_usage else None
        chunk_delay = fault.chunk_delay if fault and fault.kind is FaultKind.SLOW else 0.0
        drop_after = (
            fault.after_chunks if fault and fault.kind is FaultKind.DROP_MID_REPLY else None
        )

        head = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "standin",
        }

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body: dict[str, Any] = {**head, "choices": [choice]}
            if include_usage:
                body["usage"] = None
            return body

        events: list[dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in _pieces(done.text, self._words_per_chunk)]
        for i, call in enumerate(done.calls):
            first = _call_json(call, index, i)
            first["function"] = {"name": call.name, "arguments": ""}
            events.append(chunk({"tool_calls": [{"index": i, **first}]}))
            events += [
                chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
                for part in _split(call.arguments_json, 3)
            ]
        events.append(chunk({}, done.finish))
        if usage is not None:
            events.append({**head, "choices": [], "usage": usage})
        await write(conn, response_head(200, STREAM_HEADERS))
        for sent, event in enumerate(events):
            if drop_after is not None and sent >= drop_after:
                return False
            if sent:
                await conn.pause(chunk_delay)
            data = chunked(b"data: " + json.dumps(event).encode() + b"\n\n")
            if sent < len(events) - 1:
                await write(conn, data)
        await self._finish(conn, data + chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n", usage)
        return True

    async def _send_malformed(self, conn: Conn, invalid_json: bool, stream: bool) -> None:
        """A 200 whose body (or, streamed, whose one event) is not JSON, or is
        JSON without ``choices``."""
        obj = "chat.completion.chunk" if stream else "chat.completion"
        data = (
            b'{"id": "chatcmpl-standin", "choices": ['
            if invalid_json
            else json.dumps({"id": "chatcmpl-standin", "object": obj}).encode()
        )
        if not stream:
            await send_raw(conn, 200, data)
            return
        await write(conn, response_head(200, STREAM_HEADERS))
        events = chunked(b"data: " + data + b"\n\n") + chunked(b"data: [DONE]\n\n")
        await write(conn, events + b"0\r\n\r\n")

    async def _finish(self, conn: Conn, data: bytes, usage: Mapping[str, int] | None) -> None:
        """Write a reply's last bytes, counting it served *before*: a client that
        has its reply always finds it counted. If the write fails (the client is
        gone) the count is taken back and ``ClientGoneError`` raised."""
        prompt = usage["prompt_tokens"] if usage else 0
        completion = usage["completion_tokens"] if usage else 0
        self._ledger.count(served=1, prompt=prompt, completion=completion)
        try:
            await write(conn, data)
        except ClientGoneError:
            self._ledger.count(served=-1, prompt=-prompt, completion=-completion)
            raise

    def _take_fault(self, header: str | None) -> Fault | None:
        if header is not None:
            try:
                return Fault.parse(header)
            except ValueError as err:
                raise HTTPError(
                    400, str(err), code="invalid_fault", param="x-standin-fault"
                ) from err
        return self._ledger.take_fault()

    def _next_reply(self, messages: Sequence[Mapping[str, Any]]) -> tuple[Reply, int]:
        """The scripted reply (or the echo) and this completion's sequence number."""
        reply, sequence = self._ledger.take_reply()
        if reply is not None:
            return reply, sequence
        last_user = next(
            (content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"),
            "",
        )
        return Reply(" ".join(["echo", *last_user.split()])), sequence


def _validate(body: object) -> tuple[list[dict[str, Any]], str, bool, bool, int | None]:
    """Check a chat request's fields; raises a 400 ``HTTPError`` naming the field."""
    if not isinstance(body, dict):
        raise HTTPError(400, "request body must be a JSON object", code="invalid_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise HTTPError(
            400, "`model` must be a non-empty string", param="model", code="invalid_type"
        )
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise HTTPError(
            400,
            "`messages` must be a non-empty list of objects with a `role`",
            param="messages",
            code="invalid_type",
        )
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise HTTPError(
            400,
            "`max_tokens` must be a non-negative integer",
            param="max_tokens",
            code="invalid_type",
        )
    return messages, model, stream, include_usage, limit


def _shape(
    reply: Reply, tools_offered: bool, limit: int | None
) -> tuple[str, tuple[ToolCall, ...], str]:
    """The text, tool calls and finish reason a reply goes out with under ``limit``."""
    calls = reply.tool_calls if tools_offered else ()
    words = reply.text.split()
    if limit is None or len(words) + sum(c.tokens for c in calls) <= limit:
        return reply.text, calls, "tool_calls" if calls else "stop"
    return " ".join(words[:limit]), (), "length"


def _call_json(call: ToolCall, index: int, position: int) -> dict[str, Any]:
    return {
        "id": f"call_standin_{index}_{position}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def _pieces(text: str, words_per_chunk: int) -> Iterator[str]:
    """The text in chunks of ``words_per_chunk`` words, spacing kept: joined, they
    give back the text exactly."""
    if not text:
        return
    words = text.split(" ")
    for start in range(0, len(words), words_per_chunk):
        piece = " ".join(words[start : start + words_per_chunk])
        yield piece if start == 0 else " " + piece


def _split(text: str, parts: int) -> list[str]:
    """``text`` in up to ``parts`` non-empty pieces that join back to it."""
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]
