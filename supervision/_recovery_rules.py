"""What recovery does with work a crash interrupted: pure functions of the
stored record, its attempt count and the clock (no store, no threads).

- *fresh*: run it again; the run is attempt ``attempts + 1`` and the skill
  sees that number (``session.attempt``) so it can deduplicate effects
  outside the store;
- *stale*: past its TTL, or older than the configured age: ended (a branch
  ``expired``), or held back (a Main's message), never run;
- *wedged*: crashes cut ``max_attempts`` runs of it off already: held back
  as a poison message or branch, never run again on its own.

A node that keeps dying soon after it starts holds all replay back
(``hold_replay``): the OTP supervisor's restart intensity, over the node's
own starts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Decision", "Verdict", "classify", "crashes_after_start", "hold_replay"]


class Decision(enum.StrEnum):
    """Recovery's decision for one piece of interrupted work."""

    FRESH = "fresh"
    STALE = "stale"
    WEDGED = "wedged"


@dataclass(frozen=True, slots=True)
class Verdict:
    """A decision, why, and (fresh) the attempt the next run is."""

    decision: Decision
    reason: str
    attempt: int


def classify(
    *,
    attempts: int,
    created_at: float,
    deadline: float | None,
    now: float,
    max_attempts: int,
    max_age: float | None,
) -> Verdict:
    """Decide for work that crashes cut ``attempts`` runs of off (0: none ran, or
    none was cut off), created at ``created_at`` (wall-clock seconds), with a
    TTL ending at ``deadline`` (None: no TTL), at ``now``."""
    if deadline is not None and now >= deadline:
        return Verdict(Decision.STALE, "its TTL ran out while the node was down", attempts)
    if max_age is not None and now - created_at > max_age:
        age = now - created_at
        return Verdict(
            Decision.STALE, f"it is {age:.0f} s old, past recovery_max_age={max_age:g}", attempts
        )
    if attempts >= max_attempts:
        return Verdict(
            Decision.WEDGED,
            f"a crash cut off each of its last {attempts} runs (limit {max_attempts})",
            attempts,
        )
    return Verdict(Decision.FRESH, "interrupted" if attempts else "waiting", attempts + 1)


def crashes_after_start(
    *,
    previous_running: bool,
    previous_start: float,
    crashes: list[float],
    now: float,
    period: float,
) -> list[float]:
    """The start times of recent runs that crashed, as of a start at ``now``:
    the earlier ones still within ``period``, plus the previous run's if it
    never shut down cleanly (``previous_running``)."""
    recent = [t for t in crashes if now - t <= period]
    if previous_running and now - previous_start <= period:
        recent.append(previous_start)
    return recent


def hold_replay(crashes: list[float], *, intensity: int, period: float) -> str | None:
    """Why replay is held back at this start (None: it is not): ``intensity``
    runs or more crashed within ``period`` seconds."""
    if intensity > 0 and len(crashes) >= intensity:
        return (
            f"the node crashed {len(crashes)} times within {period:g} s "
            f"(restart_intensity={intensity}); replay is held until released"
        )
    return None
