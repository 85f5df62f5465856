"""A node's HTTP API served for real on 127.0.0.1, in this process (for tests
that need the node in hand: a virtual clock, a stand-in model, direct reads)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Self

import httpx
import uvicorn

from sessiontree.cli.commands._node import _bind, _Server
from sessiontree.cli.server import create_app
from sessiontree.supervision import Node, NodeMetrics

__all__ = ["ServedNode"]

STOP_WAIT = 10.0  # real seconds the server thread may take to stop


class ServedNode:
    """``node``'s API (with its ``NodeMetrics``) served by uvicorn on an ephemeral
    port of 127.0.0.1, on a thread of its own; ``url`` is its base URL and
    ``http`` a client on it. The socket listens before the server thread starts,
    so a request made at once waits in the backlog, never fails or races. The
    node stays the caller's to shut down; ``close()`` stops the server (close
    any open event stream first: the server waits for it). ``port``: listen
    there instead (to serve a node again where it was); ``options`` go to
    ``create_app``."""

    def __init__(self, node: Node, port: int = 0, **options: Any) -> None:
        self.node = node
        self.metrics = NodeMetrics(node)
        self._sock = _bind("127.0.0.1", port)
        port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.app = create_app(node, self.metrics, **{"max_wait": 5.0, **options})
        self._server = _Server(
            uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="on")
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def get(self, path: str, **params: Any) -> Any:
        """``GET path`` as JSON; fails the test on anything but 200."""
        answer = self.http.get(path, params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def close(self) -> None:
        self.http.close()
        self._server.should_exit = True
        self._thread.join(STOP_WAIT)
        assert not self._thread.is_alive(), "the HTTP server did not stop"
        self._sock.close()
        self.metrics.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
