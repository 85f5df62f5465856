"""Counts, listings and answers agree before and after a restart: sessions that
ended before it (the node's index no longer holds them) are read from the
store, and what recovery did is logged once and shown in ``/v1/node``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sessiontree.cli._agents import BUILTIN
from tests._running_node import ROOT, RunningNode

pytestmark = pytest.mark.timeout(180)


def _cli(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _ended(node: RunningNode, session_id: str) -> dict[str, Any]:
    answer = node.http.get(f"/v1/sessions/{session_id}/result", params={"timeout": 30})
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    assert found["done"], found
    return found


def _listed(node: RunningNode) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 5}
        if cursor:
            params["cursor"] = cursor
        page = node.http.get("/v1/sessions", params=params).json()
        ids += [item["session_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


def test_a_restarted_node_counts_lists_and_answers_what_ended_before(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = RunningNode(store, "--grace", "1", agents=BUILTIN)
    try:
        main = first.http.post("/v1/sessions", json={"agent_id": "assistant"}).json()
        main_id = main["info"]["session_id"]
        ended = []
        for _ in range(6):
            spawned = first.http.post(
                f"/v1/sessions/{main_id}/children",
                json={"kind": "branch", "skill": "work", "task": "0"},
            )
            assert spawned.status_code == 201, spawned.text
            ended.append(spawned.json()["info"]["session_id"])
        for session_id in ended:
            _ended(first, session_id)
        before = first.http.get("/v1/node").json()["sessions"]
    finally:
        assert first.stop() == 0
    assert before["completed"] == 6

    again = RunningNode(store, "--grace", "1", agents=BUILTIN)
    try:
        again.wait_log("recovery: brought back 1,")
        assert again.log().count("recovery: brought back") == 1
        status = again.http.get("/v1/node").json()
        assert status["recovery"]["brought_back"] == 1  # the Main
        assert status["recovery"]["failed"] == 0
        assert status["recovery"]["held_back"] == 0
        assert status["sessions"]["completed"] == 6  # ended before the restart, counted
        assert status["sessions"]["active"] == 1
        stored = _cli("node", "status", "--store", str(store), "--json")
        assert {k: v for k, v in status["sessions"].items() if v} == stored["sessions"]

        listed = _listed(again)
        assert len(listed) == len(set(listed)) == 7
        assert set(listed) == {main_id, *ended}
        by_state = Counter(item["state"] for item in again.http.get("/v1/sessions").json()["items"])
        assert by_state == Counter({"completed": 6, "active": 1})
        only_completed = again.http.get("/v1/sessions", params={"state": "completed"}).json()
        assert {item["session_id"] for item in only_completed["items"]} == set(ended)

        branch = ended[0]
        assert again.http.get(f"/v1/sessions/{branch}").status_code == 200
        sent = again.http.post(f"/v1/sessions/{branch}/messages", json={"message": "hi"})
        assert sent.status_code == 403, sent.text  # as for a branch the index holds, not 404
        assert sent.json()["error"]["code"] == "not_allowed"
        assert sent.json()["error"]["session_id"] == branch

        text = subprocess.run(
            [sys.executable, "-m", "sessiontree.cli", "node", "status", "--node", again.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert text.returncode == 0, text.stderr
        assert "6 completed" in text.stdout
        assert "recovery: brought back 1, failed 0, held back 0" in text.stdout
    finally:
        assert again.stop() == 0


def test_a_message_to_a_main_that_ended_before_a_restart_is_a_409(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = RunningNode(store, "--grace", "1", agents=BUILTIN)
    try:
        main = first.http.post("/v1/sessions", json={"agent_id": "assistant"}).json()
        main_id = main["info"]["session_id"]
        assert first.http.post(f"/v1/sessions/{main_id}/cancel").status_code == 202
        _ended(first, main_id)
    finally:
        assert first.stop() == 0
    again = RunningNode(store, "--grace", "1", agents=BUILTIN)
    try:
        assert again.http.get(f"/v1/sessions/{main_id}").status_code == 200
        sent = again.http.post(f"/v1/sessions/{main_id}/messages", json={"message": "hi"})
        assert sent.status_code == 409, sent.text
        assert sent.json()["error"]["code"] == "session_not_active"
    finally:
        assert again.stop() == 0
