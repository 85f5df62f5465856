"""A node's connections are bounded (issue 38), tried against real ``node
start`` subprocesses on 127.0.0.1 with raw sockets: silent, trickling and
idle connections are closed within the header, body and idle timeouts while
``/healthz`` keeps answering; past ``--max-connections`` a new connection is
answered 503 and closed; the bounds come from flags or the config file. And
a clean SIGTERM with event streams open ends each with its ``closed``
message and logs no error."""

from __future__ import annotations

import json
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from sessiontree.cli._agents import BUILTIN
from tests._running_node import ROOT, RunningNode
from tests.conftest import WAIT

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 1.0  # seconds: every bound of the node under test
SLACK = 10.0  # real seconds past the bound a close may take on a loaded machine
DRIP = 0.2  # seconds between two bytes of a trickling client


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    bounds = ("--header-timeout", "--body-timeout", "--idle-timeout")
    args = [arg for flag in bounds for arg in (flag, str(TIMEOUT))]
    running = RunningNode(tmp_path_factory.mktemp("bounded") / "store", *args, agents=BUILTIN)
    yield running
    assert running.stop() == 0
    assert "ERROR" not in running.log(), running.log()


def _port(node: RunningNode) -> int:
    return int(node.url.rsplit(":", 1)[1])


@dataclass
class _Client:
    """One raw connection: what it sends a byte at a time, what it received,
    and when the node closed it."""

    sock: socket.socket
    drip: bytes
    opened: float
    received: bytes = b""
    closed_at: float | None = None
    sent: int = 0
    kind: str = field(default="idle")


def _open(port: int, kind: str, head: bytes, drip: bytes) -> _Client:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setblocking(False)
    if head:
        sock.sendall(head)
    return _Client(sock, drip, time.monotonic(), kind=kind)


def _drain(client: _Client) -> None:
    try:
        while chunk := client.sock.recv(65536):
            client.received += chunk
    except BlockingIOError:
        return
    except ConnectionError:
        pass
    client.closed_at = time.monotonic()


def test_silent_and_trickling_connections_are_closed_while_healthz_answers(
    node: RunningNode,
) -> None:
    port = _port(node)
    host = f"Host: 127.0.0.1:{port}\r\n".encode()
    body_head = (
        b"POST /v1/sessions HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )
    clients = (
        [_open(port, "silent", b"", b"") for _ in range(70)]
        + [_open(port, "head", b"GET /v1/node HTTP/1.1\r\n" + host, b"X") for _ in range(70)]
        + [_open(port, "body", body_head, b" ") for _ in range(60)]
    )
    selector = selectors.DefaultSelector()
    for client in clients:
        selector.register(client.sock, selectors.EVENT_READ, client)
    answered = 0
    deadline = time.monotonic() + TIMEOUT + SLACK
    next_drip = time.monotonic()
    with httpx.Client(base_url=node.url, timeout=5.0) as probe:
        while any(c.closed_at is None for c in clients) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=DRIP / 2):
                client = key.data
                _drain(client)
                if client.closed_at is not None:
                    selector.unregister(client.sock)
            if time.monotonic() >= next_drip:
                next_drip += DRIP
                for client in clients:
                    if client.drip and client.closed_at is None:
                        try:
                            client.sock.send(client.drip)
                            client.sent += 1
                        except (BlockingIOError, ConnectionError):
                            pass
                # the node keeps answering its probe, on a fresh connection each time
                health = probe.get("/healthz", headers={"connection": "close"})
                assert health.status_code == 200
                answered += 1
    open_still = [c.kind for c in clients if c.closed_at is None]
    for client in clients:
        client.sock.close()
    selector.close()
    assert not open_still, f"{len(open_still)} connections still open: {set(open_still)}"
    assert answered >= 3
    for client in clients:
        held = client.closed_at - client.opened  # type: ignore[operator]
        assert held < TIMEOUT + SLACK, (client.kind, held)
        if client.kind == "silent":
            assert client.received == b"", client.received  # nothing sent: closed in silence
            continue
        # part of a request came: answered 408 with an ErrorBody, then closed
        head, _, body = client.received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), client.received[:200]
        error = json.loads(body)["error"]
        assert error["code"] == "rejected_input"
        assert f"request's {client.kind} did not arrive within 1 s" in error["message"]
        assert client.sent >= 2  # it kept trickling, and that did not extend the deadline


