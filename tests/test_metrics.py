"""The node's Prometheus metrics (``NodeMetrics``): exact values after a known
workload, Prometheus naming rules, ``promtool``, a bounded label set, and a
scrape that survives what it cannot read."""

from __future__ import annotations

import errno
import logging
import pathlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import lmdb
import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily

from sessiontree.actors import AsyncSession, Cancelled, VirtualClock
from sessiontree.actors.runtime import Inspect, Reply, post
from sessiontree.protocol import (
    Budget,
    ErrorCode,
    EscalationError,
    RejectedInputError,
    SessionState,
)
from sessiontree.store import Store, StoreIO, WriteBatch
from sessiontree.supervision import (
    MAX_MODEL_SERIES,
    REJECT_REASONS,
    Agent,
    Event,
    EventKind,
    Node,
    NodeConfig,
    NodeMetrics,
    Price,
    Provider,
    Retry,
)
from sessiontree.supervision._metric_models import OTHER, bounded
from sessiontree.supervision._requests import GetActorRef, GetStats
from sessiontree.testing import StandinServer
from tests._promtool import promtool
from tests.conftest import WAIT, settle

# -- skills ---------------------------------------------------------------------------


def idle_main(session: Any) -> None:
    return None


def quick(session: Any) -> str:
    return "ok"


async def quick_async(session: Any) -> str:
    return "ok"


def crashes(session: Any) -> str:
    raise ValueError("model refused")


def waits(session: Any) -> str:
    session.sleep(10_000)
    return "never"


async def holds(session: Any) -> str:
    await session.sleep(1e9)
    return "never"


def wraps_up(session: Any) -> str:
    try:
        session.sleep(10_000)
    except Cancelled:
        return "partial"
    return "finished"


def make_agent(release: threading.Event, caught: threading.Event, **options: Any) -> Agent:
    def ignores_cancel(session: Any) -> str:
        try:
            session.sleep(10_000)
        except Cancelled:
            caught.set()
            release.wait(WAIT)  # keeps "working" past any grace
        return "too late"

    skills = {
        "main": idle_main,
        "quick": quick,
        "quick_async": quick_async,
        "crashes": crashes,
        "waits": waits,
        "holds": holds,
        "wraps_up": wraps_up,
        "ignores_cancel": ignores_cancel,
    }
    return Agent("agent", skills, **options)


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture
def watch() -> Iterator[Callable[..., NodeMetrics]]:
    """``NodeMetrics`` for a node; every one is closed after the test."""
    made: list[NodeMetrics] = []

    def make(node: Node, registry: CollectorRegistry | None = None, **options: Any) -> NodeMetrics:
        metrics = NodeMetrics(node, registry, **options)
        made.append(metrics)
        return metrics

    yield make
    for metrics in made:
        metrics.close()


@pytest.fixture
def store_node(
    clock: VirtualClock, tmp_path: pathlib.Path, release: threading.Event, caught: threading.Event
) -> Iterator[Node]:
    """A node on the virtual clock with a real LMDB store in ``tmp_path``."""
    node = Node(
        [make_agent(release, caught)], NodeConfig(grace=30.0), clock=clock, store=tmp_path / "db"
    )
    yield node
    release.set()
    node.shutdown(grace=0, timeout=5.0)


