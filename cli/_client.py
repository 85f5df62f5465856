"""A small client of a node's HTTP API, and where a command reads from.

Every command that talks to a running node goes through ``NodeClient``. A
node that does not answer raises ``NodeUnreachable`` (exit 69, the
``EX_UNAVAILABLE`` of sysexits); an error answer raises ``NodeRefused`` with
the node's structured error (exit 1).

``resolve_source`` decides, for every command, whether it talks to a node or
reads a store directory, in one order: a flag given on the command line
(``--node URL`` or ``--store DIR``; both at once is a usage error), then the
environment (``SESSIONTREE_NODE``, then ``SESSIONTREE_STORE``), then the
default, the node at ``DEFAULT_NODE`` (``node start``'s default port on
127.0.0.1).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx
from click.core import ParameterSource

from sessiontree.cli._text import shown
from sessiontree.cli._token import auth_headers

__all__ = [
    "DEFAULT_NODE",
    "DEFAULT_PORT",
    "EXIT_UNREACHABLE",
    "NODE_ENV",
    "NODE_OPTION",
    "STORE_ENV",
    "STORE_OPTION",
    "NodeClient",
    "NodeRefused",
    "NodeUnreachable",
    "Source",
    "resolve_source",
]

EXIT_UNREACHABLE = 69
DEFAULT_PORT = 8470
DEFAULT_NODE = f"http://127.0.0.1:{DEFAULT_PORT}"
NODE_ENV = "SESSIONTREE_NODE"
STORE_ENV = "SESSIONTREE_STORE"

NODE_OPTION = click.option(
    "--node",
    "node_url",
    envvar=NODE_ENV,
    default=None,
    metavar="URL",
    help=f"A running node's base URL (env {NODE_ENV}; default {DEFAULT_NODE}).",
)

STORE_OPTION = click.option(
    "--store",
    "store_dir",
    envvar=STORE_ENV,
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help=f"Read this store directory instead of a node (read-only, also while a node "
    f"runs; env {STORE_ENV}).",
)


@dataclass(frozen=True, slots=True)
class Source:
    """Where a command reads: a node's URL or a store directory (exactly one),
    and ``origin``, what chose it (a flag, a variable, or the default)."""

    node_url: str | None
    store_dir: Path | None
    origin: str

    def client(self) -> NodeClient:
        """A client of the node (a usage error when this source is a store)."""
        if self.node_url is None:
            raise click.UsageError("this command changes a node: give --node URL")
        return NodeClient(self.node_url, origin=self.origin)


def _flagged(ctx: click.Context | None, name: str, value: object) -> bool:
    """Whether ``value`` came from the command line (not the environment)."""
    if value is None:
        return False
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not ParameterSource.ENVIRONMENT


def resolve_source(node_url: str | None = None, store_dir: Path | None = None) -> Source:
    """Where the running command reads, from its ``--node`` and ``--store``
    values: an explicit flag wins over the environment (``SESSIONTREE_NODE``
    before ``SESSIONTREE_STORE``), which wins over the default node address.

    Raises ``click.UsageError`` (exit 2) when both flags are given; a bad URL
    is refused when a client is made (``NodeClient``)."""
    ctx = click.get_current_context(silent=True)
    node_flag = _flagged(ctx, "node_url", node_url)
    store_flag = _flagged(ctx, "store_dir", store_dir)
    if node_flag and store_flag:
        raise click.UsageError("give one of --node URL or --store DIR, not both")
    if node_flag:
        return Source(node_url, None, "--node")
    if store_flag:
        return Source(None, store_dir, "--store")
    if node_url is not None:
        return Source(node_url, None, NODE_ENV)
    if store_dir is not None:
        return Source(None, store_dir, STORE_ENV)
    return Source(DEFAULT_NODE, None, "the default address")


class NodeUnreachable(click.ClickException):
    """The node at ``--node`` did not answer (connection refused, timeout)."""

    exit_code = EXIT_UNREACHABLE


class NodeRefused(click.ClickException):
    """The node answered with an error; ``error`` is its ``ErrorBody.error``."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        where = f" (field {error['field']})" if error.get("field") else ""
        # one line, whatever the node put in its message (``_text.shown``)
        super().__init__(shown(f"{error.get('code', status)}: {error.get('message', '')}{where}"))
        self.status = status
        self.error = error


class NodeClient:
    """Calls one node's ``/v1`` API. ``timeout`` bounds each request in seconds
    (a long-poll adds its own wait on top)."""

    def __init__(self, url: str, timeout: float = 10.0, *, origin: str = "--node") -> None:
        if not url.startswith(("http://", "https://")):
            msg = f"{url!r} is not a node URL (like {DEFAULT_NODE})"
            raise click.BadParameter(msg, param_hint=f"--node (from {origin})")
        self.url = url.rstrip("/")
        self.origin = origin
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=auth_headers())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        wait: float = 0.0,
    ) -> httpx.Response:
        """One request; raises ``NodeUnreachable`` or ``NodeRefused``."""
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(
                method, path, json=json, params=clean, timeout=self._timeout + wait
            )
        except httpx.TransportError as exc:
            msg = f"node {self.url} ({self.origin}) is unreachable: {exc}"
            if self.origin != "--node":
                msg += "; give --node URL or --store DIR"
            raise NodeUnreachable(msg) from exc
        if response.status_code >= 400:
            raise _refused(response)
        return response

    @contextmanager
    def stream(
        self, path: str, params: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Iterator[httpx.Response]:
        """``GET path`` as a stream (no read timeout: a stream may stay quiet);
        raises ``NodeUnreachable`` or ``NodeRefused`` like ``request``."""
        clean = {k: v for k, v in params.items() if v is not None}
        timeout = httpx.Timeout(self._timeout, read=None)
        try:
            with self._http.stream(
                "GET", path, params=clean, headers=headers, timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _refused(response)
                yield response
        except httpx.TransportError as exc:
            msg = f"node {self.url} is unreachable: {exc}"
            raise NodeUnreachable(msg) from exc

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).json()

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {}).json()

    def text(self, path: str) -> str:
        return self.request("GET", path).text

    def wait(self, session_id: str, timeout: float) -> Any:
        """One long-poll of at most ``timeout`` seconds."""
        return self.request(
            "GET", f"/v1/sessions/{session_id}/result", params={"timeout": timeout}, wait=timeout
        ).json()

    def main_of(self, agent: str, key: str) -> str:
        """The id of ``agent``'s Main for ``key``; ``NodeRefused`` (404) if it has none."""
        page = self.get("/v1/sessions", agent=agent, key=key, kind="main", limit=1)
        if not page["items"]:
            raise NodeRefused(
                404,
                {"code": "unknown_session", "message": f"agent {agent!r} has no Main for {key}"},
            )
        return str(page["items"][0]["session_id"])


def _refused(response: httpx.Response) -> NodeRefused:
    """The node's error answer as ``NodeRefused`` (its status and a short text
    when the body is not the API's ``{"error": …}``)."""
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {"code": str(response.status_code), "message": response.text[:200]}
    return NodeRefused(response.status_code, error)
