"""A web page the operator opens cannot drive a node (issue 38), tried against
real ``node start`` subprocesses on 127.0.0.1: a body that is not JSON is a
415, a foreign ``Host`` a 421, a state-changing request from a page of
another ``Origin`` a 403, each a typed ``ErrorBody`` and nothing done; a JSON
client, with a token or without, is unaffected; the bearer scheme is matched
in any case; and a token or API-key file others may read is named in a
warning."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiontree.cli._agents import BUILTIN
from sessiontree.cli.server import AllowedHosts, parse_authority
from tests._running_node import ROOT, RunningNode

pytestmark = pytest.mark.timeout(120)

TOKEN = "cross-site-token-7"
EVIL = "http://attacker.example"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    """A node without a token (loopback), answering also to ``node.lan`` (any
    port) and ``other.lan:9``."""
    store = tmp_path_factory.mktemp("open") / "store"
    allowed = ("--allowed-host", "node.lan", "--allowed-host", "other.lan:9")
    running = RunningNode(store, "--grace", "1", *allowed, agents=BUILTIN)
    yield running
    assert running.stop() == 0
    assert "ERROR" not in running.log()


@pytest.fixture(scope="module")
def token_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    folder = tmp_path_factory.mktemp("token")
    (folder / "token").write_text(TOKEN)
    (folder / "token").chmod(0o600)
    running = RunningNode(
        folder / "store", "--grace", "1", "--token-file", str(folder / "token"), agents=BUILTIN
    )
    yield running
    assert running.stop() == 0


def _port(node: RunningNode) -> int:
    return int(node.url.rsplit(":", 1)[1])


def _count(node: RunningNode, **headers: str) -> int:
    page = node.http.get("/v1/sessions", params={"limit": 1000}, headers=headers).json()
    return len(page["items"])


def _refused(answer: httpx.Response, status: int, code: str, field: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = answer.json()
    assert body["status"] == status
    assert body["error"]["code"] == code
    assert body["error"]["field"] == field
    return body


def _main(node: RunningNode, **headers: str) -> str:
    opened = node.http.post("/v1/sessions", json={"agent_id": "assistant"}, headers=headers)
    assert opened.status_code == 200, opened.text
    return str(opened.json()["info"]["session_id"])


# -- bodies ------------------------------------------------------------------------------------


def test_a_text_plain_or_form_body_is_a_415_and_nothing_is_done(node: RunningNode) -> None:
    main = _main(node)
    before = _count(node)
    cases = [
        ("/v1/sessions", b'{"agent_id": "assistant", "key": "web:dm:1"}', "text/plain"),
        ("/v1/sessions", b'{"agent_id": "assistant"}', "text/plain;charset=UTF-8"),
        (
            f"/v1/sessions/{main}/children",
            b"kind=worker&task=5",
            "application/x-www-form-urlencoded",
        ),
        (f"/v1/sessions/{main}/children", b'{"kind": "worker"}', "multipart/form-data; boundary=x"),
        (f"/v1/sessions/{main}/messages", b'{"message": "hi"}', "text/plain"),
        (f"/v1/sessions/{main}/cancel", b"{}", "text/plain"),
        (f"/v1/sessions/{main}/terminate", b"", "application/x-www-form-urlencoded"),
        ("/v1/route", b'{"agent_id": "assistant", "key": "a:dm:b", "text": "x"}', "text/plain"),
    ]
    for path, content, kind in cases:
        answer = node.http.post(path, content=content, headers={"content-type": kind})
        body = _refused(answer, 415, "rejected_input", "Content-Type")
        assert kind.partition(";")[0] in body["error"]["message"]
    # a body without any Content-Type is no better
    bare = node.http.post("/v1/sessions", content=b'{"agent_id": "assistant"}')
    _refused(bare, 415, "rejected_input", "Content-Type")
    assert _count(node) == before
    shown = node.http.get(f"/v1/sessions/{main}").json()
    assert shown["info"]["state"] == "active"  # neither cancelled nor terminated
    conversation = node.http.get(f"/v1/sessions/{main}/conversation/context").json()
    assert conversation == []  # no message arrived
    # JSON, with a charset or not, is taken
    fine = node.http.post(
        "/v1/sessions",
        content=b'{"agent_id": "assistant", "key": "web:dm:2"}',
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert fine.status_code == 200, fine.text


# -- Host ----------------------------------------------------------------------------------------


def test_a_foreign_host_is_a_421_on_every_route_but_the_probes(node: RunningNode) -> None:
    main = _main(node)
    for host in (
        "attacker.example",
        f"attacker.example:{_port(node)}",
        "127.0.0.1:1",
        "node.lan.evil",
    ):
        for path in (
            "/v1/sessions",
            "/v1/node",
            "/metrics",
            "/schema/openapi.json",
            f"/v1/sessions/{main}/conversation/transcript",
        ):
            answer = node.http.get(path, headers={"host": host})
            _refused(answer, 421, "rejected_input", "Host")
        posted = node.http.post(
            f"/v1/sessions/{main}/messages", json={"message": "hi"}, headers={"host": host}
        )
        _refused(posted, 421, "rejected_input", "Host")
        # the probes tell a rebinding page nothing, and a kubelet sends the pod's address
        assert node.http.get("/healthz", headers={"host": host}).status_code == 200
        assert node.http.get("/readyz", headers={"host": host}).status_code == 200
    for host in (
        f"127.0.0.1:{_port(node)}",
        f"localhost:{_port(node)}",
        f"LOCALHOST:{_port(node)}",
        "127.0.0.1",
        "node.lan",
        "node.lan:8080",
        "other.lan:9",
    ):
        assert node.http.get("/v1/node", headers={"host": host}).status_code == 200, host
    _refused(
        node.http.get("/v1/node", headers={"host": "other.lan"}), 421, "rejected_input", "Host"
    )


def test_a_request_without_a_host_is_a_400(node: RunningNode) -> None:
    with socket.create_connection(("127.0.0.1", _port(node)), timeout=10) as conn:
        conn.sendall(b"GET /v1/node HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b'"field":"Host"' in body


# -- Origin --------------------------------------------------------------------------------------


def test_a_state_changing_request_from_a_foreign_origin_is_a_403(node: RunningNode) -> None:
    main = _main(node)
    child = node.http.post(
        f"/v1/sessions/{main}/children", json={"kind": "branch", "task": "3600", "skill": "work"}
    )
    assert child.status_code == 201, child.text
    branch = child.json()["info"]["session_id"]
    before = _count(node)
    for origin in (EVIL, "null", f"{EVIL}:{_port(node)}", "file://", "http://node.lan.evil"):
        headers = {"origin": origin}
        for path in (f"/v1/sessions/{branch}/cancel", f"/v1/sessions/{branch}/terminate"):
            answer = node.http.post(path, headers=headers)  # no body, no type
            _refused(answer, 403, "not_allowed", "Origin")
        opened = node.http.post(
            "/v1/sessions", json={"agent_id": "assistant", "key": "web:dm:3"}, headers=headers
        )
        _refused(opened, 403, "not_allowed", "Origin")
        gone = node.http.delete(f"/v1/wedged/{main}", headers=headers)
        _refused(gone, 403, "not_allowed", "Origin")
    assert _count(node) == before
    assert node.http.get(f"/v1/sessions/{branch}").json()["info"]["state"] == "active"
    # reading is not changing (the browser keeps a foreign page from the answer)
    assert node.http.get("/v1/node", headers={"origin": EVIL}).status_code == 200
    # a page of the node itself, or a named host, may act
    for origin in (node.url, f"http://localhost:{_port(node)}", "https://node.lan"):
        opened = node.http.post(
            "/v1/sessions", json={"agent_id": "assistant"}, headers={"origin": origin}
        )
        assert opened.status_code == 200, (origin, opened.text)
    ended = node.http.post(f"/v1/sessions/{branch}/terminate", headers={"origin": node.url})
    assert ended.status_code == 202, ended.text


# -- a token ---------------------------------------------------------------------------------------


def test_a_json_client_with_a_token_is_unaffected(token_node: RunningNode) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    main = _main(token_node, **auth)
    # the token is the guard: any Host (a name the operator uses for the machine) is served
    shown = token_node.http.get(f"/v1/sessions/{main}", headers={**auth, "host": "box.lan:1"})
    assert shown.status_code == 200, shown.text
    sent = token_node.http.post(
        f"/v1/sessions/{main}/messages", json={"message": "hello"}, headers=auth
    )
    assert sent.status_code == 202, sent.text
    spawned = token_node.http.post(
        f"/v1/sessions/{main}/children", json={"kind": "worker", "task": "0"}, headers=auth
    )
    assert spawned.status_code == 201, spawned.text
    cancelled = token_node.http.post(f"/v1/sessions/{main}/cancel", json={}, headers=auth)
    assert cancelled.status_code == 202, cancelled.text
    plain = token_node.http.post(
        "/v1/sessions", content=b"{}", headers={**auth, "content-type": "text/plain"}
    )
    _refused(plain, 415, "rejected_input", "Content-Type")
    schema = token_node.http.get("/schema/openapi.json", headers=auth).json()
    spawn = schema["paths"]["/v1/sessions/{session_id}/children"]["post"]["responses"]
    assert "415" in spawn
    assert "421" not in spawn  # no Host rule on this node


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
def test_the_bearer_scheme_is_matched_in_any_case(token_node: RunningNode, scheme: str) -> None:
    for header in (f"{scheme} {TOKEN}", f"{scheme}   {TOKEN}"):
        answer = token_node.http.get("/v1/node", headers={"authorization": header})
        assert answer.status_code == 200, (header, answer.text)


@pytest.mark.parametrize(
    "header", [f"Basic {TOKEN}", f"Bearer{TOKEN}", TOKEN, "Bearer", f"Bearer {TOKEN}x", ""]
)
def test_anything_but_the_bearer_token_is_a_401(token_node: RunningNode, header: str) -> None:
    answer = token_node.http.get("/v1/node", headers={"authorization": header})
    assert answer.status_code == 401, header
    assert answer.json()["error"]["code"] == "not_allowed"


# -- the contract ------------------------------------------------------------------------------


def test_the_openapi_document_names_the_new_answers(node: RunningNode) -> None:
    paths = node.http.get("/schema/openapi.json").json()["paths"]
    for path, item in paths.items():
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            answers = operation["responses"]
            if method in ("post", "put", "patch", "delete"):
                assert "415" in answers, (method, path)
                assert "403" in answers, (method, path)
            if path in ("/healthz", "/readyz"):
                assert "421" not in answers, path
            else:
                assert "421" in answers, (method, path)
                assert "400" in answers, (method, path)


# -- flags and the config file -------------------------------------------------------------------


def _start(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sessiontree.cli", "node", "start"]
    return subprocess.run(
        [*command, "--store", str(tmp_path / "store"), "--port", "0", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("bad", ["http://node.lan", "node.lan/x", "node.lan:0", "::1", "[::1"])
def test_a_bad_allowed_host_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    done = _start(tmp_path, "--allowed-host", bad)
    assert done.returncode == 2, done.stderr
    assert "--allowed-host" in done.stderr
    assert not (tmp_path / "store").exists()


def test_allowed_hosts_come_from_the_config_file_too(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('allowed_hosts = ["box.lan", "[::1]:8"]\n')
    running = RunningNode(tmp_path / "store", "--config", str(config), agents=BUILTIN)
    try:
        assert running.config["allowed_hosts"] == ["box.lan", "[::1]:8"]
        assert running.sources["allowed_hosts"] == "file"
        assert running.http.get("/v1/node", headers={"host": "box.lan:3"}).status_code == 200
        assert running.http.get("/v1/node", headers={"host": "[::1]:8"}).status_code == 200
        refused = running.http.get("/v1/node", headers={"host": "[::1]:9"})
        assert refused.status_code == 421
    finally:
        assert running.stop() == 0
    config.write_text('allowed_hosts = "box.lan"\n')
    done = _start(tmp_path, "--config", str(config))
    assert done.returncode == 2
    assert "allowed_hosts" in done.stderr
    assert "list of strings" in done.stderr


# -- secret files -----------------------------------------------------------------------------


def test_a_token_or_key_file_others_may_read_is_named_in_one_warning(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o644)
    (tmp_path / "key").write_text("sk-test")
    (tmp_path / "key").chmod(0o640)
    running = RunningNode(
        tmp_path / "store",
        *("--token-file", str(tmp_path / "token")),
        *("--model-url", "http://127.0.0.1:9/v1", "--api-key-file", str(tmp_path / "key")),
        agents=BUILTIN,
    )
    try:
        lines = [line for line in running.log().splitlines() if "may be read by" in line]
        assert len(lines) == 2, running.log()
        token_line, key_line = sorted(lines, key=lambda line: "--api-key-file" in line)
        assert f"--token-file {tmp_path / 'token'} may be read by everyone (mode 0644)" in (
            token_line
        )
        assert f"--api-key-file {tmp_path / 'key'} may be read by its group (mode 0640)" in (
            key_line
        )
        assert "WARNING" in token_line
    finally:
        assert running.stop() == 0


def test_a_private_token_file_draws_no_warning(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", "--token-file", str(tmp_path / "token"),
         "node", "status", "--node", "http://127.0.0.1:9"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ},
    )  # fmt: skip
    assert done.returncode == 69  # nobody at port 9; the token file was read quietly
    assert "may be read" not in done.stderr
    (tmp_path / "token").chmod(0o604)
    shared = subprocess.run(
        [sys.executable, "-m", "sessiontree.cli", "--token-file", str(tmp_path / "token"),
         "node", "status", "--node", "http://127.0.0.1:9"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shared.stderr.count("may be read by everyone (mode 0604)") == 1, shared.stderr


# -- the rules as values ------------------------------------------------------------------------


def test_authorities_parse_as_browsers_and_clients_send_them() -> None:
    assert parse_authority("Node.LAN:8470") == ("node.lan", 8470)
    assert parse_authority("[::1]:8470") == ("::1", 8470)
    assert parse_authority("[::1]") == ("::1", None)
    assert parse_authority("127.0.0.1") == ("127.0.0.1", None)
    for bad in ("", ":80", "a:b", "a:70000", "a b", "a/b", "u@a", "::1", "[::1", "[::1]x", "a:"):
        with pytest.raises(ValueError, match=r"."):
            parse_authority(bad)


def test_allowed_hosts_are_the_bound_address_localhost_and_the_given_names() -> None:
    hosts = AllowedHosts.of(("127.0.0.1",), 8470, loopback=True, allowed=("box.lan", "x.lan:1"))
    assert hosts.allows("127.0.0.1:8470")
    assert hosts.allows("localhost")
    assert hosts.allows("box.lan:5")
    assert hosts.allows("x.lan:1")
    assert not hosts.allows("x.lan:2")
    assert not hosts.allows("127.0.0.1:8471")
    assert not hosts.allows("attacker.example:8470")
    assert not hosts.allows("garbage:port")
    public = AllowedHosts.of(("10.0.0.5",), 80, loopback=False)
    assert not public.allows("localhost:80")
    assert hosts.allows_origin("http://localhost:8470")
    assert hosts.allows_origin("https://box.lan")
    assert not hosts.allows_origin("null")
    assert not hosts.allows_origin("ftp://box.lan")
    assert not hosts.allows_origin("http://box.lan/path")