def value(metrics: NodeMetrics, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (as
    PromQL's ``sum`` over the other labels); fails the test if there is none."""
    found = [
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]
    assert found, f"no series {name}{labels}"
    return sum(found)


def series(metrics: NodeMetrics) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every series of the registry: (sample name, labels)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in metrics.registry.collect()
        for sample in family.samples
    }


def families(exposition: bytes) -> dict[str, str]:
    """Family name -> type, from the ``# TYPE`` lines of an exposition."""
    found = re.findall(r"^# TYPE (\S+) (\S+)$", exposition.decode(), flags=re.MULTILINE)
    return dict(found)


def workload(node: Node, clock: VirtualClock, caught: threading.Event) -> None:
    """Spawns, a crash, a TTL expiry, a cancel wrapped up in grace, a forced
    termination (its thread left a zombie) and a refused spawn. The clock moves
    60 s for the TTL, then 30 s for the grace."""
    main = node.main("agent")
    quick_ref = main.spawn(kind="branch", skill="quick").ref
    assert quick_ref is not None
    assert quick_ref.wait(WAIT).status is SessionState.COMPLETED
    crash_ref = main.spawn(kind="worker", skill="crashes").ref
    assert crash_ref is not None
    assert crash_ref.wait(WAIT).status is SessionState.FAILED

    expiring = main.spawn(kind="branch", skill="waits", ttl=60.0).ref
    assert expiring is not None
    settle(node)
    clock.advance(60.0)
    assert expiring.wait(WAIT).error.code is ErrorCode.TTL_EXPIRED
    settle(node)

    wrapping = main.spawn(kind="branch", skill="wraps_up").ref
    assert wrapping is not None
    settle(node)
    assert wrapping.cancel() is None
    result = wrapping.wait(WAIT)
    assert result.error.code is ErrorCode.CANCELLED
    assert result.summary == "partial"

    stubborn = main.spawn(kind="branch", skill="ignores_cancel").ref
    assert stubborn is not None
    settle(node)
    assert stubborn.cancel() is None
    assert caught.wait(WAIT)  # it took its Cancelled and keeps running
    clock.advance(30.0)
    assert stubborn.wait(WAIT).error.code is ErrorCode.TERMINATED_BY_FORCE

    refused = node.spawn(uuid.uuid4(), kind="branch", task="no such parent")
    assert refused.error is not None
    assert refused.error.code is ErrorCode.UNKNOWN_SESSION


# -- values ---------------------------------------------------------------------------


def test_a_known_workload_gives_exact_counters_gauges_and_histograms(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    clock: VirtualClock,
    release: threading.Event,
    caught: threading.Event,
) -> None:
    node = make_node(make_agent(release, caught), grace=30.0)
    metrics = watch(node)
    workload(node, clock, caught)

    spawned = {k: value(metrics, "sessiontree_sessions_spawned_total", kind=k) for k in KINDS}
    assert spawned == {"main": 1.0, "branch": 4.0, "worker": 1.0}
    ended = {
        (k, s): value(metrics, "sessiontree_sessions_terminated_total", kind=k, state=s)
        for k in KINDS
        for s in END_STATES
    }
    assert {key: n for key, n in ended.items() if n} == {
        ("branch", "completed"): 1.0,
        ("worker", "failed"): 1.0,
        ("branch", "expired"): 1.0,
        ("branch", "cancelled"): 2.0,
    }
    for kind in KINDS:
        forced = value(metrics, "sessiontree_forced_terminations_total", kind=kind)
        expired = value(metrics, "sessiontree_ttl_expirations_total", kind=kind)
        assert (forced, expired) == ((1.0, 1.0) if kind == "branch" else (0.0, 0.0))
    rejections = {c.value: value(metrics, "sessiontree_spawn_rejections_total", code=c.value)
                  for c in ErrorCode}  # fmt: skip
    assert {code: n for code, n in rejections.items() if n} == {"unknown_session": 1.0}

    live = {
        (k, s): value(metrics, "sessiontree_sessions", kind=k, state=s)
        for k in KINDS
        for s in ("pending", "active", "suspended")
    }
    assert {key: n for key, n in live.items() if n} == {("main", "active"): 1.0}

    # durations on the virtual clock: 0 (quick), 60 (TTL), 0 (wrapped up), 30 (forced)
    duration = "sessiontree_session_duration_seconds"
    assert value(metrics, f"{duration}_count", kind="branch") == 4.0
    assert value(metrics, f"{duration}_sum", kind="branch") == 90.0
    assert value(metrics, f"{duration}_count", kind="worker") == 1.0
    assert value(metrics, f"{duration}_sum", kind="worker") == 0.0
    assert value(metrics, f"{duration}_count", kind="main") == 0.0
    assert value(metrics, f"{duration}_bucket", kind="branch", le="30.0") == 3.0

    grace = "sessiontree_grace_wrap_up_duration_seconds"
    assert value(metrics, f"{grace}_count", outcome="wrapped_up") == 1.0
    assert value(metrics, f"{grace}_sum", outcome="wrapped_up") == 0.0
    assert value(metrics, f"{grace}_count", outcome="forced") == 1.0
    assert value(metrics, f"{grace}_sum", outcome="forced") == 30.0
    assert value(metrics, f"{grace}_bucket", outcome="forced", le="20.0") == 0.0
    assert value(metrics, f"{grace}_bucket", outcome="forced", le="30.0") == 1.0
    assert value(metrics, f"{grace}_count", outcome="expired") == 0.0

    delivery = "sessiontree_result_delivery_latency_seconds"
    assert value(metrics, f"{delivery}_count") == 5.0  # every child's result reached main
    assert value(metrics, f"{delivery}_sum") == 0.0  # in the same handler, on a still clock

    # read at scrape time: the forced sync skill's thread is a zombie until it returns
    assert value(metrics, "sessiontree_zombie_threads") == 1.0
    assert value(metrics, "sessiontree_grace_period_seconds") == 30.0
    assert value(metrics, "sessiontree_zombie_threads_limit") == 64.0
    release.set()
    settle(node)
    assert value(metrics, "sessiontree_zombie_threads") == 0.0
    # the expired skill's checkpoint, and the forced one's late "too late"
    assert value(metrics, "sessiontree_fenced_refusals_total") == 2.0
    assert value(metrics, "sessiontree_step_threads") == 0.0
    assert value(metrics, "sessiontree_compute_slots_in_use") == 0.0
    assert value(metrics, "sessiontree_cortex_mailbox_depth") == 0.0
    assert value(metrics, "sessiontree_node_failed") == 0.0
    stats = node.stats()
    assert sum(live.values()) == stats["live_sessions"]
    assert value(metrics, "sessiontree_indexed_sessions") == stats["indexed_sessions"]


KINDS = ("main", "branch", "worker")
END_STATES = ("completed", "failed", "expired", "cancelled")


def test_every_family_is_prefixed_counters_end_in_total_and_no_label_is_an_id(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    clock: VirtualClock,
    release: threading.Event,
    caught: threading.Event,
) -> None:
    node = make_node(make_agent(release, caught), grace=30.0)
    metrics = watch(node)
    workload(node, clock, caught)
    metrics.rejected_input("too_large")
    typed = families(metrics.exposition())
    assert typed
    for name, kind in typed.items():
        assert name.startswith("sessiontree_"), name
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
    labels = {value for _, pairs in series(metrics) for _, value in pairs}
    for label in labels:
        with pytest.raises(ValueError, match=r"UUID|hexadecimal"):
            uuid.UUID(label)


def test_promtool_accepts_the_exposition_of_a_node_with_a_store(
    store_node: Node,
    watch: Callable[..., NodeMetrics],
    clock: VirtualClock,
    caught: threading.Event,
) -> None:
    metrics = watch(store_node)
    workload(store_node, clock, caught)
    text = metrics.exposition()
    assert b"sessiontree_store_map_used_bytes" in text
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    assert metrics.content_type.startswith("text/plain")


# -- bounded ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_series_are_the_same_before_and_after_ten_thousand_sessions(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    release: threading.Event,
    caught: threading.Event,
) -> None:
    node = make_node(
        make_agent(release, caught, max_children=100), retain_terminal=200, max_retained_results=50
    )
    metrics = watch(node)
    holder = node.main("agent").spawn(kind="branch", skill="holds").ref
    assert holder is not None
    settle(node)
    before = series(metrics)
    started = time.monotonic()
    for _ in range(100):
        refs = [node.spawn(holder, kind="worker", skill="quick_async").ref for _ in range(100)]
        for ref in refs:
            assert ref is not None
            assert ref.wait(WAIT).status is SessionState.COMPLETED
    settle(node)
    elapsed = time.monotonic() - started
    assert series(metrics) == before
    assert value(metrics, "sessiontree_sessions_spawned_total", kind="worker") == 10_000.0
    assert value(metrics, "sessiontree_session_duration_seconds_count", kind="worker") == 10_000
    assert value(metrics, "sessiontree_sessions", kind="worker", state="active") == 0.0
    assert value(metrics, "sessiontree_sessions", kind="branch", state="active") == 1.0
    assert metrics._tracker.live.keys() == {holder.session_id, node.main("agent").session_id}
    assert not metrics._tracker.ended_at
    assert elapsed < 60.0, f"10,000 sessions took {elapsed:.1f} s"


