"""``sessiontree demo``: the example application of ``sessiontree.cli.demo`` run on a
terminal (the tree as it evolves, then its figures) or as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from sessiontree.cli._render import EventPrinter, render_rejections, render_summary, render_tree
from sessiontree.cli._text import echo
from sessiontree.cli._words import money, plural
from sessiontree.cli.demo import (
    DEMO_GRACE,
    REAL_MODEL_GRACE,
    DemoError,
    DemoReport,
    run_demo,
    usage_of,
)

__all__ = ["demo"]


@click.command("demo")
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
            f"Store {stored['path']}: {plural(stored['sessions'], 'session record')}, "
            f"{plural(stored['results_filed'], 'result')} filed on their parents, "
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


def _figure(plain: Mapping[str, Any] | None, priced: bool, *, aligned: bool = True) -> str:
    usage = usage_of(plain)
    calls, tokens = plural(usage.calls, "call"), plural(usage.tokens, "token")
    text = f"{calls:>8}, {tokens:>11}" if aligned else f"{calls}, {tokens}"
    if priced:
        text += f", {money(usage.cost)}"
    elif usage.unpriced_calls:
        text += f" (unpriced: {usage.unpriced_calls})"
    return text


def render_models(figures: Mapping[str, Any]) -> list[str]:
    """The ``Model calls`` section of the demo's printed output."""
    priced = bool(figures["stand_in"])
    models = ", ".join(f"{tier} -> {name}" for tier, name in figures["models"].items())
    where = "a local stand-in" if figures["stand_in"] else "the endpoint"
    lines = [f"on {where} at {figures['endpoint']} ({models})"]
    roll = figures["roll_up"]
    if roll is not None:
        lines.append(f'usage rolls up: branch "{roll["task"]}" and its workers')
        lines.append(f"  {'its own call':<40} {_figure(roll['own'], priced)}")
        for child in roll["children"]:
            label = f'worker "{child["task"]}"'
            note = "  (failed: still counted)" if child["state"] == "failed" else ""
            lines.append(f"  {label:<40} {_figure(child['usage'], priced)}{note}")
        lines.append(f"  {'= its subtree usage':<40} {_figure(roll['subtree'], priced)}")
    spent = figures["budget"]
    if spent is not None:
        bound = ", ".join(f"{k} {v}" for k, v in spent["budget"].items())
        lines.append(
            f'a budget is hit: branch "{spent["task"]}" ({bound}) fans out to '
            f"{plural(spent['workers'], 'worker')}"
        )
        lines.append(
            f"  {plural(spent['calls_sent'], 'call')} sent, {spent['calls_refused']} refused "
            "before sending; the subtree was cancelled with the grace"
        )
        lines.append(
            f"  it ended {spent['state']} [{spent['code']}], keeping "
            f"{plural(spent['partial_results'], 'partial result')}; its subtree: "
            f"{_figure(spent['subtree'], priced, aligned=False)}"
        )
        if spent["summary"]:
            lines.append(f"  its result: {spent['summary']}")
    events = figures["events"]
    lines.append(
        f"events: {events.get('budget_warning', 0)} budget_warning, "
        f"{events.get('budget_exhausted', 0)} budget_exhausted"
    )
    total = _figure(figures["usage"], priced, aligned=False)
    lines.append(f"the whole tree (durable in the store): {total}")
    served = figures["served"]
    if served is not None:
        same = "the same" if _same(figures["usage"], served) else "NOT the same"
        lines.append(
            f"the stand-in served {plural(served['calls'], 'call')}, "
            f"{plural(served['tokens'], 'token')}: {same}"
        )
    return lines


def _same(usage: Mapping[str, Any] | None, served: Mapping[str, int]) -> bool:
    counted = usage_of(usage)
    return (
        counted.calls == served["calls"]
        and counted.prompt_tokens == served["prompt_tokens"]
        and counted.completion_tokens == served["completion_tokens"]
    )
