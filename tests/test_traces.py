"""Traces (issue 24): every session run, Main cycle and model call as a span.

The main check exports to a real Arize Phoenix (``phoenix serve`` from the
``test-traces`` extra) on 127.0.0.1 over OTLP/HTTP and reads the spans back
through its REST API. The others read the spans an in-memory exporter got
(the node's own ``Tracing(exporter=...)``), or count what an endpoint that
does not answer cost.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sessiontree.actors import AsyncSession
from sessiontree.protocol import (
    ErrorCode,
    SessionKind,
    SpawnSpec,
    child_traceparent,
    parse_traceparent,
    sampled_by_ratio,
)
from sessiontree.supervision import (
    Agent,
    Node,
    NodeConfig,
    NodeMetrics,
    Provider,
    Retry,
    TraceIds,
    Tracing,
)
from sessiontree.testing import StandinServer
from tests._processes import stop
from tests._served import ServedNode
from tests.conftest import WAIT

pytestmark = pytest.mark.timeout(180)

FANOUT = 8
MODEL = "trace-model"
PHOENIX_START = 120.0  # real seconds Phoenix may take to answer (its first start migrates)


# -- the agent -------------------------------------------------------------------------


async def inbox(session: AsyncSession) -> None:
    if session.message == "go":
        await session.spawn(kind="branch", skill="parent")


async def parent(session: AsyncSession) -> str:
    specs = [SpawnSpec(kind=SessionKind.WORKER, task=f"task {i}", skill="asks") for i in range(6)]
    specs.append(SpawnSpec(kind=SessionKind.WORKER, skill="crashes"))
    specs.append(SpawnSpec(kind=SessionKind.WORKER, skill="waits"))
    spawned = await session.spawn_many(specs)
    refs = [s.ref for s in spawned]
    assert all(ref is not None for ref in refs)
    for ref in refs[:7]:
        assert ref is not None
        await session.wait(ref.session_id)
    waiting = refs[7]
    assert waiting is not None
    await session.cancel_child(waiting.session_id)
    await session.collect()
    return "done"


async def asks(session: AsyncSession) -> str:
    completion = await session.complete(f"say something about {session.task}")
    assert completion.error is None, completion.error
    return completion.text or ""


async def crashes(session: AsyncSession) -> None:
    raise RuntimeError("a worker crashes")


async def waits(session: AsyncSession) -> None:
    await session.sleep(3600)


def agent() -> Agent:
    return Agent(
        "tracer",
        {
            "inbox": inbox,
            "parent": parent,
            "asks": asks,
            "crashes": crashes,
            "waits": waits,
        },
        main_skill="inbox",
        models={"small": MODEL, "large": MODEL},
    )


# -- Phoenix ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def phoenix_binary() -> str | None:
    beside = Path(sys.executable).with_name("phoenix")
    return str(beside) if beside.exists() else shutil.which("phoenix")


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``phoenix serve`` on 127.0.0.1 (its own ports and working directory);
    yields its base URL. Under CI a missing Phoenix fails, never skips."""
    binary = phoenix_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("phoenix (the test-traces extra) is not installed")
        pytest.skip("phoenix is not installed (pip install -e '.[test-traces]')")
    port, grpc = free_port(), free_port()
    workdir = tmp_path_factory.mktemp("phoenix")
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc),
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (workdir / "phoenix.log").open("wb")
    process = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PHOENIX_START
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v1/projects", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / "phoenix.log").read_bytes()[-2000:].decode(errors="replace")
                pytest.fail(f"phoenix did not start ({process.returncode}): {tail}")
            time.sleep(0.25)
        yield url
    finally:
        stop(process, 15)
        log.close()


def phoenix_spans(url: str, project: str, at_least: int) -> list[dict[str, Any]]:
    """Every span of ``project`` once there are ``at_least`` (bounded wait)."""
    deadline = time.monotonic() + 30.0
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found, cursor = [], None
        while True:
            params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            answer = httpx.get(f"{url}/v1/projects/{project}/spans", params=params, timeout=10)
            if answer.status_code == 404:  # the project appears with its first span
                break
            answer.raise_for_status()
            body = answer.json()
            found.extend(body["data"])
            cursor = body.get("next_cursor")
            if not cursor:
                break
        if len(found) >= at_least:
            return found
        time.sleep(0.2)
    names = sorted(s["name"] for s in found)
    pytest.fail(f"phoenix holds {len(found)} spans of {project}, expected {at_least}: {names}")


