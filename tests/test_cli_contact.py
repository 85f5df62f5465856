"""The CLI does what the API does (issue 39): a spawn's budget and model tier,
a cancel's or termination's reason (recorded on the events and in the
results), the root's options after the command, usage errors that exit 2,
through CliRunner and a real node on 127.0.0.1; the reason through the
embedded API too."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from sessiontree.cli import main as cli_main
from sessiontree.cli._agents import builtin_agents
from sessiontree.cli._words import money, plural
from sessiontree.protocol import MAX_REASON_CHARS, ErrorCode, RejectedInputError
from sessiontree.supervision import Event, EventKind, Node, NodeConfig
from sessiontree.testing import Reply, StandinServer
from tests._running_node import RunningNode
from tests._served import ServedNode

pytestmark = pytest.mark.timeout(120)

NO_ENV = {"SESSIONTREE_NODE": None, "SESSIONTREE_STORE": None, "SESSIONTREE_TOKEN_FILE": None}
WAIT = 10.0


def cli(*args: str) -> Result:
    return CliRunner().invoke(cli_main, list(args), env=NO_ENV, prog_name="sessiontree")


def js(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


class Seen:
    """The node's events, kept as they come; ``wait`` for one of a kind."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def of(self, kind: EventKind) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.kind is kind]


@pytest.fixture
def node() -> Iterator[Node]:
    made = Node(builtin_agents(), NodeConfig(grace=30.0))
    try:
        yield made
    finally:
        made.shutdown(grace=0, timeout=10.0)


@pytest.fixture
def served(node: Node) -> Iterator[ServedNode]:
    with ServedNode(node) as server:
        yield server


def main_of(served: ServedNode) -> str:
    made = js("sessions", "spawn", "--node", served.url, "--agent", "assistant")
    return str(made["info"]["session_id"])


# -- spawn --budget, --tier --------------------------------------------------------------------


def test_spawn_takes_a_budget_and_a_tier(served: ServedNode) -> None:
    main = main_of(served)
    made = js(
        "sessions", "spawn", "--node", served.url, "--parent", main, "--kind", "branch",
        "--task", "3600", "--budget", "calls=5, tokens=20000,cost=0.5,soft=0.5",
        "--tier", "fast",
    )  # fmt: skip
    info = made["info"]
    assert info["model_tier"] == "fast"
    assert info["budget"] == {
        "tokens": 20000,
        "cost": 0.5,
        "calls": 5,
        "descendants": None,
        "soft": 0.5,
    }
    shown = cli("sessions", "show", "--node", served.url, info["session_id"])
    assert "  Budget        20000 tokens, cost $0.50, 5 calls; left: " in shown.output


@pytest.mark.parametrize(
    ("budget", "said"),
    [
        ("calls", "'calls' is not NAME=NUMBER"),
        ("money=5", "'money=5' is not NAME=NUMBER with NAME one of tokens, cost, calls"),
        ("calls=2.5", "calls must be a whole number"),
        ("calls=5,calls=6", "calls is given twice"),
        ("calls=-1", "calls"),
        ("cost=nan", "cost"),
        ("soft=2", "soft"),
    ],
)
def test_a_bad_budget_is_a_usage_error_naming_it(
    served: ServedNode, budget: str, said: str
) -> None:
    main = main_of(served)
    result = cli("sessions", "spawn", "--node", served.url, "--parent", main, "--budget", budget)
    assert result.exit_code == 2, result.output
    assert "--budget" in result.output
    assert said in result.output
    assert len(served.get("/v1/sessions")["items"]) == 1  # nothing spawned


@pytest.mark.parametrize("option", [("--budget", "calls=1"), ("--tier", "fast")])
def test_a_mains_spawn_takes_no_budget_or_tier(served: ServedNode, option: tuple[str, str]) -> None:
    result = cli("sessions", "spawn", "--node", served.url, "--agent", "assistant", *option)
    assert result.exit_code == 2
    assert f"{option[0]} goes with --parent" in result.output


# -- cancel/terminate --reason -------------------------------------------------------------


def test_cancel_reason_is_on_the_events_and_in_the_results(served: ServedNode, node: Node) -> None:
    seen = Seen()
    node.subscribe(seen)
    main = main_of(served)
    at = ("--node", served.url)
    branch = js(
        "sessions", "spawn", *at, "--parent", main, "--kind", "branch", "--task", "3600",
    )["info"]["session_id"]  # fmt: skip
    worker = js("sessions", "spawn", *at, "--parent", branch, "--task", "3600")
    because = "ops: runaway branch (ticket 7)"
    js("sessions", "cancel", *at, branch[:8], "--grace", "5", "--reason", because)
    for sid, code in ((branch, ErrorCode.CANCELLED), (worker["info"]["session_id"], None)):
        result = node.wait(sid, WAIT)
        assert result is not None
        assert result.error is not None
        assert result.error.code is (code or ErrorCode.PARENT_TERMINATED)
        assert result.error.detail["reason"] == because
    requested = seen.of(EventKind.CANCEL_REQUESTED)
    assert len(requested) == 2
    assert {e.data.get("reason") for e in requested} == {because}
    assert node.get(main).state.value == "active"  # the reason went no higher


