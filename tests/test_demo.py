"""The README's first command, run the way a user runs it: ``sessiontree demo``."""

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

DEMO_TIMEOUT = 45.0  # real seconds; the demo itself takes about two
CODES = ("crashed", "ttl_expired", "parent_terminated", "terminated_by_force")
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


def test_demo_json_has_exactly_the_documented_fields(demo_json: dict[str, Any]) -> None:
    assert set(demo_json) == {"sessions", "rejections"}
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
        }
        if session["result"] is not None:
            assert set(session["result"]) == {"status", "summary", "error"}
            assert session["result"]["status"] == session["state"]
            if session["result"]["error"] is not None:
                assert set(session["result"]["error"]) == {"code", "message"}
    for rejection in demo_json["rejections"]:
        assert set(rejection) == {"parent_id", "kind", "error"}
        assert set(rejection["error"]) == {"code", "message"}


def test_demo_reaches_every_state_and_error_code(demo_json: dict[str, Any]) -> None:
    states = Counter(s["state"] for s in demo_json["sessions"])
    assert states == {"active": 1, "completed": 8, "failed": 1, "expired": 1, "cancelled": 2}
    endings = Counter((s["state"], code_of(s)) for s in demo_json["sessions"])
    assert endings[("failed", "crashed")] == 1
    assert endings[("expired", "ttl_expired")] == 1
    assert endings[("cancelled", "parent_terminated")] == 1
    assert endings[("cancelled", "terminated_by_force")] == 1
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
    cancelled = [s for s in demo_json["sessions"] if s["state"] == "cancelled"]
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
    assert "13 sessions" in demo_text


def test_demo_help_names_the_store_option() -> None:
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0
    assert "--store" in result.output
    assert "LMDB" in result.output


def test_demo_runs_on_the_given_store_and_a_second_run_adds_its_own_main(tmp_path: Path) -> None:
    first = sessiontree.cli.run_demo(store=tmp_path)
    assert first.store["sessions"] == 13
    assert first.store["results_owed"] == 0  # every result reached its parent
    second = sessiontree.cli.run_demo(store=tmp_path)
    assert second.store["recovered"]["mains"] == 1  # the first run's Main came back
    assert second.store["sessions"] == 26
    assert second.store["results_filed"] == 2 * first.store["results_filed"]


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
