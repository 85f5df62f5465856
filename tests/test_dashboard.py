"""The shipped Grafana dashboard and provisioning (``dashboards/``) against a real
node's metrics: every metric the dashboard queries exists, every query parses
as PromQL, and the provisioning points at the files that ship."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from sessiontree.actors import AsyncSession, VirtualClock
from sessiontree.cli.server._http_metrics import HttpMetrics
from sessiontree.supervision import Agent, Node, NodeConfig, NodeMetrics, Price, Provider
from sessiontree.testing import StandinServer
from tests._promtool import promtool
from tests.conftest import WAIT, settle

DASHBOARDS = pathlib.Path(__file__).resolve().parent.parent / "dashboards"
DASHBOARD = DASHBOARDS / "sessiontree.json"
PROVIDER = DASHBOARDS / "provisioning" / "dashboards" / "sessiontree.yaml"
DATASOURCE = DASHBOARDS / "provisioning" / "datasources" / "prometheus.yaml"
# Where dashboards/README.md mounts this directory in Grafana.
MOUNT = "/var/lib/grafana/sessiontree/"

_METRIC = re.compile(r"\bsessiontree_[a-zA-Z0-9_]+")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def quick(session: Any) -> str:
    return "ok"


async def asks(session: AsyncSession) -> str:
    reply = await session.complete("how much does this cost")
    return reply.text


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels and variables."""
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", []) if "expr" in t]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture
def exposed(tmp_path: pathlib.Path) -> Iterator[dict[str, str]]:
    """Family name -> type in the exposition of a node with a store, after some
    work: a worker that ran, and one that called a model (the stand-in)."""
    with StandinServer() as standin:
        provider = Provider(base_url=standin.url, prices={"m": Price(0.001, 0.002)})
        skills = {"main": quick, "quick": quick, "asks": asks}
        agent = Agent("agent", skills, model_tiers=("small",), models={"small": "m"})
        node = Node(
            [agent], NodeConfig(providers=(provider,)), clock=VirtualClock(), store=tmp_path / "db"
        )
        metrics = NodeMetrics(node)
        HttpMetrics(metrics.registry)  # what a node's /metrics adds: the HTTP API's families
        try:
            for skill in ("quick", "asks"):
                ref = node.main("agent").spawn(kind="worker", skill=skill).ref
                assert ref is not None
                ref.wait(WAIT)
            settle(node)
            assert standin.completions_served == 1
            text = metrics.exposition().decode()
            assert 'sessiontree_model_calls_total{agent="agent",model="m",tier="small"} 1.0' in text
            yield dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))
        finally:
            metrics.close()
            node.shutdown(grace=0, timeout=5.0)


def test_every_metric_the_dashboard_queries_exists_in_a_nodes_exposition(
    dashboard: dict[str, Any], exposed: dict[str, str]
) -> None:
    exprs = queries(dashboard)
    assert len(exprs) >= 20
    wanted: set[str] = set()
    for expr in exprs:
        for found in _METRIC.findall(expr):
            name = found
            for suffix in _HISTOGRAM_SUFFIXES:
                base = found.removesuffix(suffix)
                if base != found and exposed.get(base) == "histogram":
                    name = base
                    break
            wanted.add(name)
    missing = sorted(wanted - set(exposed))
    assert not missing, f"the dashboard queries metrics no node exposes: {missing}"
    histograms = {name for name, kind in exposed.items() if kind == "histogram"}
    assert histograms <= wanted, f"histograms without a panel: {sorted(histograms - wanted)}"
    spending = {n for n in exposed if n.startswith(("sessiontree_model_", "sessiontree_budget"))}
    assert len(spending) == 6
    assert spending <= wanted, f"model or budget metrics without a panel: {spending - wanted}"


