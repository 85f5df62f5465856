"""A CLI that fits the hand (issue 23), through the real commands: the default
node address and the order of --node, --store and the environment; short id
prefixes everywhere; paging with cursors; terminate and cancel --grace;
human times in tables and ISO 8601 in --json; --agents from the current
folder; help text on every command and option."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from sessiontree.cli import main as cli_main
from sessiontree.cli._agents import builtin_agents
from sessiontree.protocol import new_session_id
from sessiontree.supervision import Node, NodeConfig
from tests._running_node import RunningNode
from tests._served import ServedNode

pytestmark = pytest.mark.timeout(120)

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
UNREACHABLE = "http://127.0.0.1:9"
NO_ENV = {"SESSIONTREE_NODE": None, "SESSIONTREE_STORE": None}

# ids the node hands out first, so prefixes are shared on purpose
MAIN = "aaaa0000-0000-4000-8000-000000000001"
W1 = "bbbb1111-0000-4000-8000-000000000002"
W2 = "bbbb2222-0000-4000-8000-000000000003"


def cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli_main, list(args), env={**NO_ENV, **(env or {})})


def ok(*args: str, env: dict[str, str | None] | None = None) -> Result:
    result = cli(*args, env=env)
    assert result.exit_code == 0, result.output
    return result


def js(*args: str, env: dict[str, str | None] | None = None) -> Any:
    return json.loads(ok(*args, "--json", env=env).stdout)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServedNode]:
    """The built-in agents on a node with a store, served on 127.0.0.1; its
    first three sessions get the ids above (a Main, two workers)."""
    chosen = iter([uuid.UUID(MAIN), uuid.UUID(W1), uuid.UUID(W2)])
    monkeypatch.setattr(
        "sessiontree.supervision._spawning.new_session_id",
        lambda slot=None: next(chosen, None) or new_session_id(slot),
    )
    node = Node(builtin_agents(), NodeConfig(grace=30.0), store=tmp_path / "store")
    server = ServedNode(node)
    try:
        yield server
    finally:
        server.close()
        node.shutdown(grace=0, timeout=10.0)


def tree_of(served: ServedNode) -> None:
    """The Main with two sleeping workers (the chosen ids)."""
    at = ["--node", served.url]
    assert js("sessions", "spawn", *at, "--agent", "assistant")["info"]["session_id"] == MAIN
    for expected in (W1, W2):
        made = js("sessions", "spawn", *at, "--parent", "aaaa", "--task", "3600", "--ttl", "600")
        assert made["info"]["session_id"] == expected


# -- where a command reads -------------------------------------------------------------------


def test_sessions_ls_with_no_flags_reads_the_node_at_the_default_address(tmp_path: Path) -> None:
    node = RunningNode(tmp_path / "store", port=None)  # node start's default port
    try:
        assert node.url == "http://127.0.0.1:8470"
        node.http.post("/v1/sessions", json={"agent_id": "assistant"}).raise_for_status()
        listed = js("sessions", "ls")
        assert [i["kind"] for i in listed["items"]] == ["main"]
        assert "main   active" in ok("sessions", "ls").stdout
        assert js("node", "status")["state"] == "open"
    finally:
        assert node.stop() == 0


def test_an_explicit_store_wins_over_an_exported_node(served: ServedNode, tmp_path: Path) -> None:
    tree_of(served)
    store = str(tmp_path / "store")
    served.node.shutdown(grace=0, timeout=10.0)  # the store is read in this process next
    listed = js("sessions", "ls", "--store", store, env={"SESSIONTREE_NODE": UNREACHABLE})
    assert [i["session_id"] for i in listed["items"]] == [MAIN, W1, W2]
    # the exported store is read when no flag is given
    assert len(js("sessions", "ls", env={"SESSIONTREE_STORE": store})["items"]) == 3
    # an exported node wins over an exported store
    both = cli("sessions", "ls", env={"SESSIONTREE_STORE": store, "SESSIONTREE_NODE": UNREACHABLE})
    assert both.exit_code == 69
    assert "SESSIONTREE_NODE" in both.output
    # both flags at once is a usage error
    assert cli("sessions", "ls", "--store", store, "--node", UNREACHABLE).exit_code == 2


def test_an_explicit_node_wins_over_an_exported_store(served: ServedNode, tmp_path: Path) -> None:
    tree_of(served)
    env: dict[str, str | None] = {"SESSIONTREE_STORE": str(tmp_path / "elsewhere")}
    assert len(js("sessions", "ls", "--node", served.url, env=env)["items"]) == 3


def test_an_unreachable_default_node_says_where_it_looked() -> None:
    result = cli("sessions", "ls", "--node", UNREACHABLE)
    assert result.exit_code == 69
    assert "(--node)" in result.output


# -- short ids -------------------------------------------------------------------------------


def test_the_short_ids_ls_prints_are_taken_by_every_command(served: ServedNode) -> None:
    tree_of(served)
    at = ["--node", served.url]
    shorts = [line.split()[2] for line in ok("sessions", "ls", *at).stdout.splitlines()]
    assert shorts == [MAIN[:8], W1[:8], W2[:8]]
    main, w1, w2 = shorts
    assert js("sessions", "show", *at, w1)["info"]["session_id"] == W1
    assert js("sessions", "tree", *at, main)["children"][0]["info"]["session_id"] == W1
    assert js("sessions", "send", *at, main, "hi")["info"]["session_id"] == MAIN
    assert js("sessions", "cancel", *at, w1, "--grace", "5")["info"]["session_id"] == W1
    assert js("sessions", "wait", *at, w1, "--timeout", "30")["status"] == "cancelled"
    assert js("sessions", "terminate", *at, w2)["info"]["state"] == "cancelled"
    received = js("sessions", "results", *at, main)
    assert {r["session_id"] for r in received} == {W1, W2}
    assert "worker cancelled" in ok("sessions", "results", *at, main[:5]).stdout
    refused = cli("sessions", "suspend", *at, w1)  # resolved, then refused by the node
    assert refused.exit_code == 1
    assert "invalid_transition" in refused.output
    assert cli("sessions", "resume", *at, w1).exit_code == 1
    branches = ok("conv", "branches", *at, "--session", main[:6])
    assert "main" in branches.stdout


def test_an_ambiguous_prefix_lists_its_candidates_and_exits_2(served: ServedNode) -> None:
    tree_of(served)
    at = ["--node", served.url]
    for command in (("show",), ("cancel",), ("terminate",), ("tree",)):
        result = cli("sessions", *command, *at, "bbbb")
        assert result.exit_code == 2, result.output
        assert "ambiguous" in result.output
        assert W1 in result.output
        assert W2 in result.output
    missing = cli("sessions", "show", *at, "cccc")
    assert missing.exit_code == 2
    assert "no session starts with 'cccc'" in missing.output
    assert cli("sessions", "show", *at, "bb").exit_code == 2  # too short to be a prefix
    assert cli("sessions", "show", *at, "bbbb-zz").exit_code == 2  # not hex
    # a full id is taken as it is: an unknown one is the node's 404
    unknown = cli("sessions", "show", *at, str(uuid.uuid4()))
    assert unknown.exit_code == 1
    assert "unknown_session" in unknown.output


def test_prefixes_resolve_against_a_store_too(served: ServedNode, tmp_path: Path) -> None:
    tree_of(served)
    served.node.shutdown(grace=0, timeout=10.0)
    at = ["--store", str(tmp_path / "store")]
    assert js("sessions", "show", *at, "bbbb1")["info"]["session_id"] == W1
    assert js("sessions", "show", *at, "bbbb2222-0")["info"]["session_id"] == W2
    assert js("sessions", "tree", *at, "aaaa0")["info"]["session_id"] == MAIN
    ambiguous = cli("sessions", "show", *at, "bbbb")
    assert ambiguous.exit_code == 2
    assert W1 in ambiguous.output
    assert W2 in ambiguous.output
    assert "no session starts with" in cli("sessions", "show", *at, "cccc").output


def test_the_api_filters_sessions_by_id_prefix(served: ServedNode) -> None:
    tree_of(served)
    ids = [i["session_id"] for i in served.get("/v1/sessions", prefix="bbbb")["items"]]
    assert ids == [W1, W2]
    bad = served.http.get("/v1/sessions", params={"prefix": "BBBB"})
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == "prefix"


# -- paging ----------------------------------------------------------------------------------


def follow(*args: str) -> list[str]:
    """Every session id ``ls`` lists, page by page, following the cursors."""
    seen: list[str] = []
    cursor: list[str] = []
    while True:
        page = js("sessions", "ls", *args, "--limit", "2", *cursor)
        assert len(page["items"]) <= 2
        seen += [i["session_id"] for i in page["items"]]
        if page["next_cursor"] is None:
            return seen
        cursor = ["--cursor", page["next_cursor"]]


def test_ls_pages_with_cursors_on_a_node_and_on_a_store(served: ServedNode, tmp_path: Path) -> None:
    tree_of(served)
    at = ["--node", served.url]
    for _ in range(2):
        ok("sessions", "spawn", *at, "--parent", MAIN, "--task", "0")
    everything = [i["session_id"] for i in js("sessions", "ls", *at)["items"]]
    assert len(everything) == 5
    assert follow(*at) == everything
    first = cli("sessions", "ls", *at, "--limit", "2")
    assert len(first.stdout.splitlines()) == 2
    assert "--cursor " in first.stderr
    bad = cli("sessions", "ls", *at, "--cursor", "nope")
    assert bad.exit_code == 1
    assert "cursor" in bad.output

    served.node.shutdown(grace=0, timeout=10.0)
    stored = ["--store", str(tmp_path / "store")]
    assert follow(*stored) == everything
    refused = cli("sessions", "ls", *stored, "--cursor", "nope")
    assert refused.exit_code == 2
    assert "--cursor" in refused.output


# -- cancel --grace and terminate ----------------------------------------------------------


def test_terminate_and_cancel_grace_0_end_a_session_by_force(served: ServedNode) -> None:
    tree_of(served)
    at = ["--node", served.url]
    ended = js("sessions", "terminate", *at, W1)
    assert ended["result"]["error"]["code"] == "terminated_by_force"
    assert "terminated_by_force" in ok("sessions", "cancel", *at, "--grace", "0", W2).stdout
    again = cli("sessions", "terminate", *at, W2)
    assert again.exit_code == 1
    assert "invalid_transition" in again.output
    assert cli("sessions", "cancel", *at, "--grace", "-1", MAIN).exit_code == 2


def test_the_cancel_route_takes_a_checked_grace(served: ServedNode) -> None:
    tree_of(served)
    for body in ('{"grace": -1}', '{"grace": "5"}', '{"grace": 1e400}', '{"x": 1}', "[]"):
        answer = served.http.post(
            f"/v1/sessions/{W1}/cancel",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 400, (body, answer.text)
    answer = served.http.post(f"/v1/sessions/{W1}/cancel", json={"grace": 5})
    assert answer.status_code == 202
    assert answer.json()["info"]["session_id"] == W1
    forced = served.http.post(f"/v1/sessions/{W2}/terminate")
    assert forced.status_code == 202
    assert forced.json()["result"]["error"]["code"] == "terminated_by_force"
    body = served.http.post(f"/v1/sessions/{W1}/cancel", json={"grace": -1}).json()
    assert body["error"]["field"] == "grace"
    schema = served.get("/schema/openapi.json")
    assert "/v1/sessions/{session_id}/terminate" in schema["paths"]


# -- skills ----------------------------------------------------------------------------------


def test_ls_filters_by_skill_and_ls_and_tree_show_each_sessions_skill(
    served: ServedNode, tmp_path: Path
) -> None:
    tree_of(served)  # the Main runs chat, the two workers the default skill, work
    at = ["--node", served.url]
    crashed = js("sessions", "spawn", *at, "--parent", "aaaa", "--skill", "crash")["info"]
    assert js("sessions", "wait", *at, crashed["session_id"], "--timeout", "30")
    listed = js("sessions", "ls", *at, "--skill", "work")
    assert [i["session_id"] for i in listed["items"]] == [W1, W2]
    assert [i["session_id"] for i in js("sessions", "ls", *at, "--skill", "chat")["items"]] == [
        MAIN
    ]
    both = js("sessions", "ls", *at, "--skill", "crash", "--state", "failed")["items"]
    assert [i["session_id"] for i in both] == [crashed["session_id"]]
    none = cli("sessions", "ls", *at, "--skill", "nosuch")
    assert none.exit_code == 0
    assert none.stdout == ""
    assert "0 sessions" in none.stderr
    # the table's fourth column is the skill
    skills = {
        line.split()[2]: line.split()[3] for line in ok("sessions", "ls", *at).stdout.splitlines()
    }
    assert skills == {
        MAIN[:8]: "chat",
        W1[:8]: "work",
        W2[:8]: "work",
        crashed["session_id"][:8]: "crash",
    }
    tree = ok("sessions", "tree", *at, MAIN).stdout.splitlines()
    assert re.search(r"main\s+active\s+aaaa0000  chat\s+created", tree[0]), tree[0]
    assert all(re.search(r"  (work|crash)\s+created", line) for line in tree[1:]), tree
    # the HTTP API's filter, and a bad one named
    answer = served.http.get("/v1/sessions", params={"skill": "work"})
    assert [i["session_id"] for i in answer.json()["items"]] == [W1, W2]
    long = served.http.get("/v1/sessions", params={"skill": "x" * 129})
    assert long.status_code == 400
    assert "skill" in long.text
    # from a store, the same answer
    served.node.shutdown(grace=0, timeout=10.0)
    store = ["--store", str(tmp_path / "store")]
    stored = js("sessions", "ls", *store, "--skill", "work")["items"]
    assert [i["session_id"] for i in stored] == [W1, W2]


def test_node_status_lists_each_agents_skills(served: ServedNode) -> None:
    at = ["--node", served.url]
    status = js("node", "status", *at)
    assert status["skills"] == {"assistant": ["chat", "model", "work", "fan_out", "crash"]}
    assert served.node.skills == status["skills"]
    text = ok("node", "status", *at).stdout
    assert "  agent assistant: skills chat, model, work, fan_out, crash\n" in text


# -- times -----------------------------------------------------------------------------------


def test_tables_say_human_times_and_json_says_iso_8601(served: ServedNode) -> None:
    tree_of(served)
    at = ["--node", served.url]
    shown = js("sessions", "show", *at, W1)
    assert ISO.match(shown["info"]["created_at"])
    assert ISO.match(shown["info"]["deadline"])
    assert all(ISO.match(i["created_at"]) for i in js("sessions", "ls", *at)["items"])
    line = ok("sessions", "ls", *at).stdout.splitlines()[1]
    assert re.search(r"created (just now|\d+s ago), ttl in (9|10)m", line), line
    table = ok("sessions", "show", *at, W1).stdout
    assert re.search(r"Created +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(", table), table
    assert re.search(r"TTL +600 s, runs out \S+ \S+ \(in (9|10)m\)", table), table
    ok("sessions", "terminate", *at, W1)
    ended = js("sessions", "show", *at, W1)["result"]["timings"]
    assert ISO.match(ended["ended_at"])
    table = ok("sessions", "show", *at, W1).stdout  # an ended session has no deadline
    assert re.search(r"\n  TTL +600 s\n", table), table
    assert re.search(r"\n  Ended +\S+ \S+ \((just now|\d+s ago)\), ran \d+\.\d\d s\n", table)


# -- --agents from the current folder -------------------------------------------------------


def test_node_start_imports_agents_from_the_current_folder(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mod.py").write_text(
        textwrap.dedent(
            """
            from sessiontree.supervision import Agent

            def chat(session):
                return None

            agents = [Agent("mine", {"chat": chat}, main_skill="chat")]
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = Path(sys.executable).parent / "sessiontree"  # the console script, as a user runs it
    command = [str(script), "node", "start", "--store", "store", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--agents", "mod:agents"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())  # the effective settings
        listening = proc.stdout.readline()
        assert listening.startswith("listening on "), proc.stderr.read() if proc.stderr else ""
        assert "(agents: mine)" in listening
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert proc.returncode == 0


# -- help ------------------------------------------------------------------------------------


def walk(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``command``, the ones a group imports lazily included."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, f"{path} lists {name} but has no such command"
            yield from walk(sub, f"{path} {name}")


def test_every_command_and_option_has_help_text() -> None:
    missing: list[str] = []
    for path, command in walk(cli_main, "sessiontree"):
        if not (command.help or command.short_help or "").strip():
            missing.append(path)
        missing += [
            f"{path} {param.opts[0]}"
            for param in command.params
            if isinstance(param, click.Option) and not (param.help or "").strip()
        ]
    assert missing == []
