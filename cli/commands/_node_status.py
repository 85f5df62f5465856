"""``sessiontree node status``: a node's state, from a running node or a store.

Exit codes: 0 shown; 1 the store cannot be read; 69 no node at ``--node``;
74 the store's file is damaged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sessiontree.cli._client import NODE_OPTION, STORE_OPTION, resolve_source
from sessiontree.cli._text import echo, shown

__all__ = ["status"]


@click.command("status")
@NODE_OPTION
@STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")
def status(node_url: str | None, store_dir: Path | None, as_json: bool) -> None:
    """A node's state, sessions by state, counters and store (from a node or a store)."""
    source = resolve_source(node_url, store_dir)
    if source.node_url is not None:
        with source.client() as client:
            found: dict[str, Any] = client.get("/v1/node")
    else:
        assert source.store_dir is not None
        from sessiontree.cli._stored import store_status  # noqa: PLC0415 - only for a store

        found = store_status(source.store_dir)
    if as_json:
        echo(json.dumps(found, sort_keys=True))
        return
    echo(shown(f"node {found['node']}: {found['state']}"))
    if "uptime_s" in found:
        echo(shown(f"  up {found['uptime_s']:.0f} s, agents: {', '.join(found['agents'])}"))
    for agent, skills in (found.get("skills") or {}).items():
        echo(shown(f"  agent {agent}: skills {', '.join(skills)}"))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(found["sessions"].items()) if n)
    if found.get("unreadable"):
        counts += (
            f"{', ' if counts else ''}{found['unreadable']} unreadable (sessiontree store verify)"
        )
    echo(shown(f"  sessions: {counts or 'none'}"))
    recovered = found.get("recovery")
    if recovered:
        echo(
            f"  recovery: brought back {recovered['brought_back']}, failed {recovered['failed']}, "
            f"held back {recovered['held_back']}, quarantined {recovered['quarantined']}"
        )
    if found.get("replay_held"):
        echo(shown(f"  REPLAY HELD: {found['replay_held']} (sessiontree recovery release)"))
    if found.get("wedged"):
        echo(f"  held back: {found['wedged']} (sessiontree wedged ls)")
    store = found.get("store") or {}
    if store:
        echo(
            shown(
                f"  store {store.get('path')}: {store.get('used_bytes', 0):,} of "
                f"{store.get('map_size', 0):,} bytes used"
            )
        )
