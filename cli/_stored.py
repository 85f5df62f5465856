"""What the read commands show when they read a store directory instead of a
node (``sessions ls|show|tree|results --store``, ``node status --store``).

The store is opened read-only (so it works beside a running node) and every
answer has the shape the node's HTTP API gives, so a command prints both the
same way. A store that cannot be read exits 1 (74 when its file is damaged),
naming the directory. The light read commands import this module only when
they read a store: it loads the store and the runtime.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import msgspec

from sessiontree.cli._exits import failure
from sessiontree.cli._ids import resolve_id, store_candidates
from sessiontree.cli._wire import SessionView, TreeView, plain_figures, session_view
from sessiontree.protocol import SessionTreeError
from sessiontree.store import SessionRecord, Store
from sessiontree.supervision import stored_spending

__all__ = [
    "fetch_stored",
    "store_status",
    "stored_results",
    "stored_rows",
    "stored_tree",
    "stored_view",
    "stored_wedged",
]


@contextlib.contextmanager
def _reading(store_dir: Path) -> Iterator[Store]:
    """The store opened read-only (beside a running node too); errors exit 1."""
    try:
        with Store(store_dir, readonly=True) as store:
            yield store
    except (SessionTreeError, OSError) as exc:
        raise failure(exc, f"cannot read store {store_dir}: ") from None


def _row(record: SessionRecord) -> dict[str, Any]:
    return {"info": msgspec.to_builtins(record.info), "result": msgspec.to_builtins(record.result)}


def stored_rows(store_dir: Path) -> list[dict[str, Any]]:
    """Every readable session of the store, ``{"info", "result"}`` as JSON data."""
    with _reading(store_dir) as store:
        return [_row(r) for r in store.sessions() if not isinstance(r, SessionTreeError)]


def stored_wedged(store_dir: Path) -> set[str]:
    """The ids of the sessions holding held-back work in a store."""
    with _reading(store_dir) as store:
        return {str(item.session_id) for item in store.wedged_list()}


def _stored(store: Store, session_id: uuid.UUID) -> SessionRecord:
    record = store.session(session_id)
    if record is None:
        raise click.ClickException(f"unknown_session: no session {session_id} in {store.path}")
    return record


def _record_view(store: Store, record: SessionRecord) -> SessionView:
    """A stored session as the API's ``GET /v1/sessions/{id}`` shows it: its
    usage from its usage record (calls may settle after its result was sent),
    or from its result where it has none."""
    spent = store.usage(record.info.session_id)
    return session_view(record.info, record.result, stored_spending(record, spent))


def stored_view(store: Store, session_id: str) -> dict[str, Any]:
    """``GET /v1/sessions/{id}``'s answer, read from the store."""
    view: dict[str, Any] = msgspec.to_builtins(
        _record_view(store, _stored(store, uuid.UUID(session_id)))
    )
    return view


def stored_tree(store: Store, session_id: str) -> dict[str, Any]:
    """The subtree under ``session_id`` as the API's ``tree`` gives it, children
    oldest first, read through the store's parent index."""

    def build(record: SessionRecord) -> TreeView:
        kids = [store.session(c) for c in store.children(record.info.session_id)]
        ordered = sorted((k for k in kids if k is not None), key=lambda k: k.info.created_at)
        view = msgspec.structs.asdict(_record_view(store, record))
        return TreeView(**view, children=[build(k) for k in ordered])

    tree: dict[str, Any] = msgspec.to_builtins(build(_stored(store, uuid.UUID(session_id))))
    return tree


def stored_results(store: Store, session_id: str) -> list[dict[str, Any]]:
    """The results a stored session received from its children."""
    _stored(store, uuid.UUID(session_id))
    found: list[dict[str, Any]] = msgspec.to_builtins(store.received(uuid.UUID(session_id)))
    return found


def fetch_stored(store_dir: Path, session: str, stored: Callable[[Store, str], Any]) -> Any:
    """``stored(store, id)`` for ``session`` (an id or a unique prefix) in the store."""
    with _reading(store_dir) as store:
        return stored(store, resolve_id(session, store_candidates(store)))


def store_status(store_dir: Path) -> dict[str, Any]:
    """``GET /v1/node``'s answer as far as a store knows it: sessions by state,
    the store's figures and the held-back work."""
    with _reading(store_dir) as store:
        by_state: Counter[str] = Counter()
        unreadable = 0  # a node start quarantines them; `store verify` names them
        for record in store.sessions():
            if isinstance(record, SessionTreeError):
                unreadable += 1
            else:
                by_state[record.info.state.value] += 1
        figures = store.stats()
        wedged = store.count("wedged")
    return {
        "node": str(store_dir),
        "state": "stored",
        "sessions": dict(by_state),
        "unreadable": unreadable,
        "store": plain_figures(figures),
        "wedged": wedged,
    }