def _response(sock: socket.socket) -> bytes:
    """One whole response read from ``sock`` (its head, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(node: RunningNode) -> None:
    port = _port(node)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT + SLACK) as sock:
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        for _ in range(2):  # the connection is kept alive between requests
            sock.sendall(request)
            assert _response(sock).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        assert sock.recv(65536) == b""  # then, idle, closed by the node
        assert time.monotonic() - started < TIMEOUT + SLACK


def test_past_max_connections_a_new_one_is_answered_503_and_closed(tmp_path: Path) -> None:
    cap = 20
    running = RunningNode(
        tmp_path / "store",
        *("--max-connections", str(cap), "--header-timeout", "60"),
        agents=BUILTIN,
    )
    port = _port(running)
    held: list[socket.socket] = []
    try:
        running.http.close()  # its kept-alive connection would take a place
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(cap)]
        for _ in range(3):
            with httpx.Client(base_url=running.url, timeout=10) as extra:
                answer = extra.get("/healthz")
            assert answer.status_code == 503, answer.text
            assert answer.headers["connection"] == "close"
            error = answer.json()["error"]
            assert error["code"] == "capacity_exceeded"
            assert f"{cap} connections open" in error["message"]
        for sock in held:
            sock.close()
        held = []
        served = None
        for _ in range(50):  # the node sees the closes at once; bounded, not slept on
            with httpx.Client(base_url=running.url, timeout=10) as again:
                served = again.get("/healthz")
            if served.status_code == 200:
                break
        assert served is not None
        assert served.status_code == 200, served.text
        assert running.log().count("connections are open (--max-connections)") == 1
    finally:
        for sock in held:
            sock.close()
        assert running.stop() == 0


def test_the_bounds_come_from_flags_or_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("header_timeout = 3.5\nbody_timeout = 7\nmax_connections = 64\n")
    running = RunningNode(
        tmp_path / "store", "--config", str(config), "--idle-timeout", "2", agents=BUILTIN
    )
    try:
        shown = running.config
        assert shown["header_timeout"] == 3.5
        assert shown["body_timeout"] == 7.0
        assert shown["idle_timeout"] == 2.0
        assert shown["max_connections"] == 64
        assert running.sources["header_timeout"] == "file"
        assert running.sources["idle_timeout"] == "flag"
    finally:
        assert running.stop() == 0
    defaults = RunningNode(tmp_path / "store", agents=BUILTIN)
    try:
        assert defaults.config["header_timeout"] == 10.0
        assert defaults.config["body_timeout"] == 30.0
        assert defaults.config["idle_timeout"] == 5.0
        assert defaults.config["max_connections"] == 1000
    finally:
        assert defaults.stop() == 0


@pytest.mark.parametrize(
    "bad",
    [
        ("--header-timeout", "0"),
        ("--body-timeout", "-1"),
        ("--idle-timeout", "soon"),
        ("--max-connections", "0"),
    ],
)
def test_a_bad_bound_is_a_usage_error(tmp_path: Path, bad: tuple[str, str]) -> None:
    command = [sys.executable, "-m", "sessiontree.cli", "node", "start"]
    done = subprocess.run(
        [*command, "--store", str(tmp_path / "store"), "--port", "0", *bad],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert bad[0] in done.stderr
    assert not (tmp_path / "store").exists()


def test_a_clean_sigterm_with_event_followers_logs_no_error(tmp_path: Path) -> None:
    running = RunningNode(tmp_path / "store", "--grace", "1", agents=BUILTIN)
    followers = 20
    ready = threading.Semaphore(0)
    seen: list[str] = []
    failures: list[BaseException] = []

    def follow() -> None:
        try:
            with httpx.stream("GET", f"{running.url}/v1/events", timeout=WAIT * 3) as stream:
                lines = stream.iter_lines()
                assert next(lines).startswith(": events after")
                ready.release()
                seen.append("\n".join(lines))  # to the end of the stream
        except BaseException as exc:
            failures.append(exc)
            ready.release()

    threads = [threading.Thread(target=follow, daemon=True) for _ in range(followers)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert ready.acquire(timeout=WAIT)
    main = running.http.post("/v1/sessions", json={"agent_id": "assistant"})
    assert main.status_code == 200  # an event each follower sees before the stop
    assert running.stop(signal.SIGTERM) == 0
    for thread in threads:
        thread.join(WAIT)
    assert not failures, failures
    assert len(seen) == followers
    for stream in seen:
        assert "event: spawned" in stream
        assert stream.rstrip().splitlines()[-2:][0] == "event: closed", stream[-300:]
    log = running.log()
    assert "ERROR" not in log, log
    assert "Traceback" not in log, log
