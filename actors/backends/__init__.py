"""Execution backends: where a session's skill runs when not in the node's own threads.

A node picks one with ``NodeConfig.backend`` (or a spawn with ``backend=``),
one of :data:`BACKENDS`: ``inline`` (the node's step executor and event loop),
``process`` (:class:`ProcessBackend`, a pool of worker processes on this
machine) or ``ray`` (:class:`RayBackend`, pooled Ray actors on a Ray cluster).
A skill on ``process`` or ``ray`` gets a :class:`RemoteSession`: a leaf that
reports progress, sends to its parent, calls models through the node and
honours cancellation.

:class:`ExecutionBackend` is the protocol a backend implements: it takes a
:class:`StepJob`, reports :data:`StepEvent` values while the step runs, and
ends it with one :class:`StepEnd` through the :class:`RemoteRun` it returned,
which also carries the node's answers to the step's model calls back.
"""

from sessiontree.actors.backends._process_pool import ProcessBackend
from sessiontree.actors.backends._protocol import (
    ExecutionBackend,
    RemoteRun,
    StepEnd,
    StepEvent,
    StepJob,
)
from sessiontree.actors.backends._ray_pool import RayBackend
from sessiontree.actors.backends._registry import BACKENDS
from sessiontree.actors.backends._worker import RemoteSession

__all__ = [
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
