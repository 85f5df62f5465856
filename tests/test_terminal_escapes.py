"""What a node holds cannot drive the terminal the CLI prints it on (issue 38).

A task full of control characters (a window-title sequence, colours, a
carriage return, an 8-bit CSI, a bidirectional override, NUL, DEL) and Rich
markup goes through a real node on 127.0.0.1; ``sessions show``, ``ls``,
``tree``, ``results``, ``wait``, the conversation commands and an error
are run as real subprocesses and their output bytes read back: no control
byte of the task arrives, each is shown visibly, every table row stays one
line, and JSON output stays exact. ``sessiontree top`` (Textual) shows such
text literally, markup unparsed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from typing import Any

import pytest

from sessiontree.cli._agents import BUILTIN
from sessiontree.cli._text import SafeFormatter, shown, shown_block, terminal_safe
from sessiontree.cli.top._app import ConfirmScreen, TopApp
from sessiontree.cli.top._source import Outcome, Snapshot
from tests._running_node import ROOT, RunningNode
from tests.conftest import WAIT

pytestmark = pytest.mark.timeout(120)

HOSTILE = (
    "\x1b]0;pwned\x07 \x1b[31mred\x1b[0m [bold]markup[/bold] line1\nline2\r\x9b2J "
    "\u202e \x00\x7f end"
)
#: what must never reach the terminal raw: each control the task holds
FORBIDDEN = [b"\x1b", b"\x07", b"\r", b"\x00", b"\x7f", "\x9b".encode(), "\u202e".encode()]
VISIBLE = r"\x1b]0;pwned\x07 \x1b[31mred\x1b[0m [bold]markup[/bold] line1\nline2\r\x9b2J"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    running = RunningNode(tmp_path_factory.mktemp("escapes") / "store", agents=BUILTIN)
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def tree(node: RunningNode) -> dict[str, str]:
    """A Main, a branch whose task (and so its summary, ``done: <task>``) and
    context are hostile, and a hostile message and the Main's echo of it in
    its conversation."""
    main = node.http.post("/v1/sessions", json={"agent_id": "assistant"}).json()
    main_id = main["info"]["session_id"]
    spec = {"kind": "branch", "skill": "work", "task": HOSTILE, "context_summary": HOSTILE}
    child = node.http.post(f"/v1/sessions/{main_id}/children", json=spec)
    assert child.status_code == 201, child.text
    child_id = child.json()["info"]["session_id"]
    done = node.http.get(f"/v1/sessions/{child_id}/result", params={"timeout": WAIT}).json()
    assert done["result"]["summary"] == f"done: {HOSTILE}"
    sent = node.http.post(f"/v1/sessions/{main_id}/messages", json={"message": HOSTILE})
    assert sent.status_code == 202, sent.text
    for _ in range(200):  # the turn and its echo land in the conversation: bounded
        context = node.http.get(f"/v1/sessions/{main_id}/conversation/context").json()
        if len(context) >= 2:
            break
        node.http.get(f"/v1/sessions/{main_id}/result", params={"timeout": 0.05})
    assert [m["content"] for m in context] == [HOSTILE, f"echo: {HOSTILE}"]
    return {"main": main_id, "child": child_id}


def _run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The real ``sessiontree`` command; its output as the terminal would get it."""
    return subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", *args],
        cwd=ROOT, capture_output=True, timeout=60, check=False,
    )  # fmt: skip


def _clean(out: bytes) -> str:
    for raw in FORBIDDEN:
        assert raw not in out, (raw, out[:2000])
    return out.decode()


