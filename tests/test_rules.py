"""The Cortex's rules as pure functions: no actor, no node, plain data in and out."""

from __future__ import annotations

import pytest

from sessiontree.actors.runtime import RunEnd
from sessiontree.protocol import ErrorCode, ErrorInfo, Outcome, SessionKind, SessionState, SpawnSpec
from sessiontree.supervision import Agent
from sessiontree.supervision._rules import ENDING_MESSAGES, ending_of, model_tier

AGENT = Agent("agent", {"s": lambda session: None}, model_tiers=("small", "medium", "large"))
CRASH = ErrorInfo(code=ErrorCode.CRASHED, message="boom")


def test_a_run_that_returned_completes_with_its_outcome() -> None:
    outcome = Outcome(summary="done")
    assert ending_of(RunEnd(outcome=outcome), None) == (
        SessionState.COMPLETED,
        None,
        outcome,
        None,
    )


def test_a_run_that_raised_fails_with_its_error_and_no_outcome() -> None:
    assert ending_of(RunEnd(error=CRASH), None) == (
        SessionState.FAILED,
        ErrorCode.CRASHED,
        None,
        CRASH,
    )


def test_a_run_whose_own_cancelled_escaped_is_cancelled() -> None:
    assert ending_of(RunEnd(cancelled=True), None) == (
        SessionState.CANCELLED,
        ErrorCode.CANCELLED,
        None,
        None,
    )


@pytest.mark.parametrize("code", [ErrorCode.CANCELLED, ErrorCode.PARENT_TERMINATED])
def test_once_cancellation_was_asked_the_end_is_cancelled_whatever_the_skill_did(
    code: ErrorCode,
) -> None:
    partial = Outcome(summary="half")
    assert ending_of(RunEnd(outcome=partial), code) == (
        SessionState.CANCELLED,
        code,
        partial,
        None,
    )
    # a crash in grace still ends cancelled, with the cancellation's code
    assert ending_of(RunEnd(error=CRASH), code) == (SessionState.CANCELLED, code, None, None)


def test_every_code_an_ending_sets_itself_has_a_message_naming_the_session() -> None:
    for code in (
        ErrorCode.CANCELLED,
        ErrorCode.PARENT_TERMINATED,
        ErrorCode.TERMINATED_BY_FORCE,
        ErrorCode.TTL_EXPIRED,
        ErrorCode.NODE_RESTARTED,
        ErrorCode.NODE_CLOSED,
    ):
        assert "session abc" in ENDING_MESSAGES[code].format("abc")


def test_a_spawn_that_names_a_tier_gets_it() -> None:
    spec = SpawnSpec(kind=SessionKind.WORKER, task="t", model_tier="large")
    assert model_tier(spec, AGENT, "medium", root=False) == "large"


def test_a_worker_gets_the_cheapest_tier_and_a_branch_its_parents() -> None:
    worker = SpawnSpec(kind=SessionKind.WORKER, task="t")
    branch = SpawnSpec(kind=SessionKind.BRANCH, task="t")
    assert model_tier(worker, AGENT, "large", root=False) == "small"
    assert model_tier(branch, AGENT, "medium", root=False) == "medium"


def test_a_root_gets_the_best_tier() -> None:
    main = SpawnSpec(kind=SessionKind.MAIN, task="main")
    assert model_tier(main, AGENT, None, root=True) == "large"
