"""Model calls on the wire: one ``AsyncOpenAI`` client per provider, one call
with its retries, the reply read into plain values (issue 20).

Every call runs on the node's event loop (the clients' connection pools
belong to it). Transient failures (429, 5xx, timeouts, dropped connections,
mid-stream too) are retried with tenacity within the provider's bounds; a
429's ``Retry-After`` is honoured up to ``retry_wait_max``. Whatever else
goes wrong comes back as a ``model_error`` ``ErrorInfo`` with the
provider's status and message: ``call`` never raises for what the provider
does (``asyncio.CancelledError`` excepted: a cancelled call closes its
request and lets the cancellation through).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import openai
import tenacity

from sessiontree.protocol import ErrorCode, ErrorInfo
from sessiontree.supervision._config import Agent
from sessiontree.supervision._providers import Price, Provider

__all__ = ["ModelError", "Models", "Reply", "Route"]

log = logging.getLogger("sessiontree.models")

_TRANSIENT = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)


@dataclass(frozen=True, slots=True)
class Route:
    """Where one call goes: the provider, the model name, its price (if listed)."""

    provider: Provider
    model: str
    price: Price | None


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply read off the wire; ``usage`` is (prompt, completion) tokens as
    the provider reported them, None when it reported none."""

    text: str | None
    tool_calls: tuple[dict[str, Any], ...]
    finish_reason: str | None
    model: str
    usage: tuple[int, int] | None