def test_terminate_reason_is_in_the_result(served: ServedNode, node: Node) -> None:
    main = main_of(served)
    worker = js("sessions", "spawn", "--node", served.url, "--parent", main, "--task", "3600")
    sid = worker["info"]["session_id"]
    done = js("sessions", "terminate", "--node", served.url, sid, "--reason", "by alice")
    assert done["result"]["error"]["code"] == "terminated_by_force"
    assert done["result"]["error"]["detail"] == {"reason": "by alice"}
    text = cli("sessions", "show", "--node", served.url, sid).output
    assert "by alice" in text


def test_a_cancel_without_reason_records_none(served: ServedNode, node: Node) -> None:
    main = main_of(served)
    worker = js("sessions", "spawn", "--node", served.url, "--parent", main, "--task", "3600")
    done = js("sessions", "terminate", "--node", served.url, worker["info"]["session_id"])
    assert done["result"]["error"]["detail"] == {}


def test_a_reason_too_long_is_refused_before_it_is_sent(served: ServedNode) -> None:
    main = main_of(served)
    result = cli("sessions", "cancel", "--node", served.url, main, "--reason", "x" * 1025)
    assert result.exit_code == 2
    assert "--reason" in result.output
    assert f"more than {MAX_REASON_CHARS}" in result.output
    assert served.get(f"/v1/sessions/{main}")["info"]["state"] == "active"


def test_the_api_refuses_a_bad_reason_naming_it(served: ServedNode) -> None:
    main = main_of(served)
    for body in ({"reason": "x" * (MAX_REASON_CHARS + 1)}, {"reason": 5}):
        answer = served.http.post(f"/v1/sessions/{main}/terminate", json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["field"] == "reason"
    assert served.get(f"/v1/sessions/{main}")["info"]["state"] == "active"


def test_embedded_cancel_takes_a_reason(node: Node) -> None:
    main = node.main("assistant")
    worker = main.spawn(kind="worker", task="3600").ref
    assert worker is not None
    with pytest.raises(RejectedInputError) as refused:
        worker.cancel(reason="x" * (MAX_REASON_CHARS + 1))
    assert refused.value.field == "reason"
    with pytest.raises(RejectedInputError):
        node.terminate(worker, reason=b"bytes")  # type: ignore[arg-type]
    assert worker.cancel(0.0, reason="budget review") is None
    result = worker.wait(WAIT)
    assert result is not None
    assert result.error is not None
    assert result.error.detail == {"reason": "budget review"}


# -- the root's options after the command ---------------------------------------------------


def test_verbose_and_token_file_after_the_command(tmp_path: Path, node: Node) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n", encoding="utf-8")
    with ServedNode(node, token="s3cret") as server:
        refused = cli("sessions", "ls", "--node", server.url)
        assert refused.exit_code == 1
        assert "requires a bearer token" in refused.output
        after = cli("sessions", "ls", "--node", server.url, "--token-file", str(token), "-v")
        assert after.exit_code == 0, after.output
        before = cli("--token-file", str(token), "sessions", "ls", "--node", server.url)
        assert before.exit_code == 0, before.output
        status = cli("node", "status", "--token-file", str(token), "--node", server.url)
        assert status.exit_code == 0, status.output


def test_token_file_after_the_command_in_a_real_process(tmp_path: Path) -> None:
    """The console script as a person runs it, against a real node with a token."""
    token = tmp_path / "token"
    token.write_text("s3cret\n", encoding="utf-8")
    node = RunningNode(tmp_path / "store", "--token-file", str(token))
    try:
        node.http.headers["Authorization"] = "Bearer s3cret"
        node.http.post("/v1/sessions", json={"agent_id": "assistant"}).raise_for_status()

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "-m", "sessiontree.cli", *args]
            env = {k: v for k, v in os.environ.items() if k not in NO_ENV}
            return subprocess.run(
                command, capture_output=True, text=True, timeout=60, env=env, check=False
            )

        after = run("sessions", "ls", "--node", node.url, "--json", "--token-file", str(token))
        assert after.returncode == 0, after.stderr
        assert [i["kind"] for i in json.loads(after.stdout)["items"]] == ["main"]
        without = run("sessions", "ls", "--node", node.url)
        assert without.returncode == 1
        assert "requires a bearer token" in without.stderr
    finally:
        assert node.stop() == 0


# -- sessiontree standin ----------------------------------------------------------------------


def test_standin_serves_scripted_replies_then_echoes_until_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sessiontree.cli", "standin", "--port", "0", "--reply", "hi there"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[2]
        assert url.endswith("/v1")
        body = {"model": "standin-small", "messages": [{"role": "user", "content": "ping me"}]}
        with httpx.Client(base_url=url, timeout=WAIT) as http:
            texts = [
                http.post("/chat/completions", json=body).json()["choices"][0]["message"]["content"]
                for _ in range(2)
            ]
            listed = http.get("/models").json()
        assert texts == ["hi there", "echo ping me"]
        assert [m["id"] for m in listed["data"]] == ["standin-small", "standin-large"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, err
        assert "stand-in stopped: 2 requests, 2 completions" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT)


