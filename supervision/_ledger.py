"""What sessions spend and may spend, kept in the tree (issue 20).

Every session that spends, or whose subtree is bounded, has a ``Ledger`` on
its ``TreeEntry``: its budget (after narrowing), its own usage, its subtree's
(its own and every descendant's, each counted once) and what is reserved for
calls in flight below it. A call reserves its worst case against the session
and every ancestor in one turn of the Cortex, so concurrent children see one
order and cannot overshoot; it settles to the reported usage when it ends.

A call or spawn that does not fit is refused before it happens
(``budget_exhausted``, an answer, not an error). The first refusal reaches
the hard limit: the bounded session's live subtree is cancelled with the
normal grace and ends ``cancelled`` with ``budget_exhausted`` (a Main, whose
budget is per message cycle, keeps running; its live descendants end). A
soft threshold is announced once per budget (``BUDGET_WARNING``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import uuid
from typing import Any

import msgspec

from sessiontree.actors.runtime import Reply, post
from sessiontree.protocol import (
    COST_UNIT,
    Budget,
    ErrorCode,
    ErrorInfo,
    SessionInfo,
    SessionKind,
    SpawnSpec,
    Usage,
)
from sessiontree.supervision._budgets import crossed_soft, first_exceeded, left, narrow
from sessiontree.supervision._cancelling import Cancelling
from sessiontree.supervision._commits import Commits, answer_written, store_error
from sessiontree.supervision._config import Agent
from sessiontree.supervision._entry import Ledger, Reserved, TreeEntry
from sessiontree.supervision._events import EventKind
from sessiontree.supervision._extension import Extension
from sessiontree.supervision._persist import Persister
from sessiontree.supervision._providers import Price
from sessiontree.supervision._requests import DEFERRED, Call, Request
from sessiontree.supervision._rules import model_tier
from sessiontree.supervision._tree import Tree

__all__ = ["Ledgers", "Reserve", "Reserved", "Settle", "priced"]

ONE_SPAWN = Usage(descendants=1)


class Reserve(Request[Reserved | ErrorInfo], frozen=True):
    """Reserve one model call's worst case against the session and its ancestors
    (``prompt_tokens`` estimated; ``max_tokens`` None: as many as the budgets
    leave); refused with ``budget_exhausted`` or ``budget_unenforceable``.
    Answered once the call's record is durable (the store's error, nothing
    reserved, if it failed); ``optional``: see ``Ledgers.reserve``."""

    session_id: uuid.UUID
    prompt_tokens: int
    max_tokens: int | None
    price: Price | None
    optional: bool = False


class Settle(Request[ErrorInfo | None], frozen=True):
    """A call ended: release its reservation, count what it ``used`` (priced).
    Answered once the usage is durable (the store's error if it failed)."""

    reserved: Reserved
    used: Usage
    traced: dict[str, Any] | None = None  # a traced node: the call's span (MODEL_CALL's data)


class _Granted:
    """A new session's budget: a child's narrowed to what its bounded
    ancestors have left (``clamped``: narrower than it asked for), or a
    Main's, its agent's (which holds per message cycle)."""

    __slots__ = ("budget", "clamped", "ledgers")

    def __init__(self, ledgers: Ledgers, budget: Budget, clamped: bool = False) -> None:
        self.ledgers, self.budget, self.clamped = ledgers, budget, clamped

    def stamp(self, info: SessionInfo) -> SessionInfo:
        """Its identity names its budget."""
        return msgspec.structs.replace(info, budget=self.budget)

    def made(self, entry: TreeEntry) -> None:
        """It gets its ledger; under a parent, every bounded ancestor counts one
        more descendant (their usage records are written with the spawn)."""
        parent = entry.parent
        if parent is None:  # a Main
            entry.ledger = Ledger(budget=self.budget)
            return
        ledgers = self.ledgers
        counted = ledgers.spawned(parent, entry, self.budget, clamped=self.clamped)
        ledgers.tree.rt.persist.usage(counted)  # in the spawn's commit when it has one


class Ledgers(Extension):
    """Budgets and usage across the tree (Cortex thread), attached to the
    kernel: a spawn is admitted against the budgets above it, its child
    gets its narrowed budget and its ledger (a ``_Granted``: an unbounded
    one costs nothing more), and a restored session its accounts as they
    were."""

    answers = (Reserve, Settle)
    tree: Tree
    cancelling: Cancelling
    commits: Commits

    def bind(self, cortex: Any) -> None:
        self.tree = cortex.tree
        self.cancelling = cortex.cancelling
        self.commits = cortex.commits

    def answer(self, request: Any, reply: Any) -> object:
        """A model call's ``Reserve`` or ``Settle`` (see each)."""
        if isinstance(request, Reserve):
            return self._reserve(request, reply)
        return self._settle(request, reply)

    def _reserve(self, reserve: Reserve, reply: Reply | None) -> object:
        """A model call's reservation, answered once its record is durable: a
        request that leaves the node is always in the store, so a node that
        dies with it in flight still counts it when it comes back.

        Answered from the writer's thread (the call goes out one hop sooner);
        a write that failed is answered with the store's error, and the
        reservation is released by a settle of nothing told to the Cortex.
        ``UnknownSessionError`` for a session the index does not hold."""
        tree = self.tree
        held = self.reserve(
            tree.lookup(reserve.session_id),
            reserve.prompt_tokens,
            reserve.max_tokens,
            reserve.price,
            optional=reserve.optional,
        )
        if isinstance(held, ErrorInfo) or reply is None:
            return held
        written = tree.rt.persist.call(held, tree.now())
        if written is None:
            return held
        ref, activity = tree.ref, tree.rt.activity

        def answer(finished: concurrent.futures.Future[None]) -> None:  # the writer's thread
            error = finished.exception()
            if error is None:
                reply.set(held)
                return
            reply.set(store_error(error, reserve.session_id))
            if ref is not None:  # never sent: released, nothing counted
                post(ref, Call(Settle(held, Usage())), activity)

        written.add_done_callback(answer)
        tree.rt.persist.hurry()  # the call waits for it
        return DEFERRED

    def _settle(self, settle: Settle, reply: Reply | None) -> object:
        """A model call ended: counted (answered once that is durable) and, on a
        traced node, emitted for its span."""
        tree = self.tree
        reserved, traced = settle.reserved, settle.traced
        counted = self.settle(reserved, settle.used)
        persist = tree.rt.persist
        written = persist.usage(counted, settled=reserved)
        if written is not None:  # told only if it failed (a hop per settle cost more)
            then = functools.partial(_settle_refused, persist, counted, reserved)
            self.commits.if_refused(written, then)
        if traced is not None:
            entry = tree.entries.get(reserved.chain[0])
            tree.emit(EventKind.MODEL_CALL, entry, data=traced, at=traced["ended_at"])
        if reply is None:
            return None
        answer_written(written, reply, reserved.chain[0], persist)
        return DEFERRED

    # -- the kernel's hooks ------------------------------------------------------------

    def admit(
        self, parent: TreeEntry | None, spec: SpawnSpec, agent: Agent
    ) -> ErrorInfo | _Granted | None:
        """Whether ``parent`` may have one more child, and the child's budget
        (its spec's, else its agent's) narrowed to what every bounded ancestor
        has left, granted (None: it is unbounded; a Main is granted its
        agent's). Refused when a bounded ancestor has no room for another
        descendant: the refusal reaches the hard limit of the outermost budget
        it did not fit (see ``_refuse``), unless the child is ``optional``
        (``SpawnSpec.optional``): then it is only refused. Refused too when
        the budget bounds cost and the model the child would call has no
        price (``budget_unenforceable``)."""
        if parent is None:
            return None if agent.budget is None else _Granted(self, agent.budget)
        budget = spec.budget if spec.budget is not None else agent.budget
        clamped = False
        refused: tuple[TreeEntry, Ledger, str] | None = None
        holder: TreeEntry | None = parent
        while holder is not None:  # a walk, not a list: every spawn takes it
            ledger = holder.ledger
            if ledger is not None and ledger.budget is not None:
                used = ledger.counted()
                dimension = ledger.exhausted or first_exceeded(
                    ledger.budget, used, ledger.reserved, ONE_SPAWN
                )
                if dimension is not None:
                    refused = (holder, ledger, dimension)
                elif refused is None:
                    remaining = left(ledger.budget, used, ledger.reserved)
                    budget, narrowed = narrow(budget, _without_descendant(remaining))
                    clamped = clamped or narrowed
            holder = holder.parent
        if refused is not None:
            if spec.optional:
                return _exhausted(refused[0], refused[2])
            return self._refuse(*refused)
        if budget is None:
            return None
        if budget.cost is not None:  # only then is a price needed
            tier = model_tier(spec, agent, parent.info.model_tier, root=False)
            error = self.enforceable(agent, tier, budget)
            if error is not None:
                return error
        return _Granted(self, budget, clamped)

    def restored(self, entry: TreeEntry, before: SessionInfo, data: dict[str, Any] | None) -> None:
        """A restored session gets its accounts back."""
        entry.ledger = self._restored(entry.info, entry.agent)

    def _restored(self, info: SessionInfo, agent: Agent) -> Ledger | None:
        """A restored session's accounts: a passivated Main's as they were, else
        what the store's usage record says was spent (its budget as spawned; a
        Main's, its agent's, counting afresh from this cycle)."""
        tree = self.tree
        ledger = tree.ledgers_at_rest.pop(info.session_id, None)
        if ledger is not None:
            return ledger
        main = info.kind is SessionKind.MAIN
        budget = agent.budget if main else info.budget
        spent = tree.store.usage(info.session_id, set_aside=True) if tree.store else None
        if spent is None and budget is None:
            return None
        ledger = Ledger(budget=budget)
        if spent is not None:
            ledger.own, ledger.subtree = spent.own, spent.subtree
        if main:
            ledger.window = ledger.subtree
        return ledger

    # -- spawning ----------------------------------------------------------------------

    def enforceable(self, agent: Agent, tier: str | None, budget: Budget) -> ErrorInfo | None:
        """``budget_unenforceable`` when ``budget`` bounds cost and the model a
        session of ``agent`` at ``tier`` calls has no price (None: it can be kept)."""
        models = self.tree.rt.models
        if budget.cost is None or models is None:
            return None
        route = models.route(agent, tier)
        if isinstance(route, ErrorInfo) or route.price is not None:
            return None  # the agent calls no model at that tier, or it is priced
        return ErrorInfo(
            code=ErrorCode.BUDGET_UNENFORCEABLE,
            message=f"a budget of cost needs a price for agent {agent.agent_id!r}'s model "
            f"at tier {tier!r}, and the price table has none",
            detail={"field": "budget.cost", "agent_id": agent.agent_id, "model_tier": tier},
        )

    def spawned(
        self, parent: TreeEntry, child: TreeEntry, budget: Budget, *, clamped: bool
    ) -> list[TreeEntry]:
        """``child`` was created under ``parent`` with ``budget`` (``clamped``: narrower
        than it asked); every bounded ancestor counts one more descendant.
        Returns those ancestors (their usage records change)."""
        child.ledger = Ledger(budget=budget, clamped=clamped)
        counted = []
        for entry in _chain(parent):
            ledger = entry.ledger
            if ledger is not None and ledger.budget is not None:
                before = ledger.committed()
                ledger.subtree = ledger.subtree + ONE_SPAWN
                self._warn_if_crossed(entry, ledger, before)
                counted.append(entry)
        return counted

    # -- model calls --------------------------------------------------------------------

    def reserve(
        self,
        entry: TreeEntry,
        prompt_tokens: int,
        max_tokens: int | None,
        price: Price | None,
        *,
        optional: bool = False,
    ) -> Reserved | ErrorInfo:
        """Reserve one call's worst case against ``entry`` and every ancestor:
        ``prompt_tokens`` (an estimate) plus ``max_tokens``, capped to the
        completion tokens every bounded ancestor has room for (by tokens, and
        by cost at the model's ``price``). Refused (nothing reserved) when it
        cannot fit, when a budget bounds cost and the model has no ``price``
        (``budget_unenforceable``), or when the session is stopping.

        ``optional``: a call the session can do without (a hedge's duplicate):
        one that does not fit is refused and nothing more happens; any other
        refusal reaches the hard limit of the budget it did not fit."""
        chain = _chain(entry)
        bounded = [(e, e.ledger) for e in chain if e.ledger is not None and e.ledger.budget]
        for holder, ledger in reversed(bounded):
            if ledger.exhausted is not None:  # said first: it is why the subtree stops
                return _exhausted(holder, ledger.exhausted)
        if entry.state.is_terminal or entry.cancel_code is not None:
            return ErrorInfo(
                code=ErrorCode.SESSION_NOT_ACTIVE,
                message=f"session {entry.session_id} is stopping or ended; no model call",
            )
        for holder, ledger in bounded:
            if ledger.budget is not None and ledger.budget.cost is not None and price is None:
                return ErrorInfo(
                    code=ErrorCode.BUDGET_UNENFORCEABLE,
                    message=f"session {holder.session_id}'s budget bounds cost, and the "
                    "model has no price",
                    detail={"field": "budget.cost", "session_id": str(holder.session_id)},
                )
        cap = max_tokens
        for _, ledger in bounded:
            assert ledger.budget is not None
            remaining = left(ledger.budget, ledger.counted(), ledger.reserved)
            room = _completion_room(remaining, prompt_tokens, price)
            if room is not None:
                cap = room if cap is None else min(cap, room)
        ask = priced(Usage(prompt_tokens=prompt_tokens, completion_tokens=cap or 0, calls=1), price)
        for holder, ledger in reversed(bounded):  # the outermost first: see _refuse
            assert ledger.budget is not None
            dimension = first_exceeded(ledger.budget, ledger.counted(), ledger.reserved, ask)
            if dimension is None and cap == 0 and max_tokens != 0:
                dimension = "tokens"  # no room for a single completion token
            if dimension is not None:
                if optional:
                    return _exhausted(holder, dimension)
                return self._refuse(holder, ledger, dimension)
        for holder in chain:
            ledger = self._ledger(holder)
            before = ledger.committed()
            ledger.reserved = ledger.reserved + ask
            if ledger.budget is not None:  # announced as it is reserved: before the limit
                self._warn_if_crossed(holder, ledger, before)
        return Reserved(ask, cap, tuple(e.session_id for e in chain))

    def settle(self, reserved: Reserved, used: Usage) -> list[TreeEntry]:
        """A call ended: its reservation is released and ``used`` (what the
        provider reported, priced) counted once for its session and each
        ancestor, ended ones too: the index keeps an ended session while calls
        are in flight below it (``unsettled``), so usage settles wherever it
        lands. An ended session whose last call this was is told to observers
        (``USAGE_SETTLED``, with its final figures). Returns the entries whose
        usage changed."""
        entries = self.tree.entries
        counted = []
        for i, session_id in enumerate(reserved.chain):
            holder = entries.get(session_id)
            if holder is None:  # not reachable while the call held it; kept defensive
                continue
            ledger = self._ledger(holder)
            if i == 0:
                ledger.own = ledger.own + used
            before = ledger.committed()
            ledger.reserved = ledger.reserved - reserved.ask
            ledger.subtree = ledger.subtree + used
            if ledger.budget is not None:
                self._warn_if_crossed(holder, ledger, before)
            counted.append(holder)
            if holder.result is not None and ledger.settled:
                self.tree.emit(
                    EventKind.USAGE_SETTLED,
                    holder,
                    data={
                        "usage": msgspec.structs.asdict(ledger.own),
                        "subtree_usage": msgspec.structs.asdict(ledger.subtree),
                    },
                )
        return counted

    # -- limits ----------------------------------------------------------------------

    def _refuse(self, holder: TreeEntry, ledger: Ledger, dimension: str) -> ErrorInfo:
        """Refuse a call or spawn that ``holder``'s budget cannot fit, reaching
        its hard limit. When several budgets on the way up cannot fit, the
        outermost is the one that ran out: a child's budget is only what its
        parent had left when it was spawned, so the parent's running out is
        what the refusal means (its whole subtree stops, not just the child)."""
        if ledger.exhausted is None:
            self._exhaust(holder, ledger, dimension)
        return _exhausted(holder, dimension)

    def _exhaust(self, entry: TreeEntry, ledger: Ledger, dimension: str) -> None:
        """The hard limit: ``entry``'s subtree takes no new calls or children and
        is cancelled with the grace (a Main stays; its descendants end)."""
        ledger.exhausted = dimension
        tree = self.tree
        tree.rt.counters["budgets_exhausted"] += 1
        tree.emit(
            EventKind.BUDGET_EXHAUSTED,
            entry,
            code=ErrorCode.BUDGET_EXHAUSTED,
            data={"dimension": dimension},
        )
        group = tree.uncancelled_descendants(entry)
        if entry.kind is not SessionKind.MAIN and entry.cancel_code is None:
            group.insert(0, entry)
        if group:
            self.cancelling.cancel_group(group, ErrorCode.BUDGET_EXHAUSTED)

    def _warn_if_crossed(self, entry: TreeEntry, ledger: Ledger, before: Usage) -> None:
        """The soft threshold, announced once: it counts what is used and what
        is reserved (``committed``), as "fits" does, so a fan-out launched at
        once hears it as its calls are reserved, before the hard limit refuses one."""
        assert ledger.budget is not None
        if ledger.warned:
            return
        dimension = crossed_soft(ledger.budget, before, ledger.committed())
        if dimension is not None:
            ledger.warned = True
            self.tree.rt.counters["budget_warnings"] += 1
            self.tree.emit(
                EventKind.BUDGET_WARNING,
                entry,
                data={"dimension": dimension, "soft": ledger.budget.soft},
            )

    def _ledger(self, entry: TreeEntry) -> Ledger:
        ledger = entry.ledger
        if ledger is None:
            ledger = entry.ledger = Ledger()
        return ledger


def _chain(entry: TreeEntry) -> list[TreeEntry]:
    """``entry`` and its ancestors still in the index, nearest first."""
    chain = []
    current: TreeEntry | None = entry
    while current is not None:
        chain.append(current)
        current = current.parent
    return chain


def priced(usage: Usage, price: Price | None) -> Usage:
    """``usage`` with its cost (none without a price: counted as unpriced)."""
    if price is None:
        return Usage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            calls=usage.calls,
            unpriced_calls=usage.calls,
        )
    cost = usage.prompt_tokens * price.prompt + usage.completion_tokens * price.completion
    cost = round(cost * COST_UNIT) / COST_UNIT  # to the unit every sum is kept in
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cost=cost,
        calls=usage.calls,
    )


