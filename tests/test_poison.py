"""A poison message cannot put a node into a death spiral (issue 21).

A real ``sessiontree node start`` in a subprocess, its Main sent a message
whose cycle kills the process with SIGKILL: each restart replays it as the
next attempt, until crashes have cut off ``--recovery-attempts`` runs of it;
then the node comes up serving, the message held back as wedged, every other
message run once. The operator lists and requeues it from the CLI once
"fixed", and it runs once more, as a first attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._running_node import ROOT, RunningNode

pytestmark = pytest.mark.timeout(240)

AGENTS = "tests.poison_agents:agents"
LIMIT = 3  # the node's recovery_attempts (its default)


def env_for(tmp_path: Path) -> dict[str, str]:
    return {
        "POISON_LOG": str(tmp_path / "ran.jsonl"),
        "POISON_FLAG": str(tmp_path / "poisoned"),
        "POISON_GATE": str(tmp_path / "gate"),
    }


def ran(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ran.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def start_dies(store: Path, env: dict[str, str]) -> int:
    """Start a node that is expected to die replaying the poison: its exit code."""
    command = [sys.executable, "-m", "sessiontree.cli", "node", "start", "--store", str(store)]
    command += ["--port", "0", "--agents", AGENTS]
    proc = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    return proc.returncode


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def send(http: httpx.Client, main: str, message: dict[str, Any]) -> None:
    response = http.post(f"/v1/sessions/{main}/messages", json={"message": message})
    assert response.status_code == 202, response.text


@pytest.mark.slow
def test_a_poison_message_is_held_back_within_the_attempt_limit_and_requeued_once_fixed(
    tmp_path: Path,
) -> None:
    env = env_for(tmp_path)
    store = tmp_path / "store"
    (tmp_path / "poisoned").touch()

    node = RunningNode(store, env=env, agents=AGENTS)
    mains = []
    for key in ("internal:main:one", "internal:main:two"):
        answer = node.http.post("/v1/sessions", json={"agent_id": "poison", "key": key})
        assert answer.status_code == 200, answer.text
        mains.append(answer.json()["info"]["session_id"])
    one, two = mains
    send(node.http, one, {"text": "before", "gate": True})  # runs until the gate opens
    send(node.http, two, {"text": "elsewhere"})
    send(node.http, one, {"text": "poison", "poison": True})
    send(node.http, one, {"text": "after"})  # acknowledged: queued behind the poison
    (tmp_path / "gate").touch()
    assert node.proc.wait(60) == -signal.SIGKILL
    node.close()

    for _ in range(LIMIT - 1):  # attempts 2 and 3 die too
        start_dies(store, env)

    node = RunningNode(store, env=env, agents=AGENTS)  # the 4th start serves
    try:
        recovery = node.http.get("/v1/recovery").json()
        assert recovery["figures"]["wedged"] == 1, recovery
        wedged = node.http.get("/v1/wedged").json()
        (item,) = wedged
        assert (item["kind"], item["session_id"], item["attempts"]) == ("message", one, LIMIT)
        assert item["message"] == {"text": "poison", "poison": True}
        listed = cli("wedged", "ls", "--node", node.url, "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert [i["wedged_id"] for i in json.loads(listed.stdout)] == [item["wedged_id"]]
        for source in (("--node", node.url), ("--store", str(store))):
            held = cli("sessions", "ls", *source, "--wedged", "--json", env=env)
            assert held.returncode == 0, held.stderr
            assert [info["session_id"] for info in json.loads(held.stdout)["items"]] == [one]
        status = cli("node", "status", "--node", node.url, env=env)
        assert "held back: 1 (sessiontree wedged ls)" in status.stdout, status.stdout

        send(node.http, two, {"text": "marker"})
        wait_for_text(tmp_path, "marker")
        texts = [line["text"] for line in ran(tmp_path)]
        for text in ("before", "elsewhere", "after", "marker"):
            assert texts.count(text) == 1, texts
        assert "poison" not in texts

        (tmp_path / "poisoned").unlink()  # the operator fixed what crashed it
        requeued = cli("wedged", "requeue", item["wedged_id"], "--node", node.url, env=env)
        assert requeued.returncode == 0, requeued.stderr
        wait_for_text(tmp_path, "poison")
        poison_runs = [line for line in ran(tmp_path) if line["text"] == "poison"]
        assert poison_runs == [{"text": "poison", "attempt": 1}]
        assert node.http.get("/v1/wedged").json() == []
        again = cli("wedged", "requeue", item["wedged_id"], "--node", node.url, env=env)
        assert again.returncode == 1
        assert "unknown_session" in again.stderr
    finally:
        assert node.stop() == 0, node.log()[-3000:]
    stored = cli("wedged", "ls", "--store", str(store), env=env)
    assert (stored.returncode, stored.stdout.strip()) == (0, "nothing is held back")


def wait_for_text(tmp_path: Path, text: str, timeout: float = 30.0) -> None:
    """Wait (bounded) until a cycle for ``text`` is in the log (another process
    writes it: nothing to wait on but the file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line["text"] == text for line in ran(tmp_path)):
            return
        time.sleep(0.05)
    msg = f"no cycle ran for {text!r}: {ran(tmp_path)}"
    raise AssertionError(msg)
