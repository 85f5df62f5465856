"""``sessiontree node start|status``: a standalone node, and a look at one.

``node start`` runs the runtime on an LMDB store with its HTTP API and
``/metrics`` on one port. Settings come from, weakest first: the defaults,
the config file (TOML: ``store``, ``host``, ``port``, ``agents``, ``name``,
``max_body``, ``max_wait``, ``event_ring`` and the model provider's ``model_url``,
``model``, ``api_key_file``, ``model_price`` at the top, ``NodeConfig``
fields in a ``[node]`` table), environment variables
(``SESSIONTREE_NODE_START_<OPTION>``, click's automatic names) and flags.
Memory pressure is watched out of the box (the built-in probe: the cgroup's
memory limit, else the machine's memory); ``--memory-high`` and
``--memory-low`` (``memory_high``/``memory_low`` in ``[node]``) set its marks,
``--no-memory-probe`` (``memory_probe = false``) turns it off.
The effective settings are printed as one JSON line on stdout at start
(a provider's key never), followed by ``listening on URL``.

``--model-url`` makes an OpenAI-compatible endpoint the node's model
provider (its key read from ``--api-key-file`` at start); ``--model`` is
the model every agent that maps no tier to a model of its own calls (the
built-in assistant among them), and ``--model-price`` its price.

The node owns its signals (uvicorn's handlers would re-raise them and exit
143): the first SIGTERM or SIGINT stops accepting connections and shuts the
node down as DESIGN.md §3 says (Mains kept, running Branches suspended so
they resume after a restart, Workers cancelled with the grace and their
parents told), flushes the store and exits 0; a second signal cuts the grace
short (what still runs is forced), flushes and exits 1.

Exit codes: 0 a clean stop; 1 the node could not start (the store is held by
another node, the agents cannot be loaded, the port is taken) or was forced;
2 a usage error (a bad flag, config file or setting); 69 ``status`` found no
node at ``--node``; 74 the store's file is damaged (``start``, ``status
--store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import signal
import socket
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import uvicorn

from sessiontree.actors import ACTOR_TYPES
from sessiontree.actors.backends import BACKENDS
from sessiontree.cli._agents import BUILTIN, AgentLoadError, load_agents, with_model
from sessiontree.cli._api import EVENT_RING, MAX_BODY_BYTES, MAX_WAIT, create_app
from sessiontree.cli._client import DEFAULT_PORT, NODE_OPTION, STORE_OPTION, resolve_source
from sessiontree.cli._exits import failure
from sessiontree.cli._token import is_loopback, read_token
from sessiontree.cli._wire import plain_figures, settings_of
from sessiontree.protocol import SessionTreeError, StoreLockedError
from sessiontree.store import Store
from sessiontree.supervision import (
    DISPATCHES,
    Agent,
    Node,
    NodeConfig,
    NodeMetrics,
    Price,
    Provider,
    Tracing,
)

__all__ = ["node"]

log = logging.getLogger("sessiontree.cli.node")

_MODEL = ("model_url", "model", "api_key_file", "model_price")
_TOP = {"store", "host", "port", "agents", "name", "max_body", "max_wait", "event_ring", *_MODEL}
_NODE_FLAGS = (
    "grace",
    "max_sessions",
    "max_step_threads",
    "max_running_skills",
    "actor_type",
    "dispatch",
    "dispatcher_threads",
    "passivate_after",
    "backend",
    "process_workers",
    "ray_address",
    "ray_actors",
    "gc_tuning",
    "memory_high",
    "memory_low",
    "memory_probe",
)


@click.group("node")
def node() -> None:
    """Run a standalone node, or look at one."""


def _read_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        with path.open("rb") as file:
            raw = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--config") from None
    unknown = sorted(set(raw) - _TOP - {"node"})
    if unknown:
        msg = f"{path}: unknown setting {unknown[0]!r} (known: {sorted(_TOP | {'node'})})"
        raise click.BadParameter(msg, param_hint="--config")
    if not isinstance(raw.get("node", {}), dict):
        raise click.BadParameter(f"{path}: [node] must be a table", param_hint="--config")
    return raw


def _effective(ctx: click.Context, file: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge defaults < file < environment < flags; also say where each came from."""
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    fields = {f.name for f in dataclasses.fields(NodeConfig)}
    node_table: dict[str, Any] = dict(file.get("node", {}))
    unknown = sorted(set(node_table) - fields)
    if unknown:
        msg = f"unknown [node] setting {unknown[0]!r}"
        raise click.BadParameter(msg, param_hint="--config")
    for name in (*_TOP, *_NODE_FLAGS):
        source = ctx.get_parameter_source(name)
        value = ctx.params[name]
        explicit = source in (
            click.core.ParameterSource.COMMANDLINE,
            click.core.ParameterSource.ENVIRONMENT,
        )
        in_file = name in file if name in _TOP else name in node_table
        if explicit or not in_file:
            if value is None and name in _NODE_FLAGS:
                continue
            where = (
                "flag"
                if source is click.core.ParameterSource.COMMANDLINE
                else ("env" if source is click.core.ParameterSource.ENVIRONMENT else "default")
            )
        else:
            value = _checked(ctx, name, file[name] if name in _TOP else node_table[name])
            where = "file"
        if name in _NODE_FLAGS:
            node_table[name] = value
        else:
            settings[name] = value
        sources[name] = where
    for name in node_table:
        sources.setdefault(name, "file")
    settings["node"] = node_table
    return settings, sources


