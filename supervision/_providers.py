"""Where model calls go: providers, their prices, and which model a session's
tier picks (issue 20).

A ``Provider`` is an OpenAI-compatible endpoint (OpenAI, vLLM, Ollama,
llama.cpp's server, a LiteLLM proxy) with its key, timeouts, retry bounds
and price table. Its key is read once, when the node starts (from the
config or a key file), never from the environment while a session runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Price", "Provider"]

#: What the SDK gets as a key when a provider needs none (a local server): it
#: must get one, or it would read the process environment.
NO_KEY = "unused"


@dataclass(frozen=True, slots=True)
class Price:
    """What one token of a model costs, prompt and completion (in the price
    table's currency). ``ValueError`` for a negative or non-finite price."""

    prompt: float
    completion: float

    def __post_init__(self) -> None:
        for name in ("prompt", "completion"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                msg = f"Price.{name} must be a finite number >= 0, got {value!r}"
                raise ValueError(msg)


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible chat-completions endpoint the node's sessions call.

    ``base_url`` ends before ``/chat/completions`` (``http://127.0.0.1:8000/v1``).
    ``api_key`` or ``api_key_file`` (a file holding the key; read when the
    node starts; neither: the endpoint needs none). ``timeout`` bounds one
    request (seconds, real time), ``connect_timeout`` its connection.
    Transient errors (429, 5xx, timeouts, dropped connections) are retried up
    to ``max_retries`` times, waiting what a 429's ``Retry-After`` asks (at
    most ``retry_wait_max``) or an exponential backoff from ``retry_wait``.
    ``prices`` maps model names to their ``Price``; a call to a model it does
    not name costs nothing and is counted as unpriced (a cost budget on it is
    refused as ``budget_unenforceable``). Every field is checked at
    construction (``ValueError`` naming it).
    """

    base_url: str
    name: str = "default"
    api_key: str | None = field(default=None, repr=False)
    api_key_file: str | None = None
    timeout: float = 60.0
    connect_timeout: float = 10.0
    max_retries: int = 3
    retry_wait: float = 0.5
    retry_wait_max: float = 30.0
    prices: Mapping[str, Price] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            msg = f"Provider.name must be a non-empty string, got {self.name!r}"
            raise ValueError(msg)
        where = f"provider {self.name!r}"
        if not isinstance(self.base_url, str) or not self.base_url.startswith(
            ("http://", "https://")
        ):
            msg = f"{where}: base_url must be an http(s) URL, got {self.base_url!r}"
            raise ValueError(msg)
        if self.api_key is not None and self.api_key_file is not None:
            msg = f"{where}: give api_key or api_key_file, not both"
            raise ValueError(msg)
        for name in ("timeout", "connect_timeout", "retry_wait", "retry_wait_max"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                msg = f"{where}: {name} must be a finite number > 0, got {value!r}"
                raise ValueError(msg)
        if not isinstance(self.max_retries, int) or not 0 <= self.max_retries <= 10:
            msg = f"{where}: max_retries must be an integer from 0 to 10, got {self.max_retries!r}"
            raise ValueError(msg)
        for model, price in self.prices.items():
            if not isinstance(price, Price):
                msg = f"{where}: prices[{model!r}] must be a Price, got {price!r}"
                raise ValueError(msg)

    def key(self) -> str:
        """The API key (read from ``api_key_file`` now). ``ValueError`` naming
        the file when it cannot be read or is empty."""
        if self.api_key is not None:
            return self.api_key
        if self.api_key_file is None:
            return NO_KEY
        try:
            key = Path(self.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"provider {self.name!r}: api_key_file {self.api_key_file!r}: {exc}"
            raise ValueError(msg) from exc
        if not key:
            msg = f"provider {self.name!r}: api_key_file {self.api_key_file!r} is empty"
            raise ValueError(msg)
        return key
