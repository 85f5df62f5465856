"""The README's first command, run the way a user runs it: ``sessiontree demo``,
with its model calls on the stand-in it starts, or on an endpoint it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import sessiontree.cli
from sessiontree.cli import main
from sessiontree.testing import StandinServer

DEMO_TIMEOUT = 45.0  # real seconds; the demo itself takes about two (seven on an endpoint)
CODES = ("crashed", "ttl_expired", "parent_terminated", "terminated_by_force", "budget_exhausted")
USAGE_FIELDS = {
    "prompt_tokens",
    "completion_tokens",
    "tokens",
    "cost",
    "calls",
    "descendants",
    "unpriced_calls",
}
STATES = {"active": 1, "completed": 8, "failed": 1, "expired": 1, "cancelled": 8}
REFUSALS = ("children_exceeded", "depth_exceeded", "worker_cannot_spawn")


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    """``sessiontree demo ARGS`` in a fresh interpreter (as the console script runs it)."""
    return subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="module")
def demo_json() -> dict[str, Any]:
    proc = run_demo("--json")
    assert proc.returncode == 0, proc.stderr
    document: dict[str, Any] = json.loads(proc.stdout)  # stdout holds the JSON and nothing else
    return document


@pytest.fixture(scope="module")
def demo_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    store = tmp_path_factory.mktemp("demo") / "store"
    proc = run_demo("--store", str(store))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def by_task(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["task"]: s for s in document["sessions"]}


def code_of(session: dict[str, Any]) -> str | None:
    result = session["result"]
    if result is None or result["error"] is None:
        return None
    code: str = result["error"]["code"]
    return code


def usage(session: dict[str, Any], which: str = "subtree_usage") -> dict[str, Any]:
    figures: dict[str, Any] = session[which]
    return figures


def added(*figures: dict[str, Any]) -> dict[str, Any]:
    """Usage figures summed field by field (cost within rounding)."""
    total: dict[str, Any] = dict.fromkeys(USAGE_FIELDS, 0)
    for one in figures:
        for name in USAGE_FIELDS:
            total[name] += one[name]
    return total


def same_usage(a: dict[str, Any], b: dict[str, Any], *, descendants: bool = True) -> bool:
    names = USAGE_FIELDS - {"cost"} - (set() if descendants else {"descendants"})
    return all(a[n] == b[n] for n in names) and a["cost"] == pytest.approx(b["cost"])


def test_demo_json_has_exactly_the_documented_fields(demo_json: dict[str, Any]) -> None:
    assert set(demo_json) == {"sessions", "rejections", "models"}
    for session in demo_json["sessions"]:
        assert set(session) == {
            "session_id",
            "parent_id",
            "agent_id",
            "kind",
            "state",
            "depth",
            "task",
            "result",
            "usage",
            "subtree_usage",
        }
        if session["result"] is None:
            assert session["usage"] is None
            assert session["subtree_usage"] is None
        else:
            assert set(session["usage"]) == USAGE_FIELDS
            assert set(session["subtree_usage"]) == USAGE_FIELDS
        if session["result"] is not None:
            assert set(session["result"]) == {"status", "summary", "error"}
            assert session["result"]["status"] == session["state"]
            if session["result"]["error"] is not None:
                assert set(session["result"]["error"]) == {"code", "message"}
    for rejection in demo_json["rejections"]:
        assert set(rejection) == {"parent_id", "kind", "error"}
        assert set(rejection["error"]) == {"code", "message"}
    assert set(demo_json["models"]) == {
        "endpoint",
        "stand_in",
        "models",
        "usage",
        "branches_sum",
        "served",
        "roll_up",
        "budget",
        "events",
    }


def test_demo_reaches_every_state_and_error_code(demo_json: dict[str, Any]) -> None:
    states = Counter(s["state"] for s in demo_json["sessions"])
    assert states == STATES
    endings = Counter((s["state"], code_of(s)) for s in demo_json["sessions"])
    assert endings[("failed", "crashed")] == 1
    assert endings[("expired", "ttl_expired")] == 1
    assert endings[("cancelled", "parent_terminated")] == 1
    assert endings[("cancelled", "terminated_by_force")] == 1
    assert endings[("cancelled", "budget_exhausted")] == 6
    assert endings[("completed", None)] == 8


def test_demo_tree_has_one_main_and_consistent_depths(demo_json: dict[str, Any]) -> None:
    sessions = {s["session_id"]: s for s in demo_json["sessions"]}
    roots = [s for s in sessions.values() if s["parent_id"] is None]
    assert [(r["kind"], r["state"], r["depth"], r["result"]) for r in roots] == [
        ("main", "active", 0, None)
    ]
    assert len({s["agent_id"] for s in sessions.values()}) == 1
    for session in sessions.values():
        if session["parent_id"] is not None:
            assert session["depth"] == sessions[session["parent_id"]]["depth"] + 1
            assert sessions[session["parent_id"]]["kind"] != "worker"


def test_every_terminal_non_root_session_has_its_parent_listed(demo_json: dict[str, Any]) -> None:
    ids = {s["session_id"] for s in demo_json["sessions"]}
    ended = [s for s in demo_json["sessions"] if s["result"] is not None]
    assert len(ended) == len(demo_json["sessions"]) - 1
    for session in ended:
        assert session["parent_id"] in ids, session


def test_demo_refuses_exactly_the_expected_spawns(demo_json: dict[str, Any]) -> None:
    sessions = {s["session_id"]: s for s in demo_json["sessions"]}
    refused = sorted(
        (r["error"]["code"], r["kind"], sessions[r["parent_id"]]["kind"])
        for r in demo_json["rejections"]
    )
    assert refused == [
        ("children_exceeded", "branch", "main"),
        ("depth_exceeded", "branch", "branch"),
        ("worker_cannot_spawn", "worker", "worker"),
    ]
    for rejection in demo_json["rejections"]:
        assert rejection["error"]["message"]


def test_parent_completes_while_its_two_workers_still_run(demo_json: dict[str, Any]) -> None:
    sessions = {s["session_id"]: s for s in demo_json["sessions"]}
    cancelled = [
        s
        for s in demo_json["sessions"]
        if code_of(s) in ("parent_terminated", "terminated_by_force")
    ]
    assert len(cancelled) == 2
    assert len({s["parent_id"] for s in cancelled}) == 1
    parent = sessions[cancelled[0]["parent_id"]]
    assert parent["state"] == "completed"
    wrapped_up = next(s for s in cancelled if code_of(s) == "parent_terminated")
    assert wrapped_up["result"]["summary"].startswith("partial")  # what it returned in grace


def test_results_flow_up_the_tree(demo_json: dict[str, Any]) -> None:
    tasks = by_task(demo_json)
    deepest = tasks["verify the citation"]
    assert deepest["depth"] == 4
    assert (
        deepest["result"]["summary"] in tasks["trace the method to its source"]["result"]["summary"]
    )
    assert tasks["survey the literature"]["result"]["summary"] == "read 2 of 3 papers; 1 failed"
    assert tasks["crawl every archive"]["result"]["summary"]  # its last progress note


def test_human_output_shows_the_tree_and_every_code(demo_text: str) -> None:
    for code in (*CODES, *REFUSALS):
        assert code in demo_text
    assert "Final tree:" in demo_text
    assert "19 sessions" in demo_text
    assert "Model calls:" in demo_text
    assert "3 calls sent, 2 refused before sending" in demo_text
    assert "budget of calls exhausted" in demo_text  # the event, as it happened
    assert "the stand-in served 8 calls" in demo_text
    assert "tokens: the same" in demo_text


def test_demo_help_names_the_store_option() -> None:
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0
    assert "--store" in result.output
    assert "LMDB" in result.output
    for option in ("--model-url", "--model", "--api-key-file"):
        assert option in result.output


def test_demo_runs_on_the_given_store_and_a_second_run_adds_its_own_main(tmp_path: Path) -> None:
    first = sessiontree.cli.run_demo(store=tmp_path)
    # 19 sessions, of which the workers its branches' skills spawned are never
    # written (their branches do not survive a restart)
    assert first.store["sessions"] == 8
    assert first.models["served"]["calls"] == first.models["usage"]["calls"] == 8  # in-process too
    assert Counter(s["state"] for s in first.sessions) == STATES
    assert first.store["results_owed"] == 0  # every result reached its parent
    second = sessiontree.cli.run_demo(store=tmp_path)
    assert second.store["recovered"]["mains"] == 1  # the first run's Main came back
    assert second.store["sessions"] == 16
    assert second.store["results_filed"] == 2 * first.store["results_filed"]
    # the model figures are the same on every run (on the stand-in)
    for part in ("usage", "served", "events"):
        assert second.models[part] == first.models[part]
    assert second.models["budget"]["subtree"] == first.models["budget"]["subtree"]
    assert second.models["roll_up"]["subtree"] == first.models["roll_up"]["subtree"]


# -- the model calls ------------------------------------------------------------------


def test_usage_rolls_up_through_a_branch_and_its_workers(demo_json: dict[str, Any]) -> None:
    tasks = by_task(demo_json)
    survey = tasks["survey the literature"]
    readers = [s for s in demo_json["sessions"] if s["parent_id"] == survey["session_id"]]
    assert len(readers) == 3
    for reader in readers:  # each worker made one call, the crashed one too
        assert usage(reader, "usage")["calls"] == 1
        assert usage(reader, "usage") == usage(reader)  # a worker's subtree is itself
    assert usage(survey, "usage")["calls"] == 1  # the branch's own call
    assert same_usage(usage(survey), added(usage(survey, "usage"), *map(usage, readers)))
    roll_up = demo_json["models"]["roll_up"]
    assert roll_up["session_id"] == survey["session_id"]
    assert roll_up["subtree"] == usage(survey)
    assert same_usage(roll_up["own_plus_children"], roll_up["subtree"])
    assert [c["state"] for c in roll_up["children"]].count("failed") == 1


def test_a_deep_workers_usage_counts_once_in_every_ancestor(demo_json: dict[str, Any]) -> None:
    tasks = by_task(demo_json)
    verify = usage(tasks["verify the citation"])
    assert verify["calls"] == 1
    for level in ("trace level 3", "trace level 2", "trace the method to its source"):
        assert usage(tasks[level]) == verify
        assert usage(tasks[level], "usage")["calls"] == 0


def test_the_trees_usage_is_durable_and_equals_what_the_stand_in_served(
    demo_json: dict[str, Any],
) -> None:
    models = demo_json["models"]
    assert models["stand_in"] is True
    assert models["endpoint"].startswith("http://127.0.0.1:")
    assert models["models"] == {"small": "standin-small", "large": "standin-large"}
    served, stored = models["served"], models["usage"]
    assert served["calls"] == stored["calls"] == 8
    assert served["prompt_tokens"] == stored["prompt_tokens"]
    assert served["completion_tokens"] == stored["completion_tokens"]
    assert stored["cost"] > 0
    assert stored["unpriced_calls"] == 0
    # the Main's durable subtree usage is its branches' subtrees, added up
    assert same_usage(models["branches_sum"], stored, descendants=False)


def test_a_budget_refuses_calls_before_sending_and_keeps_partial_results(
    demo_json: dict[str, Any],
) -> None:
    spent = demo_json["models"]["budget"]
    assert spent["budget"] == {"calls": 3}
    assert (spent["workers"], spent["calls_sent"], spent["calls_refused"]) == (5, 3, 2)
    assert spent["partial_results"] == 3
    assert (spent["state"], spent["code"]) == ("cancelled", "budget_exhausted")
    branch = by_task(demo_json)["summarise every source"]
    assert usage(branch)["calls"] == 3  # never more than the budget
    assert branch["result"]["summary"].startswith("partial: 3 of 5 sources summarised")
    workers = [s for s in demo_json["sessions"] if s["parent_id"] == branch["session_id"]]
    assert {(w["state"], code_of(w)) for w in workers} == {("cancelled", "budget_exhausted")}
    answered = sorted(w["result"]["summary"] for w in workers if usage(w)["calls"])
    assert len(answered) == 3
    assert all(summary.startswith("echo summarise source") for summary in answered)
    assert demo_json["models"]["events"] == {"budget_warning": 1, "budget_exhausted": 1}


def test_demo_runs_the_same_tree_on_the_endpoint_it_is_given(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-demo-test\n")
    with StandinServer(models=("endpoint-model",)) as endpoint:  # as if a real provider
        flags = ["--model-url", endpoint.url, "--model", "endpoint-model"]
        result = CliRunner().invoke(
            main, ["demo", "--json", *flags, "--api-key-file", str(key)], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        stats = endpoint.stats()
        sent = {body["model"] for body in endpoint.requests}
    document = json.loads(result.stdout)
    assert Counter(s["state"] for s in document["sessions"]) == STATES
    models = document["models"]
    assert models["stand_in"] is False
    assert models["served"] is None
    assert models["endpoint"] == endpoint.url
    assert models["models"] == {"small": "endpoint-model", "large": "endpoint-model"}
    assert sent == {"endpoint-model"}
    assert stats.completions_served == stats.requests_received == models["usage"]["calls"] == 8
    assert models["usage"]["tokens"] == stats.tokens_served
    assert models["usage"]["unpriced_calls"] == 8  # no price is known for a real model
    assert (models["budget"]["calls_sent"], models["budget"]["calls_refused"]) == (3, 2)


def test_demo_model_options_go_together() -> None:
    runner = CliRunner()
    alone = runner.invoke(main, ["demo", "--model", "gpt"])
    assert alone.exit_code == 2
    assert "--model-url" in alone.output
    nameless = runner.invoke(main, ["demo", "--model-url", "http://127.0.0.1:9/v1"])
    assert nameless.exit_code == 2
    assert "--model NAME" in nameless.output
    bad = runner.invoke(main, ["demo", "--model-url", "ftp://x", "--model", "m"])
    assert bad.exit_code == 1
    assert "base_url must be an http(s) URL" in bad.output


def test_cli_exports_are_sorted_and_complete() -> None:
    assert sessiontree.cli.__all__ == sorted(sessiontree.cli.__all__)
    assert set(sessiontree.cli.__all__) == {"DemoError", "DemoReport", "main", "run_demo"}


def test_console_script_sits_next_to_the_interpreter() -> None:
    script = Path(sys.executable).with_name("sessiontree")
    if not script.exists():
        pytest.skip("the console script is not installed beside this interpreter")
    proc = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=DEMO_TIMEOUT, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "demo" in proc.stdout