def _checked(ctx: click.Context, name: str, value: Any) -> Any:
    """A config-file value checked and converted by its flag's own type, so a
    bad one is the same usage error (exit 2) as a bad flag."""
    param = next(p for p in ctx.command.params if p.name == name)
    try:
        return param.type_cast_value(ctx, value)
    except click.BadParameter as exc:
        msg = f"config file: {name} = {value!r}: {exc.message}"
        raise click.BadParameter(msg, param_hint="--config") from None


def _node_config(table: dict[str, Any]) -> NodeConfig:
    try:
        return NodeConfig(**table)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="[node] / --config") from None


def _price(text: str) -> Price:
    """``--model-price PROMPT,COMPLETION`` (per million tokens) as a per-token ``Price``."""
    parts = text.split(",")
    try:
        prompt, completion = (float(part) for part in parts)
    except ValueError:
        msg = f"{text!r} must be PROMPT,COMPLETION: two numbers, per million tokens"
        raise click.BadParameter(msg, param_hint="--model-price") from None
    if not all(math.isfinite(v) and v >= 0 for v in (prompt, completion)):
        msg = f"{text!r}: prices must be finite numbers >= 0"
        raise click.BadParameter(msg, param_hint="--model-price")
    return Price(prompt=prompt / 1e6, completion=completion / 1e6)


def _tracing(params: dict[str, Any], table: Any, name: str) -> Tracing | None:
    """``NodeConfig.tracing`` from the flags over the config file's ``[node.tracing]``
    table (None: no endpoint, not traced); a bad value is a usage error."""
    settings = dict(table) if isinstance(table, dict) else {}
    if table is not None and not isinstance(table, dict):
        raise click.BadParameter("[node] tracing must be a table", param_hint="--config")
    if params["otlp_endpoint"] is not None:
        settings["endpoint"] = params["otlp_endpoint"]
    headers = dict(settings.get("headers", {}))
    for header in params["otlp_header"]:
        key, sep, value = header.partition("=")
        if not sep or not key.strip():
            msg = f"{header!r} is not NAME=VALUE"
            raise click.BadParameter(msg, param_hint="--otlp-header")
        headers[key.strip()] = value.strip()
    if headers:
        settings["headers"] = headers
    if params["trace_sampling"] is not None:
        settings["sampling_ratio"] = params["trace_sampling"]
    if params["service_name"] is not None:
        settings["service_name"] = params["service_name"]
    if params["trace_content"]:
        settings["capture_content"] = True
    if settings.get("endpoint") is None:
        if len(settings) > 0:
            raise click.UsageError("tracing settings need an endpoint (--otlp-endpoint URL)")
        return None
    settings.setdefault("service_name", name)
    try:
        return Tracing(**settings)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--otlp-endpoint") from None


