"""Sessions as actors: the session actor, the handles skills get, clocks, execution."""

from sessiontree.actors._activity import Activity
from sessiontree.actors._clock import Clock, RealClock, TimerHandle, VirtualClock
from sessiontree.actors._core import (
    Cancelled,
    ContextMessage,
    SessionContext,
    SessionCore,
    wake_batch,
)
from sessiontree.actors._execution import (
    EventLoopThread,
    RunEnd,
    StepExecutor,
    crash_info,
    finish_run,
    is_async_skill,
    to_outcome,
)
from sessiontree.actors._host import SessionHost, SpawnedLike
from sessiontree.actors._mailbox import (
    ACTOR_TYPES,
    AskTimeoutError,
    Counted,
    Reply,
    actor_class,
    drain_inbox,
    handler_scope,
    in_actor_handler,
    post,
    start_actor,
    stop_actor,
)
from sessiontree.actors._session import AsyncSession, Session
from sessiontree.actors._session_actor import (
    CancelSignal,
    CycleDone,
    Deliver,
    ForceStop,
    Inbound,
    Inspect,
    SessionActorLogic,
    Start,
    StopSession,
)
from sessiontree.actors._slots import ComputeSlots

__all__ = [
    "ACTOR_TYPES",
    "Activity",
    "AskTimeoutError",
    "AsyncSession",
    "CancelSignal",
    "Cancelled",
    "Clock",
    "ComputeSlots",
    "ContextMessage",
    "Counted",
    "CycleDone",
    "Deliver",
    "EventLoopThread",
    "ForceStop",
    "Inbound",
    "Inspect",
    "RealClock",
    "Reply",
    "RunEnd",
    "Session",
    "SessionActorLogic",
    "SessionContext",
    "SessionCore",
    "SessionHost",
    "SpawnedLike",
    "Start",
    "StepExecutor",
    "StopSession",
    "TimerHandle",
    "VirtualClock",
    "actor_class",
    "crash_info",
    "drain_inbox",
    "finish_run",
    "handler_scope",
    "in_actor_handler",
    "is_async_skill",
    "post",
    "start_actor",
    "stop_actor",
    "to_outcome",
    "wake_batch",
]
