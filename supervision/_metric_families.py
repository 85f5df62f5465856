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
"""

from __future__ import annotations

from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sessiontree.protocol import ErrorCode, SessionKind, SessionState

__all__ = [
    "END_STATES",
    "KINDS",
    "LIVE_STATES",
    "NODE_REASON",
    "REJECT_REASONS",
    "SCRAPED",
    "Families",
    "family",
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
        "Sessions not yet ended, by kind and state.",
        ("kind", "state"),
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


class Families:
    """The event-fed families of one node, registered in its registry.

    Each family is appended to ``registered`` as soon as it is created, so if a
    later one fails (``ValueError``: its name is taken on a shared registry) the
    caller can take out exactly what was put in. The labelled children are kept
    ready (``spawned["worker"]``…): every label combination exists from the
    start, and the hot path skips the label lookup.
    """

    def __init__(self, r: CollectorRegistry, registered: list[Any]) -> None:
        def add(metric: _M) -> _M:
            registered.append(metric)
            return metric

        spawned = add(
            Counter("sessiontree_sessions_spawned", "Sessions created.", ["kind"], registry=r)
        )
        restored = add(
            Counter(
                "sessiontree_sessions_restored",
                "Sessions brought back from the store after a restart.",
                ["kind"],
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
        terminated = add(
            Counter(
                "sessiontree_sessions_terminated",
                "Sessions that ended, by kind and final state.",
                ["kind", "state"],
                registry=r,
            )
        )
        forced = add(
            Counter(
                "sessiontree_forced_terminations",
                "Sessions still running at their cancellation deadline, terminated by force.",
                ["kind"],
                registry=r,
            )
        )
        expired = add(
            Counter(
                "sessiontree_ttl_expirations",
                "Sessions that outlived their TTL.",
                ["kind"],
                registry=r,
            )
        )
        duration = add(
            Histogram(
                "sessiontree_session_duration_seconds",
                "Lifetime of ended sessions, from creation to their final state.",
                ["kind"],
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
        self.spawned = {kind: spawned.labels(kind) for kind in KINDS}
        self.restored = {kind: restored.labels(kind) for kind in KINDS}
        self.rejections = {code: rejections.labels(code) for code in _CODES}
        self.terminated = {
            (kind, state): terminated.labels(kind, state) for kind in KINDS for state in END_STATES
        }
        self.forced = {kind: forced.labels(kind) for kind in KINDS}
        self.expired = {kind: expired.labels(kind) for kind in KINDS}
        self.duration = {kind: duration.labels(kind) for kind in KINDS}
        self.grace = {outcome: grace.labels(outcome) for outcome in _GRACE_OUTCOMES}