def test_every_query_parses_as_promql(dashboard: dict[str, Any], tmp_path: pathlib.Path) -> None:
    rules = []
    for number, expr in enumerate(queries(dashboard)):
        # Grafana's variables as Grafana fills them in; label_values() is Grafana's, not PromQL
        promql = expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
        for variable in ("$instance", "$agent", "$skill"):
            promql = promql.replace(variable, ".*")
        promql = re.sub(r"^label_values\((.+), *\w+\)$", r"\1", promql)
        assert "$" not in promql, expr
        rules.append({"record": f"dashboard:query_{number}", "expr": promql})
    path = tmp_path / "rules.json"  # YAML is a superset of JSON: promtool reads it
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


def test_a_row_breaks_the_sessions_down_by_agent_and_skill(dashboard: dict[str, Any]) -> None:
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    titles = [row["title"] for row in rows]
    assert "By agent and skill" in titles
    start = dashboard["panels"].index(rows[titles.index("By agent and skill")])
    end = dashboard["panels"].index(rows[titles.index("By agent and skill") + 1])
    row = dashboard["panels"][start + 1 : end]
    exprs = [t["expr"] for panel in row for t in panel["targets"]]
    for family in (
        "sessiontree_sessions{",
        "sessiontree_sessions_spawned_total",
        "sessiontree_sessions_terminated_total",
        "sessiontree_session_duration_seconds_bucket",
    ):
        assert any(family in expr for expr in exprs), family
    for expr in exprs:  # every one grouped by both, narrowed by the variables
        assert re.search(r"by \((le, )?agent, skill", expr), expr
        assert 'agent=~"$agent",skill=~"$skill"' in expr, expr
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name in ("agent", "skill"):
        query = variables[name]["query"]["query"]
        assert query.startswith("label_values(sessiontree_sessions_spawned_total"), query
        assert query.endswith(f", {name})"), query


def test_the_dashboard_picks_a_prometheus_datasource_through_a_variable(
    dashboard: dict[str, Any],
) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "__inputs" not in dashboard  # an export for import, which provisioning cannot fill
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    assert dashboard["uid"]
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))


def test_the_provisioning_points_at_the_dashboard_that_ships() -> None:
    path = provider_path(PROVIDER.read_text(encoding="utf-8"))
    assert path.startswith(MOUNT), path
    target = DASHBOARDS / path.removeprefix(MOUNT)
    assert target.resolve() == DASHBOARD.resolve()
    assert target.is_file()
    assert MOUNT.rstrip("/") in (DASHBOARDS / "README.md").read_text(encoding="utf-8")


def test_the_datasource_provisioning_declares_a_prometheus() -> None:
    text = DATASOURCE.read_text(encoding="utf-8")
    try:
        import yaml  # noqa: PLC0415 - optional: parsed only where PyYAML is installed
    except ImportError:
        assert re.search(r"^\s*type:\s*prometheus\s*$", text, flags=re.MULTILINE)
        assert re.search(r"^apiVersion:\s*1\s*$", text, flags=re.MULTILINE)
        return
    loaded = yaml.safe_load(text)
    assert loaded["apiVersion"] == 1
    (source,) = loaded["datasources"]
    assert source["type"] == "prometheus"


def test_the_example_scrape_config_is_valid_and_targets_the_default_port() -> None:
    config = DASHBOARDS / "prometheus.yml"
    assert '"127.0.0.1:8470"' in config.read_text(encoding="utf-8")
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


def provider_path(text: str) -> str:
    """``providers[0].options.path`` of a Grafana dashboard provider file."""
    try:
        import yaml  # noqa: PLC0415 - optional: parsed only where PyYAML is installed
    except ImportError:
        found = re.findall(r"^\s+path:\s*(\S+)\s*$", text, flags=re.MULTILINE)
        assert len(found) == 1, found
        assert re.search(r"^\s+type:\s*file\s*$", text, flags=re.MULTILINE)
        return str(found[0]).strip("'\"")
    loaded = yaml.safe_load(text)
    assert loaded["apiVersion"] == 1
    (provider,) = loaded["providers"]
    assert provider["type"] == "file"
    return str(provider["options"]["path"])
