"""The metric families of a node: their names, help texts, labels and buckets.

Two kinds of family live here. Those fed by events (spawns, terminations,
durations, grace wrap-ups, delivery, store commits) are prometheus-client
``Counter``s and ``Histogram``s, created in a node's registry by
``Families`` with every label combination from the start. Those read at
scrape time (``_metric_sections``) are described by ``SCRAPED`` and built
afresh for each scrape by ``family`` and ``single``.

Names follow the Prometheus conventions: the ``sessiontree_`` prefix, base
units (seconds, bytes), ``_total`` on counters. Labels come from fixed sets
(kinds, states, error codes, reject reasons, grace outcomes), so the series
a node exposes never change with its workload; the one exception, model
calls by agent, model and tier, is bounded (``_metric_models``).

The session families (spawns, restorations, endings, forced ends, TTL
expiries, lifetimes, and the live gauge) are also labelled by ``agent`` and
``skill``, whose values come only from the agents the node was started with:
the series of each (agent, skill, kind) a node can run exist from the start
(``session_series``: a Main runs its agent's main skill, a Branch or Worker
any of its skills); a registered skill run as another kind adds that kind's
series once; a session whose agent or skill the node does not know (a
record stored by an older configuration) is counted under ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sessiontree.protocol import ErrorCode, SessionKind, SessionState
from sessiontree.supervision._config import Agent

__all__ = [
    "END_STATES",
    "KINDS",
    "LIVE_STATES",
    "NODE_REASON",
    "OTHER_LABEL",
    "REJECT_REASONS",
    "SCRAPED",
    "Families",
    "Series",
    "family",
    "session_series",
    "single",
]

_M = TypeVar("_M", Counter, Histogram)

#: Why untrusted input was refused before it reached the node, the label values
#: of ``sessiontree_rejected_inputs_total`` (``NodeMetrics.rejected_input``).
#: Any other reason is counted as ``other``, so the label set stays bounded.
REJECT_REASONS: tuple[str, ...] = (
    "invalid_field",
    "malformed",
    "too_deep",
    "too_large",
    "unknown_agent",
    "unknown_field",
    "unknown_session",
    "unsupported_media_type",
    "other",
)
#: The reason under which the node's own refusals (``Node.rejected_input``:
#: ``Node.control`` and ``Node.route``) appear in the same family.
NODE_REASON = "refused_by_node"

#: The agent and skill a session is counted under when the node does not know
#: its agent or its skill (label values never come from anywhere else).
OTHER_LABEL = "other"

KINDS: tuple[str, ...] = tuple(kind.value for kind in SessionKind)
LIVE_STATES: tuple[str, ...] = tuple(s.value for s in SessionState if not s.is_terminal)
END_STATES: tuple[str, ...] = tuple(s.value for s in SessionState if s.is_terminal)
_CODES: tuple[str, ...] = tuple(code.value for code in ErrorCode)
_GRACE_OUTCOMES = ("wrapped_up", "forced", "expired")

# Branches live up to 30 min and workers 5 min by default (TTLs run to a week);
# mains live for days.
_DURATION_BUCKETS = (
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    4 * 3600.0, 24 * 3600.0, 7 * 24 * 3600.0,
)  # fmt: skip
# The default grace is 30 s: a wrap-up at exactly 30 s is the deadline.
_GRACE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# State change to delivery happens in one Cortex handler: sub-millisecond.
_DELIVERY_BUCKETS = (
    0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0,
)  # fmt: skip
# One fsync'd commit costs ~1 ms on a local disk.
_COMMIT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.125, 0.25,
    0.5, 1.0,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # the writer caps at 2048

# Model calls are counted by agent, model and tier: bounded label sets, the rest
# folded into "other" (see _metric_models).
_MODEL_LABELS = ("agent", "model", "tier")

# name -> (type, help, label names) of the families read at scrape time
SCRAPED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "sessiontree_sessions": (
        "gauge",
        "Sessions not yet ended, by kind, state, agent and skill.",
        ("kind", "state", "agent", "skill"),
    ),
    "sessiontree_compute_slots_in_use": ("gauge", "Compute slots held by running skills.", ()),
    "sessiontree_compute_slots_waiting": ("gauge", "Sessions queued for a compute slot.", ()),
    "sessiontree_cortex_mailbox_depth": ("gauge", "Messages queued for the Cortex.", ()),
    "sessiontree_work_in_flight": (
        "gauge",
        "Messages queued or being handled by any actor, plus running skills.",
        (),
    ),
    "sessiontree_node_failed": ("gauge", "1 once the Cortex failed and the node refuses work.", ()),
    "sessiontree_compute_slots_limit": (
        "gauge",
        "Limit on skills running at once (max_running_skills).",
        (),
    ),
    "sessiontree_step_threads_limit": (
        "gauge",
        "Limit on threads for sync skills, zombies included (max_step_threads).",
        (),
    ),
    "sessiontree_sessions_limit": ("gauge", "Limit on live sessions (max_sessions).", ()),
    "sessiontree_zombie_threads_limit": (
        "gauge",
        "Limit on abandoned skill threads before spawns are refused (max_zombies).",
        (),
    ),
    "sessiontree_grace_period_seconds": (
        "gauge",
        "Time a cancelled session has to wrap up before it is terminated by force.",
        (),
    ),
    "sessiontree_memory_high_ratio": (
        "gauge",
        "Memory use (a fraction of what the node may use) at which branches are suspended.",
        (),
    ),
    "sessiontree_memory_low_ratio": (
        "gauge",
        "Memory use below which branches suspended by memory pressure are resumed.",
        (),
    ),
    "sessiontree_retries": (
        "counter",
        "Failed attempts of coordination patterns that were retried as fresh sessions.",
        (),
    ),
    "sessiontree_retry_escalations": (
        "counter",
        "Retries refused at the restart intensity limit (the pattern escalated).",
        (),
    ),
    "sessiontree_rejected_inputs": (
        "counter",
        f"Untrusted inputs refused, by reason ({NODE_REASON}: by Node.control or Node.route).",
        ("reason",),
    ),
    "sessiontree_zombie_threads": (
        "gauge",
        "Threads of sync skills terminated by force that have not returned yet.",
        (),
    ),
    "sessiontree_step_threads": ("gauge", "Threads held by live sessions' sync skills.", ()),
    "sessiontree_indexed_sessions": (
        "gauge",
        "Sessions in the Cortex's index, retained ended ones included.",
        (),
    ),
    "sessiontree_result_waiters": ("gauge", "Callers waiting for a session's result.", ()),
    "sessiontree_session_mailbox_depth": (
        "gauge",
        "Messages queued in the mailboxes of all session actors.",
        (),
    ),
    "sessiontree_rejected_messages": (
        "counter",
        "Messages the Cortex or a session actor did not take.",
        (),
    ),
    "sessiontree_fenced_refusals": (
        "counter",
        "Results, writes, spawns or messages of fenced sessions that were refused.",
        (),
    ),
    "sessiontree_stuck_flags": (
        "counter",
        "Sessions flagged as stuck (no checkpoint for stuck_after).",
        (),
    ),
    "sessiontree_memory_used_ratio": (
        "gauge",
        "Memory in use as a fraction of what the node may use, at the last periodic check "
        "(NaN: no reading).",
        (),
    ),
    "sessiontree_memory_pressure_suspensions": (
        "counter",
        "Branches asked to suspend because memory use reached the high mark.",
        (),
    ),
    "sessiontree_memory_pressure_resumptions": (
        "counter",
        "Branches suspended by memory pressure that were resumed below the low mark.",
        (),
    ),
    "sessiontree_memory_pressure_suspended": (
        "gauge",
        "Branches memory pressure holds suspended (or has asked to suspend).",
        (),
    ),
    "sessiontree_main_cycles_failed": ("counter", "Message cycles of mains that raised.", ()),
    "sessiontree_main_cycles_refused": (
        "counter",
        "Message cycles of mains the store refused a write of (kept, run again).",
        (),
    ),
    "sessiontree_store_held_mains": (
        "gauge",
        "Mains whose cycle the store refused, waiting for it to take writes.",
        (),
    ),
    "sessiontree_store_write_errors": (
        "counter",
        "Store writes of the Cortex that were refused or failed.",
        (),
    ),
    "sessiontree_budget_warnings": (
        "counter",
        "Budgets whose soft threshold was crossed (one warning per budget, a Main's per cycle).",
        (),
    ),
    "sessiontree_budgets_exhausted": (
        "counter",
        "Budgets whose hard limit was reached: a model call or spawn was refused.",
        (),
    ),
    "sessiontree_model_calls": (
        "counter",
        "Model calls sent to a provider (failed ones included), by agent, model and tier.",
        _MODEL_LABELS,
    ),
    "sessiontree_model_call_errors": (
        "counter",
        "Model calls that failed after their retries or replied without usage.",
        _MODEL_LABELS,
    ),
    "sessiontree_model_tokens": (
        "counter",
        "Tokens of model calls, by kind (prompt, completion): as providers reported them "
        "(a cancelled call's prompt as estimated).",
        (*_MODEL_LABELS, "kind"),
    ),
    "sessiontree_model_cost": (
        "counter",
        "Cost of model calls, in the currency of the providers' price tables.",
        _MODEL_LABELS,
    ),
    "sessiontree_recovery_decisions": (
        "counter",
        "Interrupted work recovery classified at this start, by decision (fresh, stale, wedged).",
        ("decision",),
    ),
    "sessiontree_replay_held": (
        "gauge",
        "1 while replay is held back because the node kept crashing (restart intensity).",
        (),
    ),
    "sessiontree_wedged_items": (
        "gauge",
        "Work recovery held back (wedged or stale) and not yet requeued or dropped.",
        (),
    ),
    "sessiontree_spans_exported": (
        "counter",
        "Spans a traced node exported (NodeConfig.tracing).",
        (),
    ),
    "sessiontree_spans_dropped": (
        "counter",
        "Spans a traced node dropped: its export queue was full, or an export failed.",
        (),
    ),
    "sessiontree_store_map_used_bytes": ("gauge", "Bytes of the LMDB map in use.", ()),
    "sessiontree_store_map_size_bytes": ("gauge", "Size of the LMDB map.", ()),
    "sessiontree_store_readers": ("gauge", "LMDB reader slots in use.", ()),
    "sessiontree_store_commit_errors": ("counter", "Store commits that failed.", ()),
    "sessiontree_store_map_full": (
        "counter",
        "Store writes refused because the map was full.",
        (),
    ),
}


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """An empty family of ``SCRAPED``; ``KeyError`` for a name not in it."""
    kind, doc, labels = SCRAPED[name]
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


def single(name: str, value: float) -> GaugeMetricFamily | CounterMetricFamily:
    """The unlabelled family ``name`` of ``SCRAPED`` holding one sample, ``value``."""
    found = family(name)
    found.add_metric((), value)
    return found


def session_series(agents: Iterable[Agent]) -> list[tuple[str, str, str]]:
    """The (agent, skill, kind) of every session series a node exposes from the
    start, in registration order: each agent's Mains (its main skill), then
    its Branches and Workers (each of its skills) — 1 + 2 x skills an agent."""
    found: list[tuple[str, str, str]] = []
    for agent in agents:
        found.append((agent.agent_id, agent.main, SessionKind.MAIN.value))
        for skill in agent.skills:
            found.append((agent.agent_id, skill, SessionKind.BRANCH.value))
            found.append((agent.agent_id, skill, SessionKind.WORKER.value))
    return found


class Series:
    """The children of one (agent, skill, kind) in the session families, made
    once, so counting a session's events takes no label lookup; and ``live``,
    its sessions not yet ended by state (kept by ``TreeTracker`` under its lock)."""

    __slots__ = (
        "agent",
        "duration",
        "expired",
        "forced",
        "kind",
        "live",
        "restored",
        "skill",
        "spawned",
        "terminated",
    )

    def __init__(self, families: Families, agent: str, skill: str, kind: str) -> None:
        self.agent, self.skill, self.kind = agent, skill, kind
        self.spawned = families.spawned_family.labels(kind, agent, skill)
        self.restored = families.restored_family.labels(kind, agent, skill)
        self.forced = families.forced_family.labels(kind, agent, skill)
        self.expired = families.expired_family.labels(kind, agent, skill)
        self.duration = families.duration_family.labels(kind, agent, skill)
        terminated = families.terminated_family
        self.terminated = {
            state: terminated.labels(kind, state, agent, skill) for state in END_STATES
        }
        self.live = dict.fromkeys(LIVE_STATES, 0)


class Families:
    """The event-fed families of one node, registered in its registry.

    Each family is appended to ``registered`` as soon as it is created, so if a
    later one fails (``ValueError``: its name is taken on a shared registry) the
    caller can take out exactly what was put in. The labelled children are kept
    ready (``grace["forced"]``, the session families' ``Series``): every label
    combination exists from the start, and the hot path skips the label lookup.
    ``agents``: the node's agents, the only source of ``agent`` and ``skill``
    label values.
    """

    def __init__(
        self, r: CollectorRegistry, registered: list[Any], agents: Iterable[Agent] = ()
    ) -> None:
        def add(metric: _M) -> _M:
            registered.append(metric)
            return metric

        session = ["kind", "agent", "skill"]
        self.spawned_family = add(
            Counter(
                "sessiontree_sessions_spawned",
                "Sessions created, by kind, agent and skill.",
                session,
                registry=r,
            )
        )
        self.restored_family = add(
            Counter(
                "sessiontree_sessions_restored",
                "Sessions brought back from the store after a restart.",
                session,
                registry=r,
            )
        )
        rejections = add(
            Counter(
                "sessiontree_spawn_rejections",
                "Spawns refused, by error code.",
                ["code"],
                registry=r,
            )
        )
        self.terminated_family = add(
            Counter(
                "sessiontree_sessions_terminated",
                "Sessions that ended, by kind, final state, agent and skill.",
                ["kind", "state", "agent", "skill"],
                registry=r,
            )
        )
        self.forced_family = add(
            Counter(
                "sessiontree_forced_terminations",
                "Sessions still running at their cancellation deadline, terminated by force.",
                session,
                registry=r,
            )
        )
        self.expired_family = add(
            Counter(
                "sessiontree_ttl_expirations",
                "Sessions that outlived their TTL.",
                session,
                registry=r,
            )
        )
        self.duration_family = add(
            Histogram(
                "sessiontree_session_duration_seconds",
                "Lifetime of ended sessions, from creation to their final state.",
                session,
                buckets=_DURATION_BUCKETS,
                registry=r,
            )
        )
        grace = add(
            Histogram(
                "sessiontree_grace_wrap_up_duration_seconds",
                "From a cancellation request to the session's end, by how it ended.",
                ["outcome"],
                buckets=_GRACE_BUCKETS,
                registry=r,
            )
        )
        self.delivery = add(
            Histogram(
                "sessiontree_result_delivery_latency_seconds",
                "From a session's final state to its result reaching its parent.",
                buckets=_DELIVERY_BUCKETS,
                registry=r,
            )
        )
        self.commit_seconds = add(
            Histogram(
                "sessiontree_store_commit_duration_seconds",
                "Duration of one store commit, puts to durable.",
                buckets=_COMMIT_BUCKETS,
                registry=r,
            )
        )
        self.commit_batches = add(
            Histogram(
                "sessiontree_store_commit_batches",
                "Write batches that shared one store commit.",
                buckets=_BATCH_BUCKETS,
                registry=r,
            )
        )
        # Every label combination exists from the start (and the hot path skips
        # the label lookup): the series never change with the workload.
        self.rejections = {code: rejections.labels(code) for code in _CODES}
        self.grace = {outcome: grace.labels(outcome) for outcome in _GRACE_OUTCOMES}
        registered_agents = tuple(agents)
        self.skills = {agent.agent_id: frozenset(agent.skills) for agent in registered_agents}
        self.series: dict[tuple[str, str, str], Series] = {}
        for key in session_series(registered_agents):
            self.series[key] = Series(self, *key)

    def series_of(self, agent: str | None, skill: str | None, kind: str) -> Series:
        """The series a session of ``agent``, ``skill`` and ``kind`` counts under
        (``kind`` one of ``KINDS``): its own if the node registered that skill
        of that agent, else ``other``'s; made on first use if the node did not
        expose it from the start. Call under the tracker's lock."""
        if agent is not None and skill is not None:
            found = self.series.get((agent, skill, kind))
            if found is not None:
                return found
            if skill not in self.skills.get(agent, ()):
                agent = skill = OTHER_LABEL
        else:
            agent = skill = OTHER_LABEL
        found = self.series.get((agent, skill, kind))
        if found is None:
            found = self.series[(agent, skill, kind)] = Series(self, agent, skill, kind)
        return found
