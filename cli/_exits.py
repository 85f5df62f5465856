"""The exit codes the commands share beyond click's (0 ok, 1 failure, 2 usage).

* 69: ``--node`` cannot be reached (``_client``).
* 74: the store's file is damaged (``StoreDamagedError``: truncated, a bad
  meta or data page, empty or missing where data was committed).
* 65: ``store verify`` found records that do not decode.
"""

from __future__ import annotations

import click

from sessiontree.protocol import StoreDamagedError

__all__ = ["EXIT_RECORDS_UNREADABLE", "EXIT_STORE_DAMAGED", "StoreDamagedExit", "failure"]

EXIT_STORE_DAMAGED = 74  # sysexits' EX_IOERR
EXIT_RECORDS_UNREADABLE = 65  # sysexits' EX_DATAERR


class StoreDamagedExit(click.ClickException):
    """A damaged store: one line on stderr, exit ``EXIT_STORE_DAMAGED``."""

    exit_code = EXIT_STORE_DAMAGED


def failure(exc: BaseException | str, prefix: str = "") -> click.ClickException:
    """``exc`` as one line on stderr (``prefix`` before it): exit 74 for a damaged
    store, 1 otherwise."""
    text = prefix + (" ".join(str(exc).split()) or type(exc).__name__)
    if isinstance(exc, StoreDamagedError):
        return StoreDamagedExit(text)
    return click.ClickException(text)
