"""Protocol types: the transition table, keys, strict decoding, exports."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from sessiontree.actors import Cancelled
from sessiontree.protocol import (
    MAX_CONTROL_BYTES,
    TERMINAL_STATES,
    TRANSITIONS,
    CancelCmd,
    ErrorCode,
    ErrorInfo,
    RejectedInputError,
    SessionKey,
    SessionKind,
    SessionState,
    SessionTreeError,
    SpawnCmd,
    SpawnSpec,
    decode_control,
    is_legal_transition,
    make_spec,
    spawn_batch,
)

S = SessionState


def test_enum_values_are_lower_case_strings() -> None:
    for enum in (SessionKind, SessionState, ErrorCode):
        for member in enum:
            assert member.value == member.value.lower()
            assert isinstance(member.value, str)


def test_the_transition_table() -> None:
    assert is_legal_transition(S.PENDING, S.ACTIVE)
    assert is_legal_transition(S.ACTIVE, S.SUSPENDED)
    assert is_legal_transition(S.SUSPENDED, S.ACTIVE)
    assert not is_legal_transition(S.PENDING, S.COMPLETED)
    assert not is_legal_transition(S.SUSPENDED, S.COMPLETED)
    for end in TERMINAL_STATES:
        assert TRANSITIONS[end] == frozenset()
        assert end.is_terminal
        for state in (S.PENDING, S.ACTIVE, S.SUSPENDED):
            if end is not S.COMPLETED:
                assert is_legal_transition(state, end)
    assert set(TRANSITIONS) == set(SessionState)


def test_session_keys_round_trip_and_name_the_bad_part() -> None:
    key = SessionKey.parse("telegram:dm:42")
    assert (key.provider, key.scope, key.identifier) == ("telegram", "dm", "42")
    assert str(key) == "telegram:dm:42"
    assert str(SessionKey.parse("telegram:dm:bot7/42")) == "telegram:dm:bot7/42"
    assert str(SessionKey.parse("whatsapp:dm:+1234567890")) == "whatsapp:dm:+1234567890"
    with pytest.raises(RejectedInputError) as caught:
        SessionKey.parse("Tele gram:dm:42")
    assert caught.value.field == "provider"
    with pytest.raises(RejectedInputError) as caught:
        SessionKey.parse("telegram:dm:")
    assert caught.value.field == "identifier"


def test_structs_are_frozen() -> None:
    spec = SpawnSpec(kind=SessionKind.WORKER)
    with pytest.raises(AttributeError):
        spec.task = "changed"  # type: ignore[misc]
    info = ErrorInfo(code=ErrorCode.CRASHED, message="x")
    with pytest.raises(AttributeError):
        info.message = "y"  # type: ignore[misc]


def test_control_messages_decode_as_one_tagged_union() -> None:
    sid = uuid.uuid4()
    assert decode_control(msgspec.json.encode(CancelCmd(session_id=sid))) == CancelCmd(
        session_id=sid
    )
    spawn = SpawnCmd(parent_id=sid, spec=SpawnSpec(kind=SessionKind.BRANCH, task="t"))
    assert decode_control(msgspec.msgpack.encode(spawn), fmt="msgpack") == spawn


def test_oversized_payloads_are_refused_before_decoding() -> None:
    huge = b'{"type":"cancel","session_id":"' + b"a" * MAX_CONTROL_BYTES + b'"}'
    with pytest.raises(RejectedInputError, match="over the cap"):
        decode_control(huge)


def test_deeply_nested_payloads_are_refused() -> None:
    sid = uuid.uuid4()
    nested = b"[" * 10_000 + b"]" * 10_000
    payload = f'{{"type":"send","session_id":"{sid}","message":'.encode() + nested + b"}"
    with pytest.raises(RejectedInputError, match="nested"):
        decode_control(payload)


def test_unknown_fields_and_unknown_formats_are_rejected() -> None:
    sid = uuid.uuid4()
    with pytest.raises(RejectedInputError):
        decode_control(f'{{"type":"cancel","session_id":"{sid}","extra":1}}'.encode())
    with pytest.raises(RejectedInputError) as caught:
        decode_control(b"{}", fmt="yaml")
    assert caught.value.field == "fmt"
    with pytest.raises(RejectedInputError):
        decode_control("not bytes")  # type: ignore[arg-type]


def test_make_spec_is_strict_and_names_the_field() -> None:
    assert make_spec(kind="branch", ttl=5).ttl == 5.0
    with pytest.raises(RejectedInputError) as caught:
        make_spec(kind="branch", task=7)
    assert caught.value.field == "task"
    with pytest.raises(RejectedInputError) as caught:
        make_spec(kind="branch", task="x" * 70_000)
    assert caught.value.field == "task"
    with pytest.raises(TypeError):
        make_spec(SpawnSpec(kind=SessionKind.BRANCH), task="both")


def test_cancelled_is_not_an_exception() -> None:
    assert issubclass(Cancelled, BaseException)
    assert not issubclass(Cancelled, Exception)
    assert issubclass(RejectedInputError, SessionTreeError)


def test_a_batch_spec_built_by_hand_is_checked_and_converted() -> None:
    """A ``SpawnSpec`` constructor checks no types: a skill's hand-built spec with
    ``kind="worker"`` once reached the Cortex as a str and failed the node."""
    loose = SpawnSpec(kind="worker", task="x")  # type: ignore[arg-type]
    (spec,) = spawn_batch([loose])
    assert spec.kind is SessionKind.WORKER
    bad = SpawnSpec(kind=SessionKind.WORKER, task="x", ttl="5")  # type: ignore[arg-type]
    with pytest.raises(RejectedInputError) as caught:
        spawn_batch([loose, bad])
    assert caught.value.field == "specs[1].ttl"


BAD_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"kind": "nope"}, "kind"),
    ({"kind": None}, "kind"),
    ({"kind": "worker", "task": 5}, "task"),
    ({"kind": "worker", "context_summary": None}, "context_summary"),
    ({"kind": "worker", "skill": 5}, "skill"),
    ({"kind": "worker", "ttl": "5"}, "ttl"),
    ({"kind": "worker", "model_tier": ""}, "model_tier"),
    ({"kind": "worker", "request_id": 7}, "request_id"),
    ({"kind": "worker", "metadata": [1]}, "metadata"),
    ({"kind": "worker", "metadata": {1: "x"}}, "metadata"),
    ({"kind": "worker", "metadata": {"x": object()}}, "metadata"),
    ({"kind": "worker", "backend": 3}, "backend"),
    ({"kind": "worker", "budget": "lots"}, "budget"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_SPECS, ids=[f for _, f in BAD_SPECS])
def test_a_hand_built_spec_with_a_bad_field_is_refused_naming_it(
    fields: dict[str, Any], field: str
) -> None:
    spec = SpawnSpec(**fields)
    with pytest.raises(RejectedInputError) as single:
        make_spec(spec)
    assert single.value.field == field
    with pytest.raises(RejectedInputError) as batch:
        spawn_batch([make_spec(kind="worker"), spec])
    assert batch.value.field == f"specs[1].{field}"


def test_a_hand_built_spec_with_a_str_kind_is_taken_as_the_enum() -> None:
    assert make_spec(SpawnSpec(kind="branch")).kind is SessionKind.BRANCH  # type: ignore[arg-type]


def test_a_spec_field_with_no_plain_form_is_refused_naming_it() -> None:
    """A value with no plain form passed as a keyword is refused here, not by the store."""
    with pytest.raises(RejectedInputError) as caught:
        make_spec(kind="worker", metadata={"x": object()})
    assert caught.value.field == "metadata"
