"""``sessiontree top``: a live terminal view of a running node (``_top_app``).

Exit codes: 0 quit; 2 a usage error (a bad URL, interval or root id). A node
that does not answer is not an exit: the view says so and keeps polling.
"""

from __future__ import annotations

import uuid

import click

from sessiontree.cli._client import NODE_OPTION
from sessiontree.cli._top_source import TopSource

__all__ = ["DEFAULT_NODE", "top"]

#: The node ``top`` watches without ``--node`` or SESSIONTREE_NODE: one
#: started with ``node start``'s defaults on this machine.
DEFAULT_NODE = "http://127.0.0.1:8470"


def _root(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a session id", param_hint="--root") from None


@click.command("top")
@NODE_OPTION
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 60.0),
    default=1.0,
    show_default=True,
    metavar="S",
    help="Seconds between two polls of the node.",
)
@click.option(
    "--root",
    default=None,
    metavar="ID",
    callback=_root,
    help="Start on the subtree under this session (default: every Main's tree).",
)
def top(node_url: str | None, interval: float, root: str | None) -> None:
    """A live view of a node: its session tree (kind, state, age, TTL left,
    tokens and cost), its figures and its rates of spawns, endings and failures.

    Keys: / filter (agent, skill, id or state), s sort (age, state, kind,
    usage), f or Enter follow the selected subtree, b or Backspace go up,
    c cancel, t terminate, p suspend, r resume (each asks y/n), q quit.
    Without --node it watches SESSIONTREE_NODE, else http://127.0.0.1:8470.
    """
    # Textual is imported here, not with the CLI: other commands do not pay for it.
    from sessiontree.cli._top_app import TopApp  # noqa: PLC0415

    source = TopSource(node_url or DEFAULT_NODE, timeout=max(2.0, interval * 2))
    try:
        TopApp(source, interval=interval, root=root).run()
    finally:
        source.close()