def _provider(settings: dict[str, Any]) -> Provider | None:
    """The model provider ``--model-url`` and its companions describe (None
    without ``--model-url``); a companion without it is a usage error."""
    url, model = settings["model_url"], settings["model"]
    if url is None:
        given = [name for name in _MODEL[1:] if settings[name] is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise click.UsageError(f"{flag} goes with --model-url (the provider it belongs to)")
        return None
    price = settings["model_price"]
    if price is not None and model is None:
        raise click.UsageError("--model-price prices --model; give --model NAME too")
    prices = {} if price is None else {str(model): _price(str(price))}
    try:
        return Provider(base_url=url, api_key_file=settings["api_key_file"], prices=prices)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--model-url") from None


def _agents(settings: dict[str, Any]) -> list[Agent]:
    try:
        agents = load_agents(str(settings["agents"]))
    except AgentLoadError as exc:
        raise click.ClickException(str(exc)) from None
    if settings["model"] is not None:
        agents = with_model(agents, str(settings["model"]))
    return agents


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the node owns SIGTERM/SIGINT.

    Once the node is down the server stops with ``force_exit`` (open
    long-polls are not waited for), which makes uvicorn skip the app's
    lifespan shutdown and cancel it instead, logging an ERROR with a
    ``CancelledError`` traceback; the lifespan is shut down here as well."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        lifespan = getattr(self, "lifespan", None)
        if self.force_exit and lifespan is not None:
            await lifespan.shutdown()


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket. Its protocol is IPPROTO_TCP explicitly: asyncio
    turns Nagle's algorithm off (TCP_NODELAY) only on sockets that say so, and
    with it on, each small response waits for a delayed ACK (about 40 ms)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        msg = f"cannot listen on {host}:{port}: {exc}"
        raise click.ClickException(msg) from None
    return sock


async def _serve(
    server: _Server, sock: socket.socket, running: Node, early: list[int], signals: list[int]
) -> int:
    """Serve until a signal; then stop accepting, shut the node down, flush.

    Returns the exit code: 0 after a graceful stop, 1 when a second signal
    forced it or the server stopped by itself (it failed to start). The
    signals that arrived are appended to ``signals``.
    """
    loop = asyncio.get_running_loop()
    shutdown: asyncio.Future[None] | None = None

    def stopped(_: object) -> None:
        server.force_exit = True  # the node is down: open long-polls need not be waited for

    def on_signal(signum: int) -> None:
        nonlocal shutdown
        signals.append(signum)
        if len(signals) == 1:
            log.warning("%s: stopping (a second signal forces)", signal.Signals(signum).name)
            server.should_exit = True
            shutdown = loop.run_in_executor(None, running.shutdown)
            shutdown.add_done_callback(stopped)
        else:
            log.warning("%s again: forcing the shutdown", signal.Signals(signum).name)
            server.force_exit = True
            loop.run_in_executor(None, running.force_shutdown)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    for early_signal in early:  # arrived while the node was starting
        on_signal(early_signal)
    try:
        await server.serve(sockets=[sock])
        if shutdown is None:  # the server stopped by itself: it could not start
            log.error("the HTTP server stopped by itself; shutting the node down")
            await loop.run_in_executor(None, running.shutdown)
            return 1
        await shutdown
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 1 if len(signals) > 1 else 0


@node.command("start")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A TOML file of settings (flags and environment variables override it).",
)
@click.option(
    "--store",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The LMDB store directory (created if missing). Required here or in --config.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port for the API and /metrics (0: any free port, printed at start).",
)
@click.option(
    "--agents",
    default=BUILTIN,
    show_default=True,
    metavar="MODULE:OBJECT",
    help="The agents to run: an Agent, a list of them, or a callable returning either.",
)
@click.option("--name", default="sessiontree", show_default=True, help="The node's name.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the bearer token every request but /healthz and /readyz must carry "
    "(required to listen on an address other than loopback).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary at the stop as one JSON object on stdout.",
)
@click.option(
    "--max-body",
    type=click.IntRange(1024),
    default=MAX_BODY_BYTES,
    show_default=True,
    help="Request body cap in bytes (413 past it).",
)
@click.option(
    "--max-wait",
    type=click.FloatRange(0.0, MAX_WAIT),
    default=60.0,
    show_default=True,
    help="The longest a result long-poll waits, in seconds.",
)
@click.option(
    "--event-ring",
    type=click.IntRange(1),
    default=EVENT_RING,
    show_default=True,
    help="Recent events GET /v1/events keeps for a client resuming with Last-Event-ID.",
)
@click.option(
    "--model-url",
    default=None,
    metavar="URL",
    help="An OpenAI-compatible endpoint as the node's model provider, ending before "
    "/chat/completions (e.g. http://127.0.0.1:8000/v1).",
)
@click.option(
    "--model",
    default=None,
    metavar="NAME",
    help="The model every agent that maps no tier to a model calls at --model-url "
    "(the built-in assistant's chat and model skills).",
)
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A file holding the API key of --model-url, read at start (none: no key needed).",
)
@click.option(
    "--model-price",
    default=None,
    metavar="PROMPT,COMPLETION",
    help="What a million prompt and completion tokens of --model cost (for usage and cost "
    "budgets; none: its calls are counted as unpriced).",
)
@click.option("--grace", type=click.FloatRange(0.0), default=None, help="NodeConfig.grace (s).")
@click.option(
    "--max-sessions", type=click.IntRange(1), default=None, help="NodeConfig.max_sessions."
)
@click.option(
    "--max-step-threads", type=click.IntRange(1), default=None, help="NodeConfig.max_step_threads."
)
@click.option(
    "--max-running-skills",
    type=click.IntRange(1),
    default=None,
    help="NodeConfig.max_running_skills.",
)
@click.option(
    "--actor-type",
    type=click.Choice(sorted(ACTOR_TYPES)),
    default=None,
    help="NodeConfig.actor_type: pooled mailboxes (default) or a thread per session.",
)
@click.option(
    "--dispatch",
    type=click.Choice(DISPATCHES),
    default=None,
    help="NodeConfig.dispatch: pooled actors on the event loop (default) or on threads.",
)
@click.option(
    "--dispatcher-threads",
    type=click.IntRange(1),
    default=None,
    help="NodeConfig.dispatcher_threads: the pool serving pooled actors (--dispatch threads).",
)
@click.option(
    "--passivate-after",
    type=click.FloatRange(0.0, min_open=True),
    default=None,
    help="NodeConfig.passivate_after (s): an idle Main is written out and its actor stopped.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="NodeConfig.backend: where workers' skills run (inline, process, ray).",
)
@click.option(
    "--process-workers",
    type=click.IntRange(1),
    default=None,
    help="NodeConfig.process_workers: worker processes of the process backend (one per CPU).",
)
@click.option(
    "--ray-address",
    default=None,
    help="NodeConfig.ray_address: the Ray cluster to join (none: start a local one).",
)
@click.option(
    "--ray-actors",
    type=click.IntRange(1),
    default=None,
    help="NodeConfig.ray_actors: pooled Ray actors of the ray backend.",
)
@click.option(
    "--gc-tuning/--no-gc-tuning",
    default=True,
    help="NodeConfig.gc_tuning: collector thresholds for many sessions (on for a node).",
)
@click.option(
    "--memory-high",
    type=click.FloatRange(0.0, 1.0, min_open=True),
    default=None,
    help="NodeConfig.memory_high: memory use (a fraction) at which branches are suspended "
    "[default: 0.9].",
)
@click.option(
    "--memory-low",
    type=click.FloatRange(0.0, 1.0, min_open=True),
    default=None,
    help="NodeConfig.memory_low: memory use below which branches suspended by memory "
    "pressure resume [default: 0.8].",
)
@click.option(
    "--memory-probe/--no-memory-probe",
    default=True,
    help="NodeConfig.memory_probe: watch memory with the built-in probe (the cgroup's limit, "
    "else the machine's memory).",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    metavar="URL",
    help="Export every session run, Main cycle and model call as OpenTelemetry spans to this "
    "OTLP/HTTP traces URL (e.g. http://127.0.0.1:4318/v1/traces; needs the otlp extra).",
)
@click.option(
    "--otlp-header",
    multiple=True,
    metavar="NAME=VALUE",
    help="A header every span export carries (an API key); repeat for more.",
)
@click.option(
    "--trace-sampling",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="The share of traces exported, each kept or dropped whole [default: 1.0].",
)
@click.option(
    "--service-name",
    default=None,
    help="The service.name the spans carry, also their Phoenix project "
    "(openinference.project.name) [default: the node's --name].",
)
@click.option(
    "--trace-content",
    is_flag=True,
    help="Model-call spans also carry the prompt and the reply (off: they may hold what "
    "users said).",
)
@click.pass_context
def start(ctx: click.Context, /, config_file: Path | None, **_: Any) -> None:
    """Run a node: the runtime on an LMDB store, its HTTP API and /metrics."""
    early: list[int] = []  # signals before the loop owns them: acted on once it does
    previous = {
        signum: signal.signal(signum, lambda signum, _: early.append(signum))
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        code = _start(ctx, config_file, early)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    ctx.exit(code)


def _start(ctx: click.Context, config_file: Path | None, early: list[int]) -> int:
    settings, sources = _effective(ctx, _read_config(config_file))
    if settings["store"] is None:
        raise click.UsageError("give --store DIR (or `store` in --config)")
    token = read_token(ctx.params["token_file"])
    if token is None and not is_loopback(str(settings["host"])):
        msg = (
            f"--host {settings['host']} is not a loopback address: give --token-file PATH "
            "so the API is not open to anyone who can reach it"
        )
        raise click.UsageError(msg)
    provider = _provider(settings)
    table = dict(settings["node"])
    if provider is not None:
        table["providers"] = (provider,)
    tracing = _tracing(ctx.params, table.pop("tracing", None), str(settings["name"]))
    config = dataclasses.replace(_node_config(table), tracing=tracing)
    agents = _agents(settings)
    try:
        running = Node(agents, config, store=Path(settings["store"]))
    except StoreLockedError as exc:
        msg = f"store {settings['store']} is held by another node: {exc}"
        raise click.ClickException(msg) from None
    except (SessionTreeError, OSError, ValueError) as exc:  # ValueError: a key file, a model
        raise failure(exc, "the node could not start: ") from None
    try:
        sock = _bind(str(settings["host"]), int(settings["port"]))
    except click.ClickException:
        running.shutdown(grace=0)
        raise
    metrics = NodeMetrics(running)
    app = create_app(
        running,
        metrics,
        name=str(settings["name"]),
        max_body=int(settings["max_body"]),
        max_wait=float(settings["max_wait"]),
        event_ring=int(settings["event_ring"]),
        token=token,
    )
    server = _Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=int(config.grace) + 5,
        )
    )
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    shown = {**settings, "store": str(settings["store"]), "node": settings_of(config)}
    click.echo(json.dumps({"effective_config": shown, "sources": sources}, sort_keys=True))
    click.echo(f"listening on http://{url_host}:{port} (agents: {', '.join(running.agents)})")
    sys.stdout.flush()
    signals: list[int] = []
    started = time.monotonic()
    try:
        code = asyncio.run(_serve(server, sock, running, early, signals))
    finally:
        metrics.close()
        sock.close()
    final = Counter(info.state.value for info in running.final_sessions)
    summary = {
        "event": "node_stopped",
        "exit_code": code,
        "signal": signal.Signals(signals[0]).name if signals else None,
        "forced": len(signals) > 1,
        "uptime_s": round(time.monotonic() - started, 3),
        "sessions": dict(sorted(final.items())),
    }
    if ctx.params["as_json"]:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        click.echo(stopped_line(summary), err=True)
    return code