def test_a_fan_out_is_the_same_tree_of_spans_in_phoenix(phoenix: str) -> None:
    project = f"fanout-{uuid.uuid4().hex[:8]}"
    # the service name is the Phoenix project too (no resource attribute needed)
    tracing = Tracing(endpoint=f"{phoenix}/v1/traces", service_name=project, schedule_delay=0.1)
    with StandinServer(models=(MODEL,)) as standin:
        config = NodeConfig(tracing=tracing, providers=(Provider(base_url=standin.url),))
        node = Node([agent()], config)
        try:
            main = node.main("tracer")
            assert main.send("go") is None
            deadline = time.monotonic() + WAIT
            while not node.sessions(kind=SessionKind.BRANCH):  # the cycle spawns it
                assert time.monotonic() < deadline, "the message cycle spawned no branch"
                node.wait_idle(0.05)
            branch = node.sessions(kind=SessionKind.BRANCH)[0]
            result = node.ref(branch.session_id).wait(WAIT)
            assert result is not None, "the branch did not end"
            assert result.ok, result
            assert node.wait_idle(WAIT)  # the Main's cycle for that result ran
            branch = node.ref(branch.session_id).info()
            workers = list(node.sessions(kind=SessionKind.WORKER))
            assert len(workers) == FANOUT
            served = standin.tokens_served
        finally:
            node.shutdown()  # ends the cycles' spans and exports what is queued
    # 2 cycles (the message's, the branch result's), 1 branch, 8 workers, 6 model calls
    spans = phoenix_spans(phoenix, project, 2 + 1 + FANOUT + 6)
    assert len(spans) == 17
    by_session = {
        s["attributes"].get("sessiontree.session.id"): s
        for s in spans
        if s["name"].startswith(("branch", "worker"))
    }
    by_id = {s["context"]["span_id"]: s for s in spans}
    cycles = [s for s in spans if s["name"] == "main cycle"]
    first = next(c for c in cycles if c["parent_id"] is None)

    # the tree of spans is the tree of sessions: one span per run, same parents
    branch_span = by_session[str(branch.session_id)]
    assert branch_span["parent_id"] == first["context"]["span_id"]
    assert branch.trace is not None
    assert branch.trace[36:52] == branch_span["context"]["span_id"]
    for info in workers:
        span = by_session[str(info.session_id)]
        assert span["parent_id"] == branch_span["context"]["span_id"]
        assert span["context"]["trace_id"] == first["context"]["trace_id"]
        assert span["attributes"]["sessiontree.session.kind"] == "worker"
        assert span["attributes"]["sessiontree.session.state"] == info.state.value
    # the branch's result runs a cycle of the Main under the branch's span
    second = next(c for c in cycles if c is not first)
    assert second["parent_id"] == branch_span["context"]["span_id"]

    # the crash and the cancellation carry their codes; the crash says why, read back
    crashed = next(s for s in by_session.values() if s["name"] == "worker crashes")
    assert crashed["attributes"]["sessiontree.error.code"] == ErrorCode.CRASHED.value
    assert crashed["status_code"] == "ERROR"
    assert crashed["status_message"] == "RuntimeError: a worker crashes"
    (exception,) = [e for e in crashed["events"] if e["name"] == "exception"]
    assert exception["attributes"]["exception.type"] == "RuntimeError"
    assert exception["attributes"]["exception.message"] == "a worker crashes"
    stack = exception["attributes"]["exception.stacktrace"]
    assert "in crashes" in stack
    assert stack.rstrip().endswith("RuntimeError: a worker crashes")
    # the six runs of one skill are told apart by their tasks
    asking = [s for s in by_session.values() if s["name"] == "worker asks"]
    assert sorted(s["attributes"]["sessiontree.task"] for s in asking) == [
        f"task {i}" for i in range(6)
    ]
    cancelled = next(s for s in by_session.values() if s["name"] == "worker waits")
    assert cancelled["attributes"]["sessiontree.error.code"] == ErrorCode.CANCELLED.value
    assert "cancel_requested" in [e["name"] for e in cancelled["events"]]

    # model calls: children of their workers' spans, tokens adding up to what was served
    calls = [s for s in spans if s["name"] == f"chat {MODEL}"]
    assert len(calls) == 6
    askers = {s["context"]["span_id"] for s in by_session.values() if s["name"] == "worker asks"}
    assert {c["parent_id"] for c in calls} == askers
    for call in calls:
        assert call["attributes"]["gen_ai.operation.name"] == "chat"
        assert call["attributes"]["gen_ai.request.model"] == MODEL
        assert call["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]
        assert "gen_ai.input.messages" not in call["attributes"]  # content is off by default
    tokens = sum(
        c["attributes"]["gen_ai.usage.input_tokens"] + c["attributes"]["gen_ai.usage.output_tokens"]
        for c in calls
    )
    assert tokens == served
    # usage rolls up onto the branch's span
    assert branch_span["attributes"]["sessiontree.usage.calls"] == 6
    assert all(by_id.get(s["parent_id"]) is not None for s in spans if s["parent_id"])


# -- context that travels --------------------------------------------------------------


def spans_of(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(exporter.get_finished_spans())


def traced_config(exporter: InMemorySpanExporter, **fields: Any) -> NodeConfig:
    return NodeConfig(tracing=Tracing(exporter=exporter, schedule_delay=0.05), **fields)


async def done(session: AsyncSession) -> str:
    return "done"


async def parks_forever(session: AsyncSession) -> None:
    await session.sleep(3600)


SIMPLE = Agent(
    "simple", {"main": inbox, "done": done, "parks_forever": parks_forever}, main_skill="main"
)
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_traceparent_sent_over_http_is_the_parent_of_the_spawned_root() -> None:
    exporter = InMemorySpanExporter()
    node = Node([SIMPLE], traced_config(exporter))
    served = ServedNode(node)
    try:
        main = node.main("simple")
        answer = served.http.post(
            f"/v1/sessions/{main.session_id}/children",
            json={"kind": "branch", "skill": "done"},
            headers={"traceparent": CALLER},
        )
        assert answer.status_code == 201, answer.text
        traced = answer.json()["info"]
        malformed = served.http.post(
            f"/v1/sessions/{main.session_id}/children",
            json={"kind": "branch", "skill": "done"},
            headers={"traceparent": "00-not-a-trace-01"},
        )
        assert malformed.status_code == 201, malformed.text  # ignored, the request served
        untraced = malformed.json()["info"]
        assert node.wait_idle(WAIT)
    finally:
        served.close()
        node.shutdown()
    spans = {format(s.context.span_id, "016x"): s for s in spans_of(exporter)}
    root = spans[traced["trace"][36:52]]
    assert format(root.context.trace_id, "032x") == CALLER[3:35]
    assert root.parent is not None
    assert format(root.parent.span_id, "016x") == CALLER[36:52]
    assert traced["trace_parent"] == CALLER
    fresh = spans[untraced["trace"][36:52]]
    assert fresh.parent is None  # a new trace of its own
    assert format(fresh.context.trace_id, "032x") != CALLER[3:35]


def test_a_message_continues_the_callers_span_into_the_cycle() -> None:
    exporter = InMemorySpanExporter()
    node = Node([SIMPLE], traced_config(exporter))
    try:
        main = node.main("simple")
        assert main.send("hello", trace=CALLER) is None
        assert main.send("again", trace="garbage") is None  # malformed: a trace of its own
        assert node.wait_idle(WAIT)
    finally:
        node.shutdown()
    cycles = [s for s in spans_of(exporter) if s.name == "main cycle"]
    assert len(cycles) == 2
    continued = [c for c in cycles if c.parent is not None]
    assert len(continued) == 1
    assert format(continued[0].parent.span_id, "016x") == CALLER[36:52]  # type: ignore[union-attr]


async def parks(session: AsyncSession) -> str:
    """A branch that waits at a checkpoint: a shutdown parks it; after the
    restart it runs again and ends."""
    if session.resumed:
        return "resumed"
    await session.sleep(3600)
    return "never"


PARKING = Agent("parking", {"main": inbox, "parks": parks}, main_skill="main")


def test_a_recovered_branch_starts_a_new_span_linked_to_the_one_cut_off(tmp_path: Path) -> None:
    exporter, later = InMemorySpanExporter(), InMemorySpanExporter()  # a node closes its own
    store = tmp_path / "store"
    first = Node([PARKING], traced_config(exporter, grace=1.0), store=store)
    try:
        main = first.main("parking")
        spawned = main.spawn(kind="branch", skill="parks")
        assert spawned.ref is not None
        branch_id = spawned.ref.session_id
        before = spawned.ref.info().trace
        assert first.wait_idle(WAIT)
    finally:
        first.shutdown(grace=1.0)  # the running branch is parked, to resume after a restart
    assert before is not None
    second = Node([PARKING], traced_config(later), store=store)
    try:
        result = second.ref(branch_id).wait(WAIT)
        assert result is not None
        assert result.summary == "resumed"
        after = second.ref(branch_id).info().trace
    finally:
        second.shutdown()
    assert after is not None
    assert after != before
    spans = {format(s.context.span_id, "016x"): s for s in spans_of(exporter) + spans_of(later)}
    cut = spans[before[36:52]]
    assert "node_closed" in [e.name for e in cut.events]  # ended by the first node's close
    rerun = spans[after[36:52]]
    assert rerun.parent is None
    assert cut.parent is None
    assert [format(link.context.span_id, "016x") for link in rerun.links] == [before[36:52]]


def test_a_skill_runs_with_its_span_as_the_current_one() -> None:
    from opentelemetry import trace  # noqa: PLC0415 - the API a skill's own code uses

    seen: list[str] = []

    async def looks(session: AsyncSession) -> str:
        context = trace.get_current_span().get_span_context()
        seen.append(f"{context.trace_id:032x}-{context.span_id:016x}")
        return session.traceparent or ""

    exporter = InMemorySpanExporter()
    node = Node(
        [Agent("looks", {"main": inbox, "looks": looks}, main_skill="main")],
        traced_config(exporter),
    )
    try:
        main = node.main("looks")
        result = main.run(kind="worker", skill="looks", timeout=WAIT)
    finally:
        node.shutdown()
    assert result is not None
    assert result.summary
    assert seen == [result.summary[3:52]]


# -- spans that say why and what --------------------------------------------------------


class DiskFullError(OSError):
    """An exception of the application's own (its type is module-qualified)."""


async def reads(session: AsyncSession) -> str:
    if session.task.startswith("crash"):
        raise DiskFullError(f"no room left for {session.task}")
    if session.task.startswith("oops"):
        raise RuntimeError("a plain crash")
    if session.task.startswith("shout"):
        raise RuntimeError("A" * 20_000)
    return session.task


async def fails_its_cycle(session: AsyncSession) -> None:
    if session.message == "raise":
        raise ValueError("the cycle cannot parse this message")


READER = Agent(
    "reader",
    {"main": fails_its_cycle, "read": reads, "parks_forever": parks_forever},
    main_skill="main",
)


def span_of(exporter: InMemorySpanExporter, session_id: uuid.UUID) -> ReadableSpan:
    found = [
        s
        for s in spans_of(exporter)
        if (s.attributes or {}).get("sessiontree.session.id") == str(session_id)
        and s.name != "main cycle"
    ]
    assert len(found) == 1, [s.name for s in spans_of(exporter)]
    return found[0]


def test_a_crashed_sessions_span_carries_the_exception_type_message_and_stack() -> None:
    exporter = InMemorySpanExporter()
    node = Node([READER], traced_config(exporter))
    try:
        main = node.main("reader")
        crashed = main.spawn(kind="worker", skill="read", task="crash chapter 3").ref
        plain = main.spawn(kind="worker", skill="read", task="oops").ref
        assert crashed is not None
        assert plain is not None
        result = crashed.wait(WAIT)
        assert plain.wait(WAIT) is not None
        assert node.flush_traces(WAIT)
    finally:
        node.shutdown()
    assert result is not None
    assert result.error is not None
    assert result.error.code is ErrorCode.CRASHED
    span = span_of(exporter, crashed.session_id)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "DiskFullError: no room left for crash chapter 3"
    (exception,) = [e for e in span.events if e.name == "exception"]
    attributes = dict(exception.attributes or {})
    assert attributes["exception.type"] == f"{__name__}.DiskFullError"
    assert attributes["exception.message"] == "no room left for crash chapter 3"
    stack = attributes["exception.stacktrace"]
    assert isinstance(stack, str)
    assert stack == result.error.detail["traceback"]  # the result's own traceback
    assert "in reads" in stack
    assert stack.rstrip().endswith("DiskFullError: no room left for crash chapter 3")
    assert exception.timestamp == span.end_time
    # a builtin exception is named as a traceback names it
    (builtin,) = [e for e in span_of(exporter, plain.session_id).events if e.name == "exception"]
    assert (builtin.attributes or {})["exception.type"] == "RuntimeError"


def test_a_huge_crash_is_clipped_on_its_span_keeping_the_end_of_its_stack() -> None:
    exporter = InMemorySpanExporter()
    node = Node([READER], traced_config(exporter))
    try:
        result = node.main("reader").run(kind="worker", skill="read", task="shout", timeout=WAIT)
        assert node.flush_traces(WAIT)
    finally:
        node.shutdown()
    assert result is not None
    assert result.error is not None
    (span,) = [s for s in spans_of(exporter) if s.name == "worker read"]
    assert span.status.description is not None
    assert len(span.status.description) == 4096
    (exception,) = [e for e in span.events if e.name == "exception"]
    attributes = exception.attributes or {}
    assert len(str(attributes["exception.message"])) == 4096
    stack = str(attributes["exception.stacktrace"])
    assert len(stack) == 16_384
    assert stack.startswith("...\n")
    assert stack.endswith(result.error.detail["traceback"][-1000:])  # the raise is kept


def test_an_ending_that_is_no_crash_has_no_exception_event() -> None:
    exporter = InMemorySpanExporter()
    node = Node([READER], traced_config(exporter, grace=0.0))
    try:
        main = node.main("reader")
        done_ref = main.spawn(kind="worker", skill="read", task="fine").ref
        expiring = main.spawn(kind="branch", skill="parks_forever", ttl=0.05).ref
        cancelled = main.spawn(kind="branch", skill="parks_forever").ref
        assert done_ref is not None
        assert expiring is not None
        assert cancelled is not None
        assert node.wait_idle(WAIT)
        assert node.cancel(cancelled) is None
        for ref in (done_ref, expiring, cancelled):
            assert ref.wait(WAIT) is not None
        assert node.flush_traces(WAIT)
    finally:
        node.shutdown()
    for ref in (done_ref, expiring, cancelled):
        assert "exception" not in [e.name for e in span_of(exporter, ref.session_id).events]
    assert span_of(exporter, done_ref.session_id).status.status_code is StatusCode.UNSET
    expired = span_of(exporter, expiring.session_id)
    assert expired.status.status_code is StatusCode.ERROR
    assert expired.status.description is not None
    assert "ttl" in expired.status.description.lower()


def test_a_main_cycle_that_raises_carries_the_exception_and_its_skill() -> None:
    exporter = InMemorySpanExporter()
    node = Node([READER], traced_config(exporter))
    try:
        main = node.main("reader")
        assert main.send("raise") is None
        assert node.wait_idle(WAIT)
        assert node.flush_traces(WAIT)
    finally:
        node.shutdown()
    (cycle,) = [s for s in spans_of(exporter) if s.name == "main cycle"]
    assert cycle.attributes is not None
    assert cycle.attributes["sessiontree.skill"] == "main"
    assert cycle.status.status_code is StatusCode.ERROR
    (exception,) = [e for e in cycle.events if e.name == "exception"]
    attributes = exception.attributes or {}
    assert attributes["exception.type"] == "ValueError"
    assert attributes["exception.message"] == "the cycle cannot parse this message"
    assert "in fails_its_cycle" in str(attributes["exception.stacktrace"])


def test_runs_of_one_skill_are_told_apart_by_their_task() -> None:
    exporter = InMemorySpanExporter()
    node = Node([READER], traced_config(exporter))
    long_task = "summarise " + "the whole book " * 40
    tasks = ["chapter 1", "chapter 2", "chapter 3", long_task, ""]
    try:
        main = node.main("reader")
        refs = [main.spawn(kind="worker", skill="read", task=task).ref for task in tasks]
        for ref in refs:
            assert ref is not None
            assert ref.wait(WAIT) is not None
        assert node.flush_traces(WAIT)
    finally:
        node.shutdown()
    spans = [span_of(exporter, ref.session_id) for ref in refs if ref is not None]
    assert {s.name for s in spans} == {"worker read"}  # the name stays low in cardinality
    for span, task in zip(spans[:3], tasks[:3], strict=True):
        assert span.attributes is not None
        assert span.attributes["sessiontree.task"] == task
        assert span.attributes["input.value"] == task  # what Phoenix shows as the input
        assert span.attributes["input.mime_type"] == "text/plain"
        assert span.attributes["sessiontree.skill"] == "read"
    clipped = (spans[3].attributes or {})["sessiontree.task"]
    assert isinstance(clipped, str)
    assert len(clipped) == 200
    assert clipped == long_task[:199] + "\u2026"
    assert "sessiontree.task" not in (spans[4].attributes or {})  # no task, no attribute


def test_the_service_name_is_the_phoenix_project_unless_the_resource_names_one() -> None:
    named, overridden = InMemorySpanExporter(), InMemorySpanExporter()
    configs = [
        NodeConfig(tracing=Tracing(exporter=named, service_name="research-bot")),
        NodeConfig(
            tracing=Tracing(
                exporter=overridden,
                service_name="research-bot",
                resource={"openinference.project.name": "staging"},
            )
        ),
    ]
    for config in configs:
        node = Node([READER], config)
        try:
            assert node.main("reader").run(kind="worker", skill="read", timeout=WAIT) is not None
        finally:
            node.shutdown()
    for exporter, project in ((named, "research-bot"), (overridden, "staging")):
        spans = spans_of(exporter)
        assert spans
        for span in spans:
            assert span.resource.attributes["service.name"] == "research-bot"
            assert span.resource.attributes["openinference.project.name"] == project


# -- off costs nothing, a dead endpoint costs little ------------------------------------


def test_a_node_that_is_not_traced_names_no_spans() -> None:
    node = Node([SIMPLE])
    try:
        main = node.main("simple")
        spawned = main.spawn(kind="branch", skill="done")
        assert spawned.ref is not None
        assert spawned.ref.info().trace is None
        assert node.spans_dropped == 0
        assert not node.flush_traces()
    finally:
        node.shutdown()


def test_a_node_that_is_not_traced_never_imports_the_sdk() -> None:
    script = (
        "import sys\n"
        "from sessiontree.supervision import Agent, Node\n"
        "async def done(s): return 'ok'\n"
        "node = Node([Agent('a', {'main': done, 'done': done}, main_skill='main')])\n"
        "result = node.main('a').run(kind='worker', skill='done', timeout=30)\n"
        "node.shutdown()\n"
        "assert result is not None and result.ok, result\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"


def test_an_unreachable_endpoint_never_holds_a_session_and_drops_are_counted() -> None:
    closed = free_port()  # nothing listens there
    tracing = Tracing(
        endpoint=f"http://127.0.0.1:{closed}/v1/traces",
        max_queue_size=4,
        max_export_batch_size=4,
        schedule_delay=0.05,
        export_timeout=0.5,
    )
    node = Node([SIMPLE], NodeConfig(tracing=tracing))
    metrics = NodeMetrics(node)
    started = time.monotonic()
    try:
        main = node.main("simple")
        results = [main.run(kind="worker", skill="done", timeout=WAIT) for _ in range(40)]
        assert all(r is not None and r.ok for r in results)
        ran = time.monotonic() - started
    finally:
        node.shutdown()
    closing = time.monotonic() - started - ran
    assert closing < 2 * tracing.export_timeout + 5.0  # the export thread is bounded
    assert node.spans_dropped >= 40 - tracing.max_queue_size
    assert node.spans_exported == 0
    assert f"sessiontree_spans_dropped_total {float(node.spans_dropped)}" in (
        metrics.exposition().decode()
    )
    assert not [t for t in threading.enumerate() if "OtelBatch" in t.name]


# -- the W3C header and sampling -------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # upper case
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",  # 00 has no more
        "x" * 600,
    ],
)
def test_a_malformed_traceparent_is_ignored(header: str) -> None:
    assert parse_traceparent(header) is None


def test_a_traceparent_of_a_later_version_is_read_by_its_first_fields() -> None:
    later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes-next"
    assert parse_traceparent(later) == CALLER
    assert parse_traceparent(f" {CALLER} ") == CALLER
    assert parse_traceparent(42) is None


def test_a_child_span_keeps_its_trace_and_sampling_and_a_root_follows_the_ratio() -> None:
    child = child_traceparent(CALLER)
    assert child[:36] == CALLER[:36]
    assert child[-2:] == "01"
    assert child[36:52] != CALLER[36:52]
    roots = [child_traceparent(None, 0.25) for _ in range(2000)]
    sampled = [r for r in roots if r.endswith("-01")]
    assert 300 < len(sampled) < 700  # about a quarter
    assert all(sampled_by_ratio(int(r[3:35], 16), 0.25) == r.endswith("-01") for r in roots)
    assert not any(child_traceparent(None, 0.0).endswith("-01") for _ in range(100))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({}, "endpoint"),
        ({"endpoint": "http://127.0.0.1:1/v1/traces", "sampling_ratio": 1.5}, "sampling_ratio"),
        ({"endpoint": "http://127.0.0.1:1/v1/traces", "max_queue_size": 0}, "max_queue_size"),
        ({"endpoint": "http://127.0.0.1:1/v1/traces", "export_timeout": 0}, "export_timeout"),
        (
            {
                "endpoint": "http://127.0.0.1:1/v1/traces",
                "max_queue_size": 4,
                "max_export_batch_size": 8,
            },
            "max_export_batch_size",
        ),
    ],
)
def test_a_bad_tracing_setting_is_refused_naming_it(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Tracing(**fields)


def test_the_node_command_takes_its_tracing_from_flags(tmp_path: Path) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from sessiontree.cli import main as cli  # noqa: PLC0415

    runner = CliRunner()
    bad = runner.invoke(
        cli, ["node", "start", "--store", str(tmp_path / "s"), "--otlp-header", "nokey"]
    )
    assert bad.exit_code == 2
    assert "NAME=VALUE" in bad.output
    lonely = runner.invoke(
        cli, ["node", "start", "--store", str(tmp_path / "s"), "--trace-sampling", "0.5"]
    )
    assert lonely.exit_code == 2
    assert "--otlp-endpoint" in lonely.output


def test_a_skills_log_records_carry_its_span() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    handler.addFilter(TraceIds())
    skill_log = logging.getLogger("tests.traces.skill")
    skill_log.addHandler(handler)
    skill_log.setLevel(logging.INFO)

    async def logs(session: AsyncSession) -> str:
        skill_log.info("working on %s", session.task)
        return session.traceparent or ""

    node = Node(
        [Agent("logs", {"main": inbox, "logs": logs}, main_skill="main")],
        traced_config(InMemorySpanExporter()),
    )
    try:
        result = node.main("logs").run(kind="worker", skill="logs", task="t", timeout=WAIT)
        skill_log.info("outside any span")
    finally:
        node.shutdown()
        skill_log.removeHandler(handler)
    assert result is not None
    inside, outside = records
    assert (inside.otelTraceID, inside.otelSpanID) == (result.summary[3:35], result.summary[36:52])
    assert inside.trace == f" [trace={result.summary[3:35]} span={result.summary[36:52]}]"
    assert (outside.otelTraceID, outside.trace) == ("0", "")


def test_a_step_on_the_process_backend_runs_under_its_sessions_span() -> None:
    from tests import _remote_skills  # noqa: PLC0415 - importable by the worker processes

    exporter = InMemorySpanExporter()
    remote = Agent(
        "remote", {"main": inbox, "reports": _remote_skills.reports_span}, main_skill="main"
    )
    node = Node([remote], traced_config(exporter, backend="process", process_workers=1))
    try:
        result = node.main("remote").run(kind="worker", skill="reports", timeout=60)
    finally:
        node.shutdown()
    assert result is not None, "the step did not end"
    assert result.ok, result
    seen = result.artifacts
    assert seen["pid"] != os.getpid()  # it ran in a worker process
    assert seen["traceparent"] is not None
    assert seen["current"] == seen["traceparent"][3:52]
    spans = [s for s in spans_of(exporter) if s.name == "worker reports"]
    assert [format(s.context.span_id, "016x") for s in spans] == [seen["traceparent"][36:52]]


def test_a_retry_is_an_event_on_the_parents_span() -> None:
    async def flaky(session: AsyncSession) -> str:
        if session.task == "first":
            raise RuntimeError("the first attempt fails")
        return "ok"

    async def retries(session: AsyncSession) -> str:
        gathered = await session.fan_out(
            ["first"],
            skill="flaky",
            retry=Retry(max_attempts=2, initial=0.01, fallback_skill="steady"),
        )
        return gathered.status.value

    async def steady(session: AsyncSession) -> str:
        return "steady"

    skills = {"main": inbox, "retries": retries, "flaky": flaky, "steady": steady}
    exporter = InMemorySpanExporter()
    node = Node([Agent("retry", skills, main_skill="main")], traced_config(exporter))
    try:
        result = node.main("retry").run(kind="branch", skill="retries", timeout=WAIT)
    finally:
        node.shutdown()
    assert result is not None, "the parent did not end"
    assert result.ok, result
    parent = next(s for s in spans_of(exporter) if s.name == "branch retries")
    retried = [e for e in parent.events if e.name == "retry"]
    assert len(retried) == 1
    assert retried[0].attributes is not None
    assert retried[0].attributes["sessiontree.attempt"] == 2
    assert retried[0].attributes["sessiontree.code"] == ErrorCode.CRASHED.value
    workers = [s.name for s in spans_of(exporter) if s.name.startswith("worker")]
    assert sorted(workers) == ["worker flaky", "worker steady"]


def test_the_demo_is_one_trace_in_phoenix(phoenix: str) -> None:
    from sessiontree.cli.demo._scenario import run_demo  # noqa: PLC0415

    report = run_demo(otlp_endpoint=f"{phoenix}/v1/traces")  # its service names the project
    runs = {s["session_id"]: s for s in report.sessions if s["kind"] != "main"}
    main_id = next(s["session_id"] for s in report.sessions if s["kind"] == "main")
    deadline = time.monotonic() + 30.0
    while True:  # other runs of the demo export to its project too: this Main's trace
        spans = phoenix_spans(phoenix, "sessiontree-demo", len(runs) + 1)
        roots = [
            s
            for s in spans
            if s["parent_id"] is None and s["attributes"].get("sessiontree.session.id") == main_id
        ]
        trace = roots[0]["context"]["trace_id"] if roots else None
        spans = [s for s in spans if s["context"]["trace_id"] == trace]
        by_session = {
            s["attributes"]["sessiontree.session.id"]: s
            for s in spans
            if s["name"].startswith(("branch", "worker"))
        }
        if set(by_session) >= set(runs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # the research task is one trace: every branch and worker of it, in a tree
    assert set(by_session) == set(runs)
    assert [r["name"] for r in roots] == ["main cycle"]
    ids = {s["context"]["span_id"] for s in spans}
    assert all(s["parent_id"] in ids for s in spans if s["parent_id"] is not None)
    for session_id, run in runs.items():
        span = by_session[session_id]
        assert span["attributes"]["sessiontree.session.state"] == run["state"]
        parent = run["parent_id"]
        if parent != main_id:  # under a branch: its parent's span
            assert span["parent_id"] == by_session[parent]["context"]["span_id"]


def test_a_session_core_keeps_to_a_shared_key_dict() -> None:
    """CPython 3.11 shares one key table among a class's instances while they hold
    fewer than 30 attributes; at 30 every session's dict is one of its own (296
    bytes become 1,584) and spawns ran 7 % slower. Tracing's attribute on the
    core is a class default."""
    node = Node([SIMPLE], traced_config(InMemorySpanExporter()))
    try:
        main = node.main("simple")
        spawned = main.spawn(kind="branch", skill="parks_forever")
        assert spawned.ref is not None
        assert node.wait_idle(WAIT)
        sizes = [node.inspect(ref, lambda core: len(vars(core))) for ref in (main, spawned.ref)]
    finally:
        node.shutdown(grace=0)
    assert max(sizes) < 30


def test_a_cycle_a_crash_cut_off_reruns_under_a_span_linked_to_it(tmp_path: Path) -> None:
    from tests import traced_crash_node  # noqa: PLC0415 - the killed node's agent

    store = tmp_path / "store"
    command = [sys.executable, "-m", "tests.traced_crash_node", str(store)]
    root = Path(__file__).resolve().parent.parent
    with subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], 60.0)  # the cycle runs
            assert ready, "the cycle never started"
            cut_off = child.stdout.readline().strip()  # its mark, with this span, is durable
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(30)
    assert parse_traceparent(cut_off) == cut_off

    exporter = InMemorySpanExporter()
    config = dataclasses.replace(
        traced_crash_node.config(), tracing=Tracing(exporter=exporter, schedule_delay=0.05)
    )
    node = Node([traced_crash_node.make_agent()], config, store=store)
    try:
        assert node.wait_idle(WAIT)
    finally:
        node.shutdown()
    cycles = [s for s in spans_of(exporter) if s.name == "main cycle"]
    assert len(cycles) == 1  # the message's second attempt
    rerun = cycles[0]
    assert [format(link.context.span_id, "016x") for link in rerun.links] == [cut_off[36:52]]
    assert format(rerun.context.span_id, "016x") != cut_off[36:52]


