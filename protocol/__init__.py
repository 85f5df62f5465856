"""The wire and storage types: msgspec Structs, enums, errors and codecs."""

import logging

from sessiontree.protocol._codec import (
    MAX_CONTROL_BYTES,
    MAX_NESTING,
    decode_control,
    decode_strict,
    encode_json,
    make_spec,
)
from sessiontree.protocol._errors import (
    CorruptRecordError,
    DeadlockError,
    ErrorCode,
    ErrorInfo,
    InvalidTransitionError,
    NodeClosedError,
    NotAllowedError,
    RejectedInputError,
    SessionTreeError,
    StoreError,
    StoreFullError,
    StoreLockedError,
    UnknownAgentError,
    UnknownSessionError,
)
from sessiontree.protocol._ids import SessionId, SessionKey, new_session_id
from sessiontree.protocol._messages import (
    CancelCmd,
    ControlMessage,
    ResumeCmd,
    SendCmd,
    SpawnCmd,
    SuspendCmd,
)
from sessiontree.protocol._results import Collected, Outcome, SessionResult, Timings
from sessiontree.protocol._specs import MAX_TASK_CHARS, SessionInfo, SpawnSpec
from sessiontree.protocol._states import (
    TERMINAL_STATES,
    TRANSITIONS,
    SessionKind,
    SessionState,
    is_legal_transition,
)

# The library never configures logging; applications (and the CLI) do.
logging.getLogger("sessiontree").addHandler(logging.NullHandler())

__all__ = [
    "MAX_CONTROL_BYTES",
    "MAX_NESTING",
    "MAX_TASK_CHARS",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "CancelCmd",
    "Collected",
    "ControlMessage",
    "CorruptRecordError",
    "DeadlockError",
    "ErrorCode",
    "ErrorInfo",
    "InvalidTransitionError",
    "NodeClosedError",
    "NotAllowedError",
    "Outcome",
    "RejectedInputError",
    "ResumeCmd",
    "SendCmd",
    "SessionId",
    "SessionInfo",
    "SessionKey",
    "SessionKind",
    "SessionResult",
    "SessionState",
    "SessionTreeError",
    "SpawnCmd",
    "SpawnSpec",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "SuspendCmd",
    "Timings",
    "UnknownAgentError",
    "UnknownSessionError",
    "decode_control",
    "decode_strict",
    "encode_json",
    "is_legal_transition",
    "make_spec",
    "new_session_id",
]
