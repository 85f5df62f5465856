"""The ``sessiontree`` command: a click group and its commands.

The library never configures logging; this module does, for the command
line only: log records go to stderr, so stdout carries nothing but the
command's own output (``--json`` documents stay parseable).

Every option can also come from an environment variable named by click's
automatic prefix, ``SESSIONTREE_<COMMAND>_<OPTION>``, except ``--node`` and a
read command's ``--store``, which read ``SESSIONTREE_NODE`` and
``SESSIONTREE_STORE`` (resolved by ``_client.resolve_source``: a flag, then
the environment, then the node at http://127.0.0.1:8470). Exit codes, for
every command: 0 ok, 1 failure, 2 usage, 69 node unreachable, 74 the
store's file is damaged (65: ``store verify`` found records that do not
decode).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from sessiontree.cli._conv_cmds import conv
from sessiontree.cli._demo import (
    DEMO_GRACE,
    REAL_MODEL_GRACE,
    DemoError,
    DemoReport,
    run_demo,
)
from sessiontree.cli._demo_models import render_models
from sessiontree.cli._events_cmds import events_cmd
from sessiontree.cli._node_cmds import node
from sessiontree.cli._recovery_cmds import recovery, wedged
from sessiontree.cli._render import EventPrinter, render_rejections, render_summary, render_tree
from sessiontree.cli._replay_cmds import replay_cmd
from sessiontree.cli._session_cmds import sessions
from sessiontree.cli._store_cmds import export_cmd, import_cmd, store
from sessiontree.cli._text import SafeFormatter, echo, terminal_safe
from sessiontree.cli._token import TOKEN_META
from sessiontree.cli._top import top
from sessiontree.supervision import TraceIds

__all__ = ["configure_logging", "main"]

_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)
_LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s%(trace)s"


def configure_logging(verbosity: int) -> None:
    """Send log records to stderr: warnings by default, ``-v`` info, ``-vv`` debug;
    a record made inside a span (a skill's, on a traced node) ends with its ids.
    Control characters a record quotes (a task, a message) are escaped."""
    level = _LEVELS[min(max(verbosity, 0), len(_LEVELS) - 1)]
    logging.basicConfig(stream=sys.stderr, level=level, format=_LOG_FORMAT, force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(TraceIds())
        handler.setFormatter(SafeFormatter(_LOG_FORMAT))


class _SafeGroup(click.Group):
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


@click.group(
    cls=_SafeGroup,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "SESSIONTREE"},
    epilog="Exit codes: 0 ok, 1 failure, 2 usage, 69 node unreachable, 74 store file "
    "damaged, 65 records that do not decode (store verify). Shell completion: "
    'eval "$(_SESSIONTREE_COMPLETE=bash_source sessiontree)" (zsh_source, fish_source).',
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
    configure_logging(verbose)
    ctx.meta[TOKEN_META] = token_file


@main.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print only the final sessions, refused spawns and model figures as JSON on stdout "
    "(logs: stderr).",
)
@click.option(
    "--store",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=(
        "Directory of the node's LMDB store (created if missing; each run adds a Main of "
        "its own). Without it the demo uses a temporary directory, removed afterwards."
    ),
)
@click.option(
    "--model-url",
    default=None,
    metavar="URL",
    help="Run the model calls on this OpenAI-compatible endpoint (ending before "
    "/chat/completions, e.g. http://127.0.0.1:8000/v1) instead of the local stand-in. "
    f"The grace becomes {REAL_MODEL_GRACE:g} s, so replies in flight can land.",
)
@click.option(
    "--model",
    default=None,
    metavar="NAME",
    help="The model every tier calls at --model-url.",
)
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the API key of --model-url (none: the endpoint needs no key).",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    metavar="URL",
    help="Export the demo's spans to this OTLP/HTTP traces URL (e.g. Phoenix's "
    "http://127.0.0.1:6006/v1/traces; needs the otlp extra).",
)
def demo(
    as_json: bool,
    store: Path | None,
    model_url: str | None,
    model: str | None,
    api_key_file: Path | None,
    otlp_endpoint: str | None,
) -> None:
    """Run a fixed, deterministic scenario on simulated skills and a model (a few seconds).

    A Main fans a research task out to branches and workers: a worker crashes,
    a branch overruns its TTL, spawns past the depth and children limits are
    refused, and a branch completes while two workers still run: one wraps up
    within the grace, the other is terminated by force. Workers and branches
    call a chat model (a local stand-in the demo starts, offline and
    deterministic, or --model-url): usage rolls up through a branch and its
    workers, and a fan-out under a budget of 3 calls for 5 workers has 2 calls
    refused before they are sent and its subtree cancelled with the grace,
    keeping the partial results. Prints the tree as it evolves, then the final
    tree, the refused spawns and the model figures.
    """
    if model_url is None and (model is not None or api_key_file is not None):
        raise click.UsageError("--model and --api-key-file go with --model-url")
    if model_url is not None and not model:
        raise click.UsageError("--model-url needs --model NAME (the model to call there)")
    options = {
        "model_url": model_url,
        "model": model,
        "api_key_file": api_key_file,
        "otlp_endpoint": otlp_endpoint,
    }
    if as_json:
        report = _run(store, None, options)
        echo(json.dumps(report.to_json(), indent=2))
        return
    where = "a local stand-in model" if model_url is None else f"the model {model} at {model_url}"
    grace = DEMO_GRACE if model_url is None else REAL_MODEL_GRACE
    echo(
        f"sessiontree demo: a research task on simulated skills and {where} "
        f"(real clock, grace {grace:g} s)\n"
    )
    report = _run(store, EventPrinter(echo), options)
    echo("\nFinal tree:")
    for line in render_tree(report.sessions):
        echo(f"  {line}")
    echo("\nRefused spawns:")
    for line in render_rejections(report.rejections, report.sessions):
        echo(f"  {line}")
    echo("\nModel calls:")
    for line in render_models(report.models):
        echo(f"  {line}")
    refused_late = report.stats.get("refused_after_fence", 0)
    if refused_late:
        echo(f"\nLate calls refused from fenced sessions (terminated or expired): {refused_late}")
    echo(f"\n{render_summary(report.sessions, report.rejections)}")
    stored = report.store
    if stored:
        echo(
            f"Store {stored['path']}: {stored['sessions']} session records, "
            f"{stored['results_filed']} results filed on their parents, "
            f"{stored['results_owed']} still owed."
        )
    echo(f"Finished in {report.elapsed:.2f} s.")


def _run(store: Path | None, printer: EventPrinter | None, options: dict[str, Any]) -> DemoReport:
    try:
        return run_demo(store=store, on_event=printer, **options)
    except DemoError as exc:
        raise click.ClickException(str(exc)) from exc
    except ValueError as exc:  # a bad endpoint URL or key file
        raise click.ClickException(f"the model endpoint cannot be used: {exc}") from exc


main.add_command(export_cmd)
main.add_command(import_cmd)
main.add_command(conv)
main.add_command(node)
main.add_command(sessions)
main.add_command(store)
main.add_command(top)
main.add_command(wedged)
main.add_command(recovery)
main.add_command(replay_cmd)
main.add_command(events_cmd)
