"""One session's accounts as the node reports them (``Spending``): from its
ledger while the tree holds it (ended or not), and from its stored records
for a session only the store knows.

Usage settles wherever it lands: a model call still in flight when a session
ended (a child cancelled mid-call, a hedge's losing request) is counted in
its ledger and its stored usage record when it settles, so an ended session
reports those, not its result's figures (which were final only if the result
says ``usage_settled``); what is left of its budget counts them too. A
Main's budget holds per message cycle: while the tree holds it, what is left
is this cycle's; read from the store (dormant, or by ``sessions show
--store``) it counts from a fresh cycle, as it will when it comes back.

The tree keeps the dimension a budget ran out in; the store does not. For a
session that ended ``budget_exhausted`` and that only the store knows, the
dimension reported is the first its own budget has nothing left in (None
when its own budget still had room: an ancestor's ran out).
"""

from __future__ import annotations

from sessiontree.protocol import (
    Budget,
    ErrorCode,
    SessionKind,
    SessionResult,
    Spending,
    Usage,
)
from sessiontree.store import SessionRecord, UsageRecord
from sessiontree.supervision._budgets import DIMENSIONS, bound_of, left, spent
from sessiontree.supervision._entry import NOTHING, Ledger

__all__ = ["stored_spending", "tree_spending"]


def tree_spending(ledger: Ledger | None, result: SessionResult | None) -> Spending:
    """What the tree holds of a session: its ``ledger`` (None: it is unbounded
    and spent nothing) and, once it ended, its ``result``; for a passivated
    Main, the ledger the tree keeps at rest and no result."""
    if ledger is None:
        if result is None:
            return Spending()
        return _ended(result, None)
    if result is not None:
        return _ended(result, ledger)
    budget = ledger.budget
    return Spending(
        usage=ledger.own,
        subtree_usage=ledger.subtree,
        reserved=ledger.reserved,
        budget=budget,
        budget_left=None if budget is None else left(budget, ledger.counted(), ledger.reserved),
        budget_clamped=ledger.clamped,
        budget_exhausted=ledger.exhausted,
    )


def _ended(result: SessionResult, ledger: Ledger | None) -> Spending:
    if ledger is None:
        return Spending(
            usage=result.usage or NOTHING, subtree_usage=result.subtree_usage or NOTHING
        )
    own, subtree = ledger.own, ledger.subtree
    budget = ledger.budget
    return Spending(
        usage=own,
        subtree_usage=subtree,
        reserved=ledger.reserved,
        budget=budget,
        budget_left=(
            None if budget is None else left(budget, subtree - ledger.window, ledger.reserved)
        ),
        budget_clamped=ledger.clamped,
        budget_exhausted=ledger.exhausted,
    )


def stored_spending(record: SessionRecord, usage: UsageRecord | None) -> Spending:
    """A session's accounts from what the store holds: its record (its budget as
    spawned; its result, once it ended) and its usage record (None: it spent
    nothing, or none was written), which is the later of the two: calls that
    settled after the result was sent count there. The store keeps no
    reservations (calls in flight are the running node's) nor whether a
    budget was clamped."""
    info, result = record.info, record.result
    budget = info.budget
    if usage is not None:
        own, subtree = usage.own, usage.subtree
    elif result is not None:
        own = result.usage or NOTHING
        subtree = result.subtree_usage or NOTHING
    else:
        own = subtree = NOTHING
    if budget is None:
        return Spending(usage=own, subtree_usage=subtree)
    counted = NOTHING if info.kind is SessionKind.MAIN else subtree  # a fresh cycle
    remaining = left(budget, counted, NOTHING)
    exhausted = None
    error = result.error if result is not None else None
    if error is not None and error.code is ErrorCode.BUDGET_EXHAUSTED:
        exhausted = _used_up(budget, counted)
    return Spending(
        usage=own,
        subtree_usage=subtree,
        budget=budget,
        budget_left=remaining,
        budget_exhausted=exhausted,
    )


def _used_up(budget: Budget, counted: Usage) -> str | None:
    """The first dimension ``budget`` bounds and ``counted`` has reached."""
    for dimension in DIMENSIONS:
        bound = bound_of(budget, dimension)
        if bound is not None and spent(counted, dimension) >= bound:
            return dimension
    return None
