"""``sessiontree export`` and ``sessiontree import``: a store as canonical JSONL and back.

Exit codes: 0 done; 2 a usage error (click's); 1 the store cannot be opened
or written, or the file is not a valid export — with one line on stderr that
names the problem (for a bad file, its line number and field).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sessiontree.protocol import SessionTreeError
from sessiontree.store import Store, export_jsonl, import_jsonl

__all__ = ["export_cmd", "import_cmd"]

_STORE = click.option(
    "--store",
    "store_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The node's store directory.",
)


def _summary(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return f"{total} lines (" + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + ")"


def _fail(exc: BaseException) -> click.ClickException:
    """Exit 1 with the problem on one line of stderr."""
    return click.ClickException(" ".join(str(exc).split()) or type(exc).__name__)


@click.command("export")
@_STORE
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path, allow_dash=True),
    default=None,
    help=(
        "Write here (atomically: a temporary file renamed over it) instead of stdout; "
        "'-' is stdout."
    ),
)
def export_cmd(store_dir: Path, out: Path | None) -> None:
    """Write the store as canonical JSONL: one JSON object a line.

    Opens the store read-only, so it runs beside a live node; it reads in
    short transactions, so on a live node entries of different databases
    may be a few commits apart. The counts of lines go to stderr.
    """
    try:
        with Store(store_dir, readonly=True) as store:
            if out is None or str(out) == "-":
                counts = export_jsonl(store, sys.stdout.buffer)
                where = "stdout"
            else:
                counts = export_jsonl(store, out)
                where = str(out)
    except (SessionTreeError, OSError) as exc:
        raise _fail(exc) from exc
    click.echo(f"exported {_summary(counts)} to {where}", err=True)


@click.command("import")
@_STORE
@click.option(
    "--replace",
    is_flag=True,
    help="Delete everything the store holds, in the same transaction as the import.",
)
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, path_type=Path, allow_dash=True)
)
def import_cmd(store_dir: Path, replace: bool, file: Path) -> None:
    """Restore a store from FILE, an export ('-' reads stdin).

    Opens the store for writing (creating it if needed), so no node may run
    on it. The whole file is checked before anything is written; the store
    must be empty unless --replace is given.
    """
    try:
        with Store(store_dir) as store:
            if str(file) == "-":
                counts = import_jsonl(store, sys.stdin.buffer, replace=replace)
            else:
                counts = import_jsonl(store, file, replace=replace)
    except (SessionTreeError, OSError) as exc:
        raise _fail(exc) from exc
    click.echo(f"imported {_summary(counts)} into {store_dir}")
