"""``sessiontree wedged ls|show|requeue|drop`` and ``sessiontree recovery
show|release``: the work recovery held back after repeated crashes (or as
too old to replay), and what it decided when the node started.

``ls`` and ``show`` read a running node or a store directory (read-only,
also while a node runs); the others change a node. Where they read is
decided as for every command (``_client.resolve_source``: flags, then
``SESSIONTREE_NODE``/``SESSIONTREE_STORE``, then the default node). An ID is
a held-back item's id or a unique prefix of it (as ``wedged ls`` prints).

Exit codes: 0 done; 1 the node or store refused, or no such item (one line
on stderr names it); 2 a usage error; 69 no node answered at ``--node``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import msgspec

from sessiontree.cli._client import NODE_OPTION, STORE_OPTION, NodeClient, resolve_source
from sessiontree.cli._exits import failure
from sessiontree.cli._ids import from_ids, resolve_id
from sessiontree.cli._text import echo, shown
from sessiontree.cli._times import utc
from sessiontree.protocol import SessionTreeError
from sessiontree.store import Store

__all__ = ["recovery", "wedged"]

_STORE = STORE_OPTION
_JSON = click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")
_ID = click.argument("wedged_id", metavar="ID")


def _client(node_url: str | None) -> NodeClient:
    return resolve_source(node_url).client()


def _wid(client: NodeClient, text: str) -> str:
    """The held-back item ``text`` (an id or a unique prefix) names on the node."""
    known = [str(item["wedged_id"]) for item in client.get("/v1/wedged")]
    return resolve_id(text, from_ids(known), what="held-back item", hint="ID")


def _from_store(store_dir: Path) -> list[dict[str, Any]]:
    try:
        with Store(store_dir, readonly=True) as store:
            items = store.wedged_list()
    except (SessionTreeError, OSError) as exc:
        raise failure(exc, f"cannot read store {store_dir}: ") from None
    plain = [msgspec.to_builtins(item) for item in items]
    return [{k: v for k, v in item.items() if k != "v"} for item in plain]


def _items(node_url: str | None, store_dir: Path | None) -> list[dict[str, Any]]:
    source = resolve_source(node_url, store_dir)
    if source.store_dir is not None:
        return _from_store(source.store_dir)
    with source.client() as client:
        found: list[dict[str, Any]] = client.get("/v1/wedged")
        return found


def _line(item: dict[str, Any]) -> str:
    at = utc(item["at"])
    what = f"{item['kind']} of {item['session_id']}"
    if item.get("seq") is not None:
        what += f" (message {item['seq']})"
    return shown(
        f"{item['wedged_id']}  {at}  {what}  attempts={item['attempts']}  {item['reason']}"
    )


@click.group()
def wedged() -> None:
    """Work recovery held back: list, inspect, requeue or drop it."""


@wedged.command("ls")
@NODE_OPTION
@_STORE
@_JSON
def ls_cmd(node_url: str | None, store_dir: Path | None, as_json: bool) -> None:
    """List held-back work, oldest first."""
    items = _items(node_url, store_dir)
    if as_json:
        echo(json.dumps(items, sort_keys=True))
        return
    if not items:
        echo("nothing is held back")
    for item in items:
        echo(_line(item))


@wedged.command("show")
@NODE_OPTION
@_STORE
@_ID
def show_cmd(node_url: str | None, store_dir: Path | None, wedged_id: str) -> None:
    """One held-back item, as JSON (its message or result included)."""
    items = _items(node_url, store_dir)
    wanted = resolve_id(
        wedged_id, from_ids(str(i["wedged_id"]) for i in items), what="held-back item", hint="ID"
    )
    found = [item for item in items if item["wedged_id"] == wanted]
    echo(json.dumps(found[0], sort_keys=True, indent=2))


@wedged.command("requeue")
@NODE_OPTION
@_ID
def requeue_cmd(node_url: str | None, wedged_id: str) -> None:
    """Run held-back work again, as a first attempt (a wedged branch runs as a
    fresh session under its parent)."""
    with _client(node_url) as client:
        wedged_id = _wid(client, wedged_id)
        answer = client.post(f"/v1/wedged/{wedged_id}/requeue")
    echo(shown(f"requeued {wedged_id}: runs in session {answer['session_id']}"))


@wedged.command("drop")
@NODE_OPTION
@_ID
def drop_cmd(node_url: str | None, wedged_id: str) -> None:
    """Forget a held-back item for good."""
    with _client(node_url) as client:
        wedged_id = _wid(client, wedged_id)
        client.request("DELETE", f"/v1/wedged/{wedged_id}")
    echo(f"dropped {wedged_id}")


@click.group()
def recovery() -> None:
    """What recovery decided at the node's start; release a held replay."""


@recovery.command("show")
@NODE_OPTION
@_JSON
def recovery_show(node_url: str | None, as_json: bool) -> None:
    """Recovery's figures and decisions (replays after a crash, held-back work)."""
    with _client(node_url) as client:
        view = client.get("/v1/recovery")
    if as_json:
        echo(json.dumps(view, sort_keys=True))
        return
    if view["replay_held"]:
        echo(shown(f"replay held: {view['replay_held']}"))
    figures = ", ".join(f"{k}={v}" for k, v in sorted(view["figures"].items()))
    echo(shown(f"figures: {figures}"))
    for d in view["decisions"]:
        where = f" message {d['seq']}" if d.get("seq") is not None else ""
        echo(
            shown(
                f"{d['decision']:<7} {d['kind']} of {d['session_id']}{where} "
                f"(attempt {d['attempt']}): {d['reason']}"
            )
        )
    echo(shown(f"held back: {view['wedged']} (sessiontree wedged ls)"))


@recovery.command("release")
@NODE_OPTION
def recovery_release(node_url: str | None) -> None:
    """Run what a held replay kept back (after the node kept crashing), and retry
    at once the Main cycles a store refusal kept (after the map grew)."""
    with _client(node_url) as client:
        answer = client.post("/v1/recovery/release")
    echo(shown(f"released {answer['released']} held replays"))