@pytest.mark.parametrize("source", ["node", "store"])
def test_show_ls_and_tree_print_the_task_visibly_on_one_line(
    node: RunningNode, tree: dict[str, str], source: str
) -> None:
    where = ["--node", node.url] if source == "node" else ["--store", node.config["store"]]
    show = _run("sessions", "show", tree["child"], *where)
    assert show.returncode == 0, show.stderr
    text = _clean(show.stdout)
    task_lines = [line for line in text.splitlines() if line.startswith("  Task ")]
    assert task_lines == [f"  Task          {VISIBLE} \\u202e \\x00\\x7f end"]
    context = [line for line in text.splitlines() if line.startswith("  Context ")]
    assert len(context) == 1
    assert VISIBLE in context[0]
    summary = [line for line in text.splitlines() if line.startswith("  Summary ")]
    assert summary == [f"  Summary       done: {VISIBLE} \\u202e \\x00\\x7f end"]
    listed = _run("sessions", "ls", *where)
    assert listed.returncode == 0, listed.stderr
    rows = _clean(listed.stdout).splitlines()
    assert len(rows) == 2  # the Main and the worker: one line each
    assert r'"\x1b]0;pwned\x07 \x1b[31mred\x1b[0m [bold]markup[/b~"' in rows[1]
    drawn = _run("sessions", "tree", tree["main"], *where)
    assert drawn.returncode == 0, drawn.stderr
    lines = _clean(drawn.stdout).splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("`-- branch completed ")
    results = _run("sessions", "results", tree["main"], *where)
    assert results.returncode == 0, results.stderr
    (line,) = _clean(results.stdout).splitlines()
    assert f"done: {VISIBLE}" in line


def test_wait_prints_the_summary_with_its_newlines_and_nothing_raw(
    node: RunningNode, tree: dict[str, str]
) -> None:
    waited = _run("sessions", "wait", tree["child"], "--node", node.url)
    assert waited.returncode == 0, waited.stderr
    lines = _clean(waited.stdout).splitlines()
    # a summary printed on lines of its own keeps its newline, nothing else
    assert lines == [
        "completed",
        r"done: \x1b]0;pwned\x07 \x1b[31mred\x1b[0m [bold]markup[/bold] line1",
        r"line2\r\x9b2J \u202e \x00\x7f end",
    ]


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_json_output_stays_exact(node: RunningNode, tree: dict[str, str]) -> None:
    show = _run("sessions", "show", tree["child"], "--node", node.url, "--json")
    assert show.returncode == 0, show.stderr
    assert json.loads(_clean(show.stdout))["info"]["task"] == HOSTILE
    transcript = _run("conv", "transcript", "--session", tree["main"], "--node", node.url)
    assert transcript.returncode == 0, transcript.stderr
    said = [json.loads(line) for line in _clean(transcript.stdout).splitlines()]
    assert [m.get("content") for m in said] == [HOSTILE, f"echo: {HOSTILE}"]
    exported = _run("store", "export", "--store", node.config["store"])
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in _clean(exported.stdout).splitlines()]
    assert HOSTILE in set(_strings(lines))  # the task, exact


def test_the_conversation_commands_print_nothing_raw(
    node: RunningNode, tree: dict[str, str]
) -> None:
    session = ["--session", tree["main"], "--node", node.url]
    context = _run("conv", "context", *session)
    assert context.returncode == 0, context.stderr
    turn, line = _clean(context.stdout).splitlines()  # the message and its echo, a line each
    assert r"user: \x1b]0;pwned\x07 \x1b[31mred\x1b[0m" in turn
    assert r"assistant: echo: \x1b]0;pwned\x07 \x1b[31mred\x1b[0m" in line
    branches = _run("conv", "branches", *session)
    assert branches.returncode == 0, branches.stderr
    assert len(_clean(branches.stdout).splitlines()) == 1
    for fmt in ("text", "json", "html"):
        exported = _run("conv", "tree", "--format", fmt, *session)
        assert exported.returncode == 0, (fmt, exported.stderr)
        _clean(exported.stdout)


def test_an_error_quoting_what_was_sent_prints_nothing_raw(
    node: RunningNode, tree: dict[str, str]
) -> None:
    skill = HOSTILE.replace("\x00", "")  # an argument cannot hold NUL
    refused = _run(
        "sessions", "spawn", "--parent", tree["main"], "--skill", skill, "--node", node.url
    )
    assert refused.returncode == 1
    error = _clean(refused.stderr)
    assert error.startswith("Error: unknown_skill")
    assert len(error.strip().splitlines()) == 1


# -- sessiontree top ---------------------------------------------------------------------


