"""A node under a write-heavy workload, to be killed with SIGKILL by
``tests/test_crash_recovery.py`` (nothing acknowledged is lost to a kill -9).

Run as ``python -m tests.crash_node STORE_DIR ACK_LOG SEED`` from the
repository root. It opens a ``Node`` on STORE_DIR (recovering whatever an
earlier run left there), and several threads drive Mains, inbound messages,
branch spawns, waits, suspensions and cancels. Every operation whose API
call returned (so the runtime acknowledged it as durable) is appended to
ACK_LOG as one JSON line, written and flushed only after the call returned:

- ``{"op": "main", "key", "id"}`` — ``node.main`` returned (record durable)
- ``{"op": "spawn", "id", "parent", "kind"}`` — ``node.spawn`` returned a session
  (record durable)
- ``{"op": "child", "id", "parent", "kind"}`` — a branch's skill spawned a child
  (answered at once: nothing outside the process was promised; its record is
  queued, and is durable no later than anything the child writes)
- ``{"op": "send", "main", "text"}`` — ``node.send`` accepted (in the durable inbox)
- ``{"op": "memory", "id", "key", "seq", "nonce", "value"}`` — ``memory_put`` returned
- ``{"op": "result", "id", "status"}`` — ``ref.wait`` returned (terminal write durable)
- ``{"op": "cycle", "text", "attempt"}`` — a Main's cycle for a message reached its
  end (``session.attempt``: a rerun after a crash says so)

It runs until killed, and exits by itself after ``RUN_FOR`` seconds.
``make_agents`` is imported by the test, so the recovering node runs the
same skills.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sessiontree.protocol import (
    Outcome,
    SessionKind,
    SessionResult,
    SessionState,
    SessionTreeError,
)
from sessiontree.supervision import Agent, Node, NodeConfig, SessionRef

AGENT_ID = "crash"
MAIN_KEYS = tuple(f"internal:thread:m{i}" for i in range(4))
_BRANCHES = ("branch", "branch_async")
_WORKERS = ("worker", "worker_async")
RUN_FOR = 60.0  # real seconds; the test kills the process long before
CONFIG = NodeConfig(grace=0.5, max_step_threads=128, ask_timeout=20.0)

Ack = Callable[..., None]


def _no_ack(op: str, **fields: Any) -> None:
    return None


def make_agents(ack: Ack = _no_ack) -> list[Agent]:
    """The agent of the crash workload; ``ack`` logs a branch's acknowledged
    memory writes and spawns (the recovering node in the test passes none).

    The Main appends each message and child result it runs a cycle for to its
    context. A branch writes shared memory, spawns workers (and sometimes a
    branch of its own), collects them, may block (sleep, a checkpoint loop,
    or until cancelled) and may crash, as its spawn's metadata says.
    """

    def main(session: Any) -> None:
        """One message cycle: append what it ran for to the Main's context (then
        raise, when the message asks for it: the cycle fails, the context stays);
        a message's cycle logs its attempt as it ends."""
        message = session.message
        if isinstance(message, SessionResult):
            entry = {"result": str(message.session_id), "status": message.status.value}
            session.add_message("tool", entry)
        else:
            session.add_message("user", message)
            if message.get("pause"):
                # a model call, not a checkpoint: the cycle counts as running (so
                # wait_idle waits for it), and a crash may cut it here
                time.sleep(message["pause"])
            ack("cycle", text=message["text"], attempt=session.attempt)
            if message.get("fail"):
                raise RuntimeError("a planned failure of a message cycle")

    def branch(session: Any) -> Outcome:
        plan = session.info.metadata
        nonce = uuid.uuid4().hex[:12]  # a rerun after a restart writes keys of its own
        memory_ids = []
        for seq in range(plan["writes"]):
            key, value = _memory_entry(session, nonce, seq)
            memory_id = session.memory_put(key, value)
            ack("memory", id=memory_id, key=key, seq=seq, nonce=nonce, value=value)
            memory_ids.append(memory_id)
        children = []
        for spec in _children(plan):
            spawned = session.spawn(**spec)
            if spawned.session_id is not None:
                ack("child", id=str(spawned.session_id), parent=id_of(session), kind=spec["kind"])
                children.append(spawned.session_id)
        if children:
            session.collect(children, timeout=plan["pause"] * 20)
        if plan["block"] == "sleep":
            session.sleep(plan["pause"])
        elif plan["block"] == "loop":
            deadline = time.monotonic() + plan["pause"]
            while time.monotonic() < deadline:
                session.checkpoint()
                session.sleep(0.005)
        elif plan["block"] == "long":
            session.sleep(RUN_FOR)
        if plan["crash"]:
            raise RuntimeError("a planned crash")
        return Outcome(summary=f"branch {nonce}", memory_ids=tuple(memory_ids))

    async def branch_async(session: Any) -> Outcome:
        plan = session.info.metadata
        nonce = uuid.uuid4().hex[:12]
        memory_ids = []
        for seq in range(plan["writes"]):
            key, value = _memory_entry(session, nonce, seq)
            memory_id = await session.memory_put(key, value)
            ack("memory", id=memory_id, key=key, seq=seq, nonce=nonce, value=value)
            memory_ids.append(memory_id)
        children = []
        for spec in _children(plan):
            spawned = await session.spawn(**spec)
            if spawned.session_id is not None:
                ack("child", id=str(spawned.session_id), parent=id_of(session), kind=spec["kind"])
                children.append(spawned.session_id)
        if children:
            await session.collect(children, timeout=plan["pause"] * 20)
        if plan["block"] in ("sleep", "loop"):
            await session.sleep(plan["pause"])
        elif plan["block"] == "long":
            await session.sleep(RUN_FOR)
        if plan["crash"]:
            raise RuntimeError("a planned crash")
        return Outcome(summary=f"branch {nonce}", memory_ids=tuple(memory_ids))

    def worker(session: Any) -> dict[str, str]:
        session.checkpoint()
        return {"done": session.task}

    async def worker_async(session: Any) -> dict[str, str]:
        await session.checkpoint()
        return {"done": session.task}

    skills = {
        "main": main,
        "branch": branch,
        "branch_async": branch_async,
        "worker": worker,
        "worker_async": worker_async,
    }
    return [Agent(AGENT_ID, skills, default_skill="branch", main_skill="main", max_children=64)]


