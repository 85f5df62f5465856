"""``sessiontree export`` and ``sessiontree import`` (a store as canonical JSONL
and back), and the ``sessiontree store`` group: ``backup``, ``verify``, and
``export``/``import`` again under it.

Exit codes: 0 done; 2 a usage error (click's); 1 the store cannot be opened
or written, or the file is not a valid export; 74 the store's file is damaged;
65 ``verify`` found records that do not decode — with one line on stderr that
names the problem (for a bad file, its line number and field).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import IO, cast

import click

from sessiontree.cli._exits import EXIT_RECORDS_UNREADABLE, failure
from sessiontree.cli._fresh import removed_on_failure
from sessiontree.cli._text import echo, shown, terminal_safe
from sessiontree.cli._words import plural
from sessiontree.protocol import SessionTreeError
from sessiontree.store import (
    Store,
    Verified,
    backup_from_meta_page,
    export_jsonl,
    import_jsonl,
    verify_store,
)

__all__ = ["export_cmd", "import_cmd", "store"]

_STORE = click.option(
    "--store",
    "store_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The node's store directory.",
)


def _summary(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return (
        f"{plural(total, 'line')} (" + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + ")"
    )


def _fail(exc: BaseException) -> click.ClickException:
    """Exit 1 (74: the store's file is damaged) with the problem on one line of stderr."""
    return failure(exc)


class _SafeLines(io.TextIOBase):
    """``binary`` as a text stream that writes each line terminal-safe
    (``_text.terminal_safe``: a control character a record holds becomes a
    JSON escape, so every line stays the same JSON value)."""

    def __init__(self, binary: IO[bytes]) -> None:
        super().__init__()
        self._binary = binary

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._binary.write(terminal_safe(text).encode())
        return len(text)


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
                # a TextIOBase as export_jsonl wants a text stream, which typeshed's IO misses
                stdout = cast(IO[str], _SafeLines(sys.stdout.buffer))
                counts = export_jsonl(store, stdout)
                where = "stdout"
            else:
                counts = export_jsonl(store, out)
                where = str(out)
    except (SessionTreeError, OSError) as exc:
        raise _fail(exc) from exc
    echo(f"exported {_summary(counts)} to {where}", err=True)


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
    must be empty unless --replace is given. A refused import leaves no store
    it created behind.
    """
    try:
        with removed_on_failure(store_dir), Store(store_dir) as store:
            if str(file) == "-":
                counts = import_jsonl(store, sys.stdin.buffer, replace=replace)
            else:
                counts = import_jsonl(store, file, replace=replace)
    except (SessionTreeError, OSError) as exc:
        raise _fail(exc) from exc
    echo(f"imported {_summary(counts)} into {store_dir}")


@click.group("store")
def store() -> None:
    """Back a store up, verify it, export it and import it."""


store.add_command(export_cmd)
store.add_command(import_cmd)


@store.command("backup")
@_STORE
@click.option(
    "--compact", is_flag=True, help="Leave free pages out (mdb_copy -c): smaller, slower."
)
@click.option(
    "--meta-page",
    type=click.IntRange(0, 1),
    default=None,
    help="The store's other meta page is damaged: copy it as meta page N (0 or 1) "
    "describes it, as the damage message offers (commits after it are lost).",
)
@click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
def backup_cmd(
    store_dir: Path, compact: bool, meta_page: int | None, as_json: bool, dest: Path
) -> None:
    """Copy the store into DEST, a new (or empty) directory, as mdb_copy does.

    Opens the store read-only, so it runs beside a live node: the copy is one
    consistent snapshot holding every write acknowledged before it began.
    DEST appears only once the copy is whole and synced. Restore by putting
    DEST in place of the store directory (the node stopped), or run a node
    with --store DEST. With --meta-page the store is not opened: the file is
    copied with that meta page in both places, then checked.
    """
    if meta_page is not None and compact:
        raise click.UsageError("--meta-page makes a plain copy: leave --compact out")
    try:
        if meta_page is not None:
            made = backup_from_meta_page(store_dir, dest, meta_page)
        else:
            with Store(store_dir, readonly=True) as opened:
                made = opened.backup(dest, compact=compact)
    except (SessionTreeError, OSError) as exc:
        raise _fail(exc) from exc
    if as_json:
        echo(json.dumps(vars(made), sort_keys=True))
        return
    source = store_dir if meta_page is None else f"{store_dir} (its meta page {meta_page})"
    echo(
        f"backed up {source} to {made.path}: {made.bytes:,} bytes, up to transaction "
        f"{made.txnid}, in {made.seconds:.2f} s"
    )


@store.command("verify")
@_STORE
@click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")
def verify_cmd(store_dir: Path, as_json: bool) -> None:
    """Check that the store's file is whole and every record decodes.

    Opens the store read-only (beside a live node too), checks its pages,
    decodes every entry of every database, and lists the values recovery
    quarantined. Exit 0 when every record decodes, 65 when some do not
    (each named), 74 when the file itself is damaged.
    """
    try:
        with Store(store_dir, readonly=True, walk=True) as opened:
            found = verify_store(opened)
    except (SessionTreeError, OSError) as exc:
        raise _fail(exc) from exc
    if as_json:
        echo(json.dumps(found.to_json(), sort_keys=True))
    else:
        _print_verified(found)
    if not found.clean:
        bad = sum(found.unreadable.values())
        echo(f"Error: {plural(bad, 'record')} of {found.path} do not decode", err=True)
        raise click.exceptions.Exit(EXIT_RECORDS_UNREADABLE)


def _print_verified(found: Verified) -> None:
    total = sum(found.entries.values())
    echo(f"store {found.path}: {plural(total, 'entry', 'entries')}")
    for db, n in found.entries.items():
        bad = found.unreadable.get(db, 0)
        note = f", {bad} unreadable" if bad else ""
        note += ", not decoded (no record type here)" if db in found.unchecked else ""
        echo(f"  {db}: {n}{note}")
    for problem in found.problems:
        echo(shown(f"  unreadable {problem.db} {problem.key}: {problem.reason}"))
    echo(f"quarantined: {len(found.quarantined)}")
    for item in found.quarantined:
        echo(shown(f"  {item.db} {item.key.hex()}: {item.reason}"))
    echo("clean" if found.clean else "NOT clean: some records do not decode")