class _HostileSource:
    """A node as ``top`` polls it whose names and states carry control
    characters and Rich markup."""

    url = "http://127.0.0.1:9"

    def __init__(self) -> None:
        info = {
            "session_id": "0123456789abcdef-0000-0000-0000-000000000000",
            "parent_id": None,
            "kind": "[bold]main\x1b[5m",
            "state": "active\x1b]0;pwned\x07",
            "agent_id": "[red]agent[/red]",
            "skill": "chat\x9b2J\nsecond",
            "task": HOSTILE,
            "created_at": 1000.0,
            "deadline": None,
        }
        self.tree = {
            "info": info,
            "result": None,
            "usage": None,
            "subtree_usage": None,
            "children": [],
        }

    def fetch(self, root: str | None = None) -> Snapshot:
        node = {"node": "[blink]node[/blink]\x1b]2;x\x07", "agents": ["[i]a\x1bb"], "state": "up"}
        return Snapshot(node=node, trees=[self.tree], counters=None, taken_at=1001.0)

    def act(self, action: str, session_id: str) -> Outcome:
        return Outcome(ok=False, message=f"refused: [red]no[/red]\x1b[2J {session_id}")

    def close(self) -> None:
        return None


def test_top_shows_names_literally_markup_unparsed_and_nothing_raw() -> None:
    app = TopApp(_HostileSource(), interval=0.2)  # type: ignore[arg-type]
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT
            while app.polls == 0:
                assert loop.time() < deadline, "top never drew a poll"
                await pilot.pause(0.02)
            table = app.query_one("#sessions")
            seen["cells"] = [str(c) for c in table.get_row_at(0)]  # type: ignore[attr-defined]
            seen["header"] = str(app.query_one("#header").render())
            await pilot.press("c")
            await pilot.pause(0.05)
            screen = app.screen
            assert isinstance(screen, ConfirmScreen)
            seen["question"] = str(screen.query_one("#question").render())
            await pilot.press("y")
            while "refused" not in str(app.query_one("#message").render()):
                assert loop.time() < deadline, "top never said the action was refused"
                await pilot.pause(0.02)
            seen["message"] = str(app.query_one("#message").render())

    asyncio.run(scenario())
    cells = seen["cells"]
    assert cells[1] == r"[bold]main\x1b[5m"
    assert cells[2] == r"active\x1b]0;pwned\x07"
    assert cells[3] == r"[red]agent[/red]/chat\x9b2J\nsecond"
    assert r"node [blink]node[/blink]\x1b]2;x\x07" in seen["header"]
    assert r"agents [i]a\x1bb" in seen["header"]
    assert r"(chat\x9b2J\nsecond, active\x1b]0;pwned\x07)" in seen["question"]
    assert r"refused: [red]no[/red]\x1b[2J" in seen["message"]
    for text in (*cells, seen["header"], seen["question"], seen["message"]):
        for char in text.replace("\n", ""):
            assert unicodedata.category(char) != "Cc", (char, text)


# -- the escapes themselves ------------------------------------------------------------

_EVERY_CONTROL = "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0)])) + "\u202e\u2066\u2028"


def test_shown_leaves_no_control_character_and_keeps_the_rest() -> None:
    text = f"a{_EVERY_CONTROL}é✓z"
    one_line = shown(text)
    assert all(unicodedata.category(c) != "Cc" for c in one_line)
    assert "\u202e" not in one_line
    assert one_line.startswith(r"a\x00\x01")
    assert one_line.endswith("é✓z")
    for visible in (r"\n", r"\t", r"\x1b", r"\x9b", r"\u202e"):
        assert visible in one_line
    block = shown_block(text)
    assert "\n" in block
    assert "\t" in block
    assert all(unicodedata.category(c) != "Cc" or c in "\n\t" for c in block)
    assert shown(None) == ""
    assert shown(3) == "3"
    assert shown(shown(text)) == shown(text)  # escaping twice changes nothing


def test_the_safety_net_keeps_json_exact() -> None:
    value = {"k\x1b": [_EVERY_CONTROL, "plain"]}
    for document in (
        json.dumps(value, ensure_ascii=False),
        json.dumps(value),
        json.dumps(value, indent=2, ensure_ascii=False),
    ):
        safe = terminal_safe(document)
        assert all(unicodedata.category(c) != "Cc" or c in "\n\t" for c in safe)
        assert json.loads(safe) == value


def test_log_lines_are_made_safe() -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "task %s", (HOSTILE,), None)
    line = SafeFormatter("%(message)s").format(record)
    assert all(unicodedata.category(c) != "Cc" or c in "\n\t" for c in line)
    assert line.startswith(r"task \u001b]0;pwned\u0007")
