"""The families read when Prometheus scrapes: ``ScrapeCollector`` and ``Only``.

Figures that are state rather than history — the live sessions by kind and
state, compute slots, limits, retries, rejected inputs, the Cortex's own
figures (budget warnings and exhaustions among them), model calls by agent,
model and tier, the store's map — are read at scrape time, each family from
its source, in sections. A section is read whole or skipped: one that raises is
logged (with its name) and left out of that scrape, so a closed store or a
busy Cortex never breaks the rest of the exposition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric

from sessiontree.actors.runtime import mailbox_depth
from sessiontree.protocol import SessionTreeError
from sessiontree.supervision._metric_families import NODE_REASON, SCRAPED, family, single
from sessiontree.supervision._metric_models import bounded, seeds
from sessiontree.supervision._metric_tracking import TreeTracker
from sessiontree.supervision._requests import GetStats

if TYPE_CHECKING:
    from sessiontree.supervision._node import Node

__all__ = ["Only", "ScrapeCollector"]

log = logging.getLogger("sessiontree.metrics")

# How long a scrape waits for the Cortex's figures before skipping them.
_STATS_TIMEOUT = 2.0


class ScrapeCollector:
    """The families read at scrape time, for one node (a prometheus-client
    collector). ``collect`` runs on the scraping thread and never raises: a
    section that raises is logged and left out of that scrape."""

    def __init__(self, node: Node, tracker: TreeTracker, max_model_series: int) -> None:
        self._node = node
        self._tracker = tracker
        self._max_model_series = max_model_series
        self._model_seeds = seeds(node._runtime.agents.values())
        self._sections: tuple[Callable[[], Iterable[Metric]], ...] = (
            self._sessions_section,
            self._slots_section,
            self._activity_section,
            self._limits_section,
            self._retries_section,
            self._rejected_section,
            self._cortex_section,
            self._models_section,
            self._store_section,
            self._recovery_section,
            self._tracing_section,
        )

    def describe(self) -> list[Metric]:
        """Every family this collector may yield (what the registry checks names by)."""
        return [family(name) for name in SCRAPED]

    def collect(self) -> Iterator[Metric]:
        """The sections in order, each whole or (if it raised) not at all."""
        for section in self._sections:
            try:
                families = list(section())
            except SessionTreeError as exc:  # a closed node or store, a busy Cortex
                log.warning("metrics: %s skipped: %s", section.__name__, exc)
                continue
            except Exception:
                log.warning(
                    "metrics: %s failed; its families are skipped", section.__name__, exc_info=True
                )
                continue
            yield from families

    # -- the sections ---------------------------------------------------------------------

    def _sessions_section(self) -> Iterator[Metric]:
        sessions = family("sessiontree_sessions")
        for labels, value in self._tracker.session_counts():
            sessions.add_metric(labels, value)
        yield sessions

    def _slots_section(self) -> Iterator[Metric]:
        slots = self._node._runtime.slots
        yield single("sessiontree_compute_slots_in_use", slots.in_use)
        yield single("sessiontree_compute_slots_waiting", slots.waiting)

    def _activity_section(self) -> Iterator[Metric]:
        yield single("sessiontree_cortex_mailbox_depth", mailbox_depth(self._node._cortex))
        yield single("sessiontree_work_in_flight", max(0, self._node.activity.busy))
        yield single("sessiontree_node_failed", 1 if self._node.failure is not None else 0)

    def _limits_section(self) -> Iterator[Metric]:
        config = self._node.config
        yield single("sessiontree_compute_slots_limit", config.max_running_skills)
        yield single("sessiontree_step_threads_limit", config.max_step_threads)
        yield single("sessiontree_sessions_limit", config.max_sessions)
        yield single("sessiontree_zombie_threads_limit", config.max_zombies)
        yield single("sessiontree_grace_period_seconds", config.grace)
        yield single("sessiontree_memory_high_ratio", config.memory_high)
        yield single("sessiontree_memory_low_ratio", config.memory_low)

    def _retries_section(self) -> Iterator[Metric]:
        restarts = self._node._restarts
        yield single("sessiontree_retries", restarts.retries)
        yield single("sessiontree_retry_escalations", restarts.escalations)

    def _rejected_section(self) -> Iterator[Metric]:
        rejected = family("sessiontree_rejected_inputs")
        for reason, value in self._tracker.rejected_counts():
            rejected.add_metric((reason,), value)
        rejected.add_metric((NODE_REASON,), self._node.rejected_input)
        yield rejected

    def _cortex_section(self) -> Iterator[Metric]:
        """The Cortex's own figures: one call to it, bounded by ``_STATS_TIMEOUT``."""
        stats: dict[str, int] = self._node._call(GetStats(), check=False, timeout=_STATS_TIMEOUT)
        yield single("sessiontree_zombie_threads", stats.get("zombies", 0))
        yield single("sessiontree_step_threads", stats.get("sync_threads", 0))
        yield single("sessiontree_indexed_sessions", stats.get("indexed_sessions", 0))
        yield single("sessiontree_result_waiters", stats.get("result_waiters", 0))
        yield single("sessiontree_session_mailbox_depth", stats.get("session_mailbox_depth", 0))
        yield single("sessiontree_rejected_messages", stats.get("rejected_messages", 0))
        yield single("sessiontree_fenced_refusals", stats.get("refused_after_fence", 0))
        yield single("sessiontree_stuck_flags", stats.get("stuck_flagged", 0))
        yield single("sessiontree_memory_used_ratio", self._node._runtime.memory_used)
        yield single(
            "sessiontree_memory_pressure_suspensions", stats.get("pressure_suspensions", 0)
        )
        yield single(
            "sessiontree_memory_pressure_resumptions", stats.get("pressure_resumptions", 0)
        )
        yield single("sessiontree_memory_pressure_suspended", stats.get("pressure_suspended", 0))
        yield single("sessiontree_main_cycles_failed", stats.get("main_cycles_failed", 0))
        yield single("sessiontree_main_cycles_refused", stats.get("main_cycles_refused", 0))
        yield single("sessiontree_store_held_mains", stats.get("store_held_mains", 0))
        yield single("sessiontree_store_write_errors", stats.get("store_write_errors", 0))
        yield single("sessiontree_budget_warnings", stats.get("budget_warnings", 0))
        yield single("sessiontree_budgets_exhausted", stats.get("budgets_exhausted", 0))

    def _models_section(self) -> Iterator[Metric]:
        """Model calls by agent, model and tier, from the node's tallies (at most
        ``max_model_series`` label sets; the rest under ``other``)."""
        tallies = self._node._model_calls.tallies()
        calls = family("sessiontree_model_calls")
        errors = family("sessiontree_model_call_errors")
        tokens = family("sessiontree_model_tokens")
        cost = family("sessiontree_model_cost")
        for labels, figures in bounded(self._model_seeds, tallies, self._max_model_series).items():
            calls.add_metric(labels, figures["calls"])
            errors.add_metric(labels, figures["errors"])
            tokens.add_metric((*labels, "prompt"), figures["prompt_tokens"])
            tokens.add_metric((*labels, "completion"), figures["completion_tokens"])
            cost.add_metric(labels, figures["cost"])
        yield from (calls, errors, tokens, cost)

    def _store_section(self) -> Iterator[Metric]:
        store = self._node.store
        if store is None:
            return
        figures = store.stats()
        yield single("sessiontree_store_map_used_bytes", figures["used_bytes"])
        yield single("sessiontree_store_map_size_bytes", figures["map_size"])
        yield single("sessiontree_store_readers", figures["readers"])
        yield single("sessiontree_store_commit_errors", figures.get("write_errors", 0))
        yield single("sessiontree_store_map_full", figures.get("store_full", 0))

    def _recovery_section(self) -> Iterator[Metric]:
        node = self._node
        if node.store is None:
            return
        decisions = family("sessiontree_recovery_decisions")
        for decision in ("fresh", "stale", "wedged"):
            decisions.add_metric((decision,), node.recovery.figures.get(decision, 0))
        yield decisions
        yield single("sessiontree_replay_held", 1 if node.recovery.replay_held is not None else 0)
        yield single("sessiontree_wedged_items", node.store.count("wedged"))

    def _tracing_section(self) -> Iterator[Metric]:
        node = self._node
        if node.config.tracing is None:
            return
        yield single("sessiontree_spans_exported", node.spans_exported)
        yield single("sessiontree_spans_dropped", node.spans_dropped)


class Only:
    """A registry stand-in that collects just the given collectors (what a scrape
    renders when another collector on a shared registry raises)."""

    def __init__(self, collectors: Iterable[Any]) -> None:
        self._collectors = tuple(collectors)

    def collect(self) -> Iterator[Metric]:
        """Each collector's families in turn; raises what a collector raises."""
        for collector in self._collectors:
            yield from collector.collect()
