"""The pieces of a node the Cortex drives, assembled by ``NodeParts.runtime``."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sessiontree.actors import Clock
from sessiontree.actors.runtime import (
    Activity,
    Backends,
    ComputeSlots,
    EventLoopThread,
    LoopDispatcher,
    SessionHost,
    StepExecutor,
)
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._events import EventBus
from sessiontree.supervision._extension import Extensions
from sessiontree.supervision._models import Models
from sessiontree.supervision._persist import Persister
from sessiontree.supervision._recovery import Recovered

__all__ = ["Runtime"]


@dataclass
class Runtime:
    """The pieces of a node the Cortex drives (built by ``NodeParts.runtime``)."""

    config: NodeConfig
    clock: Clock
    activity: Activity
    slots: ComputeSlots
    executor: StepExecutor
    main_executor: StepExecutor
    loop: Callable[[], EventLoopThread]
    events: EventBus
    host: SessionHost
    agents: dict[str, Agent]
    on_fatal: Callable[[BaseException], None]
    on_failed: Callable[[BaseException], None]
    persist: Persister
    dispatcher: LoopDispatcher  # serves the Cortex and the sessions on the node's loop
    recovered: Recovered | None = None
    models: Models | None = None  # the node's model providers, when it has any
    # the features attached to the kernel (recording, tracing: see _extension)
    extensions: Extensions = field(default_factory=Extensions)
    backends: Backends = field(default_factory=lambda: Backends({}))
    counters: collections.Counter[str] = field(default_factory=collections.Counter)
    # the fraction of memory in use at the last periodic check (NaN: no reading)
    memory_used: float = math.nan
    # set by the Cortex once started (its periodic check armed): Node() waits for it
    started: threading.Event = field(default_factory=threading.Event)
