"""The model-call families' label sets: seeded from the agents, bounded.

Model calls are counted by (agent, model, tier): ``ModelCalls`` tallies
them as they end, and a scrape reads the tallies. Those labels come from the
node's configuration — each agent's tiers and the models they map to —
except that a skill may name another model per call, so the label sets are
bounded: the first ``limit`` of them keep their labels, every later one is
folded into one ``other`` set. "First" is a fixed order: the agents' tier
maps (every one exposed at zero from the start), then the tallies in the
order each label set was first seen. A label set never moves between its
own series and ``other``, so each series only ever grows, as a counter must.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sessiontree.supervision._config import Agent
from sessiontree.supervision._model_calls import Spent

__all__ = ["FIGURES", "OTHER", "bounded", "seeds"]

#: The label set every label set past the bound is folded into.
OTHER: Spent = ("other", "other", "other")

#: The figures ``ModelCalls.tallies`` keeps for each label set.
FIGURES = ("calls", "errors", "prompt_tokens", "completion_tokens", "cost")


def seeds(agents: Iterable[Agent]) -> list[Spent]:
    """The (agent, model, tier) of each agent's model tiers, in registration
    and tier order: the label sets a node exposes before any call."""
    return [
        (agent.agent_id, agent.models[tier], tier)
        for agent in agents
        for tier in agent.model_tiers
        if tier in agent.models
    ]


def bounded(
    seeded: Iterable[Spent], tallies: Mapping[tuple[Spent, str], float], limit: int
) -> dict[Spent, dict[str, float]]:
    """Each label set's figures, at most ``limit`` label sets with their own
    labels and the rest summed under ``OTHER`` (present only when some are).
    ``tallies`` is ``ModelCalls.tallies()``: keyed by (label set, figure), in
    the order each was first seen."""
    series: dict[Spent, dict[str, float]] = {}
    for spent in seeded:
        if spent not in series and len(series) < limit:
            series[spent] = dict.fromkeys(FIGURES, 0.0)
    for (spent, figure), value in tallies.items():
        figures = series.get(spent)
        if figures is None:
            if len(series) < limit:
                figures = series[spent] = dict.fromkeys(FIGURES, 0.0)
            else:
                figures = series.setdefault(OTHER, dict.fromkeys(FIGURES, 0.0))
        figures[figure] = figures.get(figure, 0.0) + value
    return series