def _memory_entry(session: Any, nonce: str, seq: int) -> tuple[str, dict[str, Any]]:
    # two keys per run, each overwritten in turn: seq 0, 2, 4… and 1, 3, 5…
    key = f"b/{session.session_id}/{nonce}/{seq % 2}"
    return key, {"branch": str(session.session_id), "nonce": nonce, "seq": seq}


def _children(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """What a branch spawns: its workers, and a branch of its own if planned."""
    specs: list[dict[str, Any]] = [
        {"kind": "worker", "skill": _WORKERS[n % 2], "task": f"w{n}"}
        for n in range(plan["workers"])
    ]
    if plan.get("sub") is not None:
        specs.append({"kind": "branch", "skill": plan["sub_skill"], "metadata": plan["sub"]})
    return specs


def id_of(session: Any) -> str:
    """A session's id as the ack log writes it."""
    return str(session.session_id)


class AckLog:
    """One JSON line per acknowledged operation, flushed as it is written."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run
        self._lock = threading.Lock()

    def __call__(self, op: str, **fields: Any) -> None:
        line = json.dumps({"op": op, **fields}, sort_keys=True) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class Workload:
    """The driver threads; each draws its choices from its own seeded generator."""

    def __init__(self, node: Node, ack: AckLog, seed: int) -> None:
        self.node = node
        self.ack = ack
        self.seed = seed
        self.stop = threading.Event()
        self.mains: list[SessionRef] = []
        # (branch, counted in in_flight): what the waiter threads wait for
        self.to_wait: queue.Queue[tuple[SessionRef, bool]] = queue.Queue()
        self.in_flight = threading.Semaphore(24)  # short branches not yet waited for
        self.long: list[SessionRef] = []  # branches that block until cancelled
        self.long_lock = threading.Lock()

    def rng(self, stream: int) -> random.Random:
        return random.Random(self.seed * 1009 + stream)

    def run(self) -> list[threading.Thread]:
        for key in MAIN_KEYS:
            ref = self.node.main(AGENT_ID, key)
            self.ack("main", key=key, id=id_of(ref))
            self.mains.append(ref)
        loops: list[tuple[str, Callable[[random.Random], None]]] = [
            ("send", self.send),
            ("spawn-0", self.spawn),
            ("spawn-1", self.spawn),
            ("wait-0", self.wait),
            ("wait-1", self.wait),
            ("control", self.control),
        ]
        threads = []
        for stream, (name, step) in enumerate(loops):
            thread = threading.Thread(
                target=self._loop, args=(name, step, self.rng(stream)), name=name, daemon=True
            )
            thread.start()
            threads.append(thread)
        return threads

    def _loop(self, name: str, step: Callable[[random.Random], None], rng: random.Random) -> None:
        while not self.stop.is_set():
            try:
                step(rng)
            except SessionTreeError as exc:  # reported, the workload goes on
                print(f"{name}: {exc!r}", file=sys.stderr, flush=True)
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.003)  # vary the interleavings

    def send(self, rng: random.Random) -> None:
        main = rng.choice(self.mains)
        text = f"{self.seed}-{uuid.uuid4().hex[:12]}"
        pause = rng.uniform(0.002, 0.02) if rng.random() < 0.1 else 0.0
        message = {"text": text, "fail": rng.random() < 0.1, "pause": pause}
        if self.node.send(main, message) is None:
            self.ack("send", main=id_of(main), text=text)

    def spawn(self, rng: random.Random) -> None:
        with self.long_lock:
            may_block = len(self.long) < 6
        plan = _plan(rng, may_block=may_block)
        if rng.random() < 0.2:
            plan["sub"] = _plan(rng, may_block=rng.random() < 0.3)
            plan["sub_skill"] = rng.choice(_BRANCHES)
        long = plan["block"] == "long"
        if not long:
            self.in_flight.acquire()
        main = rng.choice(self.mains)
        spawned = self.node.spawn(
            main,
            kind="branch",
            skill=rng.choice(_BRANCHES),
            task="crash",
            metadata=plan,
            ttl=plan["pause"] * 3 if rng.random() < 0.1 else None,  # some expire mid-way
        )
        if spawned.ref is None:
            if not long:
                self.in_flight.release()
            return
        self.ack("spawn", id=str(spawned.ref.session_id), parent=id_of(main), kind="branch")
        if long:
            with self.long_lock:
                self.long.append(spawned.ref)
        else:
            self.to_wait.put((spawned.ref, True))

    def wait(self, rng: random.Random) -> None:
        try:
            ref, counted = self.to_wait.get(timeout=0.1)
        except queue.Empty:
            return
        try:
            result = ref.wait(timeout=20.0)
        finally:
            if counted:
                self.in_flight.release()
        if result is not None:
            self.ack("result", id=str(ref.session_id), status=result.status.value)

    def control(self, rng: random.Random) -> None:
        """Suspend a running branch, resume a suspended one (also one a restart
        brought back), cancel a blocking one, or now and then a Main."""
        choice = rng.random()
        if choice < 0.3:
            running = self.node.sessions(SessionState.ACTIVE, SessionKind.BRANCH)
            running = [info for info in running if info.ttl is None or info.ttl > RUN_FOR]
            if running:  # never one whose TTL could run out while it waits suspended
                self.node.suspend(rng.choice(running).session_id)
        elif choice < 0.7:
            suspended = self.node.sessions(SessionState.SUSPENDED, SessionKind.BRANCH)
            if suspended:
                self.node.resume(rng.choice(suspended).session_id)
        elif choice < 0.85:
            with self.long_lock:
                ref = self.long.pop(rng.randrange(len(self.long))) if self.long else None
            if ref is not None and self.node.cancel(ref) is None:
                self.to_wait.put((ref, False))
        elif choice < 0.87:
            # end a Main (its subtree's results are filed on it) and open its successor
            n = rng.randrange(len(self.mains))
            self.node.cancel(self.mains[n])
            ref = self.node.main(AGENT_ID, MAIN_KEYS[n])
            self.ack("main", key=MAIN_KEYS[n], id=id_of(ref))
            self.mains[n] = ref
        time.sleep(0.005)


def _plan(rng: random.Random, *, may_block: bool) -> dict[str, Any]:
    """What one branch does (its spawn's metadata)."""
    return {
        "writes": rng.randint(0, 4),
        "workers": rng.randint(0, 3),
        "block": rng.choice(["none", "none", "sleep", "loop", *(["long"] * may_block)]),
        "pause": rng.uniform(0.005, 0.1),
        "crash": rng.random() < 0.1,
    }


def main(argv: list[str]) -> None:
    store_dir, ack_path, seed = argv[0], argv[1], int(argv[2])
    ack = AckLog(ack_path)
    node = Node(make_agents(ack), CONFIG, store=store_dir)
    workload = Workload(node, ack, seed)
    workload.run()
    time.sleep(RUN_FOR)  # the test kills this process long before
    workload.stop.set()
    with contextlib.suppress(SessionTreeError):
        node.shutdown(grace=0.5, timeout=5.0)
    os._exit(0)  # driver threads may still block in waits


if __name__ == "__main__":
    main(sys.argv[1:])
