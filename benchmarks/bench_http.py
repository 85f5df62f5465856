"""Benchmark: spawns over HTTP from 64 keep-alive connections, without and with
20 followers of ``/v1/events``.

    python benchmarks/bench_http.py [--quick] [--connections 64] [--subscribers 20]

A real node runs as a subprocess (``sessiontree node start --store DIR
--port 0 --agents bench_http:agents`` on 127.0.0.1; the agent ``bench`` has
one async skill that returns at once and allows 100,000 live children). Each
connection has a Main of its own and spawns workers under it
(``POST /v1/sessions/{main}/children``), one request after the other on its
keep-alive connection, timed from the request's first byte sent to the
response's last byte read. The connections live in a separate load process
(asyncio streams speaking HTTP/1.1 by hand, so the client's own CPU stays
small); the event followers live in a third process and read (and count) the
stream without parsing it.

Rounds alternate: without followers, with followers, … (each pair's order
alternates too, so a drift of the shared machine falls on both sides).

* ``spawns_per_s``, ``p50_ms``, ``p99_ms`` — the rounds without followers
  (all their spawns, latencies pooled).
* ``event_subscribers`` (20) and ``spawn_rate_ratio_with_subscribers`` — the
  spawn rate with the followers over the rate without, the median of the
  pairs' ratios. ``with_subscribers_p99_ms``; ``events_per_subscriber_per_s``
  says the followers did read (every spawn is 4 to 6 events).
* ``refused`` — answers other than 201 (none expected).

``--quick``: 2 pairs of 3 s rounds (full: 4 pairs of 8 s); the same sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import log

from sessiontree.supervision import Agent

HERE = Path(__file__).resolve().parent
WARMUP = 20  # spawns each connection makes before a round's clock starts


def agents() -> list[Agent]:
    """The node's agents (``--agents bench_http:agents``, imported by the node)."""

    async def noop(session: Any) -> str:
        return "ok"

    async def main(session: Any) -> None:
        return None

    return [
        Agent(
            "bench",
            skills={"noop": noop, "main": main},
            main_skill="main",
            default_skill="noop",
            max_children=100_000,
        )
    ]


# -- HTTP/1.1 by hand -------------------------------------------------------------------


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length) if length else b""
    return status, body


def _post(host: str, path: str, body: bytes) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), host.encode(), len(body), body)
    )


# -- the load process -------------------------------------------------------------------


async def _load(host: str, port: int, mains: list[str], seconds: float) -> dict[str, Any]:
    body = json.dumps({"kind": "worker", "skill": "noop"}).encode()
    start = asyncio.Event()
    stop_at = [0.0]
    latencies: list[list[float]] = [[] for _ in mains]
    refused = [0]
    ready = [0]

    async def connection(i: int, main: str) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        request = _post(f"{host}:{port}", f"/v1/sessions/{main}/children", body)
        for _ in range(WARMUP):
            await _exchange(reader, writer, request)
        ready[0] += 1
        if ready[0] == len(mains):
            stop_at[0] = time.perf_counter() + seconds
            start.set()
        await start.wait()
        mine = latencies[i]
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                break
            status, _ = await _exchange(reader, writer, request)
            mine.append(time.perf_counter() - t0)
            if status != 201:
                refused[0] += 1
        writer.close()

    await asyncio.gather(*(connection(i, m) for i, m in enumerate(mains)))
    pooled = [x for per in latencies for x in per]
    return {"spawns": len(pooled), "seconds": seconds, "latencies": pooled, "refused": refused[0]}


