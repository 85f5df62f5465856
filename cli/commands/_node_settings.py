"""``node start``'s settings: the config file, the environment and the flags
merged (weakest first), checked by the flags' own types, and turned into the
node's ``NodeConfig``, model provider, tracing, agents, token and connection
bounds. Every bad setting is a usage error (exit 2) naming the flag or the
config file's key.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import resource
import socket
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sessiontree.actors.backends import BACKENDS
from sessiontree.cli._agents import AgentLoadError, load_agents, with_model
from sessiontree.cli._token import is_loopback, read_token, warn_if_exposed
from sessiontree.cli.server import AllowedHosts, parse_authority
from sessiontree.cli.server._connections import ConnectionLimits
from sessiontree.supervision import Agent, NodeConfig, Price, Provider, Tracing, removed_setting

__all__ = [
    "NodeSettings",
    "allowed_hosts",
    "check_allowed_host",
    "node_flags",
    "node_settings",
]

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("sessiontree.cli.node")

_OWN_FILES = 64  # open files a node needs beside its connections (store, pipes, logs)

_MODEL = ("model_url", "model", "api_key_file", "model_price")
_LIMITS = ("header_timeout", "body_timeout", "idle_timeout", "max_connections")
_TOP = {
    "store",
    "map_size",
    "host",
    "port",
    "agents",
    "name",
    "max_body",
    "max_wait",
    "event_ring",
    "allowed_hosts",
    *_LIMITS,
    *_MODEL,
}
#: The flags that set the ``NodeConfig`` field of their name (``--max-sessions``:
#: ``max_sessions``), in their order in ``--help``; unset, the field keeps its
#: default (or what ``[node]`` says).
_NODE_FLAGS: dict[str, dict[str, Any]] = {
    "grace": {"type": click.FloatRange(0.0), "help": "NodeConfig.grace (s)."},
    "max_sessions": {"type": click.IntRange(1), "help": "NodeConfig.max_sessions."},
    "max_step_threads": {"type": click.IntRange(1), "help": "NodeConfig.max_step_threads."},
    "max_running_skills": {"type": click.IntRange(1), "help": "NodeConfig.max_running_skills."},
    "passivate_after": {
        "type": click.FloatRange(0.0, min_open=True),
        "help": "NodeConfig.passivate_after (s): an idle Main is written out and its actor "
        "stopped.",
    },
    "backend": {
        "type": click.Choice(BACKENDS),
        "help": "NodeConfig.backend: where workers' skills run (inline, process, ray).",
    },
    "process_workers": {
        "type": click.IntRange(1),
        "help": "NodeConfig.process_workers: worker processes of the process backend "
        "(one per CPU).",
    },
    "ray_address": {
        "help": "NodeConfig.ray_address: the Ray cluster to join (none: start a local one).",
    },
    "ray_actors": {
        "type": click.IntRange(1),
        "help": "NodeConfig.ray_actors: pooled Ray actors of the ray backend.",
    },
    "gc_tuning": {
        "default": True,
        "help": "NodeConfig.gc_tuning: collector thresholds for many sessions (on for a node).",
    },
    "memory_high": {
        "type": click.FloatRange(0.0, 1.0, min_open=True),
        "help": "NodeConfig.memory_high: memory use (a fraction) at which branches are "
        "suspended [default: 0.9].",
    },
    "memory_low": {
        "type": click.FloatRange(0.0, 1.0, min_open=True),
        "help": "NodeConfig.memory_low: memory use below which branches suspended by memory "
        "pressure resume [default: 0.8].",
    },
    "memory_probe": {
        "default": True,
        "help": "NodeConfig.memory_probe: watch memory with the built-in probe (the cgroup's "
        "limit, else the machine's memory).",
    },
}


def node_flags(func: F) -> F:
    """``node start``'s ``NodeConfig`` flags: ``--NAME`` (default None), or a
    ``--NAME/--no-NAME`` switch for a setting on by default."""
    for name, attrs in reversed(_NODE_FLAGS.items()):
        flag = "--" + name.replace("_", "-")
        if attrs.get("default") is True:
            flag += "/--no-" + flag[2:]
        func = click.option(flag, **{"default": None, **attrs})(func)
    return func


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """What ``node start`` runs with: ``settings`` the merged top-level ones
    (``node`` the ``[node]`` table as given), ``sources`` where each came from."""

    settings: dict[str, Any]
    sources: dict[str, str]
    config: NodeConfig
    agents: list[Agent]
    token: str | None
    limits: ConnectionLimits


def node_settings(ctx: click.Context, config_file: Path | None) -> NodeSettings:
    """The settings of ``ctx``'s flags over ``config_file``; a missing store or
    a bad setting is a usage error."""
    settings, sources = _effective(ctx, _read_config(config_file))
    if settings["store"] is None:
        raise click.UsageError("give --store DIR (or `store` in --config)")
    token = _token(ctx, settings)
    limits = _limits(settings)
    provider = _provider(settings)
    table = dict(settings["node"])
    if provider is not None:
        table["providers"] = (provider,)
    tracing = _tracing(ctx.params, table.pop("tracing", None), str(settings["name"]))
    config = dataclasses.replace(_node_config(table), tracing=tracing)
    return NodeSettings(settings, sources, config, _agents(settings), token, limits)


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
    for name in sorted(node_table):
        why = removed_setting(name)
        if why is not None:
            raise click.BadParameter(f"[node] {name}: {why}", param_hint="--config")
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
    if param.multiple and not (
        isinstance(value, list) and all(isinstance(item, str) for item in value)
    ):
        msg = f"config file: {name} = {value!r}: must be a list of strings"
        raise click.BadParameter(msg, param_hint="--config")
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
    except AgentLoadError as exc:  # the value given cannot be loaded: a usage error
        raise click.UsageError(str(exc)) from None
    if settings["model"] is not None:
        agents = with_model(agents, str(settings["model"]))
    return agents


def check_allowed_host(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    for text in value:
        try:
            parse_authority(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return value


def _token(ctx: click.Context, settings: dict[str, Any]) -> str | None:
    """The API's token (None: none, and then only a loopback ``--host``: a usage
    error otherwise); a token or key file others may read is warned about."""
    token = read_token(ctx.params["token_file"])
    if token is None and not is_loopback(str(settings["host"])):
        msg = (
            f"--host {settings['host']} is not a loopback address: give --token-file PATH "
            "so the API is not open to anyone who can reach it"
        )
        raise click.UsageError(msg)
    if settings["api_key_file"] is not None:
        warn_if_exposed(Path(settings["api_key_file"]), "--api-key-file")
    return token


def _limits(settings: dict[str, Any]) -> ConnectionLimits:
    """The connection bounds; a warning when ``max_connections`` leaves too few
    of the process's open-file limit for the store and the node's own files
    (accepting would then fail)."""
    limits = ConnectionLimits(**{name: settings[name] for name in _LIMITS})
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and limits.max_connections + _OWN_FILES > soft:
        log.warning(
            "--max-connections %d is close to the open-file limit (%d, ulimit -n): "
            "raise the limit or lower --max-connections",
            limits.max_connections,
            soft,
        )
    return limits


def allowed_hosts(
    settings: dict[str, Any], sock: socket.socket, token: str | None
) -> AllowedHosts | None:
    """The addresses the node answers to: the one asked for and the one bound
    (with its port), ``localhost`` on loopback and every ``--allowed-host``;
    None (not checked) for a node with a token and no ``--allowed-host``."""
    given = tuple(settings["allowed_hosts"])
    if token is not None and not given:
        return None
    host, port = sock.getsockname()[:2]
    asked = str(settings["host"])
    return AllowedHosts.of((asked, host), port, loopback=is_loopback(host), allowed=given)
