"""What recovery did at a node's start, in a few numbers and one log line:
what it brought back, what it ended as failed, what it held back.

``recovery_summary`` reads the figures ``recover`` counted (``node.recovery.figures``)
and never fails: a figure it does not find counts as 0.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["recovery_summary", "recovery_summary_line"]


def recovery_summary(figures: Mapping[str, int], held: str | None = None) -> dict[str, int]:
    """``brought_back`` (Mains and suspended branches that come back),
    ``replayed`` (work a crash cut off that runs again), ``failed`` (sessions
    ended ``failed``, orphans ended ``cancelled``), ``held_back`` (work kept for
    the operator as stale or wedged), ``quarantined`` (records that did not
    decode), ``results_owed`` (results still on their way to parents),
    ``replay_held`` (1 when the node kept crashing and holds every replay
    back; ``held`` says why) and ``recovery_ms``."""

    def n(name: str) -> int:
        return int(figures.get(name, 0))

    return {
        "brought_back": n("mains") + n("suspended"),
        "replayed": n("fresh"),
        "failed": n("failed") + n("orphans_cancelled"),
        "held_back": n("stale") + n("wedged"),
        "quarantined": n("quarantined"),
        "results_owed": n("outbox"),
        "replay_held": 1 if held is not None or n("replay_held") else 0,
        "recovery_ms": n("recovery_ms"),
    }


def recovery_summary_line(summary: Mapping[str, int]) -> str:
    """One line for the log: ``recovery: brought back 3, replayed 0, failed 2,
    held back 0, quarantined 0, results owed 1, replay held: no (12 ms)``."""
    return (
        f"recovery: brought back {summary['brought_back']}, replayed {summary['replayed']}, "
        f"failed {summary['failed']}, held back {summary['held_back']}, "
        f"quarantined {summary['quarantined']}, results owed {summary['results_owed']}, "
        f"replay held: {'yes' if summary['replay_held'] else 'no'} "
        f"({summary['recovery_ms']} ms)"
    )
