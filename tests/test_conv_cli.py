"""``sessiontree conv``: a conversation tree from the command line, on a real store."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiontree.actors import VirtualClock
from sessiontree.cli import main
from sessiontree.protocol import Inbound
from sessiontree.store import Store
from sessiontree.supervision import Agent, Node, NodeConfig
from tests.conftest import WAIT

KEY = "telegram:dm:42"


def chat(session: Any) -> None:
    """A Main that answers each message."""
    if isinstance(session.message, dict) and session.message.get("type") == "chat":
        session.conversation.append("assistant", "echo: " + session.message["inbound"]["text"])


AGENT = Agent("assistant", {"chat": chat}, dm_scope="per-channel-peer")


def say(node: Node, text: str, message_id: str | None = None, reply_to: str | None = None) -> Any:
    routed = node.route(
        Inbound(
            provider="telegram",
            chat_type="dm",
            chat_id="42",
            sender_id="42",
            text=text,
            message_id=message_id,
            reply_to=reply_to,
        )
    )
    assert node.wait_idle(WAIT)
    return routed


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """A store with one Main whose conversation has two branches."""
    with Node([AGENT], NodeConfig(), clock=VirtualClock(), store=tmp_path) as node:
        say(node, "fix the auth bug", "p1")
        say(node, "try OAuth", "p2")
        say(node, "/fork oauth", reply_to="p1")
        say(node, "use Auth0", "p3")
    return tmp_path


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def target(store_dir: Path) -> list[str]:
    return ["--store", str(store_dir), "--agent", "assistant", "--key", KEY]


def test_branches_lists_every_branch_and_marks_the_current(store_dir: Path) -> None:
    result = cli("conv", "branches", *target(store_dir))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("    1  main  (4 messages)")
    assert lines[1].startswith("*   2  oauth  (3 messages)")
    listed = json.loads(cli("conv", "branches", *target(store_dir), "--json").output)
    assert [(b["number"], b["name"], b["current"]) for b in listed] == [
        (1, "main", False),
        (2, "oauth", True),
    ]
    with Store(store_dir, readonly=True) as store:
        main_id = store.main_of("assistant", KEY)
    by_id = cli("conv", "branches", "--store", str(store_dir), "--session", str(main_id), "--json")
    ages = ("age_s",)  # the CLI reads the real clock: it moves between the two calls
    strip = [{k: v for k, v in b.items() if k not in ages} for b in json.loads(by_id.output)]
    assert strip == [{k: v for k, v in b.items() if k not in ages} for b in listed]


def test_context_shows_what_the_agent_sees(store_dir: Path) -> None:
    result = cli("conv", "context", *target(store_dir), "--json")
    assert result.exit_code == 0, result.output
    contents = [m["content"] for m in json.loads(result.output)]
    assert contents == ["fix the auth bug", "use Auth0", "echo: use Auth0"]
    assert set(json.loads(result.output)[0]) >= {"id", "parentId", "role", "branchId"}


def test_tree_exports_text_json_and_an_html_file(store_dir: Path, tmp_path: Path) -> None:
    text = cli("conv", "tree", *target(store_dir)).output
    assert "[2 oauth]" in text
    nested = json.loads(cli("conv", "tree", *target(store_dir), "--format", "json").output)
    assert nested["root"]["children"][0]["content"] == "fix the auth bug"
    page = tmp_path / "tree.html"
    result = cli("conv", "tree", *target(store_dir), "--format", "html", "--out", str(page))
    assert result.exit_code == 0, result.output
    assert "<svg" in page.read_text()


def test_transcript_is_jsonl(store_dir: Path) -> None:
    lines = cli("conv", "transcript", *target(store_dir)).output.splitlines()
    assert [json.loads(line)["content"] for line in lines][:2] == [
        "fix the auth bug",
        "echo: fix the auth bug",
    ]


def test_fork_checkout_merge_and_delete_change_the_stored_tree(store_dir: Path) -> None:
    context = json.loads(cli("conv", "context", *target(store_dir), "--json").output)
    first = context[0]["id"]
    forked = cli("conv", "fork", *target(store_dir), "--from", first, "--name", "idea", "--json")
    assert forked.exit_code == 0, forked.output
    assert json.loads(forked.output)["name"] == "idea"
    assert cli("conv", "checkout", *target(store_dir), "main").exit_code == 0
    merged = cli("conv", "merge", *target(store_dir), "oauth")
    assert merged.output.startswith("merged 2 messages of oauth into main")
    ask = cli("conv", "delete-branch", *target(store_dir), "oauth", "--json")
    plan = json.loads(ask.output)
    assert plan["count"] == 2
    wrong = cli("conv", "delete-branch", *target(store_dir), "idea", "--confirm", plan["token"])
    assert wrong.exit_code == 1  # the token of another branch's plan
    done = cli("conv", "delete-branch", *target(store_dir), "oauth", "--confirm", plan["token"])
    assert done.exit_code == 0, done.output
    names = [
        b["name"] for b in json.loads(cli("conv", "branches", *target(store_dir), "--json").output)
    ]
    assert names == ["main", "idea"]


T = ["--store", "{dir}", "--agent", "assistant", "--key", KEY]
NIL = str(uuid.UUID(int=7))


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["conv", "branches", "--store", "{dir}"], 2, "give --session ID"),
        (["conv", "branches", "--store", "{dir}", "--session", "x-1"], 2, "not a session id"),
        (["conv", "branches", "--store", "{dir}", "--session", NIL], 1, "no session"),
        (["conv", "branches", "--store", "{dir}", "--agent", "nobody"], 1, "has no Main"),
        (
            ["conv", "branches", "--store", "{dir}", "--agent", "assistant", "--key", "x"],
            2,
            "--key",
        ),
        (["conv", "checkout", *T, "9"], 1, "no branch"),
        (["conv", "fork", *T, "--from", "m"], 1, "UUID"),
        (["conv", "context", *T, "--limit", "-1"], 2, "--limit"),
        (["conv", "branches", "--store", "{missing}", "--agent", "assistant"], 1, "no store"),
    ],
)
def test_mistakes_exit_non_zero_with_one_line_naming_them(
    store_dir: Path, tmp_path: Path, args: list[str], code: int, says: str
) -> None:
    filled = [a.format(dir=store_dir, missing=tmp_path / "missing") for a in args]
    result = CliRunner().invoke(main, filled)
    assert result.exit_code == code, result.output
    assert says in result.output


def test_reads_work_beside_a_live_node_and_writes_are_refused(store_dir: Path) -> None:
    with Node([AGENT], NodeConfig(), clock=VirtualClock(), store=store_dir):
        script = (
            "import sys; from sessiontree.cli import main; "
            "sys.exit(main(sys.argv[1:], prog_name='sessiontree'))"
        )
        read = subprocess.run(
            [sys.executable, "-c", script, "conv", "branches", *target(store_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=WAIT * 3,
            check=False,
        )
        assert read.returncode == 0, read.stderr
        assert [b["name"] for b in json.loads(read.stdout)] == ["main", "oauth"]
        write = subprocess.run(
            [sys.executable, "-c", script, "conv", "checkout", *target(store_dir), "main"],
            capture_output=True,
            text=True,
            timeout=WAIT * 3,
            check=False,
        )
        assert write.returncode == 1
        assert "held by another node" in write.stderr


def test_a_conversation_of_one_branch_says_branch(tmp_path: Path) -> None:
    with Node([AGENT], NodeConfig(), clock=VirtualClock(), store=tmp_path) as node:
        say(node, "/new", "p1")  # a conversation of one branch
    text = cli("conv", "tree", *target(tmp_path)).output
    assert ": 1 branch, current" in text.splitlines()[0]