def test_standin_on_a_busy_port_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("standin", "--port", str(port))
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output


def test_the_stand_in_is_public_in_sessiontree_testing() -> None:
    with StandinServer() as model:
        model.script(Reply(text="scripted"))
        answer = httpx.post(
            f"{model.url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            timeout=WAIT,
        )
    assert answer.json()["choices"][0]["message"]["content"] == "scripted"


# -- a command that fails leaves nothing new on disk ---------------------------------------------


def test_node_start_on_a_busy_port_creates_no_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("node", "start", "--store", str(store), "--port", str(port))
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert not store.exists()


def test_a_node_that_cannot_start_takes_its_new_store_away(tmp_path: Path) -> None:
    store, key = tmp_path / "store", tmp_path / "key"
    key.write_text("", encoding="utf-8")
    result = cli(
        "node", "start", "--store", str(store), "--port", "0",
        "--model-url", "http://127.0.0.1:9/v1", "--model", "m", "--api-key-file", str(key),
    )  # fmt: skip
    assert result.exit_code == 1
    assert "the node could not start" in result.output
    assert "is empty" in result.output
    assert not store.exists()


def test_a_refused_import_leaves_no_store_and_keeps_what_was_there(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "an export"}\n', encoding="utf-8")
    new = tmp_path / "new"
    result = cli("import", "--store", str(new), str(bad))
    assert result.exit_code == 1, result.output
    assert "line 1" in result.output
    assert not new.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("mine", encoding="utf-8")
    assert cli("store", "import", "--store", str(empty), str(bad)).exit_code == 1
    assert [p.name for p in empty.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    ("agents", "said"),
    [
        ("nosuch:thing", "cannot import 'nosuch'"),
        ("json:nothing", "'json' has no attribute 'nothing'"),
        ("json", "must look like module:object"),
        ("json:dumps", "raised"),
    ],
)
def test_agents_that_cannot_be_loaded_are_a_usage_error(
    tmp_path: Path, agents: str, said: str
) -> None:
    store = tmp_path / "store"
    result = cli("node", "start", "--store", str(store), "--port", "0", "--agents", agents)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not store.exists()


# -- counts, money and sessions show ---------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "said"),
    [
        (0, "0 branches"),
        (1, "1 branch"),
        (2, "2 branches"),
        (1.0, "1 branch"),
        (2.5, "2.5 branches"),
    ],
)
def test_a_count_takes_its_noun_in_the_right_number(count: float, said: str) -> None:
    assert plural(count, "branch", "branches") == said
    assert plural(count, "call") == said.replace("branches", "calls").replace("branch", "call")


@pytest.mark.parametrize(
    ("cost", "said"),
    [
        (0.0, "$0.00"),
        (1.1e-05, "$0.000011"),
        (0.000273, "$0.000273"),
        (0.5, "$0.50"),
        (12.0, "$12.00"),
        (1.5e-07, "$0.00000015"),
        (1234.5678, "$1234.5678"),
    ],
)
def test_money_is_written_one_way_never_in_exponents(cost: float, said: str) -> None:
    assert money(cost) == said


def test_show_reads_like_a_description(served: ServedNode, node: Node) -> None:
    """A failure block with the stack trace as lines, no deadline once a session
    ended, one budget line; counts and money as everywhere else."""
    main = main_of(served)
    at = ("--node", served.url)
    crashed = js("sessions", "spawn", *at, "--parent", main, "--skill", "crash", "--task", "x")
    sid = crashed["info"]["session_id"]
    assert node.wait(sid, WAIT) is not None
    lines = cli("sessions", "show", *at, sid).output.splitlines()
    assert lines[0] == f"Session {sid}"
    assert "  State         failed" in lines
    assert "  TTL           300 s" in lines  # ended: no deadline, no "in 5m"
    assert not any("runs out" in line for line in lines)
    failure = lines[lines.index("Failure") :]
    assert failure[1] == "  Code          crashed"
    assert failure[2].startswith("  Message       RuntimeError: the crash skill always fails")
    trace = failure[failure.index("  Stack trace") + 1 :]
    assert trace[0] == "    Traceback (most recent call last):"
    assert any(line.startswith('      File "') and "_crash" in line for line in trace)
    assert "    RuntimeError: the crash skill always fails (task 'x')" in trace
    assert not any("\\n" in line for line in lines)  # no escaped JSON
    assert [line for line in lines if "udget" in line] == ["  Budget        none"]
    assert "  Own           0 tokens (0 prompt, 0 completion), 0 calls, cost $0.00" in lines
    # a live one: its deadline, and how long is left
    live = js("sessions", "spawn", *at, "--parent", main, "--task", "3600", "--ttl", "600")
    shown = cli("sessions", "show", *at, live["info"]["session_id"]).output
    assert "runs out" in shown
    assert "(in 9m)" in shown or "(in 10m)" in shown
    assert "Failure" not in shown
    assert "Result" not in shown
    listed = cli("sessions", "ls", *at)
    assert "3 sessions" in listed.output
