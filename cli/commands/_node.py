"""``sessiontree node start|status``: a standalone node, and a look at one.

``node start`` runs the runtime on an LMDB store with its HTTP API and
``/metrics`` on one port. Settings come from, weakest first: the defaults,
the config file (TOML: ``store``, ``map_size``, ``host``, ``port``,
``agents``, ``name``, ``max_body``, ``max_wait``, ``event_ring``,
``allowed_hosts`` (a list), the connection bounds ``header_timeout``,
``body_timeout``, ``idle_timeout``, ``max_connections`` and the model
provider's ``model_url``, ``model``, ``api_key_file``, ``model_price`` at the
top, ``NodeConfig`` fields in a ``[node]`` table), environment variables
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

Without ``--token-file`` (a loopback node) every request must name the node
by its address (``Host``) or by a name given with ``--allowed-host``, and a
page of another origin may not change anything (``server._cross_site``); a
request body must be ``application/json`` either way. Each connection is
bounded by the header, body and idle timeouts, and at most
``--max-connections`` are served at once (``server._connections``).

The node owns its signals (uvicorn's handlers would re-raise them and exit
143): the first SIGTERM or SIGINT stops accepting connections and shuts the
node down as the README's Execution model says (Mains kept, running Branches suspended so
they resume after a restart, Workers cancelled with the grace and their
parents told), flushes the store and exits 0; a second signal cuts the grace
short (what still runs is forced), flushes and exits 1. Open event streams
are ended with their ``closed`` message, and what still runs of the HTTP
side is let finish or disconnected before the loop closes (no ERROR).

Exit codes: 0 a clean stop; 1 the node could not start (the store is held by
another node, the port is taken) or was forced; 2 a usage error (a bad flag,
config file or setting, agents that cannot be loaded); 69 ``status`` found no
node at ``--node``; 74 the store's file is damaged (``start``, ``status
--store``). A start that fails leaves no store directory it created.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import uvicorn

from sessiontree.cli._agents import BUILTIN
from sessiontree.cli._client import DEFAULT_PORT
from sessiontree.cli._exits import failure
from sessiontree.cli._fresh import removed_on_failure
from sessiontree.cli._text import echo
from sessiontree.cli._wire import settings_of
from sessiontree.cli.commands._node_settings import (
    allowed_hosts,
    check_allowed_host,
    node_flags,
    node_settings,
)
from sessiontree.cli.server import (
    EVENT_RING,
    MAX_BODY_BYTES,
    MAX_WAIT,
    create_app,
)
from sessiontree.cli.server._connections import (
    BODY_TIMEOUT,
    HEADER_TIMEOUT,
    IDLE_TIMEOUT,
    MAX_CONNECTIONS,
    guarded_protocol,
)
from sessiontree.protocol import SessionTreeError, StoreLockedError
from sessiontree.store import Store
from sessiontree.supervision import (
    Agent,
    Node,
    NodeConfig,
    NodeMetrics,
    removed_setting,
)

__all__ = ["start", "stopped_line"]

log = logging.getLogger("sessiontree.cli.node")

_MIN_MAP_SIZE = 1 << 20  # --map-size: below a MiB the store's own databases barely fit
_MAX_MAP_SIZE = 1 << 46  # 64 TiB: more than a process's address space can map

F = TypeVar("F", bound=Callable[..., Any])


def _removed(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """A removed setting's flag (or its environment variable): refused, never ignored."""
    if value is not None and param.name is not None:
        raise click.BadParameter(removed_setting(param.name) or "removed", ctx, param)


