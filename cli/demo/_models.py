"""The demo's model endpoint, and the usage figures it reads off the tree.

By default the demo's model calls go to a ``StandinServer`` it starts on
127.0.0.1 (deterministic replies, tokens counted as words, a price table), so
``sessiontree demo`` stays offline and prints the same figures on every run.
``--model-url URL --model NAME`` sends them to a real OpenAI-compatible
endpoint instead: both model tiers call ``NAME``, no price is known (calls
are counted as unpriced), and the grace is longer, so that replies in flight
when a budget runs out still land.

The figures (``model_figures``) are computed from the ``--json`` session rows
and the store, so the printed output and ``--json`` always agree.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sessiontree.protocol import Usage
from sessiontree.supervision import Price, Provider
from sessiontree.testing import StandinServer

__all__ = [
    "STANDIN_MODELS",
    "STANDIN_PRICES",
    "Endpoint",
    "model_endpoint",
    "model_figures",
    "usage_json",
    "usage_of",
]

STANDIN_MODELS = {"small": "standin-small", "large": "standin-large"}
"""The stand-in's model for each tier: workers call the small one, branches the large."""

STANDIN_PRICES = {
    "standin-small": Price(prompt=0.15e-6, completion=0.60e-6),
    "standin-large": Price(prompt=2.50e-6, completion=10.0e-6),
}
"""What a token costs on the stand-in (USD; a million small-model prompt tokens: $0.15)."""

_REAL_TIMEOUT = 60.0  # seconds one request to a real endpoint may take
_REAL_RETRIES = 2


@dataclass(frozen=True)
class Endpoint:
    """Where the demo's model calls go: the provider, each tier's model, and
    the stand-in serving them (None for a real endpoint)."""

    provider: Provider
    models: Mapping[str, str]
    standin: StandinServer | None

    @property
    def url(self) -> str:
        return self.provider.base_url

    def served(self) -> dict[str, int] | None:
        """What the stand-in served (calls and tokens); None for a real endpoint."""
        if self.standin is None:
            return None
        stats = self.standin.stats()
        return {
            "calls": stats.completions_served,
            "prompt_tokens": stats.prompt_tokens_served,
            "completion_tokens": stats.completion_tokens_served,
            "tokens": stats.tokens_served,
        }


@contextmanager
def model_endpoint(
    url: str | None = None, model: str | None = None, api_key_file: Path | None = None
) -> Iterator[Endpoint]:
    """The stand-in (started here, closed on the way out) when ``url`` is None,
    else the endpoint at ``url`` serving ``model`` for every tier (its key in
    ``api_key_file``, if it needs one). ``ValueError`` for a bad URL or a
    missing model name."""
    if url is None:
        with StandinServer(models=tuple(STANDIN_MODELS.values())) as standin:
            provider = Provider(base_url=standin.url, name="standin", prices=STANDIN_PRICES)
            yield Endpoint(provider, STANDIN_MODELS, standin)
        return
    if not model:
        msg = "a real endpoint needs a model name (--model)"
        raise ValueError(msg)
    provider = Provider(
        base_url=url,
        api_key_file=None if api_key_file is None else str(api_key_file),
        timeout=_REAL_TIMEOUT,
        max_retries=_REAL_RETRIES,
    )
    yield Endpoint(provider, {"small": model, "large": model}, None)


# -- the figures ---------------------------------------------------------------------


def usage_json(usage: Usage | None) -> dict[str, Any] | None:
    """A ``Usage`` as ``--json`` shows it (its fields and ``tokens``; the cost
    rounded to 12 places, so sums taken in another order print the same)."""
    if usage is None:
        return None
    plain: dict[str, Any] = msgspec.to_builtins(usage)
    plain["cost"] = round(usage.cost, 12)
    plain["tokens"] = usage.tokens
    return plain


def usage_of(plain: Mapping[str, Any] | None) -> Usage:
    if not plain:
        return Usage()
    fields = {k: v for k, v in plain.items() if k != "tokens"}
    return msgspec.convert(fields, Usage)


def model_figures(
    rows: Sequence[Mapping[str, Any]],
    *,
    endpoint: Endpoint,
    stored: Usage | None,
    roll_up_task: str,
    budget_task: str,
    budget: Mapping[str, Any],
    events: Mapping[str, int],
) -> dict[str, Any]:
    """The ``models`` part of ``--json``: where the calls went, the whole tree's
    usage (as the store has it, durable) beside what the stand-in served, the
    branch ``roll_up_task`` whose subtree usage is its own plus its children's,
    and the branch ``budget_task`` whose ``budget`` ran out."""
    by_task = {row["task"]: row for row in rows}
    children: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        children.setdefault(row["parent_id"], []).append(row)
    root = next((row for row in rows if row["parent_id"] is None), None)
    added = Usage()
    for top in children.get(root["session_id"] if root else "", []):
        added = added + usage_of(top["subtree_usage"])
    return {
        "endpoint": endpoint.url,
        "stand_in": endpoint.standin is not None,
        "models": dict(endpoint.models),
        "usage": usage_json(stored),
        "branches_sum": usage_json(added),
        "served": endpoint.served(),
        "roll_up": _roll_up(by_task.get(roll_up_task), children),
        "budget": _budget(by_task.get(budget_task), children, budget),
        "events": dict(events),
    }


def _roll_up(
    branch: Mapping[str, Any] | None, children: Mapping[str, list[Mapping[str, Any]]]
) -> dict[str, Any] | None:
    if branch is None:
        return None
    below = children.get(branch["session_id"], [])
    added = Usage()
    for child in below:
        added = added + usage_of(child["subtree_usage"])
    return {
        "session_id": branch["session_id"],
        "task": branch["task"],
        "own": branch["usage"],
        "children": [
            {
                "session_id": c["session_id"],
                "task": c["task"],
                "state": c["state"],
                "usage": c["subtree_usage"],
            }
            for c in below
        ],
        "own_plus_children": usage_json(usage_of(branch["usage"]) + added),
        "subtree": branch["subtree_usage"],
    }


def _budget(
    branch: Mapping[str, Any] | None,
    children: Mapping[str, list[Mapping[str, Any]]],
    budget: Mapping[str, Any],
) -> dict[str, Any] | None:
    if branch is None:
        return None
    workers = children.get(branch["session_id"], [])
    sent = sum(usage_of(w["subtree_usage"]).calls for w in workers)
    kept = [w for w in workers if w["result"] and w["result"]["summary"]]
    result = branch["result"] or {}
    error = result.get("error") or {}
    return {
        "session_id": branch["session_id"],
        "task": branch["task"],
        "budget": dict(budget),
        "workers": len(workers),
        "calls_sent": sent,
        "calls_refused": len(workers) - sent,
        "partial_results": sum(
            1 for w in kept if usage_of(w["subtree_usage"]).calls and w["state"] == "cancelled"
        ),
        "state": branch["state"],
        "code": error.get("code"),
        "summary": result.get("summary"),
        "subtree": branch["subtree_usage"],
    }