# -- by agent and skill -----------------------------------------------------------------------


def test_sessions_are_counted_by_agent_and_skill(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    clock: VirtualClock,
    release: threading.Event,
    caught: threading.Event,
) -> None:
    node = make_node(make_agent(release, caught), grace=30.0)
    metrics = watch(node)
    workload(node, clock, caught)

    def of(name: str, skill: str, **labels: str) -> float:
        return value(metrics, name, agent="agent", skill=skill, **labels)

    skills = ("main", "quick", "crashes", "waits", "wraps_up", "ignores_cancel", "holds")
    spawned = {skill: of("sessiontree_sessions_spawned_total", skill) for skill in skills}
    assert spawned == {
        "main": 1.0, "quick": 1.0, "crashes": 1.0, "waits": 1.0, "wraps_up": 1.0,
        "ignores_cancel": 1.0, "holds": 0.0,
    }  # fmt: skip
    ended = "sessiontree_sessions_terminated_total"
    assert of(ended, "quick", kind="branch", state="completed") == 1.0
    assert of(ended, "crashes", kind="worker", state="failed") == 1.0
    assert of(ended, "waits", kind="branch", state="expired") == 1.0
    assert of(ended, "wraps_up", state="cancelled") == 1.0
    assert of(ended, "ignores_cancel", state="cancelled") == 1.0
    assert of(ended, "quick", state="failed") == 0.0
    assert of("sessiontree_ttl_expirations_total", "waits") == 1.0
    assert of("sessiontree_forced_terminations_total", "ignores_cancel") == 1.0
    assert of("sessiontree_forced_terminations_total", "wraps_up") == 0.0
    duration = "sessiontree_session_duration_seconds"
    assert of(f"{duration}_sum", "waits", kind="branch") == 60.0
    assert of(f"{duration}_sum", "ignores_cancel", kind="branch") == 30.0
    assert of(f"{duration}_count", "crashes", kind="worker") == 1.0
    assert of("sessiontree_sessions", "main", kind="main", state="active") == 1.0
    assert value(metrics, "sessiontree_sessions", state="active") == 1.0  # the Main alone


