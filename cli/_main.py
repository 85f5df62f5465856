"""The ``sessiontree`` command: a click group and its commands.

The library never configures logging; this module does, for the command
line only: log records go to stderr, so stdout carries nothing but the
command's own output (``--json`` documents stay parseable).

Every option can also come from an environment variable named by click's
automatic prefix, ``SESSIONTREE_<COMMAND>_<OPTION>``, except ``--node`` and a
read command's ``--store``, which read ``SESSIONTREE_NODE`` and
``SESSIONTREE_STORE`` (resolved by ``_client.resolve_source``: a flag, then
the environment, then the node at http://127.0.0.1:8470). Exit codes, for
every command: 0 ok, 1 failure, 2 usage (and a command whose extra is not
installed), 69 node unreachable, 74 the store's file is damaged (65:
``store verify`` found records that do not decode).

Each command's module is imported only when that command runs (``_lazy``):
``--version``, ``--help`` and the read commands against a node load click
and httpx, not the runtime.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from sessiontree.cli._lazy import Lazy, LazyGroup, remember_logging
from sessiontree.cli._text import SafeFormatter, terminal_safe
from sessiontree.cli._token import TOKEN_META

__all__ = ["configure_logging", "main"]

_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)
_LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s%(trace)s"
_CLI = "sessiontree.cli."


class _TraceIds(logging.Filter):
    """``supervision.TraceIds``, imported with the runtime by the first record it
    sees: a command that logs nothing never loads the runtime for it."""

    def __init__(self) -> None:
        super().__init__()
        self._inner: logging.Filter | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self._inner is None:
            from sessiontree.supervision import TraceIds  # noqa: PLC0415 - see the class

            self._inner = TraceIds()
        return bool(self._inner.filter(record))


def configure_logging(verbosity: int) -> None:
    """Send log records to stderr: warnings by default, ``-v`` info, ``-vv`` debug;
    a record made inside a span (a skill's, on a traced node) ends with its ids.
    Control characters a record quotes (a task, a message) are escaped."""
    level = _LEVELS[min(max(verbosity, 0), len(_LEVELS) - 1)]
    logging.basicConfig(stream=sys.stderr, level=level, format=_LOG_FORMAT, force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_TraceIds())
        handler.setFormatter(SafeFormatter(_LOG_FORMAT))


class _SafeGroup(LazyGroup):
    """The root group: a command's failure (``Error: …`` on stderr) is printed
    with its control characters escaped, newlines kept, since its message may
    quote what a node or a store holds."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            # click's stubs call message Final; it is a plain attribute, read by show()
            exc.message = terminal_safe(exc.message)  # type: ignore[misc]
            raise


#: Every command, by the module that defines it and its one line of help (so
#: ``--help`` imports none of them; tests/test_cli_lazy.py checks the lines
#: against the commands' own).
COMMANDS = {
    "conv": Lazy(
        f"{_CLI}commands._conv:conv",
        "A session's conversation tree: branches, context, fork, checkout, merge, delete.",
    ),
    "demo": Lazy(
        f"{_CLI}commands._demo:demo",
        "Run a fixed, deterministic scenario on simulated skills and a model (a few seconds).",
    ),
    "events": Lazy(
        f"{_CLI}commands._events:events_cmd",
        "Print a node's events: what its ring holds now, or (--follow) as they come.",
    ),
    "export": Lazy(
        f"{_CLI}commands._store:export_cmd",
        "Write the store as canonical JSONL: one JSON object a line.",
    ),
    "import": Lazy(
        f"{_CLI}commands._store:import_cmd",
        "Restore a store from FILE, an export ('-' reads stdin).",
    ),
    "recovery": Lazy(
        f"{_CLI}commands._recovery:recovery",
        "What recovery decided at the node's start; release a held replay.",
    ),
    "replay": Lazy(
        f"{_CLI}commands._replay:replay_cmd",
        "Replay a recorded run (or list the store's recordings, or export one).",
    ),
    "sessions": Lazy(
        f"{_CLI}commands._sessions:sessions",
        "List, inspect, draw, spawn, message, cancel, terminate, suspend, resume and wait "
        "on sessions.",
    ),
    "standin": Lazy(
        f"{_CLI}commands._standin:standin",
        "Run the stand-in chat model (an OpenAI-compatible chat-completions server) on "
        "127.0.0.1 until SIGINT or SIGTERM.",
    ),
    "store": Lazy(
        f"{_CLI}commands._store:store", "Back a store up, verify it, export it and import it."
    ),
    "top": Lazy(
        f"{_CLI}commands._top:top",
        "A live view of a node: its session tree (kind, state, age, TTL left, tokens and "
        "cost), its figures and its rates of spawns, endings and failures.",
    ),
    "wedged": Lazy(
        f"{_CLI}commands._recovery:wedged",
        "Work recovery held back: list, inspect, requeue or drop it.",
    ),
}


@click.group(
    cls=_SafeGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SESSIONTREE"},
    epilog="Exit codes: 0 ok, 1 failure, 2 usage (or a command whose extra is not "
    "installed), 69 node unreachable, 74 store file damaged, 65 records that do not "
    "decode (store verify). -v and --token-file may also follow the command. Shell "
    'completion: eval "$(_SESSIONTREE_COMPLETE=bash_source sessiontree)" (zsh_source, '
    "fish_source).",
)
@click.version_option(package_name="sessiontree", prog_name="sessiontree")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the bearer token of the node a command talks to "
    "(env SESSIONTREE_TOKEN_FILE).",
)
@click.pass_context
def main(ctx: click.Context, verbose: int, token_file: Path | None) -> None:
    """sessiontree: a supervision runtime for AI-agent session trees."""
    remember_logging(ctx, verbose, configure_logging)
    ctx.meta[TOKEN_META] = token_file


@main.group(
    "node",
    cls=LazyGroup,
    lazy={
        "start": Lazy(
            f"{_CLI}commands._node:start",
            "Run a node: the runtime on an LMDB store, its HTTP API and /metrics.",
            extra="node",
        ),
        "status": Lazy(
            f"{_CLI}commands._node_status:status",
            "A node's state, sessions by state, counters and store (from a node or a store).",
        ),
    },
)
def node() -> None:
    """Run a standalone node, or look at one."""
