"""``sessiontree top``: a live terminal view of a running node (``cli/top``).

Exit codes: 0 quit; 1 the node refused the token (401, 403: the view stops
and says so); 2 a usage error (a bad URL, interval or root id), or the
``top`` extra (Textual) is not installed. A node that does not answer is not
an exit: the view says so and keeps polling.
"""

from __future__ import annotations

import click

from sessiontree.cli._client import NODE_OPTION, resolve_source
from sessiontree.cli._ids import resolve_session
from sessiontree.cli._lazy import needs_extra
from sessiontree.cli.top._source import TopSource

__all__ = ["top"]


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
    help="Start on the subtree under this session, a unique id prefix will do "
    "(default: every Main's tree).",
)
def top(node_url: str | None, interval: float, root: str | None) -> None:
    """A live view of a node: its session tree (kind, state, age, TTL left,
    tokens and cost), its figures and its rates of spawns, endings and failures.

    Keys: / filter (agent, skill, id or state), s sort (age, state, kind,
    usage), f or Enter follow the selected subtree, b or Backspace go up,
    c cancel, t terminate, p suspend, r resume (each asks y/n), q quit.
    It watches the node the other commands read (--node, SESSIONTREE_NODE,
    else http://127.0.0.1:8470).
    """
    # Textual is imported here, not with the CLI: other commands do not pay for it.
    with needs_extra("sessiontree top", "top"):
        from sessiontree.cli.top._app import TopApp  # noqa: PLC0415

    where = resolve_source(node_url)
    if where.node_url is None:
        raise click.UsageError("top watches a node: give --node URL")
    if root is not None:
        root = resolve_session(where, root, hint="--root")
    source = TopSource(where.node_url, timeout=max(2.0, interval * 2))
    app = TopApp(source, interval=interval, root=root)
    try:
        app.run()
    finally:
        source.close()
    if app.stopped is not None:
        raise click.ClickException(app.stopped)
