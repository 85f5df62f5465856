"""schemathesis against the node's own OpenAPI schema: whatever a client sends,
the node answers with a documented status and body, never a 500, and keeps
serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import allow_header_conformance

from sessiontree.actors import VirtualClock
from sessiontree.cli._agents import builtin_agents
from sessiontree.cli._api import create_app
from sessiontree.supervision import Node, NodeConfig
from tests._fakes import FakeMetrics

# Built at import: schemathesis parametrizes from the schema then (its fixture
# loader fails with this pytest); the module fixture below shuts the node down.
_CLOCK = VirtualClock()
_NODE = Node(builtin_agents(), NodeConfig(max_sessions=500), clock=_CLOCK)
_METRICS = FakeMetrics()
_APP = create_app(_NODE, _METRICS, max_wait=0.05)
_SCHEMA = schemathesis.openapi.from_asgi("/schema/openapi.json", _APP)
# a followed event stream never ends: it is fuzzed below with follow=false
schema = _SCHEMA.exclude(path="/v1/events")
events_schema = _SCHEMA.include(path="/v1/events")


@pytest.fixture(scope="module", autouse=True)
def _node_with_a_main() -> Iterator[None]:
    _NODE.main("assistant")  # so list and route operations meet a real tree
    yield
    _NODE.shutdown(grace=0, timeout=5.0)


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_operation_answers_as_documented(case: Any) -> None:
    response = case.call()
    assert response.status_code < 500, f"{case.method} {case.path}: {response.text[:300]}"
    # Litestar's automatic OPTIONS answer lists only the methods of the first
    # handler registered on a path (its route is rebuilt when a second handler
    # joins, keeping the first OPTIONS handler): the Allow check is left out.
    case.validate_response(response, excluded_checks=[allow_header_conformance])


@events_schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_event_stream_answers_as_documented(case: Any) -> None:
    case.query = {**(case.query or {}), "follow": "false"}
    response = case.call()
    assert response.status_code < 500, f"{case.method} {case.path}: {response.text[:300]}"
    case.validate_response(response, excluded_checks=[allow_header_conformance])


def test_the_node_still_serves_after_the_fuzzing() -> None:
    assert not _NODE.closed
    assert _NODE.main("assistant").info().state.value == "active"