def labelled(metrics: NodeMetrics, name: str) -> set[tuple[str, str, str]]:
    """The (kind, agent, skill) of every sample of ``name``."""
    return {
        (sample.labels["kind"], sample.labels["agent"], sample.labels["skill"])
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def test_the_agent_and_skill_labels_come_only_from_the_registered_agents(
    make_node: Any, watch: Callable[..., NodeMetrics]
) -> None:
    reader = Agent("reader", {"main": idle_main, "read": quick_async, "write": quick})
    solo = Agent("solo", {"only": quick_async})  # its one skill runs its Main and its children
    node = make_node(reader, solo)
    metrics = watch(node)
    before = series(metrics)
    expected = {("main", "reader", "main"), ("main", "solo", "only")} | {
        (kind, agent, skill)
        for agent, skills in (("reader", ("main", "read", "write")), ("solo", ("only",)))
        for skill in skills
        for kind in ("branch", "worker")
    }
    assert len(expected) == (1 + 2 * 3) + (1 + 2 * 1)  # 1 + 2 x skills an agent
    for name in (
        "sessiontree_sessions_spawned_total",
        "sessiontree_sessions_terminated_total",
        "sessiontree_session_duration_seconds_count",
        "sessiontree_sessions",
    ):
        assert labelled(metrics, name) == expected, name

    # what callers send (tasks, keys, a skill the agent lacks) adds no label value
    main = node.main("reader", key="telegram:dm:42")
    for task in ("read chapter 1", "x" * 1000, 'ünïcode {label="injection"}'):
        result = main.run(kind="worker", skill="read", task=task, timeout=WAIT)
        assert result is not None
        assert result.ok
    refused = main.spawn(kind="worker", skill="nosuch", task="other")
    assert refused.error is not None
    assert refused.error.code is ErrorCode.UNKNOWN_SKILL
    assert node.main("solo").run(kind="branch", timeout=WAIT) is not None
    settle(node)
    assert series(metrics) == before
    assert value(metrics, "sessiontree_sessions_spawned_total", agent="reader", skill="read") == 3
    assert value(metrics, "sessiontree_sessions_spawned_total", skill="only", kind="branch") == 1


def test_a_session_of_an_agent_or_skill_the_node_does_not_know_counts_under_other(
    make_node: Any, watch: Callable[..., NodeMetrics]
) -> None:
    """Never from a caller (a spawn names a registered skill or is refused): a
    record of another configuration, as events the tracker is handed."""
    node = make_node(Agent("agent", {"main": idle_main, "quick": quick}))
    metrics = watch(node)
    before = series(metrics)
    strangers = [(uuid.uuid4(), "agent", "retired_skill"), (uuid.uuid4(), "retired_agent", "quick")]
    for sid, agent, skill in strangers:
        metrics._tracker.on_event(
            Event(
                kind=EventKind.SPAWNED,
                at=0.0,
                session_id=sid,
                session_kind="worker",
                agent_id=agent,
                skill=skill,
                state="active",
            )
        )
    other = {"agent": "other", "skill": "other", "kind": "worker"}
    assert value(metrics, "sessiontree_sessions_spawned_total", **other) == 2.0
    assert value(metrics, "sessiontree_sessions", state="active", **other) == 2.0
    metrics._tracker.on_event(
        Event(
            kind=EventKind.TRANSITION,
            at=0.0,
            session_id=strangers[0][0],
            session_kind="worker",
            agent_id="agent",
            skill="retired_skill",
            state="completed",
            previous="active",
        )
    )
    assert value(metrics, "sessiontree_sessions", state="active", **other) == 1.0
    assert value(metrics, "sessiontree_sessions_terminated_total", state="completed", **other) == 1
    added = {labels for _, labels in series(metrics) - before}
    assert all(("agent", "other") in labels and ("skill", "other") in labels for labels in added)
    assert value(metrics, "sessiontree_sessions_spawned_total", agent="agent", skill="quick") == 0


# -- registries, failures ------------------------------------------------------------------


def test_two_nodes_have_independent_registries(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    release: threading.Event,
    caught: threading.Event,
) -> None:
    first = make_node(make_agent(release, caught))
    second = make_node(make_agent(release, caught))
    first_metrics, second_metrics = watch(first), watch(second)
    assert first_metrics.registry is not second_metrics.registry
    ref = first.main("agent").spawn(kind="worker", skill="quick").ref
    assert ref is not None
    ref.wait(WAIT)
    settle(first)
    assert value(first_metrics, "sessiontree_sessions_spawned_total", kind="worker") == 1.0
    assert value(second_metrics, "sessiontree_sessions_spawned_total", kind="worker") == 0.0
    assert value(second_metrics, "sessiontree_sessions", kind="main", state="active") == 0.0
    with pytest.raises(ValueError, match="Duplicated"):
        NodeMetrics(second, first_metrics.registry)


def test_a_name_taken_on_a_shared_registry_refuses_the_metrics_and_leaves_it_as_it_was(
    make_node: Any, release: threading.Event, caught: threading.Event
) -> None:
    registry = CollectorRegistry()
    Gauge("sessiontree_store_readers", "Someone else's figure.", registry=registry)
    node = make_node(make_agent(release, caught))
    with pytest.raises(ValueError, match="Duplicated"):
        NodeMetrics(node, registry)
    names = {family.name for family in registry.collect()}
    assert names == {"sessiontree_store_readers"}
    main = node.main("agent")  # nothing was left subscribed to the node
    settle(node)
    assert main.state is SessionState.ACTIVE


def test_a_section_that_raises_is_logged_and_skipped_and_the_rest_is_served(
    store_node: Node,
    watch: Callable[..., NodeMetrics],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = watch(store_node)
    store = store_node.store
    assert store is not None

    def broken() -> dict[str, Any]:
        raise lmdb.Error("the map went away")

    monkeypatch.setattr(store, "stats", broken)
    with caplog.at_level(logging.WARNING, logger="sessiontree.metrics"):
        text = metrics.exposition()
    assert b"sessiontree_store_map_used_bytes" not in text
    assert b"sessiontree_sessions{" in text
    assert b"sessiontree_zombie_threads " in text
    assert b"sessiontree_store_commit_duration_seconds_count" in text
    assert any("_store_section" in r.getMessage() for r in caplog.records)
    assert promtool("check", "metrics", stdin=text).returncode == 0


def test_another_collector_that_raises_leaves_this_nodes_metrics_served(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    release: threading.Event,
    caught: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def describe(self) -> list[GaugeMetricFamily]:
            return [GaugeMetricFamily("other_thing", "Another library's figure.")]

        def collect(self) -> list[GaugeMetricFamily]:
            raise RuntimeError("broken collector")

    registry = CollectorRegistry()
    node = make_node(make_agent(release, caught))
    metrics = watch(node, registry)
    registry.register(Broken())
    with caplog.at_level(logging.ERROR, logger="sessiontree.metrics"):
        text = metrics.exposition()
    assert b"sessiontree_sessions_spawned_total" in text
    assert b"sessiontree_sessions{" in text
    assert b"other_thing" not in text
    assert caplog.records


def test_a_stopped_node_serves_what_it_still_can(
    make_node: Any, watch: Callable[..., NodeMetrics], release: threading.Event,
    caught: threading.Event, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    node = make_node(make_agent(release, caught))
    metrics = watch(node)
    node.main("agent")
    node.shutdown(grace=0, timeout=5.0)
    with caplog.at_level(logging.WARNING, logger="sessiontree.metrics"):
        text = metrics.exposition()
    assert (
        b'sessiontree_sessions{agent="agent",kind="main",skill="main",state="active"} 1.0' in text
    )
    assert b"\nsessiontree_zombie_threads " not in text  # the Cortex no longer answers
    assert b"\nsessiontree_zombie_threads_limit 64.0" in text
    assert any("_cortex_section" in r.getMessage() for r in caplog.records)


# -- the store ----------------------------------------------------------------------------


def test_store_commits_are_timed_and_sized_with_a_real_store(
    store_node: Node, watch: Callable[..., NodeMetrics]
) -> None:
    metrics = watch(store_node)
    assert value(metrics, "sessiontree_store_commit_duration_seconds_count") == 0.0
    main = store_node.main("agent")
    for _ in range(3):
        ref = main.spawn(kind="branch", skill="quick").ref
        assert ref is not None
        ref.wait(WAIT)
    settle(store_node)
    store = store_node.store
    assert store is not None
    store.flush()
    commits = value(metrics, "sessiontree_store_commit_duration_seconds_count")
    assert commits >= 2
    assert value(metrics, "sessiontree_store_commit_duration_seconds_sum") > 0.0
    assert value(metrics, "sessiontree_store_commit_batches_count") == commits
    assert value(metrics, "sessiontree_store_commit_batches_sum") >= commits
    assert value(metrics, "sessiontree_store_commit_batches_bucket", le="2048.0") == commits
    figures = store.stats()
    assert value(metrics, "sessiontree_store_map_size_bytes") == figures["map_size"]
    assert 0 < value(metrics, "sessiontree_store_map_used_bytes") <= figures["map_size"]
    metrics.close()
    before = figures["commits"]
    store.write(WriteBatch().unwedge(uuid.uuid4()))  # a commit (a flush alone makes none)
    assert store.stats()["commits"] > before  # the writer goes on without the observer


def test_a_commit_observer_that_raises_never_stops_the_writer(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[float, int]] = []

    def broken(seconds: float, batches: int) -> None:
        raise RuntimeError("observer bug")

    with Store(tmp_path / "db") as store:
        unhook_broken = store.observe_commits(broken)
        unhook = store.observe_commits(lambda s, b: seen.append((s, b)))
        with caplog.at_level(logging.ERROR, logger="sessiontree.store"):
            store.write(WriteBatch().unwedge(uuid.uuid4()))  # a flush alone commits nothing
        assert len(seen) == 1
        assert seen[0][0] >= 0.0
        assert seen[0][1] == 1
        assert any("observer" in r.getMessage() for r in caplog.records)
        unhook()
        unhook()  # idempotent
        unhook_broken()
        store.write(WriteBatch().unwedge(uuid.uuid4()))
        assert len(seen) == 1


class FailingIO(StoreIO):
    """Commits fail with EIO while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = threading.Event()

    def commit(self, txn: lmdb.Transaction) -> None:
        if self.failing.is_set():
            raise OSError(errno.EIO, "injected I/O error")
        super().commit(txn)


def test_a_session_whose_record_cannot_be_written_leaves_the_gauge(
    tmp_path: pathlib.Path,
    clock: VirtualClock,
    watch: Callable[..., NodeMetrics],
    release: threading.Event,
    caught: threading.Event,
) -> None:
    io = FailingIO()
    store = Store(tmp_path / "db", io=io)
    node = Node([make_agent(release, caught)], clock=clock, store=store)
    try:
        metrics = watch(node)
        main = node.main("agent")
        settle(node)
        io.failing.set()
        refused = main.spawn(kind="branch", skill="waits")
        io.failing.clear()
        assert refused.error is not None
        assert refused.error.code is ErrorCode.STORE_FAILED
        settle(node)
        assert value(metrics, "sessiontree_sessions", kind="branch", state="active") == 0.0
        assert value(metrics, "sessiontree_sessions", kind="main", state="active") == 1.0
        assert value(metrics, "sessiontree_store_commit_errors_total") >= 1.0
    finally:
        node.shutdown(grace=0, timeout=5.0)
        store.close()


# -- input, retries, late start ---------------------------------------------------------


def test_rejected_inputs_are_counted_by_reason_and_unknown_reasons_as_other(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    release: threading.Event,
    caught: threading.Event,
) -> None:
    node = make_node(make_agent(release, caught))
    metrics = watch(node)
    assert {"too_large", "malformed", "invalid_field", "unknown_field", "too_deep",
            "unknown_session", "other"} <= set(REJECT_REASONS)  # fmt: skip
    metrics.rejected_input("too_large")
    metrics.rejected_input("too_large")
    metrics.rejected_input("malformed")
    metrics.rejected_input("session 6f1c… is bad")  # never a label of its own
    with pytest.raises(RejectedInputError):
        node.control(b"{not json")
    counts = {
        r: value(metrics, "sessiontree_rejected_inputs_total", reason=r)
        for r in (*REJECT_REASONS, "refused_by_node")
    }
    assert {reason: n for reason, n in counts.items() if n} == {
        "too_large": 2.0,
        "malformed": 1.0,
        "other": 1.0,
        "refused_by_node": 1.0,
    }


def test_retries_and_escalations_of_patterns_are_counted(
    make_node: Any, watch: Callable[..., NodeMetrics], clock: VirtualClock
) -> None:
    failures = {"flaky": 1}
    lock = threading.Lock()

    def work(session: Any) -> str:
        with lock:
            left = failures.get(session.task, 0)
            failures[session.task] = max(0, left - 1)
        if left or session.task == "hopeless":
            raise ValueError("model refused")
        return "done"

    node = make_node(Agent("agent", {"main": idle_main, "work": work}), grace=5.0)
    metrics = watch(node)
    main = node.main("agent")
    gathered = node.patterns.fan_out(
        main, ["flaky"], skill="work", retry=Retry(max_attempts=3, initial=0)
    )
    assert gathered.reports[0].ok
    assert value(metrics, "sessiontree_retries_total") == 1.0
    assert value(metrics, "sessiontree_retry_escalations_total") == 0.0
    with pytest.raises(EscalationError, match="escalating"):
        node.patterns.fan_out(
            main, ["hopeless"], skill="work", retry=Retry(max_attempts=3, intensity=0)
        )
    assert value(metrics, "sessiontree_retries_total") == 1.0
    assert value(metrics, "sessiontree_retry_escalations_total") == 1.0


def test_sessions_that_existed_before_the_metrics_are_counted_from_a_snapshot(
    make_node: Any,
    watch: Callable[..., NodeMetrics],
    clock: VirtualClock,
    release: threading.Event,
    caught: threading.Event,
) -> None:
    node = make_node(make_agent(release, caught), grace=30.0)
    main = node.main("agent")
    branch = main.spawn(kind="branch", skill="waits").ref
    assert branch is not None
    settle(node)
    metrics = watch(node)
    assert value(metrics, "sessiontree_sessions", kind="main", state="active") == 1.0
    assert value(metrics, "sessiontree_sessions", kind="branch", state="active") == 1.0
    assert value(metrics, "sessiontree_sessions_spawned_total", kind="branch") == 0.0
    clock.advance(5.0)
    assert branch.cancel() is None
    assert branch.wait(WAIT).status is SessionState.CANCELLED
    settle(node)
    assert value(metrics, "sessiontree_sessions", kind="branch", state="active") == 0.0
    ended = value(
        metrics, "sessiontree_sessions_terminated_total", kind="branch", state="cancelled"
    )
    assert ended == 1.0
    assert value(metrics, "sessiontree_session_duration_seconds_sum", kind="branch") == 5.0
    assert (
        value(metrics, "sessiontree_grace_wrap_up_duration_seconds_count", outcome="wrapped_up")
        == 1.0
    )


def test_close_stops_observing_frees_the_names_and_is_idempotent(
    make_node: Any, release: threading.Event, caught: threading.Event
) -> None:
    node = make_node(make_agent(release, caught))
    registry = CollectorRegistry()
    metrics = NodeMetrics(node, registry)
    metrics.close()
    metrics.close()
    main = node.main("agent")
    settle(node)
    assert [family.name for family in registry.collect()] == []  # nothing left registered
    again = NodeMetrics(node, registry)  # the names are free again
    try:
        assert value(again, "sessiontree_sessions", kind="main", state="active") == 1.0
        assert main.session_id in again._tracker.live
    finally:
        again.close()


def test_sessions_restored_after_a_restart_are_counted_in_their_states(
    tmp_path: pathlib.Path,
    watch: Callable[..., NodeMetrics],
    release: threading.Event,
    caught: threading.Event,
) -> None:
    clock = VirtualClock()
    agent = make_agent(release, caught)
    node = Node([agent], NodeConfig(grace=5.0), clock=clock, store=tmp_path / "db")
    try:
        branch = node.main("agent").spawn(kind="branch", skill="waits").ref
        assert branch is not None
        settle(node)
        assert branch.suspend() is None
        settle(node)
        assert branch.state is SessionState.SUSPENDED
    finally:
        node.shutdown(timeout=WAIT)

    again = Node([agent], NodeConfig(grace=5.0), clock=clock, store=tmp_path / "db")
    try:
        metrics = watch(again)  # the restored branch may come back before or after this
        settle(again)
        assert value(metrics, "sessiontree_sessions", kind="main", state="active") == 1.0
        assert value(metrics, "sessiontree_sessions", kind="branch", state="suspended") == 1.0
        assert value(metrics, "sessiontree_sessions_spawned_total", kind="branch") == 0.0
        clock.advance(3.0)
        assert again.cancel(branch.session_id) is None
        assert again.wait(branch.session_id, WAIT).status is SessionState.CANCELLED
        settle(again)
        assert value(metrics, "sessiontree_sessions", kind="branch", state="suspended") == 0.0
        ended = {
            s: value(metrics, "sessiontree_sessions_terminated_total", kind="branch", state=s)
            for s in END_STATES
        }
        assert ended == {"completed": 0.0, "failed": 0.0, "expired": 0.0, "cancelled": 1.0}
        # from its creation before the restart, on the wall clock
        assert value(metrics, "sessiontree_session_duration_seconds_sum", kind="branch") == 3.0
    finally:
        again.shutdown(grace=0, timeout=5.0)


def test_session_mailbox_depth_counts_messages_waiting_in_session_actors(
    make_node: Any, watch: Callable[..., NodeMetrics]
) -> None:
    # The loop serves every actor: it is held while the Cortex gets the
    # question the metric reads and then the Main's actor a message, so the
    # Cortex (first in the loop's queue) answers with that message still waiting.
    node = make_node(Agent("a", {"main": idle_main}))
    metrics = watch(node)
    main = node.main("a")
    settle(node)
    ref = node._call(GetActorRef(main.session_id))
    inside, gate = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        gate.wait(WAIT)

    node.loop.call_soon_threadsafe(hold)
    asked = Reply()
    try:
        assert inside.wait(WAIT)
        node._send(GetStats(), asked)
        assert post(ref, Inspect(lambda core: None), node.activity)  # behind the question
    finally:
        gate.set()
    assert asked.get(WAIT)["session_mailbox_depth"] >= 1
    settle(node)
    assert value(metrics, "sessiontree_session_mailbox_depth") == 0


# -- model calls and budgets ----------------------------------------------------------------

PRICE = Price(0.001, 0.002)


async def asks(session: AsyncSession) -> str:
    """One model call per word of its task (``-`` for its tier's model, any
    other word names the model); an error reply ends it early."""
    for word in session.task.split():
        reply = await session.complete("a question", model=None if word == "-" else word)
        if reply.error is not None:
            return str(reply.error.code)
    return "answered"


async def asks_until_refused(session: AsyncSession) -> str:
    while True:
        reply = await session.complete("more")
        if reply.error is not None:
            return str(reply.error.code)


@pytest.fixture
def standin() -> Iterator[StandinServer]:
    with StandinServer() as server:
        yield server


@pytest.fixture
def model_node(standin: StandinServer, make_node: Any) -> Node:
    agent = Agent(
        "writer",
        {"main": idle_main, "asks": asks, "asks_until_refused": asks_until_refused},
        main_skill="main",
        models={"small": "cheap", "large": "smart"},
    )
    provider = Provider(
        base_url=standin.url, prices={"cheap": PRICE, "smart": PRICE}, max_retries=0
    )
    return make_node(agent, providers=(provider,), grace=5.0)


def ran(node: Node, kind: str, skill: str, task: str = "", **spec: Any) -> str:
    ref = node.main("writer").spawn(kind=kind, skill=skill, task=task, **spec).ref
    assert ref is not None
    result = ref.wait(WAIT)
    assert result is not None
    return result.summary


def model_series(metrics: NodeMetrics) -> set[tuple[str, str, str]]:
    """The (agent, model, tier) label sets of ``sessiontree_model_calls_total``."""
    return {
        (s.labels["agent"], s.labels["model"], s.labels["tier"])
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "sessiontree_model_calls_total"
    }


def test_model_calls_tokens_and_cost_are_counted_by_agent_model_and_tier(
    model_node: Node, standin: StandinServer, watch: Callable[..., NodeMetrics]
) -> None:
    metrics = watch(model_node)
    seeded = {("writer", "cheap", "small"), ("writer", "smart", "large")}
    assert model_series(metrics) == seeded  # every tier of every agent, from the start
    smart = {"agent": "writer", "model": "smart", "tier": "large"}
    cheap = {"agent": "writer", "model": "cheap", "tier": "small"}
    assert value(metrics, "sessiontree_model_calls_total", **smart) == 0

    assert ran(model_node, "branch", "asks", "- -") == "answered"  # a branch: the large tier
    assert ran(model_node, "worker", "asks", "-") == "answered"  # a worker: the small tier
    standin.fail_next("server_error")
    assert ran(model_node, "worker", "asks", "-") == "model_error"
    settle(model_node)

    assert value(metrics, "sessiontree_model_calls_total", **smart) == 2
    assert value(metrics, "sessiontree_model_calls_total", **cheap) == 2
    assert value(metrics, "sessiontree_model_call_errors_total", **smart) == 0
    assert value(metrics, "sessiontree_model_call_errors_total", **cheap) == 1
    tokens = {
        (labels["model"], kind): value(
            metrics, "sessiontree_model_tokens_total", **labels, kind=kind
        )
        for labels in (smart, cheap)
        for kind in ("prompt", "completion")
    }
    assert sum(tokens.values()) == standin.tokens_served  # the failed call served none
    stats = standin.stats()
    assert tokens[("smart", "prompt")] + tokens[("cheap", "prompt")] == stats.prompt_tokens_served
    for labels in (smart, cheap):
        prompt = tokens[(labels["model"], "prompt")]
        completion = tokens[(labels["model"], "completion")]
        assert value(metrics, "sessiontree_model_cost_total", **labels) == pytest.approx(
            prompt * PRICE.prompt + completion * PRICE.completion
        )
    assert model_series(metrics) == seeded
    checked = promtool("check", "metrics", stdin=metrics.exposition())
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


def test_budget_warnings_and_exhaustions_are_counted(
    model_node: Node, standin: StandinServer, watch: Callable[..., NodeMetrics]
) -> None:
    metrics = watch(model_node)
    assert value(metrics, "sessiontree_budget_warnings_total") == 0
    assert value(metrics, "sessiontree_budgets_exhausted_total") == 0
    summary = ran(model_node, "branch", "asks_until_refused", budget=Budget(calls=2, soft=0.5))
    assert summary == "budget_exhausted"
    assert standin.requests_received == 2  # the third call was refused before it was sent
    settle(model_node)
    assert value(metrics, "sessiontree_budget_warnings_total") == 1  # at the first call of two
    assert value(metrics, "sessiontree_budgets_exhausted_total") == 1
    stats = model_node.stats()
    assert (stats["budget_warnings"], stats["budgets_exhausted"]) == (1, 1)


def test_model_label_sets_past_the_bound_are_counted_as_other(
    model_node: Node, standin: StandinServer, watch: Callable[..., NodeMetrics]
) -> None:
    metrics = watch(model_node, max_model_series=3)
    assert ran(model_node, "worker", "asks", "alpha beta gamma beta -") == "answered"
    settle(model_node)
    assert model_series(metrics) == {
        ("writer", "cheap", "small"),
        ("writer", "smart", "large"),
        ("writer", "alpha", "small"),  # the third label set keeps its own
        ("other", "other", "other"),
    }
    other = {"agent": "other", "model": "other", "tier": "other"}
    assert value(metrics, "sessiontree_model_calls_total", **other) == 3  # beta, gamma, beta
    assert value(metrics, "sessiontree_model_cost_total", **other) == 0  # no price: unpriced
    total = sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "sessiontree_model_tokens_total"
    )
    assert total == standin.tokens_served
    assert MAX_MODEL_SERIES == 64


def test_the_bound_on_model_label_sets_must_be_positive(make_node: Any) -> None:
    node = make_node(Agent("a", {"main": idle_main}))
    with pytest.raises(ValueError, match="max_model_series"):
        NodeMetrics(node, max_model_series=0)


def test_a_model_label_set_never_moves_between_its_own_series_and_other() -> None:
    seeded = [("a", "m", "small")]
    tallies: dict[tuple[tuple[str, str, str], str], float] = {}
    seen: list[set[tuple[str, str, str]]] = []
    for n, model in enumerate(["x", "y", "z", "x", "w", "y"]):
        key = (("a", model, "small"), "calls")
        tallies[key] = tallies.get(key, 0) + 1
        series = bounded(seeded, tallies, limit=2)
        seen.append(set(series))
        assert sum(f["calls"] for f in series.values()) == n + 1
    assert seen[0] == {("a", "m", "small"), ("a", "x", "small")}
    assert all(s == {("a", "m", "small"), ("a", "x", "small"), OTHER} for s in seen[1:])
    assert bounded(seeded, tallies, limit=2)[OTHER]["calls"] == 4  # y, z, w, y
