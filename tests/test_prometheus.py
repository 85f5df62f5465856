"""A real Prometheus server (Debian's ``prometheus``) on 127.0.0.1 scrapes a
running node; its HTTP API then holds the expected series with the expected
values after a known workload."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._processes import stop
from tests._running_node import RunningNode
from tests.node_agents import agents

pytestmark = pytest.mark.timeout(180)

ASSISTANT_SKILLS = frozenset(agents()[0].skills)  # what the running node registers

SCRAPE_WAIT = 90.0  # real seconds for Prometheus to start and scrape the settled workload


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is missing under CI: .ci/run installs Debian's prometheus")
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    return binary


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RunningNode]:
    running = RunningNode(tmp_path / "store", "--grace", "1")
    yield running
    if running.proc.poll() is None:
        assert running.stop() == 0


@pytest.fixture
def prometheus(prometheus_binary: str, node: RunningNode, tmp_path: Path) -> Iterator[str]:
    target = node.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: sessiontree\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            prometheus_binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc, 30)
        log.close()


def _query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    answer = client.get("/api/v1/query", params={"query": expr})
    answer.raise_for_status()
    result: list[dict[str, Any]] = answer.json()["data"]["result"]
    return result


def _value(client: httpx.Client, expr: str) -> float | None:
    result = _query(client, expr)
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_the_expected_series_from_a_running_node(
    node: RunningNode, prometheus: str
) -> None:
    http = node.http
    main = http.post("/v1/sessions", json={"agent_id": "assistant"}).json()["info"]["session_id"]
    workers = [
        http.post(f"/v1/sessions/{main}/children", json={"kind": "worker", "task": "0"}).json()
        for _ in range(3)
    ]
    crash = http.post(
        f"/v1/sessions/{main}/children", json={"kind": "worker", "skill": "crash"}
    ).json()
    for made in [*workers, crash]:
        sid = made["info"]["session_id"]
        assert http.get(f"/v1/sessions/{sid}/result", params={"timeout": 30}).json()["done"]
    ended = workers[0]["info"]["session_id"]
    refused = http.post(f"/v1/sessions/{ended}/children", json={"kind": "worker"})
    assert refused.json()["error"]["code"] == "parent_not_active"
    assert http.post(f"/v1/sessions/{main}/children", json={"kind": "x"}).status_code == 400
    # a branch bounded to one descendant: the first child crosses its soft
    # threshold, the second is refused at the hard limit
    bounded = http.post(
        f"/v1/sessions/{main}/children",
        json={"kind": "branch", "task": "3600", "budget": {"descendants": 1, "soft": 0.5}},
    ).json()["info"]["session_id"]
    child = http.post(f"/v1/sessions/{bounded}/children", json={"kind": "worker", "task": "0"})
    child_id = child.json()["info"]["session_id"]
    assert http.get(f"/v1/sessions/{child_id}/result", params={"timeout": 30}).json()["done"]
    over = http.post(f"/v1/sessions/{bounded}/children", json={"kind": "worker", "task": "0"})
    assert over.json()["error"]["code"] == "budget_exhausted"
    assert http.get(f"/v1/sessions/{bounded}").json()["budget_exhausted"] == "descendants"

    expected = {
        'sum(sessiontree_sessions_spawned_total{kind="worker"})': 5.0,
        'sum(sessiontree_sessions_spawned_total{kind="main"})': 1.0,
        'sum(sessiontree_sessions_terminated_total{kind="worker",state="completed"})': 4.0,
        'sum(sessiontree_sessions_terminated_total{kind="worker",state="failed"})': 1.0,
        'sessiontree_spawn_rejections_total{code="parent_not_active"}': 1.0,
        'sessiontree_rejected_inputs_total{reason="invalid_field"}': 1.0,
        'sum(sessiontree_sessions{kind="main",state="active"})': 1.0,
        'sum(sessiontree_sessions{kind="worker",state="active"})': 0.0,
        'sum(sessiontree_session_duration_seconds_count{kind="worker"})': 5.0,
        # by agent and skill: the default skill's workers, the crash, the Main's skill
        'sum(sessiontree_sessions_terminated_total{agent="assistant",skill="work",'
        'state="completed"})': 4.0,
        'sessiontree_sessions_terminated_total{agent="assistant",kind="worker",'
        'skill="crash",state="failed"}': 1.0,
        'sessiontree_sessions{agent="assistant",kind="main",skill="chat",state="active"}': 1.0,
        'count(count by (skill) (sessiontree_sessions_spawned_total{agent="assistant"}))': float(
            len(ASSISTANT_SKILLS)
        ),
        'sessiontree_spawn_rejections_total{code="budget_exhausted"}': 1.0,
        "sessiontree_budget_warnings_total": 1.0,
        "sessiontree_budgets_exhausted_total": 1.0,
        'up{job="sessiontree"}': 1.0,
    }
    found: dict[str, float | None] = {}
    with httpx.Client(base_url=prometheus, timeout=10.0) as client:
        deadline = time.monotonic() + SCRAPE_WAIT
        while time.monotonic() < deadline:
            try:
                found = {expr: _value(client, expr) for expr in expected}
            except httpx.TransportError:  # Prometheus still starting
                found = {}
            except httpx.HTTPStatusError as exc:  # 503 until its storage is ready
                if exc.response.status_code != 503:
                    raise
                found = {}
            if found == expected:
                break
            time.sleep(0.5)
        assert found == expected
        series = _query(client, '{__name__=~"sessiontree_.+"}')
    assert len(series) > 50
    for sample in series:
        for label, value in sample["metric"].items():
            assert label not in ("session_id", "parent_id", "task"), sample["metric"]
            assert len(value) < 64, sample["metric"]
        # the agent and skill labels name only what the node registered
        assert sample["metric"].get("agent", "assistant") == "assistant", sample["metric"]
        assert sample["metric"].get("skill", "work") in ASSISTANT_SKILLS, sample["metric"]