async def _follow(host: str, port: int, count: int) -> None:
    """``count`` followers of /v1/events; prints ``ready``, then on stdin's end
    prints what they read and stops."""
    got = [0] * count
    streams = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /v1/events HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host.encode(), port))
        await reader.readuntil(b"events after")  # the node registered this follower
        streams.append((reader, writer))

    async def read(i: int, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(65536):
            got[i] += chunk.count(b"\nid: ") + chunk.startswith(b"id: ")

    tasks = [asyncio.ensure_future(read(i, r)) for i, (r, _) in enumerate(streams)]
    t0 = time.perf_counter()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    elapsed = time.perf_counter() - t0
    for task in tasks:
        task.cancel()
    for _, writer in streams:
        writer.close()
    print(json.dumps({"events": sum(got), "seconds": elapsed}), flush=True)


# -- the orchestrator -------------------------------------------------------------------


def _start_node(store: str) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "sessiontree.cli", "node", "start", "--store", store]
    command += ["--port", "0", "--agents", "bench_http:agents", "--no-memory-probe"]
    paths = [str(HERE), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.Popen(
        command, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, line.split()[2]
    msg = f"the node did not start (exit {proc.wait()})"
    raise SystemExit(msg)


def _mains(url: str, count: int) -> list[str]:
    with httpx.Client(base_url=url, timeout=30.0) as http:
        return [
            http.post("/v1/sessions", json={"agent_id": "bench", "key": f"internal:main:bench{i}"})
            .raise_for_status()
            .json()["info"]["session_id"]
            for i in range(count)
        ]


def _role(role: str, url: str, *extra: str, stdin: str | None = None) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--url", url, *extra]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def _round(url: str, mains: list[str], seconds: float, subscribers: int) -> dict[str, Any]:
    follow = None
    if subscribers:
        follow = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--role", "follow", "--url", url,
             "--subscribers", str(subscribers)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follow.stdout is not None
        assert follow.stdout.readline().strip() == "ready"
    lines = _role("load", url, "--seconds", str(seconds), stdin=json.dumps(mains))
    result: dict[str, Any] = json.loads(lines[-1])
    if follow is not None:
        out, _ = follow.communicate("", timeout=60)
        read = json.loads(out.splitlines()[-1])
        result["events_per_subscriber_per_s"] = read["events"] / subscribers / read["seconds"]
    result["rate"] = result["spawns"] / seconds
    return result


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--role", choices=("load", "follow"), default=None)
    parser.add_argument("--url", default=None)
    parser.add_argument("--seconds", type=float, default=0.0)
    args = parser.parse_args()
    if args.role is not None:
        host, port = args.url.removeprefix("http://").rsplit(":", 1)
        if args.role == "load":
            mains = json.loads(sys.stdin.read())
            print(json.dumps(asyncio.run(_load(host, int(port), mains, args.seconds))))
        else:
            asyncio.run(_follow(host, int(port), args.subscribers))
        return

    pairs, seconds = (2, 3.0) if args.quick else (4, 8.0)
    store = tempfile.mkdtemp(prefix="bench-http-")
    load_before = os.getloadavg()[0]
    node, url = _start_node(store)
    try:
        mains = _mains(url, args.connections)
        log(f"node at {url}; {args.connections} connections, {pairs} pairs of {seconds:g} s rounds")
        without: list[dict[str, Any]] = []
        with_subs: list[dict[str, Any]] = []
        for pair in range(pairs):
            order = (0, args.subscribers) if pair % 2 == 0 else (args.subscribers, 0)
            for subs in order:
                got = _round(url, mains, seconds, subs)
                (with_subs if subs else without).append(got)
                log(
                    f"  pair {pair} subscribers={subs}: {got['rate']:.0f} spawns/s, "
                    f"p99 {_ms(got['latencies'], 0.99)} ms, refused {got['refused']}"
                )
    finally:
        node.terminate()
        node.wait(60)
        shutil.rmtree(store, ignore_errors=True)
    base = [x for r in without for x in r["latencies"]]
    loaded = [x for r in with_subs for x in r["latencies"]]
    ratios = [w["rate"] / b["rate"] for b, w in zip(without, with_subs, strict=True)]
    print(
        json.dumps(
            {
                "bench": "http",
                "connections": args.connections,
                "spawns_per_s": round(statistics.median(r["rate"] for r in without), 1),
                "p50_ms": _ms(base, 0.50),
                "p99_ms": _ms(base, 0.99),
                "event_subscribers": args.subscribers,
                "spawn_rate_ratio_with_subscribers": round(statistics.median(ratios), 3),
                "with_subscribers_spawns_per_s": round(
                    statistics.median(r["rate"] for r in with_subs), 1
                ),
                "with_subscribers_p99_ms": _ms(loaded, 0.99),
                "events_per_subscriber_per_s": round(
                    statistics.median(r["events_per_subscriber_per_s"] for r in with_subs), 1
                ),
                "refused": sum(r["refused"] for r in without + with_subs),
                "round_s": seconds,
                "pairs": pairs,
                "load_avg_before": round(load_before, 2),
                "load_avg_after": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
