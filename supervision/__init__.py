"""Supervision: the Cortex, spawn rules, timers, cleanup, and the embedded ``Node``."""

from sessiontree.protocol import Hedge, Retry, Summarizer
from sessiontree.supervision._aggregate import (
    aggregate,
    extractive_summary,
    normalise_answer,
)
from sessiontree.supervision._chat import COMMANDS, chat_command, is_command
from sessiontree.supervision._config import Agent, NodeConfig, removed_setting
from sessiontree.supervision._continuation import continuation_token, parse_continuation
from sessiontree.supervision._conversations import StoreConversations
from sessiontree.supervision._cortex import Cortex
from sessiontree.supervision._events import Event, EventBus, EventKind
from sessiontree.supervision._memory import InMemorySpace, MemorySpace
from sessiontree.supervision._memory_probe import MemoryProbe, MemoryReading
from sessiontree.supervision._metrics import MAX_MODEL_SERIES, REJECT_REASONS, NodeMetrics
from sessiontree.supervision._node import Node
from sessiontree.supervision._node_recovery import Requeued
from sessiontree.supervision._node_replay import load_recording
from sessiontree.supervision._node_slots import Freeze
from sessiontree.supervision._providers import Price, Provider
from sessiontree.supervision._recording import stored_recording
from sessiontree.supervision._recovery import RecoveryDecision
from sessiontree.supervision._recovery_rules import Decision, classify
from sessiontree.supervision._recovery_summary import recovery_summary
from sessiontree.supervision._refs import SessionRef, Spawned
from sessiontree.supervision._rules import MAX_BRANCH_DEPTH, MAX_WORKER_DEPTH, check_spawn
from sessiontree.supervision._spending import stored_spending
from sessiontree.supervision._trace_context import TraceIds
from sessiontree.supervision._tracing_config import Tracing

__all__ = [
    "COMMANDS",
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
    "Freeze",
    "Hedge",
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
    "TraceIds",
    "Tracing",
    "aggregate",
    "chat_command",
    "check_spawn",
    "classify",
    "continuation_token",
    "extractive_summary",
    "is_command",
    "load_recording",
    "normalise_answer",
    "parse_continuation",
    "recovery_summary",
    "removed_setting",
    "stored_recording",
    "stored_spending",
]
