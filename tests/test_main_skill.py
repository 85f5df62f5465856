"""Which skill runs a Main's message cycles, and what a failed cycle leaves in the log."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from sessiontree.cli._agents import AgentLoadError, load_agents
from sessiontree.protocol import (
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SessionResult,
    SessionState,
)
from sessiontree.supervision import Agent, Node
from sessiontree.supervision._cycle_log import FailedCycles
from tests.conftest import settle


def idle(session: Any) -> None:
    return None


def explodes_on_results(session: Any) -> None:
    """A Main that fans out on a message and raises on every child result."""
    if isinstance(session.message, SessionResult):
        raise_for(session.message.summary)
    for i in range(int(session.message)):
        session.spawn(kind="worker", skill="quick", task=f"child {i}")


def raise_for(summary: str) -> None:
    msg = f"cannot digest {summary!r}"
    raise LookupError(msg)


def quick(session: Any) -> str:
    return session.task


def cortex_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sessiontree.cortex" and r.levelname == "ERROR"]


# -- the rule ----------------------------------------------------------------------------------


def test_an_agent_with_several_skills_and_no_main_skill_is_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="main_skill") as refused:
        Agent("bench", {"fan": idle, "work": idle})
    assert "'bench'" in str(refused.value)
    assert "'fan', 'work'" in str(refused.value)
    # a default_skill says what children run, not what the Main runs
    with pytest.raises(ValueError, match="main_skill"):
        Agent("bench", {"fan": idle, "work": idle}, default_skill="work")


def test_a_main_runs_main_skill_else_the_skill_named_main_else_the_only_skill() -> None:
    assert Agent("a", {"fan": idle, "work": idle}, main_skill="work").main == "work"
    assert Agent("a", {"work": idle, "main": idle}).main == "main"  # not the first
    assert Agent("a", {"work": idle, "main": idle}, main_skill="work").main == "work"
    assert Agent("a", {"only": idle}).main == "only"
    assert Agent("a", {"only": idle}, default_skill="only").main == "only"
    # what a spawn naming no skill runs is unchanged: default_skill, else the first
    assert Agent("a", {"work": idle, "main": idle}).default == "work"


def test_a_node_runs_the_skill_named_main_for_its_main(make_node: Any) -> None:
    node: Node = make_node(Agent("agent", {"quick": quick, "main": idle}))
    main = node.main("agent")
    assert main.info().skill == "main"
    assert main.info().kind is SessionKind.MAIN


def test_agents_refused_while_loading_are_a_load_error_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "refused_at_import.py").write_text(
        "from sessiontree.supervision import Agent\nAGENT = Agent('x', {'a': print, 'b': print})\n"
    )
    (tmp_path / "refused_when_made.py").write_text(
        "from sessiontree.supervision import Agent\n"
        "def agents():\n"
        "    return [Agent('x', {'a': print, 'b': print})]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AgentLoadError, match=r"refused_at_import:AGENT.*main_skill"):
        load_agents("refused_at_import:AGENT")
    with pytest.raises(AgentLoadError, match=r"refused_when_made:agents.*main_skill"):
        load_agents("refused_when_made:agents")
    for name in ("refused_at_import", "refused_when_made"):
        sys.modules.pop(name, None)


# -- the log of failed cycles ----------------------------------------------------------------


def test_a_failed_main_cycle_is_logged_once_with_its_traceback(
    make_node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessiontree.cortex")
    agent = Agent("agent", {"main": explodes_on_results, "quick": quick})
    node: Node = make_node(agent)
    main = node.main("agent")
    assert main.send("1") is None
    settle(node)
    (record,) = cortex_errors(caplog)
    text = record.getMessage()
    assert str(main.session_id) in text
    assert "message cycle 2 (skill 'main') failed with crashed" in text
    assert "LookupError: cannot digest 'child 0'" in text
    assert "Traceback (most recent call last)" in text
    assert "in raise_for" in text  # the skill's own frames, from the error's detail
    assert main.send("0") is None  # a cycle that ends well logs nothing
    settle(node)
    assert len(cortex_errors(caplog)) == 1
    assert main.state is SessionState.ACTIVE
    assert node.stats()["main_cycles_failed"] == 1


def test_a_main_failing_on_every_child_result_logs_a_burst_then_only_counts(
    make_node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sessiontree.cortex")
    agent = Agent("agent", {"main": explodes_on_results, "quick": quick}, max_children=16)
    node: Node = make_node(agent)
    main = node.main("agent")
    assert main.send("14") is None
    settle(node)
    assert node.stats()["main_cycles_failed"] == 14
    logged = cortex_errors(caplog)
    assert len(logged) == FailedCycles().burst == 10  # the virtual clock stood still
    assert "only counted" in logged[-1].getMessage()


def test_failed_cycles_past_the_burst_are_summarised_when_the_window_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sessiontree.cortex")
    failed = FailedCycles(burst=2, window=60.0)
    error = ErrorInfo(code=ErrorCode.CRASHED, message="ValueError: no", detail={})
    main = SessionInfo(
        session_id=uuid.uuid4(),
        agent_id="a",
        parent_id=None,
        kind=SessionKind.MAIN,
        state=SessionState.ACTIVE,
        depth=0,
        created_at=0.0,
        ttl=None,
        deadline=None,
        skill="main",
    )
    times = enumerate((0.0, 1.0, 2.0, 59.0))
    logged = [failed.failed("m", main, cycle, error, now) for cycle, now in times]
    assert logged == [True, True, False, False]
    assert failed.failed("m", main, 5, error, 60.0)
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(messages) == 4
    assert messages[2][0] == "WARNING"
    assert messages[2][1].startswith("2 more failed Main cycles were not logged in 60 s")
    assert "ValueError: no" in messages[3][1]
    assert "Traceback" not in messages[3][1]  # no traceback in the detail: none made up
