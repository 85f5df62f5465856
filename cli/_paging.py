"""Pages of sessions read from a store, cut as the API cuts them.

The order is stable: by ``created_at``, then by id. A cursor names the last
session of a page (its ``created_at`` as Python writes the float, ``_``, its
id), the same opaque text ``GET /v1/sessions`` answers in ``next_cursor``; a
page holds what comes strictly after it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any

import click

__all__ = ["cursor_after", "page_of"]

_CURSOR = re.compile(
    r"[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,3})?"
    r"_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)


def cursor_after(raw: str | None) -> tuple[float, str] | None:
    """The position ``raw`` names; ``click.BadParameter`` naming ``--cursor``
    (exit 2) for text no listing wrote."""
    if raw is None:
        return None
    if not _CURSOR.fullmatch(raw):
        msg = f"{raw[:64]!r} is not a cursor a listing printed"
        raise click.BadParameter(msg, param_hint="--cursor")
    stamp, _, sid = raw.partition("_")
    return float(stamp), str(uuid.UUID(sid))


def _key(info: dict[str, Any]) -> tuple[float, str]:
    return float(info["created_at"]), str(info["session_id"])


def page_of(
    infos: Iterable[dict[str, Any]], limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """At most ``limit`` of ``infos`` (sessions as JSON) after ``cursor``, in
    the stable order, and the cursor of the next page (None on the last)."""
    after = cursor_after(cursor)
    ordered = sorted((i for i in infos if after is None or _key(i) > after), key=_key)
    page = ordered[:limit]
    if len(ordered) <= limit or not page:
        return page, None
    last = page[-1]
    return page, f"{float(last['created_at'])!r}_{last['session_id']}"
