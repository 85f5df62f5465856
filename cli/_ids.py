"""Ids as a person types them: a full id, or a unique prefix of one (as git
takes a commit's).

A full id (a UUID in its canonical form, either case) is taken as it is,
without a round trip. Anything else must be at least ``MIN_PREFIX``
characters of a canonical id (hex digits and hyphens); the ids that start
with it are asked of the node (``GET /v1/sessions?prefix=…``) or read from
the store's index. No id starting with it, or more than one, is a usage
error (exit 2) naming the prefix, and the candidates when there are several.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sessiontree.cli._client import NodeClient, Source
from sessiontree.cli._exits import failure
from sessiontree.protocol import SessionTreeError

if TYPE_CHECKING:
    from sessiontree.store import Store

__all__ = [
    "MIN_PREFIX",
    "Candidates",
    "from_ids",
    "node_candidates",
    "resolve_id",
    "resolve_session",
    "store_candidates",
]

MIN_PREFIX = 4
SHOWN = 8  # the candidates an ambiguity error lists
_PREFIX = re.compile(r"[0-9a-f-]{%d,36}" % MIN_PREFIX)  # noqa: UP031 - a regex's braces

Candidates = Callable[[str], tuple[list[str], bool]]
"""The ids starting with a prefix (at most ``SHOWN + 1``), and whether there are more."""


def _canonical(text: str) -> str | None:
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        return None
    return str(parsed) if str(parsed) == text.lower() else None


def resolve_id(
    text: str, candidates: Candidates, *, what: str = "session", hint: str = "SESSION"
) -> str:
    """The full id ``text`` names: itself when it is one, else the one id that
    starts with it. ``click.BadParameter`` (exit 2) for text that cannot start
    an id, for no match (``no session starts with …``) and for several (listing
    them)."""
    full = _canonical(text)
    if full is not None:
        return full
    prefix = text.strip().lower()
    if not _PREFIX.fullmatch(prefix):
        msg = (
            f"{text!r} is not a {what} id or a prefix of one "
            f"(at least {MIN_PREFIX} hex digits, as 'sessions ls' prints)"
        )
        raise click.BadParameter(msg, param_hint=hint)
    found, more = candidates(prefix)
    if not found:
        raise click.BadParameter(f"no {what} starts with {prefix!r}", param_hint=hint)
    if len(found) > 1 or more:
        shown = ", ".join(found[:SHOWN])
        tail = ", …" if more or len(found) > SHOWN else ""
        msg = f"{what} prefix {prefix!r} is ambiguous: it starts {shown}{tail}; give more digits"
        raise click.BadParameter(msg, param_hint=hint)
    return found[0]


def node_candidates(client: NodeClient) -> Candidates:
    """Ask the node for the sessions whose ids start with a prefix."""

    def ask(prefix: str) -> tuple[list[str], bool]:
        page = client.get("/v1/sessions", prefix=prefix, limit=SHOWN + 1)
        return [str(i["session_id"]) for i in page["items"]], page["next_cursor"] is not None

    return ask


def store_candidates(store: Store, db: str = "sessions") -> Candidates:
    """Read the keys of the store's ``db`` (sessions; recordings) for ids
    starting with a prefix: the whole hex bytes of the prefix narrow the scan
    to the keys under them."""

    def read(prefix: str) -> tuple[list[str], bool]:
        digits = prefix.replace("-", "")
        under = bytes.fromhex(digits[: len(digits) // 2 * 2])
        found: list[str] = []
        for key, _ in store.scan(db, under):
            if len(key) != 16:
                continue
            sid = str(uuid.UUID(bytes=key))
            if sid.startswith(prefix):
                found.append(sid)
                if len(found) > SHOWN:
                    return found[:SHOWN], True
        return found, False

    return read


def from_ids(ids: Iterable[str]) -> Candidates:
    """Candidates from ids already in hand (a listing the command read)."""
    known = sorted(set(ids))

    def pick(prefix: str) -> tuple[list[str], bool]:
        found = [i for i in known if i.startswith(prefix)]
        return found[:SHOWN], len(found) > SHOWN

    return pick


def resolve_session(source: Source, text: str, *, hint: str = "SESSION") -> str:
    """The full session id ``text`` names on ``source`` (a node or a store);
    see ``resolve_id``. An unreadable store exits 1 (74 when damaged)."""
    if _canonical(text) is not None:
        return str(_canonical(text))
    if source.node_url is not None:
        with source.client() as client:
            return resolve_id(text, node_candidates(client), hint=hint)
    assert source.store_dir is not None
    return _in_store(source.store_dir, text, hint)


def _in_store(store_dir: Path, text: str, hint: str) -> str:
    from sessiontree.store import Store  # noqa: PLC0415 - only a store's reader loads it

    try:
        with Store(store_dir, readonly=True) as store:
            return resolve_id(text, store_candidates(store), hint=hint)
    except (SessionTreeError, OSError) as exc:
        raise failure(exc, f"cannot read store {store_dir}: ") from None