def _completion_room(remaining: Budget, prompt_tokens: int, price: Price | None) -> int | None:
    """The completion tokens ``remaining`` leaves room for after a prompt of
    ``prompt_tokens``, by tokens and by cost (None: unbounded; never below 0)."""
    rooms: list[int] = []
    if remaining.tokens is not None:
        rooms.append(int(remaining.tokens) - prompt_tokens)
    if remaining.cost is not None and price is not None and price.completion > 0:
        rooms.append(math.floor((remaining.cost - prompt_tokens * price.prompt) / price.completion))
    return max(min(rooms), 0) if rooms else None


def _without_descendant(remaining: Budget) -> Budget:
    """What a new child may have: the descendants left, less itself."""
    if remaining.descendants is None:
        return remaining
    return Budget(
        tokens=remaining.tokens,
        cost=remaining.cost,
        calls=remaining.calls,
        descendants=max(remaining.descendants - 1, 0),
        soft=remaining.soft,
    )


def _exhausted(entry: TreeEntry, dimension: str) -> ErrorInfo:
    return ErrorInfo(
        code=ErrorCode.BUDGET_EXHAUSTED,
        message=f"session {entry.session_id}'s budget of {dimension} is exhausted",
        detail={"dimension": dimension, "session_id": str(entry.session_id)},
    )


def _settle_refused(
    persist: Persister, counted: list[TreeEntry], reserved: Reserved, error: BaseException | None
) -> None:
    """On the Cortex thread: a settle's write failed; it goes again with the next."""
    if error is not None:
        persist.settle_refused(counted, reserved)
