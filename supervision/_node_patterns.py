"""The coordination patterns as a ``Node`` runs them for a parent session.

``Patterns`` (``node.patterns``) gives ``fan_out``, ``pipeline``,
``map_reduce`` and ``continue_run`` with their awaitable twins. They are a
group of their own, not ``Node`` methods: they are built on the node's
public operations on sessions (spawn, result, cancel, its events) and drive
a feature above them, the pattern engine, as a skill's session does.

Each drives the pattern engine of ``_patterns`` from outside the tree
(``NodeDriver``, on the calling thread; the awaitable twin runs it on a
worker thread): children of
``parent`` are spawned, awaited and retried as the options say, on the
node's clock. Failures: ``NodeClosedError`` once the node is closed,
``RejectedInputError`` naming the argument for a ``parent`` that is not a
session id, or the field for a bad option; ``EscalationError`` past the
retry intensity limit; a refused or failed child is reported in the
``Gathered``, not raised.
"""

from __future__ import annotations

from typing import Any, Unpack

from sessiontree.protocol import (
    ContinueOptions,
    ContinueRun,
    FanOut,
    FanOutOptions,
    Gathered,
    MapReduce,
    MapReduceOptions,
    PatternCall,
    Pipeline,
    PipelineOptions,
)
from sessiontree.supervision._drivers import NodeDriver
from sessiontree.supervision._faces import offloaded
from sessiontree.supervision._node_core import NodeCore
from sessiontree.supervision._refs import SessionIdLike, as_session_id

__all__ = ["Patterns"]


class Patterns:
    """``node.patterns``: the coordination patterns, run for a parent session.

    Each blocks the calling thread while it drives the pattern (waiting on
    children and on the node's clock); its awaitable twin runs it on a
    worker thread (``offloaded``), so the event loop goes on meanwhile.
    """

    __slots__ = ("_node",)

    def __init__(self, node: NodeCore) -> None:
        self._node = node

    def fan_out(
        self, /, parent: SessionIdLike, tasks: Any, **options: Unpack[FanOutOptions]
    ) -> Gathered:
        """One child of ``parent`` per task, queued past the children limit; waits
        for them (the node's clock). Options and result: ``supervision.fan_out``."""
        return self._pattern(parent, FanOut(list(tasks), options))

    afan_out = offloaded(fan_out)

    def pipeline(
        self, /, parent: SessionIdLike, stages: Any, **options: Unpack[PipelineOptions]
    ) -> Gathered:
        """Stages of children of ``parent``, each seeded with the previous results."""
        return self._pattern(parent, Pipeline(list(stages), options))

    apipeline = offloaded(pipeline)

    def map_reduce(
        self,
        /,
        parent: SessionIdLike,
        items: Any,
        map_task: Any,
        reduce_task: Any,
        **options: Unpack[MapReduceOptions],
    ) -> Gathered:
        """Map batches of ``items`` in children of ``parent``, then reduce them."""
        return self._pattern(parent, MapReduce(list(items), map_task, reduce_task, options))

    amap_reduce = offloaded(map_reduce)

    def continue_run(
        self, /, parent: SessionIdLike, token: str, context: str, **options: Unpack[ContinueOptions]
    ) -> Gathered:
        """A fresh child of ``parent`` continuing the run a token names, with
        ``context``; ``RejectedInputError`` for a token that does not parse."""
        return self._pattern(parent, ContinueRun(token, context, options))

    acontinue_run = offloaded(continue_run)

    def _pattern(self, parent: SessionIdLike, call: PatternCall) -> Gathered:
        sid = as_session_id(parent, "parent")
        node = self._node
        node._check_open()
        gathered: Gathered = NodeDriver(node, sid).run(node._restarts, call)
        return gathered