def _removed_option(flag: str) -> Callable[[F], F]:
    """A hidden flag of a removed setting: refused with why, never ignored."""
    return click.option(
        flag,
        hidden=True,
        callback=_removed,
        expose_value=False,
        help="Removed: a node has one execution mode (refused).",
    )


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the node owns SIGTERM/SIGINT.

    Once the node is down the server stops with ``force_exit`` (open
    long-polls are not waited for), which makes uvicorn skip the app's
    lifespan shutdown and cancel it instead, logging an ERROR with a
    ``CancelledError`` traceback; the lifespan is shut down here as well.
    That ends every event stream (its ``closed`` message); what still runs
    of the HTTP side is then given ``DRAIN`` seconds, disconnected, and given
    them again: a task left to ``asyncio.run`` to cancel would log an ERROR
    traceback each."""

    DRAIN = 2.0

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        lifespan = getattr(self, "lifespan", None)
        if self.force_exit and lifespan is not None:
            await lifespan.shutdown()
        await self._drain()

    async def _drain(self) -> None:
        if self.server_state.tasks:
            await asyncio.wait(set(self.server_state.tasks), timeout=self.DRAIN)
        if not self.server_state.tasks:
            return
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if isinstance(transport, asyncio.Transport):
                transport.close()  # its request sees a disconnect and ends
        await asyncio.wait(set(self.server_state.tasks), timeout=self.DRAIN)
        if self.server_state.tasks:
            log.warning("%d HTTP requests still run at the stop", len(self.server_state.tasks))


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


@click.command("start")
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
@click.option(
    "--map-size",
    type=click.IntRange(_MIN_MAP_SIZE, _MAX_MAP_SIZE),
    default=None,
    metavar="BYTES",
    help="The store's LMDB map: the most it may hold [default: 16 GiB, or what the store "
    "was last opened with if larger]. A full map refuses writes (store_full); start the "
    "node again with a larger one to grow it.",
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
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    callback=check_allowed_host,
    help="Also answer requests whose Host is NAME (any port) or NAME:PORT, beside the "
    "bound address; repeat for more. Without a token every other Host is refused (421).",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(0.0, min_open=True),
    default=HEADER_TIMEOUT,
    show_default=True,
    help="Seconds a request's head may take to arrive (then 408 and closed).",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(0.0, min_open=True),
    default=BODY_TIMEOUT,
    show_default=True,
    help="Seconds a request's body may take to arrive after its head (then 408 and closed).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0.0, min_open=True),
    default=IDLE_TIMEOUT,
    show_default=True,
    help="Seconds a kept-alive connection may stay idle between requests.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    default=MAX_CONNECTIONS,
    show_default=True,
    help="Connections served at once; past it a new one is answered 503 and closed "
    "(keep it below the open-file limit, ulimit -n).",
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
@node_flags
@_removed_option("--actor-type")
@_removed_option("--dispatch")
@_removed_option("--dispatcher-threads")
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


def _open_node(
    agents: list[Agent], config: NodeConfig, store: Path, map_size: int | None
) -> tuple[Node, Store | None]:
    """The node on ``store``, and the ``Store`` opened here for ``map_size``
    (the caller closes it after the node; None: the node opened its own). One
    that cannot start exits 1 (74: a damaged store), taking away the store
    directory it created."""
    opened: Store | None = None
    try:
        with removed_on_failure(store):
            try:
                if map_size is not None:
                    opened = Store(store, map_size=map_size)
                return Node(agents, config, store=opened or store), opened
            except BaseException:
                if opened is not None:
                    opened.close()
                raise
    except StoreLockedError as exc:
        msg = f"store {store} is held by another node: {exc}"
        raise click.ClickException(msg) from None
    except (SessionTreeError, OSError, ValueError) as exc:  # ValueError: a key file, a model
        raise failure(exc, "the node could not start: ") from None


def _start(ctx: click.Context, config_file: Path | None, early: list[int]) -> int:
    given = node_settings(ctx, config_file)
    settings, config = given.settings, given.config
    # the port first: a node that cannot listen has touched no store
    sock = _bind(str(settings["host"]), int(settings["port"]))
    map_size = settings["map_size"]
    try:
        running, opened = _open_node(
            given.agents,
            config,
            Path(settings["store"]),
            None if map_size is None else int(map_size),
        )
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    metrics = NodeMetrics(running)
    app = create_app(
        running,
        metrics,
        name=str(settings["name"]),
        max_body=int(settings["max_body"]),
        max_wait=float(settings["max_wait"]),
        event_ring=int(settings["event_ring"]),
        token=given.token,
        allowed_hosts=allowed_hosts(settings, sock, given.token),
    )
    server = _Server(
        uvicorn.Config(
            app,
            http=guarded_protocol(given.limits),
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=int(config.grace) + 5,
        )
    )
    url_host = f"[{host}]" if ":" in host else host
    effective = {**settings, "store": str(settings["store"]), "node": settings_of(config)}
    echo(json.dumps({"effective_config": effective, "sources": given.sources}, sort_keys=True))
    echo(f"listening on http://{url_host}:{port} (agents: {', '.join(running.agents)})")
    sys.stdout.flush()
    signals: list[int] = []
    started = time.monotonic()
    try:
        code = asyncio.run(_serve(server, sock, running, early, signals))
    finally:
        metrics.close()
        sock.close()
        if opened is not None:  # after the node: it shut down on its way out of _serve
            opened.close()
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
        echo(json.dumps(summary, sort_keys=True))
    else:
        echo(stopped_line(summary), err=True)
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