def stopped_line(summary: dict[str, Any]) -> str:
    """``node stopped (SIGTERM, exit 0) after 12 s: 3 active, 1 cancelled``."""
    why = summary["signal"] or "server stopped"
    if summary["forced"]:
        why += ", forced"
    counts = ", ".join(f"{n} {state}" for state, n in summary["sessions"].items() if n)
    return (
        f"node stopped ({why}, exit {summary['exit_code']}) after "
        f"{summary['uptime_s']:.0f} s: {counts or 'no sessions'}"
    )


@node.command("status")
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
        found = _store_status(source.store_dir)
    if as_json:
        click.echo(json.dumps(found, sort_keys=True))
        return
    click.echo(f"node {found['node']}: {found['state']}")
    if "uptime_s" in found:
        click.echo(f"  up {found['uptime_s']:.0f} s, agents: {', '.join(found['agents'])}")
    for agent, skills in (found.get("skills") or {}).items():
        click.echo(f"  agent {agent}: skills {', '.join(skills)}")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(found["sessions"].items()) if n)
    click.echo(f"  sessions: {counts or 'none'}")
    recovered = found.get("recovery")
    if recovered:
        click.echo(
            f"  recovery: brought back {recovered['brought_back']}, failed {recovered['failed']}, "
            f"held back {recovered['held_back']}, quarantined {recovered['quarantined']}"
        )
    if found.get("replay_held"):
        click.echo(f"  REPLAY HELD: {found['replay_held']} (sessiontree recovery release)")
    if found.get("wedged"):
        click.echo(f"  held back: {found['wedged']} (sessiontree wedged ls)")
    store = found.get("store") or {}
    if store:
        click.echo(
            f"  store {store.get('path')}: {store.get('used_bytes', 0):,} of "
            f"{store.get('map_size', 0):,} bytes used"
        )


def _store_status(store_dir: Path) -> dict[str, Any]:
    try:
        with Store(store_dir, readonly=True) as store:
            by_state: Counter[str] = Counter()
            for record in store.sessions():
                if not isinstance(record, SessionTreeError):
                    by_state[record.info.state.value] += 1
            figures = store.stats()
            wedged = store.count("wedged")
    except (SessionTreeError, OSError) as exc:
        raise failure(exc, f"cannot read store {store_dir}: ") from None
    return {
        "node": str(store_dir),
        "state": "stored",
        "sessions": dict(by_state),
        "store": plain_figures(figures),
        "wedged": wedged,
    }
