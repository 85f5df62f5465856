"""Sessions as actors: the session actor, the handles skills get, clocks, execution."""

from sessiontree.actors._activity import Activity
from sessiontree.actors._backends import BACKENDS, Backends
from sessiontree.actors._clock import Clock, LoopTimer, RealClock, TimerHandle, VirtualClock
from sessiontree.actors._conversing import ConversationLike
from sessiontree.actors._core import (
    Cancelled,
    ContextMessage,
    SessionCond,
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
from sessiontree.actors._pooled import BlockedHandler, Dispatcher, PooledActor, stop_unstarted
from sessiontree.actors._process_pool import ProcessBackend
from sessiontree.actors._ray_pool import RayBackend
from sessiontree.actors._remote import (
    ExecutionBackend,
    RemoteRun,
    RemoteSession,
    StepEnd,
    StepJob,
)
from sessiontree.actors._session import AsyncSession, Session
from sessiontree.actors._session_actor import (
    CancelSignal,
    CycleDone,
    Deliver,
    ForceStop,
    Inbound,
    Inspect,
    Passivate,
    SessionActorLogic,
    StopSession,
    start_run,
)
from sessiontree.actors._slots import ComputeSlots

__all__ = [
    "ACTOR_TYPES",
    "BACKENDS",
    "Activity",
    "AskTimeoutError",
    "AsyncSession",
    "Backends",
    "BlockedHandler",
    "CancelSignal",
    "Cancelled",
    "Clock",
    "ComputeSlots",
    "ContextMessage",
    "ConversationLike",
    "Counted",
    "CycleDone",
    "Deliver",
    "Dispatcher",
    "EventLoopThread",
    "ExecutionBackend",
    "ForceStop",
    "Inbound",
    "Inspect",
    "LoopTimer",
    "Passivate",
    "PooledActor",
    "ProcessBackend",
    "RayBackend",
    "RealClock",
    "RemoteRun",
    "RemoteSession",
    "Reply",
    "RunEnd",
    "Session",
    "SessionActorLogic",
    "SessionCond",
    "SessionContext",
    "SessionCore",
    "SessionHost",
    "SpawnedLike",
    "StepEnd",
    "StepExecutor",
    "StepJob",
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
    "start_run",
    "stop_actor",
    "stop_unstarted",
    "to_outcome",
    "wake_batch",
]
