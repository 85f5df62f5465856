"""Admission: a spawn checked under the rules, in the order the README's Limits
and defaults gives, and what its child gets (agent, backend, TTL, the
features' grants). A refusal is counted, emitted and returned as an
``ErrorInfo``, never raised."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessiontree.actors.backends import BACKENDS, ExecutionBackend
from sessiontree.protocol import (
    BackendUnavailableError,
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SpawnSpec,
)
from sessiontree.supervision._config import Agent
from sessiontree.supervision._entry import SharedTtl, TreeEntry
from sessiontree.supervision._events import Event, EventKind
from sessiontree.supervision._extension import Grant
from sessiontree.supervision._rules import Capacity, ParentView, check_spawn, resolve_ttl
from sessiontree.supervision._tree import Tree

__all__ = ["Admission", "Admitted", "admitted_alike", "features_admit"]


class Admission:
    """Validates spawns (Cortex thread)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    def admit(
        self, parent: TreeEntry | None, parent_id: uuid.UUID, spec: SpawnSpec
    ) -> Admitted | ErrorInfo:
        """Validate a spawn under ``parent`` (in the order the README's Limits and
        defaults gives) and resolve what its child gets; a refusal is counted,
        emitted and returned."""
        tree = self.tree
        view = None
        if parent is not None:
            view = ParentView(
                session_id=parent.session_id,
                kind=parent.kind,
                state=parent.state,
                depth=parent.info.depth,
                live_children=parent.live_children,
                cancelling=parent.cancel_code is not None,
            )
        agent = parent.agent if parent is not None else None
        skill_name = (spec.skill or agent.default) if agent is not None else ""
        skill = agent.skills.get(skill_name) if agent is not None else None
        config = tree.rt.config
        backend = spec.backend or (config.backend if spec.kind is SessionKind.WORKER else "inline")
        needs_thread = (
            skill is not None
            and agent is not None
            and backend == "inline"
            and not agent.is_async(skill_name)
        )
        capacity = Capacity(
            live_sessions=tree.live,
            zombies=tree.zombies + tree.main_zombies,
            sync_threads=tree.sync_threads + tree.zombies,
            needs_thread=needs_thread,
        )
        error = check_spawn(view, spec, agent, config, capacity)
        remote = None
        if error is None and skill is not None:
            remote, error = self._remote_for(backend, skill, spec)
        grants: tuple[Grant, ...] = ()
        if error is None:  # the features' rules (budgets), after the kernel's; inline: hot
            assert agent is not None
            for ext in tree.ext.admit:
                granted = ext.admit(parent, spec, agent)
                if isinstance(granted, ErrorInfo):
                    error = granted
                    break
                if granted is not None:
                    grants = (*grants, granted)
        if error is not None:
            self.rejected(parent_id, spec.kind, error)
            return error
        assert agent is not None
        ttl = resolve_ttl(spec, agent)
        return Admitted(spec, agent, backend, remote, ttl, needs_thread, grants)

    def still_admits(self, parent: TreeEntry, admitted: Admitted) -> bool:
        """Whether one more child as ``admitted`` still passes every check. Within
        one turn of the Cortex only these change as children are created."""
        tree = self.tree
        config = tree.rt.config
        return (
            not admitted.grants  # one granted something is admitted afresh each time
            and parent.live_children < parent.agent.max_children
            and tree.live < config.max_sessions
            and tree.zombies + tree.main_zombies < config.max_zombies
            and not (
                admitted.needs_thread
                and tree.sync_threads + tree.zombies >= config.max_step_threads
            )
        )

    def _remote_for(
        self, name: str, skill: Callable[[Any], Any], spec: SpawnSpec
    ) -> tuple[tuple[ExecutionBackend, bytes] | None, ErrorInfo | None]:
        """Where a new child's skill runs: None inline, else its backend and the
        skill's bytes; or why it cannot run there (the spawn is refused)."""
        backends = self.tree.rt.backends
        skill_name = repr(spec.skill) if spec.skill else "the default skill"
        try:
            backend = backends.get(name)
        except KeyError:
            return None, ErrorInfo(
                code=ErrorCode.UNKNOWN_BACKEND,
                message=f"backend {name!r} is not one of {list(BACKENDS)}",
                detail={"field": "backend", "backend": name},
            )
        except BackendUnavailableError as exc:
            return None, ErrorInfo(
                code=ErrorCode.BACKEND_UNAVAILABLE,
                message=str(exc),
                detail={"backend": name},
            )
        if backend is None:
            return None, None
        try:
            data = backends.serialised(backend, skill)
        except TypeError as exc:
            return None, ErrorInfo(
                code=ErrorCode.NOT_SERIALISABLE,
                message=f"skill {skill_name} cannot run on the {name} backend: {exc}",
                detail={"field": "skill", "backend": name, "skill": spec.skill},
            )
        return (backend, data), None

    def rejected(self, parent_id: uuid.UUID | None, kind: SessionKind, error: ErrorInfo) -> None:
        """Count and emit a refused spawn (a rule, capacity, a closing node, or
        the store refusing the new record: ``store_full``, ``store_failed``)."""
        rt = self.tree.rt
        rt.counters[f"rejected_{error.code.value}"] += 1
        parent = None if parent_id is None else self.tree.entries.get(parent_id)
        rt.events.emit(
            Event(
                kind=EventKind.REJECTED,
                at=self.tree.now(),
                parent_id=parent_id,
                agent_id=None if parent is None else parent.info.agent_id,
                code=error.code.value,
                data={"kind": kind.value, "message": error.message},
            )
        )


def features_admit(
    tree: Tree, parent: TreeEntry | None, spec: SpawnSpec, agent: Agent
) -> tuple[Grant, ...] | ErrorInfo:
    """What the extensions say to a session of ``spec`` under ``parent`` (None:
    a Main): the first refusal, else what they granted it (as ``Admission.admit``)."""
    grants: tuple[Grant, ...] = ()
    for ext in tree.ext.admit:
        granted = ext.admit(parent, spec, agent)
        if isinstance(granted, ErrorInfo):
            return granted
        if granted is not None:
            grants = (*grants, granted)
    return grants


def admitted_alike(first: SpawnSpec, spec: SpawnSpec) -> bool:
    """Whether ``spec`` is admitted as ``first`` was: it differs at most in what
    its child works on (task, context summary, input, metadata), which no
    rule reads. A pattern's batch makes one spec per task, all alike."""
    return first is spec or (
        spec.kind is first.kind
        and spec.skill == first.skill
        and spec.ttl == first.ttl
        and spec.model_tier == first.model_tier
        and spec.backend == first.backend
        and spec.budget == first.budget
        and spec.request_id is None
    )


@dataclass(slots=True)
class Admitted:
    """A validated spawn: what its child gets (for every child of a batch that
    repeats the spec, as long as ``Admission.still_admits``)."""

    spec: SpawnSpec
    agent: Agent
    backend: str
    remote: tuple[ExecutionBackend, bytes] | None
    ttl: float | None
    needs_thread: bool
    grants: tuple[Grant, ...]  # what the extensions granted its child (its budget)
    last: SessionInfo | None = None  # the identity of the last child made from it
    ttl_share: SharedTtl | None = None  # their one TTL timer (they share their creation)