# -- spans that end with their sessions, and exporters that fail ------------------------


def test_a_main_cancelled_mid_cycle_ends_its_cycles_span_with_it() -> None:
    exporter = InMemorySpanExporter()
    node = Node([SIMPLE], traced_config(exporter, grace=0.0))
    try:
        main = node.main("simple")
        assert main.send("block") is None  # inbox ignores it: the cycle ends at once
        assert node.wait_idle(WAIT)
        blocking = node.spawn(main, kind="branch", skill="parks_forever")
        assert blocking.ref is not None
        assert node.wait_idle(WAIT)
        assert node.cancel(blocking.ref) is None
        assert blocking.ref.wait(WAIT) is not None
        assert node.flush_traces(WAIT)
        spans = spans_of(exporter)
    finally:
        node.shutdown()
    # every span of a session that ended went out before the node closed
    assert not [s.name for s in spans if "node_closed" in [e.name for e in s.events]]
    parked = next(s for s in spans if s.name == "branch parks_forever")
    assert parked.attributes is not None
    assert parked.attributes["sessiontree.error.code"] == ErrorCode.TERMINATED_BY_FORCE.value


async def blocks(session: AsyncSession) -> None:
    if session.message == "block":
        await session.sleep(3600)


def test_a_main_ended_during_a_cycle_ends_that_cycles_span() -> None:
    exporter = InMemorySpanExporter()
    agent = Agent("blocking", {"inbox": blocks}, main_skill="inbox")
    node = Node([agent], traced_config(exporter, grace=0.0))
    try:
        main = node.main("blocking")
        assert main.send("block") is None
        assert node.wait_idle(WAIT)  # the cycle waits at its checkpoint
        assert node.cancel(main) is None
        assert main.wait(WAIT) is not None
        assert node.flush_traces(WAIT)
        cycles = [s for s in spans_of(exporter) if s.name == "main cycle"]
    finally:
        node.shutdown()
    assert len(cycles) == 1
    assert cycles[0].attributes is not None
    assert cycles[0].attributes["sessiontree.session.state"] == "cancelled"
    assert "node_closed" not in [e.name for e in cycles[0].events]


