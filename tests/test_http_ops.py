"""Operating a node: HTTP request and process metrics, every refused spawn
counted, a clean SIGTERM, and the bearer token."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litestar.routes import HTTPRoute

from sessiontree.actors import VirtualClock
from sessiontree.cli._agents import BUILTIN, builtin_agents
from sessiontree.cli._token import is_loopback
from sessiontree.cli.server import create_app
from sessiontree.cli.server._auth import OPEN_PATHS
from sessiontree.protocol import ErrorCode
from sessiontree.store import Store
from sessiontree.supervision import Agent, Node, NodeConfig, NodeMetrics
from tests._running_node import ROOT, RunningNode
from tests._served import ServedNode

pytestmark = pytest.mark.timeout(120)

TOKEN = "s3cret-token_0123456789"
NIL = "00000000-0000-4000-8000-000000000000"


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def served() -> Iterator[ServedNode]:
    node = Node(builtin_agents(), NodeConfig(), clock=VirtualClock())
    with ServedNode(node) as serving:
        yield serving
    node.shutdown(grace=0, timeout=5.0)


# -- metrics -----------------------------------------------------------------------------


def test_requests_are_counted_and_timed_by_route_template_and_status_class(
    served: ServedNode,
) -> None:
    main = served.http.post("/v1/sessions", json={"agent_id": "assistant"}).json()
    sid = main["info"]["session_id"]
    for _ in range(3):
        assert served.http.get(f"/v1/sessions/{sid}").status_code == 200
    assert served.http.get(f"/v1/sessions/{NIL}").status_code == 404
    assert served.http.get("/no/such/path").status_code == 404
    text = served.http.get("/metrics").text
    route = "/v1/sessions/{session_id}"
    ok = {"route": route, "method": "GET", "status_class": "2xx"}
    assert _sample(text, "sessiontree_http_requests_total", **ok) == 3
    missing = {"route": route, "method": "GET", "status_class": "4xx"}
    assert _sample(text, "sessiontree_http_requests_total", **missing) == 1
    unmatched = {"route": "unmatched", "method": "GET", "status_class": "4xx"}
    assert _sample(text, "sessiontree_http_requests_total", **unmatched) == 1
    assert _sample(text, "sessiontree_http_request_duration_seconds_count", **ok) == 3
    assert _sample(text, "sessiontree_http_request_duration_seconds_bucket", le="+Inf", **ok) == 3
    assert sid not in text  # no id is ever a label
    # the standard process and platform metrics
    assert _sample(text, "process_resident_memory_bytes") > 0
    assert _sample(text, "process_cpu_seconds_total") > 0
    assert "python_info{" in text


def test_a_store_full_refusal_of_a_spawn_is_counted(tmp_path: Path) -> None:
    def short(session: object) -> str:
        return "short"

    store = Store(tmp_path / "store", map_size=1 << 18)
    agent = Agent("agent", {"main": lambda s: None, "short": short}, max_children=64)
    node = Node([agent], NodeConfig(), clock=VirtualClock(), store=store)
    metrics = NodeMetrics(node)
    try:
        main = node.main("agent")
        refusal = None
        for _ in range(60):
            answer = main.spawn(kind="branch", skill="short", task="x" * 16_000)
            if not answer.ok:
                refusal = answer.error
                break
        assert refusal is not None, "the map never filled"
        assert refusal.code is ErrorCode.STORE_FULL
        assert node.stats()["rejected_store_full"] == 1
        text = metrics.exposition().decode()
        assert _sample(text, "sessiontree_spawn_rejections_total", code="store_full") == 1
    finally:
        metrics.close()
        node.shutdown(grace=0, timeout=5.0)
        store.close()


# -- auth --------------------------------------------------------------------------------


def _every_route(node: Node) -> list[tuple[str, str]]:
    app = create_app(node, NodeMetrics(node), token=TOKEN)
    found = []
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        path = re.sub(r"\{[a-z_]+(:[a-z]+)?\}", NIL, route.path)
        found += [(method, path) for method in sorted(route.methods)]
    return found


def test_without_the_token_every_route_but_the_probes_is_a_401(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    node = RunningNode(tmp_path / "store", "--token-file", str(token_file), agents=BUILTIN)
    try:
        probe = Node(builtin_agents(), NodeConfig(), clock=VirtualClock())
        try:
            routes = _every_route(probe)
        finally:
            probe.shutdown(grace=0, timeout=5.0)
        assert len(routes) > 30
        bad = httpx.Client(base_url=node.url, headers={"Authorization": "Bearer wrong"})
        good = httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {TOKEN}"})
        with bad, good:
            for method, path in routes:
                for client in (node.http, bad):
                    answer = client.request(method, path)
                    if path in OPEN_PATHS:
                        assert answer.status_code in (200, 204), (method, path)
                        continue
                    assert answer.status_code == 401, (method, path, answer.status_code)
                    assert answer.headers["www-authenticate"].startswith("Bearer")
                    assert answer.json()["error"]["code"] == "not_allowed"
            assert good.get("/v1/node").status_code == 200
            assert good.get("/metrics").status_code == 200
            assert good.get("/schema/openapi.json").json()["security"] == [{"bearer": []}]
            opened = good.post("/v1/sessions", json={"agent_id": "assistant"})
            assert opened.status_code == 200
            assert good.options("/v1/sessions").status_code == 204
        # the CLI sends the token from --token-file or SESSIONTREE_TOKEN_FILE
        base = [sys.executable, "-m", "sessiontree.cli"]
        status = ["node", "status", "--node", node.url, "--json"]
        by_flag = subprocess.run(
            [*base, "--token-file", str(token_file), *status],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert by_flag.returncode == 0, by_flag.stderr
        assert json.loads(by_flag.stdout)["sessions"]["active"] == 1
        by_env = subprocess.run(
            [*base, *status],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "SESSIONTREE_TOKEN_FILE": str(token_file)},
        )  # fmt: skip
        assert by_env.returncode == 0, by_env.stderr
        without = subprocess.run(
            [*base, *status], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
        )
        assert without.returncode == 1
        assert "not_allowed" in without.stderr
    finally:
        assert node.stop() == 0


def _start(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sessiontree.cli", "node", "start"]
    return subprocess.run(
        [*command, "--store", str(tmp_path / "store"), "--port", "0", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_non_loopback_bind_without_a_token_is_refused_with_exit_2(tmp_path: Path) -> None:
    done = _start(tmp_path, "--host", "0.0.0.0")
    assert done.returncode == 2
    assert "--host 0.0.0.0" in done.stderr
    assert "--token-file" in done.stderr
    assert not (tmp_path / "store").exists()  # refused before anything was opened


@pytest.mark.parametrize(
    ("content", "why"), [("", "holds no token"), ("  \n", "holds no token"), (None, "cannot read")]
)
def test_an_empty_or_unreadable_token_file_is_a_usage_error(
    tmp_path: Path, content: str | None, why: str
) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    done = _start(tmp_path, "--token-file", str(token_file))
    assert done.returncode == 2
    assert "--token-file" in done.stderr
    assert why in done.stderr


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "::", "example.org"))


# -- a clean stop --------------------------------------------------------------------------


def test_a_clean_sigterm_logs_no_error_and_prints_a_short_summary(tmp_path: Path) -> None:
    node = RunningNode(tmp_path / "store", "--grace", "1", agents=BUILTIN)
    main = node.http.post("/v1/sessions", json={"agent_id": "assistant"}).json()
    assert uuid.UUID(main["info"]["session_id"])
    assert node.stop(signal.SIGTERM) == 0
    log = node.log()
    assert "ERROR" not in log, log
    assert "Traceback" not in log, log
    assert "node stopped (SIGTERM, exit 0) after " in log
    assert log.rstrip().endswith(": 1 active"), log
    assert "{" not in log.splitlines()[-1]


def test_node_start_json_prints_the_summary_as_one_json_object(tmp_path: Path) -> None:
    node = RunningNode(tmp_path / "store", "--grace", "1", "--json", agents=BUILTIN)
    node.http.post("/v1/sessions", json={"agent_id": "assistant"})
    assert node.stop(signal.SIGTERM) == 0
    summary = json.loads(node.line(10.0))
    assert summary["event"] == "node_stopped"
    assert summary["exit_code"] == 0
    assert summary["signal"] == "SIGTERM"
    assert summary["forced"] is False
    assert summary["sessions"] == {"active": 1}
    assert "ERROR" not in node.log()