class ModelError(Exception):
    """A reply that cannot be read (``field`` names what is wrong)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class Models:
    """The node's providers and the agents' models: routes and clients.

    Made when the node starts: every key file is read then (``ValueError``
    naming the provider), an agent that maps tiers to models must name a
    provider the node has (``ValueError`` naming the agent).
    """

    def __init__(self, providers: tuple[Provider, ...], agents: Iterable[Agent]) -> None:
        self.providers = {p.name: p for p in providers}
        self._first = providers[0] if providers else None
        for agent in agents:
            if not agent.models:
                continue
            if agent.provider is not None and agent.provider not in self.providers:
                msg = f"agent {agent.agent_id!r}: provider {agent.provider!r} is not configured"
                raise ValueError(msg)
            if self._first is None:
                msg = f"agent {agent.agent_id!r} maps tiers to models, and the node has no provider"
                raise ValueError(msg)
        self._clients = {
            p.name: openai.AsyncOpenAI(
                api_key=p.key(),
                base_url=p.base_url,
                timeout=openai.Timeout(p.timeout, connect=p.connect_timeout),
                max_retries=0,  # retried here, where a cancellation can stop them
            )
            for p in providers
        }

    def route(self, agent: Agent, tier: str | None, model: str | None = None) -> Route | ErrorInfo:
        """Where a session of ``agent`` at ``tier`` sends a call (``model``
        overrides the tier's); a ``model_error`` naming the field when no
        model or provider fits."""
        provider = self.providers.get(agent.provider) if agent.provider else self._first
        if provider is None:
            return ErrorInfo(
                code=ErrorCode.MODEL_ERROR,
                message="the node has no model provider (NodeConfig.providers)",
                detail={"field": "providers"},
            )
        if model is None:
            model = agent.models.get(tier or "")
            if model is None:
                return ErrorInfo(
                    code=ErrorCode.MODEL_ERROR,
                    message=f"agent {agent.agent_id!r} has no model for tier {tier!r}",
                    detail={"field": f"models[{tier}]", "agent_id": agent.agent_id},
                )
        return Route(provider, model, provider.prices.get(model))

    async def call(
        self,
        route: Route,
        request: Mapping[str, Any],
        on_delta: Callable[[str], None] | None,
    ) -> Reply | ErrorInfo:
        """Send one chat-completions ``request`` (streamed when ``on_delta`` is
        given: each piece of text goes to it as it arrives), with retries."""
        provider = route.provider
        client = self._clients[provider.name]
        body = dict(request, model=route.model)
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(_TRANSIENT),
            stop=tenacity.stop_after_attempt(provider.max_retries + 1),
            wait=_RetryWait(provider),
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if on_delta is None:
                        return _read(await client.chat.completions.create(**body))
                    return await _streamed(client, body, on_delta)
        except openai.APIStatusError as exc:
            return _status_error(exc)
        except openai.APIError as exc:  # connection and timeout errors, after the retries
            return ErrorInfo(
                code=ErrorCode.MODEL_ERROR,
                message=f"model {route.model!r} at {provider.name!r}: {exc}",
                detail={"type": type(exc).__name__, "provider": provider.name, "retryable": True},
            )
        except ModelError as exc:
            return _unreadable(route, str(exc), exc.field)
        except json.JSONDecodeError as exc:
            return _unreadable(route, f"the reply is not valid JSON: {exc}", "body")
        except TypeError as exc:  # an option the SDK does not take: nothing was sent
            return _unreadable(route, f"the SDK refused the call's options: {exc}", "options")
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def close(self) -> None:
        """Close every client's connection pool."""
        for client in self._clients.values():
            await client.close()


class _RetryWait(tenacity.wait.wait_base):
    """A 429's ``Retry-After`` (capped), else exponential backoff from
    ``retry_wait`` with jitter, never past ``retry_wait_max``."""

    def __init__(self, provider: Provider) -> None:
        self.cap = provider.retry_wait_max
        # what wait_exponential_jitter does, without its `initial=` (deprecated
        # since tenacity 9.2; its `multiplier=` is missing before 9.2)
        self.backoff = tenacity.wait_exponential(
            multiplier=provider.retry_wait, max=provider.retry_wait_max
        ) + tenacity.wait_random(0, provider.retry_wait)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        if isinstance(error, openai.APIStatusError):
            asked = error.response.headers.get("retry-after")
            try:
                if asked is not None and float(asked) >= 0:
                    return min(float(asked), self.cap)
            except ValueError:
                pass  # an HTTP date: back off as usual
        return min(float(self.backoff(retry_state)), self.cap)


def _log_retry(retry_state: tenacity.RetryCallState) -> None:
    outcome = retry_state.outcome
    error = outcome.exception() if outcome is not None else None
    log.info("model call attempt %d failed (%r); retrying", retry_state.attempt_number, error)


def _read(completion: Any) -> Reply:
    """A non-streamed reply; ``ModelError`` naming what is missing."""
    choices = getattr(completion, "choices", None)
    if not choices:
        raise ModelError("the reply has no choices", "choices")
    choice = choices[0]
    message = choice.message
    calls = tuple(call.model_dump(exclude_none=True) for call in (message.tool_calls or ()))
    return Reply(
        text=message.content,
        tool_calls=calls,
        finish_reason=choice.finish_reason,
        model=getattr(completion, "model", "") or "",
        usage=_usage(getattr(completion, "usage", None)),
    )


async def _streamed(
    client: openai.AsyncOpenAI, body: dict[str, Any], on_delta: Callable[[str], None]
) -> Reply:
    """A streamed reply, text handed to ``on_delta`` as it comes; the usage
    is asked for (``include_usage``). The stream is closed on every way out."""
    options = dict(body.get("stream_options") or {}, include_usage=True)
    create: Any = client.chat.completions.create  # the body is checked by the provider
    stream = await create(**dict(body, stream=True, stream_options=options))
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    model = ""
    usage: tuple[int, int] | None = None
    seen_choice = False
    async with stream:
        async for chunk in stream:
            model = chunk.model or model
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                seen_choice = True
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                    on_delta(delta.content)
                for piece in delta.tool_calls or ():
                    _merge_call(calls.setdefault(piece.index, {}), piece)
                finish = choice.finish_reason or finish
    if not seen_choice:
        raise ModelError("the streamed reply has no choices", "choices")
    return Reply(
        text="".join(text) if text or not calls else None,
        tool_calls=tuple(calls[i] for i in sorted(calls)),
        finish_reason=finish,
        model=model,
        usage=usage,
    )


def _merge_call(call: dict[str, Any], piece: Any) -> None:
    """Add one streamed tool-call delta to the call it continues."""
    if piece.id:
        call["id"] = piece.id
    call.setdefault("type", "function")
    function = call.setdefault("function", {"name": "", "arguments": ""})
    if piece.function is not None:
        function["name"] += piece.function.name or ""
        function["arguments"] += piece.function.arguments or ""


def _usage(usage: Any) -> tuple[int, int] | None:
    if usage is None:
        return None
    prompt = getattr(usage, "prompt_tokens", None)
    completion = getattr(usage, "completion_tokens", None)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return prompt, completion


def _status_error(exc: openai.APIStatusError) -> ErrorInfo:
    return ErrorInfo(
        code=ErrorCode.MODEL_ERROR,
        message=f"the provider answered {exc.status_code}: {exc.message}",
        detail={
            "status": exc.status_code,
            "provider_message": exc.message,
            "retryable": isinstance(exc, _TRANSIENT),
        },
    )


def _unreadable(route: Route, message: str, field: str) -> ErrorInfo:
    return ErrorInfo(
        code=ErrorCode.MODEL_ERROR,
        message=f"model {route.model!r} at {route.provider.name!r}: {message}",
        detail={"field": field, "provider": route.provider.name},
    )
