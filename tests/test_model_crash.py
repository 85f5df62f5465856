"""A ``kill -9`` never loses what model calls spent, nor counts it twice
(issue 20): usage is durable before a call returns, a call is on record
before its request leaves, and a restarted node rolls it up from the store
exactly as it was, with the calls the kill left in flight counted once at the
worst case they reserved (issue 37)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sessiontree.protocol import Usage
from sessiontree.store import Store
from sessiontree.supervision import Node
from sessiontree.testing import StandinServer
from tests.conftest import WAIT
from tests.model_crash_node import AGENT_ID, config, make_agent

ROOT = Path(__file__).resolve().parent.parent
ACK_WAIT = 30.0  # real seconds the workload may take to reach its kill point


def run_and_kill(store: Path, url: str, log: Path, rounds: int) -> None:
    """Run the spender on ``store`` and SIGKILL it once ``rounds`` rounds were acknowledged."""
    errors = log.with_suffix(".stderr")
    command = [sys.executable, "-m", "tests.model_crash_node", str(store), url, str(log)]
    with errors.open("wb") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + ACK_WAIT
            while len(read_acks(log)) < rounds:
                assert process.poll() is None, f"the node exited early: {errors.read_text()}"
                assert time.monotonic() < deadline, errors.read_text()
                time.sleep(0.005)  # another process: a short real pause between looks
            time.sleep(random.uniform(0, 0.05))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(WAIT)
    assert process.returncode == -signal.SIGKILL, errors.read_text()


def read_acks(path: Path) -> list[dict[str, int | str]]:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def main_usage(store_dir: Path) -> Usage:
    with Store(store_dir, readonly=True) as store:
        main_id = store.main_of(AGENT_ID, "internal:main:main")
        assert main_id is not None
        record = store.usage(main_id)
        assert record is not None
        return record.subtree


def test_kill_9_loses_no_spend_and_counts_none_twice(tmp_path: Path) -> None:
    store, log = tmp_path / "store", tmp_path / "acks.jsonl"
    with StandinServer() as server:
        run_and_kill(store, server.url, log, rounds=3)
        acked = read_acks(log)
        served = server.stats()
        recorded = main_usage(store)
        # nothing acknowledged is lost; nothing is counted the provider did not serve
        assert sum(int(a["tokens"]) for a in acked) <= recorded.tokens
        assert recorded.tokens <= served.prompt_tokens_served + served.completion_tokens_served
        assert 4 * len(acked) <= recorded.calls <= served.requests_received
        with Store(store, readonly=True) as view:  # each acknowledged round, exactly
            for ack in acked:
                record = view.session(uuid.UUID(str(ack["branch"])))
                assert record is not None
                assert record.result is not None
                assert record.result.subtree_usage.tokens == ack["tokens"]
            lost = sum((call.ask for call in view.calls()), Usage())
        # what was served and not yet counted was in flight, and is on record as such
        assert served.requests_received - recorded.calls <= lost.calls

        # the restarted node goes on from what the store held: exactly, once
        with Node([make_agent()], config(server.url), store=store) as node:
            main = node.main(AGENT_ID)
            start = server.stats()
            result = main.run(kind="branch", skill="fan", timeout=WAIT)
            assert result is not None
            assert result.ok
            end = server.stats()
        spent = (end.prompt_tokens_served + end.completion_tokens_served) - (
            start.prompt_tokens_served + start.completion_tokens_served
        )
        assert result.subtree_usage.tokens == spent
        assert main_usage(store) == recorded + lost + result.subtree_usage
        with Store(store, readonly=True) as view:
            assert view.calls() == []  # each lost call counted once, then dropped
