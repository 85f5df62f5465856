"""The standalone node and the CLI, against real node subprocesses: start,
settings precedence, signals, the one-node-per-store rule, the sessions,
node and conv commands (on a node and on a store beside it), exit codes and
shell completion."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from sessiontree.cli import main as cli_main
from sessiontree.cli.commands._node import _bind
from tests._running_node import ROOT, RunningNode

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli_main, list(args), env=env, catch_exceptions=False)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``sessiontree`` command in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def node(store: Path) -> Iterator[RunningNode]:
    running = RunningNode(store, "--grace", "2")
    yield running
    if running.proc.poll() is None:
        running.kill()


def post(node: RunningNode, path: str, body: Any = None) -> Any:
    answer = node.http.post(path, json=body if body is not None else {})
    assert answer.status_code < 300, answer.text
    return answer.json()


def open_main(node: RunningNode) -> str:
    return str(post(node, "/v1/sessions", {"agent_id": "assistant"})["info"]["session_id"])


def spawn(node: RunningNode, parent: str, **spec: Any) -> str:
    made = post(node, f"/v1/sessions/{parent}/children", {"kind": "worker", **spec})
    return str(made["info"]["session_id"])


# -- the node ------------------------------------------------------------------------------


def test_a_node_serves_and_stops_with_exit_0_on_sigterm(node: RunningNode) -> None:
    assert node.http.get("/healthz").json() == {"status": "ok"}
    assert node.http.get("/readyz").status_code == 200
    assert "sessiontree_" in node.http.get("/metrics").text
    open_main(node)
    assert node.stop(signal.SIGTERM) == 0
    assert "node stopped" in node.log()


def test_settings_come_from_file_then_environment_then_flags(store: Path, tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        'name = "from-file"\nmax_wait = 7.0\nhost = "127.0.0.1"\n'
        "[node]\ngrace = 3.0\nmax_sessions = 100\nstuck_after = 60.0\n"
    )
    running = RunningNode(
        store,
        "--config",
        str(config),
        "--max-sessions",
        "200",
        env={"SESSIONTREE_NODE_START_NAME": "from-env", "SESSIONTREE_NODE_START_MAX_WAIT": ""},
    )
    try:
        shown = running.config
        assert shown["name"] == "from-env"
        assert shown["max_wait"] == 7.0
        assert shown["node"]["grace"] == 3.0
        assert shown["node"]["max_sessions"] == 200
        assert shown["node"]["stuck_after"] == 60.0
        assert running.sources["name"] == "env"
        assert running.sources["max_wait"] == "file"
        assert running.sources["max_sessions"] == "flag"
        assert running.sources["port"] == "flag"
        status = running.http.get("/v1/node").json()
        assert status["node"] == "from-env"
        assert status["config"]["max_sessions"] == 200
    finally:
        assert running.stop() == 0


def test_a_node_started_with_the_process_backend_runs_workers_in_its_pool(store: Path) -> None:
    running = RunningNode(store, "--backend", "process", "--process-workers", "1")
    try:
        assert running.config["node"]["backend"] == "process"
        assert running.config["node"]["process_workers"] == 1
        assert running.config["node"]["gc_tuning"] is True  # a node owns its process
        assert running.sources["gc_tuning"] == "default"
        assert running.sources["backend"] == "flag"
        child = spawn(running, open_main(running), task="0")
        waited = running.http.get(f"/v1/sessions/{child}/result", params={"timeout": 30}).json()
        assert waited["done"] is True
        assert waited["result"]["summary"] == "done: 0"
        info = running.http.get(f"/v1/sessions/{child}").json()
        assert info["info"]["backend"] == "process"
    finally:
        assert running.stop() == 0


def test_shutdown_keeps_mains_resumes_branches_and_cancels_workers(store: Path) -> None:
    first = RunningNode(store, "--grace", "2")
    main = open_main(first)
    branch = spawn(first, main, kind="branch", skill="work", task="3600")
    worker = spawn(first, main, skill="work", task="3600")
    assert first.stop(signal.SIGTERM) == 0

    again = RunningNode(store, "--grace", "2")
    try:
        assert again.http.get(f"/v1/sessions/{main}").json()["info"]["state"] == "active"
        assert again.http.get(f"/v1/sessions/{branch}").json()["info"]["state"] == "active"
        ended = again.http.get(f"/v1/sessions/{worker}").json()
        assert ended["info"]["state"] == "cancelled"
        assert ended["result"]["error"]["code"] == "cancelled"
        told = again.http.get(f"/v1/sessions/{main}/results").json()
        assert [r["session_id"] for r in told] == [worker]  # the parent was told, once
    finally:
        assert again.stop() == 0


def test_a_second_signal_forces_the_shutdown(store: Path) -> None:
    running = RunningNode(store, "--grace", "60")
    main = open_main(running)
    stubborn = spawn(running, main, skill="stubborn")
    running.send(signal.SIGTERM)
    running.wait_log("a second signal forces")
    code = running.stop(signal.SIGTERM, timeout=30)
    assert code == 1
    assert "forcing the shutdown" in running.log()
    again = RunningNode(store)  # the store was flushed and let go
    try:
        ended = again.http.get(f"/v1/sessions/{stubborn}").json()
        assert ended["result"]["error"]["code"] == "terminated_by_force"
    finally:
        assert again.stop() == 0


def test_a_second_node_on_the_same_store_is_refused(node: RunningNode, store: Path) -> None:
    second = run("node", "start", "--store", str(store), "--port", "0")
    assert second.returncode == 1
    assert "held by another node" in second.stderr
    assert node.http.get("/readyz").status_code == 200


def test_a_bad_agents_path_is_a_usage_error_naming_it(store: Path) -> None:
    result = run("node", "start", "--store", str(store), "--port", "0", "--agents", "nope:x")
    assert result.returncode == 2
    assert "cannot import 'nope'" in result.stderr
    assert not store.exists()


def test_a_bad_config_file_is_a_usage_error(store: Path, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("colour = 'red'\n")
    result = run("node", "start", "--store", str(store), "--config", str(config))
    assert result.returncode == 2
    assert "unknown setting 'colour'" in result.stderr
    config.write_text('port = "abc"\n')
    result = run("node", "start", "--store", str(store), "--config", str(config))
    assert result.returncode == 2
    assert "port = 'abc'" in result.stderr
    config.write_text("[node]\ngrace = -1\n")
    result = run("node", "start", "--store", str(store), "--config", str(config))
    assert result.returncode == 2
    assert "grace" in result.stderr


# -- the CLI against a running node and beside it ---------------------------------------------


def test_sessions_commands_against_a_running_node(node: RunningNode, store: Path) -> None:
    at = ["--node", node.url]
    made = cli("sessions", "spawn", *at, "--agent", "assistant", "--json")
    assert made.exit_code == 0, made.output
    main = json.loads(made.output)["info"]["session_id"]
    worker = json.loads(
        cli("sessions", "spawn", *at, "--parent", main, "--task", "0", "--json").output
    )["info"]["session_id"]
    waited = cli("sessions", "wait", *at, worker, "--json", "--timeout", "30")
    assert waited.exit_code == 0, waited.output
    assert json.loads(waited.output)["status"] == "completed"
    listed = json.loads(cli("sessions", "ls", *at, "--json").output)
    assert {i["session_id"] for i in listed["items"]} == {main, worker}
    assert listed["next_cursor"] is None
    shown = json.loads(cli("sessions", "show", *at, worker, "--json").output)
    assert shown["result"]["summary"] == "done: 0"
    tree = cli("sessions", "tree", *at, main)
    assert tree.exit_code == 0
    lines = tree.output.splitlines()
    assert lines[0].startswith("main   active")
    assert "created just now" in lines[0] or " ago" in lines[0]
    assert lines[1].startswith("`-- worker completed")

    # read-only, straight from the store, while the node runs
    stored = json.loads(cli("sessions", "ls", "--store", str(store), "--json").output)
    assert {i["session_id"] for i in stored["items"]} == {main, worker}
    stored_tree = json.loads(cli("sessions", "tree", "--store", str(store), main, "--json").output)
    assert stored_tree["children"][0]["info"]["session_id"] == worker
    status = json.loads(cli("node", "status", *at, "--json").output)
    assert status["sessions"]["completed"] == 1
    stored_status = json.loads(cli("node", "status", "--store", str(store), "--json").output)
    assert stored_status["sessions"] == {"active": 1, "completed": 1}

    sleeper = json.loads(
        cli("sessions", "spawn", *at, "--parent", main, "--task", "3600", "--json").output
    )["info"]["session_id"]
    assert cli("sessions", "cancel", *at, sleeper).exit_code == 0
    refused = cli("sessions", "suspend", *at, worker)
    assert refused.exit_code == 1
    assert "invalid_transition" in refused.output or "session_not_active" in refused.output
    sent = cli("sessions", "send", *at, main, '{"text": "hi"}', "--json")
    assert sent.exit_code == 0, sent.output
    timed_out = cli("sessions", "wait", *at, main, "--timeout", "0.2", "-q")
    assert timed_out.exit_code == 1


def test_conv_commands_through_a_running_node(node: RunningNode, store: Path) -> None:
    routed = post(
        node,
        "/v1/route",
        {"provider": "telegram", "chat_type": "dm", "chat_id": "1", "sender_id": "2", "text": "q"},
    )
    at = ["--node", node.url, "--agent", "assistant"]
    first = json.loads(cli("conv", "context", *at, "--json").output)[0]
    forked = cli("conv", "fork", *at, "--from", first["id"], "--name", "alt", "--json")
    assert forked.exit_code == 0, forked.output
    names = [b["name"] for b in json.loads(cli("conv", "branches", *at, "--json").output)]
    assert names == ["main", "alt"]
    assert cli("conv", "checkout", *at, "main").exit_code == 0
    step = cli("conv", "delete-branch", *at, "alt", "--json")
    token = json.loads(step.output)["token"]
    assert cli("conv", "delete-branch", *at, "alt", "--confirm", token).exit_code == 0
    # the store beside the running node sees the change (read-only)
    beside = ["--store", str(store), "--session", routed["session_id"]]
    stored = [b["name"] for b in json.loads(cli("conv", "branches", *beside, "--json").output)]
    assert stored == ["main"]
    page = cli("conv", "tree", *at, "--format", "html")
    assert "<svg" in page.output or "<html" in page.output.lower()
    # writing the store under a running node is refused (one writer)
    refused = cli("conv", "fork", *beside, "--from", first["id"])
    assert refused.exit_code == 1


# -- exit codes and completion ---------------------------------------------------------------


def test_an_unreachable_node_exits_69() -> None:
    result = run("sessions", "ls", "--node", "http://127.0.0.1:9", "--json")
    assert result.returncode == 69
    assert "unreachable" in result.stderr
    assert result.stdout == ""
    assert cli("node", "status", "--node", "http://127.0.0.1:9").exit_code == 69


def test_usage_mistakes_exit_2() -> None:
    assert cli("sessions", "ls", "--node", "http://x", "--store", ".").exit_code == 2  # both
    assert cli("sessions", "show", "--node", "http://x", "not-an-id").exit_code == 2
    assert cli("node", "start").exit_code == 2  # no store
    assert cli("sessions", "cancel", "--store", ".", "x").exit_code == 2  # writes need --node
    assert cli("sessions", "ls", "--node", "localhost:8470").exit_code == 2  # not a URL


def test_the_node_url_comes_from_the_environment() -> None:
    result = cli("node", "status", env={"SESSIONTREE_NODE": "http://127.0.0.1:9"})
    assert result.exit_code == 69


def test_shell_completion_completes_commands_and_options() -> None:
    env = {
        "_SESSIONTREE_COMPLETE": "bash_complete",
        "COMP_WORDS": "sessiontree ses",
        "COMP_CWORD": "1",
    }
    result = run(env=env)
    assert "plain,sessions" in result.stdout
    env = {**env, "COMP_WORDS": "sessiontree sessions ls --j", "COMP_CWORD": "3"}
    assert "plain,--json" in run(env=env).stdout
    script = run(env={"_SESSIONTREE_COMPLETE": "bash_source"})
    assert "complete " in script.stdout


def test_the_listening_socket_lets_asyncio_turn_nagle_off() -> None:
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; without
    # it every small answer waited ~40 ms for a delayed ACK (23 GETs/s, not 764)
    with _bind("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
    with pytest.raises(click.ClickException, match="cannot listen"):
        _bind("256.0.0.1", 0)
