"""The session runtime's internal interface for ``sessiontree.supervision``.

Not for applications, and not a stable API: these are the parts the Cortex
and the ``Node`` assemble a runtime from (the session actor and its messages,
mailboxes and the loop's dispatcher, the step executor and event loop, compute slots,
the shared per-session state, the node's execution backends). They change
whenever the runtime does. A skill author or an embedding application uses
``sessiontree.actors`` (the ``Session`` handles, ``Cancelled``, clocks,
contexts), ``sessiontree.actors.backends`` and ``sessiontree.supervision``.
"""

from sessiontree.actors._activity import Activity
from sessiontree.actors._clock import LoopTimer
from sessiontree.actors._context import copy_context
from sessiontree.actors._core import CycleInput, SessionCond, SessionCore, wake_batch
from sessiontree.actors._execution import (
    EventLoopThread,
    StepExecutor,
    crash_info,
    finish_run,
    is_async_skill,
    to_outcome,
)
from sessiontree.actors._host import ModelCall, RunEnd, SessionHost, SpawnedLike
from sessiontree.actors._loop_actor import LoopActor, LoopRef
from sessiontree.actors._loop_dispatch import (
    BlockedHandler,
    LoopDispatcher,
    handle_now,
    stop_unstarted,
)
from sessiontree.actors._mailbox import (
    Counted,
    Reply,
    actor_class,
    drain_inbox,
    handler_scope,
    in_actor_handler,
    mailbox_depth,
    post,
    refuse_blocking,
    start_actor,
    stop_actor,
)
from sessiontree.actors._session_actor import (
    CancelSignal,
    CycleDone,
    CycleRefused,
    Deliver,
    ForceStop,
    Inbound,
    Inspect,
    Passivate,
    RetryCycle,
    SessionActorLogic,
    StopSession,
    start_run,
)
from sessiontree.actors._slots import ComputeSlots
from sessiontree.actors._tape import Tape, TapedClock
from sessiontree.actors._trace_scope import span_context_of
from sessiontree.actors.backends._registry import Backends

__all__ = [
    "Activity",
    "Backends",
    "BlockedHandler",
    "CancelSignal",
    "ComputeSlots",
    "Counted",
    "CycleDone",
    "CycleInput",
    "CycleRefused",
    "Deliver",
    "EventLoopThread",
    "ForceStop",
    "Inbound",
    "Inspect",
    "LoopActor",
    "LoopDispatcher",
    "LoopRef",
    "LoopTimer",
    "ModelCall",
    "Passivate",
    "Reply",
    "RetryCycle",
    "RunEnd",
    "SessionActorLogic",
    "SessionCond",
    "SessionCore",
    "SessionHost",
    "SpawnedLike",
    "StepExecutor",
    "StopSession",
    "Tape",
    "TapedClock",
    "actor_class",
    "copy_context",
    "crash_info",
    "drain_inbox",
    "finish_run",
    "handle_now",
    "handler_scope",
    "in_actor_handler",
    "is_async_skill",
    "mailbox_depth",
    "post",
    "refuse_blocking",
    "span_context_of",
    "start_actor",
    "start_run",
    "stop_actor",
    "stop_unstarted",
    "to_outcome",
    "wake_batch",
]