def test_a_spawn_the_full_store_refused_leaves_no_span(tmp_path: Path) -> None:
    from sessiontree.store import Store  # noqa: PLC0415

    exporter = InMemorySpanExporter()
    store = Store(tmp_path / "store", map_size=1 << 18)
    roomy = Agent(
        "simple",
        {"main": inbox, "parks_forever": parks_forever},
        main_skill="main",
        max_children=64,
    )
    node = Node([roomy], traced_config(exporter), store=store)
    refused = None
    try:
        main = node.main("simple")
        for _ in range(60):
            answer = main.spawn(kind="branch", skill="parks_forever", task="x" * 16_000)
            if not answer.ok:
                refused = answer.error
                break
    finally:
        node.shutdown(grace=0)
        store.close()
    assert refused is not None, "the map never filled"
    assert refused.code is ErrorCode.STORE_FULL
    discarded = refused.detail["session_id"]
    exported = {(s.attributes or {}).get("sessiontree.session.id") for s in spans_of(exporter)}
    assert discarded not in exported  # as if never created: no span, open or ended
    assert len(exported) >= 1  # the ones spawned went out at the close


class Failing(InMemorySpanExporter):
    """An exporter whose exports fail and whose shutdown raises."""

    def export(self, spans: Any) -> Any:
        raise ConnectionError("the collector is gone")

    def shutdown(self) -> None:
        raise RuntimeError("the collector would not close")


