"""Supervision: the Cortex, spawn rules, timers, cleanup, and the embedded ``Node``."""

from sessiontree.supervision._chat import COMMANDS, chat_command, is_command
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._conversations import StoreConversations
from sessiontree.supervision._cortex import CortexLogic as Cortex
from sessiontree.supervision._events import Event, EventBus, EventKind
from sessiontree.supervision._memory import InMemorySpace, MemorySpace
from sessiontree.supervision._node import Node, SessionRef, Spawned
from sessiontree.supervision._rules import MAX_BRANCH_DEPTH, MAX_WORKER_DEPTH, check_spawn

__all__ = [
    "COMMANDS",
    "MAX_BRANCH_DEPTH",
    "MAX_WORKER_DEPTH",
    "Agent",
    "Cortex",
    "Event",
    "EventBus",
    "EventKind",
    "InMemorySpace",
    "MemorySpace",
    "Node",
    "NodeConfig",
    "SessionRef",
    "Spawned",
    "StoreConversations",
    "chat_command",
    "check_spawn",
    "is_command",
]
