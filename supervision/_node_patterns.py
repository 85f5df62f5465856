"""The coordination patterns as a ``Node`` runs them for a parent session.

``NodePatterns`` gives ``Node`` ``fan_out``, ``pipeline``, ``map_reduce`` and
``continue_run`` with their awaitable twins. Each drives the pattern engine
of ``_patterns`` from outside the tree (``NodeDriver``): children of
``parent`` are spawned, awaited and retried as the options say, on the
node's clock. Failures: ``NodeClosedError`` once the node is closed,
``RejectedInputError`` naming the argument for a ``parent`` that is not a
session id, or the field for a bad option; ``EscalationError`` past the
retry intensity limit; a refused or failed child is reported in the
``Gathered``, not raised.
"""

from __future__ import annotations

from typing import Any

from sessiontree.protocol import Gathered
from sessiontree.supervision._drivers import NodeDriver, drive_node_async
from sessiontree.supervision._refs import NodeSessions, SessionIdLike, as_session_id

__all__ = ["NodePatterns"]


class NodePatterns(NodeSessions):
    """The pattern methods of ``Node``."""

    def fan_out(self, parent: SessionIdLike, tasks: Any, **options: Any) -> Gathered:
        """One child of ``parent`` per task, queued past the children limit; waits
        for them (the node's clock). Options and result: ``supervision.fan_out``."""
        return self._pattern(parent, "fan_out", (list(tasks),), options)

    def pipeline(self, parent: SessionIdLike, stages: Any, **options: Any) -> Gathered:
        """Stages of children of ``parent``, each seeded with the previous results."""
        return self._pattern(parent, "pipeline", (list(stages),), options)

    def map_reduce(
        self,
        parent: SessionIdLike,
        items: Any,
        map_task: Any,
        reduce_task: Any,
        **options: Any,
    ) -> Gathered:
        """Map batches of ``items`` in children of ``parent``, then reduce them."""
        return self._pattern(parent, "map_reduce", (list(items), map_task, reduce_task), options)

    def continue_run(
        self, parent: SessionIdLike, token: str, context: str, **options: Any
    ) -> Gathered:
        """A fresh child of ``parent`` continuing the run a token names, with
        ``context``; ``RejectedInputError`` for a token that does not parse."""
        return self._pattern(parent, "continue_run", (token, context), options)

    async def afan_out(self, parent: SessionIdLike, tasks: Any, **options: Any) -> Gathered:
        """Awaitable ``fan_out``."""
        return await self._apattern(parent, "fan_out", (list(tasks),), options)

    async def apipeline(self, parent: SessionIdLike, stages: Any, **options: Any) -> Gathered:
        """Awaitable ``pipeline``."""
        return await self._apattern(parent, "pipeline", (list(stages),), options)

    async def amap_reduce(
        self,
        parent: SessionIdLike,
        items: Any,
        map_task: Any,
        reduce_task: Any,
        **options: Any,
    ) -> Gathered:
        """Awaitable ``map_reduce``."""
        args = (list(items), map_task, reduce_task)
        return await self._apattern(parent, "map_reduce", args, options)

    async def acontinue_run(
        self, parent: SessionIdLike, token: str, context: str, **options: Any
    ) -> Gathered:
        """Awaitable ``continue_run``."""
        return await self._apattern(parent, "continue_run", (token, context), options)

    def _pattern(
        self, parent: SessionIdLike, name: str, args: tuple[Any, ...], options: Any
    ) -> Gathered:
        sid = as_session_id(parent, "parent")
        self._check_open()
        gathered: Gathered = NodeDriver(self, sid).run(self._restarts, name, args, dict(options))
        return gathered

    async def _apattern(
        self, parent: SessionIdLike, name: str, args: tuple[Any, ...], options: Any
    ) -> Gathered:
        sid = as_session_id(parent, "parent")
        self._check_open()
        gathered: Gathered = await drive_node_async(
            self, sid, self._restarts, name, args, dict(options)
        )
        return gathered
