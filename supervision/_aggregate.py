"""Aggregation of children's results: CONCAT, SUMMARIZE, VOTE, MERGE.

Every strategy says which children contributed and which tasks are missing
(no good result), so a partial answer is never mistaken for a whole one.
"""

from __future__ import annotations

import collections
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import msgspec

from sessiontree.protocol import (
    Aggregated,
    AggregateStrategy,
    ChildReport,
    RejectedInputError,
    SessionResult,
    Summarizer,
)

__all__ = ["aggregate", "extractive_summary", "normalise_answer"]

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_NOISE = re.compile(r"[\W_]+", re.UNICODE)
_MISSING = object()


def normalise_answer(text: str) -> str:
    """What VOTE compares: case-folded, accents and punctuation dropped, spaces collapsed."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(_NOISE.sub(" ", plain.casefold()).split())


def extractive_summary(summaries: Sequence[str], max_sentences: int = 5) -> str:
    """The default summarizer, deterministic: each summary's first sentence, in
    order, duplicates (after normalising) dropped, at most ``max_sentences``."""
    chosen: list[str] = []
    seen: set[str] = set()
    for text in summaries:
        first = _SENTENCE.split(text.strip(), maxsplit=1)[0].strip() if text.strip() else ""
        key = normalise_answer(first)
        if first and key not in seen:
            seen.add(key)
            chosen.append(first)
        if len(chosen) == max_sentences:
            break
    return " ".join(chosen)


def aggregate(
    items: Sequence[ChildReport] | Sequence[SessionResult],
    strategy: AggregateStrategy | str = AggregateStrategy.CONCAT,
    *,
    summarizer: Summarizer | None = None,
) -> Aggregated:
    """Make one result of ``items`` (a pattern's reports, or plain results).

    Only completed results contribute; a report without one is listed in
    ``missing``. ``RejectedInputError`` (field ``strategy``) for an unknown
    strategy; whatever ``summarizer`` raises propagates.
    """
    try:
        chosen = AggregateStrategy(strategy)
    except ValueError:
        names = ", ".join(s.value for s in AggregateStrategy)
        msg = f"strategy {strategy!r} must be one of {names}"
        raise RejectedInputError(msg, field="strategy") from None
    good: list[SessionResult] = []
    missing: list[int] = []
    entries: Sequence[ChildReport | SessionResult] = items
    for index, item in enumerate(entries):
        result = item.result if isinstance(item, ChildReport) else item
        if result is not None and result.ok:
            good.append(result)
        else:
            missing.append(item.index if isinstance(item, ChildReport) else index)
    base = Aggregated(
        strategy=chosen,
        contributors=[r.session_id for r in good],
        missing=missing,
        memory_ids=tuple(dict.fromkeys(m for r in good for m in r.memory_ids)),
    )
    summaries = [r.summary for r in good]
    if chosen is AggregateStrategy.CONCAT:
        artifacts = {str(r.session_id): r.artifacts for r in good if r.artifacts}
        return msgspec.structs.replace(
            base, summary="\n\n".join(s for s in summaries if s), artifacts=artifacts
        )
    if chosen is AggregateStrategy.SUMMARIZE:
        summary = (summarizer or extractive_summary)(summaries)
        if not isinstance(summary, str):
            msg = f"a summarizer must return a str, not {type(summary).__name__}"
            raise TypeError(msg)
        return msgspec.structs.replace(base, summary=summary)
    if chosen is AggregateStrategy.VOTE:
        return _vote(base, good)
    return _merge(base, good)


def _vote(base: Aggregated, good: list[SessionResult]) -> Aggregated:
    """Majority over normalised summaries; a tie for first is reported, not broken."""
    votes = collections.Counter(normalise_answer(r.summary) for r in good)
    votes.pop("", None)
    if not votes:
        return base
    ranked = votes.most_common()
    top = ranked[0][1]
    leaders = sorted(answer for answer, count in ranked if count == top)
    if len(leaders) > 1:
        return msgspec.structs.replace(
            base, votes=dict(votes), tie=leaders, summary="tie: " + " | ".join(leaders)
        )
    winner = leaders[0]
    original = next(r.summary for r in good if normalise_answer(r.summary) == winner)
    return msgspec.structs.replace(base, votes=dict(votes), answer=winner, summary=original)


def _merge(base: Aggregated, good: list[SessionResult]) -> Aggregated:
    """Artifacts merged key by key (nested mappings recursively); a key whose
    values differ is a conflict: left out of the merge and listed under its
    JSON Pointer (``/meta/pages``) with each contributor's value."""
    merged: dict[str, Any] = {}
    conflicts: dict[tuple[str, ...], dict[str, Any]] = {}
    for result in good:
        _merge_into(merged, result.artifacts, (), str(result.session_id), conflicts, good)
    return msgspec.structs.replace(
        base,
        artifacts=merged,
        conflicts={_pointer(path): values for path, values in conflicts.items()},
        summary="\n\n".join(r.summary for r in good if r.summary),
    )


def _merge_into(
    target: dict[str, Any],
    source: dict[str, Any],
    prefix: tuple[str, ...],
    contributor: str,
    conflicts: dict[tuple[str, ...], dict[str, Any]],
    good: list[SessionResult],
) -> None:
    for key, value in source.items():
        path = (*prefix, key)
        if path in conflicts:
            conflicts[path][contributor] = value
            continue
        current = target.get(key, _MISSING)
        if current is _MISSING:
            target[key] = _copy(value)
        elif isinstance(current, dict) and isinstance(value, dict):
            _merge_into(current, value, path, contributor, conflicts, good)
        elif current != value:
            del target[key]
            conflicts[path] = _values_at(path, good, upto=contributor)
            conflicts[path][contributor] = value


def _copy(value: Any) -> Any:
    """A deep copy of mappings (a merge must never change a child's artifacts)."""
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, dict) else value


def _values_at(path: tuple[str, ...], good: list[SessionResult], *, upto: str) -> dict[str, Any]:
    """The values earlier contributors gave at ``path`` (before ``upto``)."""
    found: dict[str, Any] = {}
    for result in good:
        if str(result.session_id) == upto:
            break
        node: Any = result.artifacts
        for part in path:
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            found[str(result.session_id)] = node
    return found


def _pointer(path: tuple[str, ...]) -> str:
    """RFC 6901: ``("meta", "a/b")`` is ``/meta/a~1b`` (a key with a dot stays one key)."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in path)
