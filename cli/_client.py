"""A small client of a node's HTTP API, for the command line.

Every command that talks to a running node goes through ``NodeClient``. A
node that does not answer raises ``NodeUnreachable`` (exit 69, the
``EX_UNAVAILABLE`` of sysexits); an error answer raises ``NodeRefused`` with
the node's structured error (exit 1).
"""

from __future__ import annotations

from typing import Any

import click
import httpx

from sessiontree.cli._token import auth_headers

__all__ = [
    "EXIT_UNREACHABLE",
    "NODE_OPTION",
    "NodeClient",
    "NodeRefused",
    "NodeUnreachable",
    "one_source",
]

EXIT_UNREACHABLE = 69

NODE_OPTION = click.option(
    "--node",
    "node_url",
    envvar="SESSIONTREE_NODE",
    default=None,
    metavar="URL",
    help="A running node's base URL, e.g. http://127.0.0.1:8470 (env SESSIONTREE_NODE).",
)


def one_source(node_url: str | None, store_dir: object | None) -> None:
    """A read command reads a node or a store: exactly one (else a usage error)."""
    if (node_url is None) == (store_dir is None):
        raise click.UsageError("give exactly one of --node URL or --store DIR")


class NodeUnreachable(click.ClickException):
    """The node at ``--node`` did not answer (connection refused, timeout)."""

    exit_code = EXIT_UNREACHABLE


class NodeRefused(click.ClickException):
    """The node answered with an error; ``error`` is its ``ErrorBody.error``."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        where = f" (field {error['field']})" if error.get("field") else ""
        super().__init__(f"{error.get('code', status)}: {error.get('message', '')}{where}")
        self.status = status
        self.error = error


class NodeClient:
    """Calls one node's ``/v1`` API. ``timeout`` bounds each request in seconds
    (a long-poll adds its own wait on top)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            msg = f"{url!r} is not a node URL (like http://127.0.0.1:8470)"
            raise click.BadParameter(msg, param_hint="--node")
        self.url = url.rstrip("/")
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
            msg = f"node {self.url} is unreachable: {exc}"
            raise NodeUnreachable(msg) from exc
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": str(response.status_code), "message": response.text[:200]}
            raise NodeRefused(response.status_code, error)
        return response

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
