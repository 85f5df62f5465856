"""The exit codes the commands share beyond click's (0 ok, 1 failure, 2 usage).

* 69: ``--node`` cannot be reached (``_client``).
* 74: the store is damaged: its file (``StoreDamagedError``: truncated, a bad
  meta or data page, empty or missing where data was committed), or a record
  a command reads does not decode (``CorruptRecordError``).
* 65: ``store verify`` found records that do not decode.
"""

from __future__ import annotations

import click

from sessiontree.protocol import CorruptRecordError, StoreDamagedError

__all__ = [
    "CORRUPT_HINT",
    "EXIT_RECORDS_UNREADABLE",
    "EXIT_STORE_DAMAGED",
    "StoreDamagedExit",
    "failure",
]

EXIT_STORE_DAMAGED = 74  # sysexits' EX_IOERR
EXIT_RECORDS_UNREADABLE = 65  # sysexits' EX_DATAERR

#: What to do about a record that does not decode (the end of its line).
CORRUPT_HINT = (
    "the store holds a damaged record: `sessiontree store verify` lists every one "
    "(see the README's 'Backups and restore')"
)


class StoreDamagedExit(click.ClickException):
    """A damaged store: one line on stderr, exit ``EXIT_STORE_DAMAGED``."""

    exit_code = EXIT_STORE_DAMAGED


def failure(exc: BaseException | str, prefix: str = "") -> click.ClickException:
    """``exc`` as one line on stderr (``prefix`` before it): exit 74 for a damaged
    store file or a record that does not decode, 1 otherwise."""
    text = prefix + (" ".join(str(exc).split()) or type(exc).__name__)
    if isinstance(exc, CorruptRecordError):
        return StoreDamagedExit(f"{text}; {CORRUPT_HINT}")
    if isinstance(exc, StoreDamagedError):
        return StoreDamagedExit(text)
    return click.ClickException(text)