def test_an_exporter_that_fails_never_fails_the_node() -> None:
    node = Node([SIMPLE], traced_config(Failing()))
    result = node.main("simple").run(kind="worker", skill="done", timeout=WAIT)
    node.shutdown()  # the exporter's shutdown raises: logged, the node closes
    assert result is not None
    assert result.ok
    assert node.closed
    assert node.spans_dropped >= 1
    assert node.spans_exported == 0


class Slow(InMemorySpanExporter):
    """An exporter that takes ``delay`` real seconds a batch (a bounded wait)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def export(self, spans: Any) -> Any:
        threading.Event().wait(self.delay)
        return super().export(spans)


def test_flush_traces_gives_up_at_its_timeout_and_says_so() -> None:
    tracing = Tracing(exporter=Slow(1.0), max_export_batch_size=1, schedule_delay=30.0)
    node = Node([SIMPLE], NodeConfig(tracing=tracing))
    try:
        main = node.main("simple")
        for _ in range(5):
            assert main.run(kind="worker", skill="done", timeout=WAIT) is not None
        started = time.monotonic()
        flushed = node.flush_traces(timeout=0.2)
        took = time.monotonic() - started
    finally:
        node.shutdown()
    assert not flushed  # some batches were dropped at the timeout
    assert took < 0.2 + 1.0 + 1.5  # the timeout, the batch already on its way, slack
    assert node.spans_dropped >= 1


def test_a_trace_sampled_out_exports_nothing() -> None:
    exporter = InMemorySpanExporter()
    node = Node([SIMPLE], NodeConfig(tracing=Tracing(exporter=exporter, sampling_ratio=0.0)))
    try:
        main = node.main("simple")
        result = main.run(kind="branch", skill="done", timeout=WAIT)
        assert main.send("hello") is None
        assert node.wait_idle(WAIT)
        traces = [i.trace for i in node.sessions(kind=SessionKind.BRANCH)]
    finally:
        node.shutdown()
    assert result is not None
    assert result.ok
    assert traces
    assert all(t is not None and t.endswith("-00") for t in traces)  # named, not sampled
    assert spans_of(exporter) == []
