"""Every package's public surface, pinned: a name joins or leaves one only on
purpose (import directions and circles: test_layout.py).

``sessiontree.actors`` is what a skill author and an embedding application
use; ``sessiontree.actors.backends`` is where a skill runs;
``sessiontree.actors.runtime`` is the plumbing ``sessiontree.supervision``
assembles a node from. A name moves between them only on purpose.
"""

from __future__ import annotations

import importlib

import pytest

ACTORS = [
    "ACTOR_TYPES",
    "AskTimeoutError",
    "AsyncSession",
    "Cancelled",
    "Clock",
    "ContextMessage",
    "ConversationLike",
    "RealClock",
    "Session",
    "SessionContext",
    "TimerHandle",
    "VirtualClock",
]

BACKENDS = [
    "BACKENDS",
    "ExecutionBackend",
    "ProcessBackend",
    "RayBackend",
    "RemoteRun",
    "RemoteSession",
    "StepEnd",
    "StepEvent",
    "StepJob",
]

RUNTIME = [
    "Activity",
    "Backends",
    "BlockedHandler",
    "CancelSignal",
    "ComputeSlots",
    "Counted",
    "CycleDone",
    "Deliver",
    "Dispatcher",
    "EventLoopThread",
    "ForceStop",
    "Inbound",
    "Inspect",
    "LoopDispatcher",
    "LoopTimer",
    "ModelCall",
    "Passivate",
    "PooledActor",
    "Reply",
    "RunEnd",
    "SessionActorLogic",
    "SessionCond",
    "SessionCore",
    "SessionHost",
    "SpawnedLike",
    "StepExecutor",
    "StopSession",
    "actor_class",
    "crash_info",
    "drain_inbox",
    "finish_run",
    "handler_scope",
    "in_actor_handler",
    "is_async_skill",
    "mailbox_depth",
    "post",
    "refuse_blocking",
    "start_actor",
    "start_run",
    "stop_actor",
    "stop_unstarted",
    "to_outcome",
    "wake_batch",
]

PROTOCOL = [
    "MAIN_KEY",
    "MAX_BRANCH_NAME_CHARS",
    "MAX_BUDGET_COST",
    "MAX_BUDGET_COUNT",
    "MAX_CONTENT_BYTES",
    "MAX_CONTROL_BYTES",
    "MAX_INPUT_BYTES",
    "MAX_INPUT_NESTING",
    "MAX_NESTING",
    "MAX_TASK_CHARS",
    "MAX_TEXT_CHARS",
    "NON_RETRYABLE",
    "SCOPES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "AggregateStrategy",
    "Aggregated",
    "Attempt",
    "BackendUnavailableError",
    "Branch",
    "BranchInfo",
    "Budget",
    "CancelCmd",
    "ChatMessage",
    "ChatReply",
    "ChatType",
    "ChildReport",
    "Collected",
    "Completion",
    "ControlMessage",
    "ConversationError",
    "ConversationState",
    "CorruptRecordError",
    "DeadlockError",
    "DeletePlan",
    "DmScope",
    "ErrorCode",
    "ErrorInfo",
    "EscalationError",
    "GatherStatus",
    "Gathered",
    "Inbound",
    "InvalidTransitionError",
    "Merged",
    "Message",
    "NodeClosedError",
    "NonRetryableError",
    "NotAllowedError",
    "Outcome",
    "RejectedInputError",
    "ResumeCmd",
    "Role",
    "Routed",
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
    "Spending",
    "StoreDamagedError",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "SuspendCmd",
    "Timings",
    "UnknownAgentError",
    "UnknownSessionError",
    "Usage",
    "as_json",
    "check_text",
    "decode_control",
    "decode_inbound",
    "decode_strict",
    "encode_json",
    "is_legal_transition",
    "iso_timestamp",
    "make_spec",
    "new_session_id",
    "session_key_for",
    "spawn_batch",
]

STORE = [
    "DATABASES",
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_READERS",
    "SCHEMA_VERSION",
    "Backup",
    "BranchRecord",
    "ContextEntry",
    "ContextRecord",
    "ConversationRecord",
    "CycleRecord",
    "InboxRecord",
    "MemoryIdRecord",
    "MemoryRecord",
    "MessageRecord",
    "MetaRecord",
    "OutboxRecord",
    "QuarantineRecord",
    "ReceivedRecord",
    "SessionRecord",
    "StartsRecord",
    "Store",
    "StoreIO",
    "UsageRecord",
    "Verified",
    "VerifyProblem",
    "WedgedRecord",
    "WriteBatch",
    "decode_record",
    "encode_record",
    "export_jsonl",
    "import_jsonl",
    "prune",
    "verify_store",
]

CONVERSATIONS = [
    "EXPORT_FORMATS",
    "Conversation",
    "ConversationBackend",
    "Conversations",
    "MemoryBackend",
    "TimeSource",
    "nested_json",
    "preview_text",
    "render_html",
    "text_tree",
]

SUPERVISION = [
    "COMMANDS",
    "DISPATCHES",
    "MAX_BRANCH_DEPTH",
    "MAX_MODEL_SERIES",
    "MAX_WORKER_DEPTH",
    "REJECT_REASONS",
    "Agent",
    "Cortex",
    "Decision",
    "Event",
    "EventBus",
    "EventKind",
    "InMemorySpace",
    "MemoryProbe",
    "MemoryReading",
    "MemorySpace",
    "Node",
    "NodeConfig",
    "NodeMetrics",
    "Price",
    "Provider",
    "RecoveryDecision",
    "Requeued",
    "Retry",
    "SessionRef",
    "Spawned",
    "StoreConversations",
    "Summarizer",
    "aggregate",
    "chat_command",
    "check_spawn",
    "classify",
    "continuation_token",
    "extractive_summary",
    "is_command",
    "normalise_answer",
    "parse_continuation",
    "recovery_summary",
    "stored_spending",
]

CLI = [
    "DemoError",
    "DemoReport",
    "main",
    "run_demo",
]

SURFACES = {
    "sessiontree.actors": ACTORS,
    "sessiontree.actors.backends": BACKENDS,
    "sessiontree.actors.runtime": RUNTIME,
    "sessiontree.protocol": PROTOCOL,
    "sessiontree.store": STORE,
    "sessiontree.conversations": CONVERSATIONS,
    "sessiontree.supervision": SUPERVISION,
    "sessiontree.cli": CLI,
}


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_each_surface_exports_exactly_its_names_sorted(name: str) -> None:
    module = importlib.import_module(name)
    assert list(module.__all__) == SURFACES[name]
    assert list(module.__all__) == sorted(module.__all__, key=lambda n: (not n.isupper(), n))
    for exported in module.__all__:
        assert hasattr(module, exported), exported


def test_no_name_is_exported_from_two_actors_surfaces() -> None:
    seen: dict[str, str] = {}
    for name, exported in SURFACES.items():
        if not name.startswith("sessiontree.actors"):
            continue
        for each in exported:
            assert each not in seen, f"{each} is exported by {seen.get(each)} and {name}"
            seen[each] = name
