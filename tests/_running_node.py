"""A standalone node as a real subprocess (``sessiontree node start``), for tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_WAIT = 60.0  # real seconds a node may take to start listening


class RunningNode:
    """``sessiontree node start --port 0`` in a subprocess; ``url`` once it listens.

    The effective-config line is parsed into ``config``/``sources``; stderr
    goes to a file (``log()``) so a chatty node never blocks on a pipe.
    """

    def __init__(
        self,
        store: Path,
        *args: str,
        env: dict[str, str] | None = None,
        agents: str = "tests.node_agents:agents",
    ) -> None:
        self.stderr_path = store.parent / f"{store.name}-node-{time.monotonic_ns()}.log"
        self._stderr = self.stderr_path.open("w")
        command = [sys.executable, "-m", "sessiontree.cli", "-v", "node", "start"]
        command += ["--store", str(store), "--port", "0", "--agents", agents, *args]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self.line(START_WAIT)
        payload = json.loads(first)
        self.config: dict[str, Any] = payload["effective_config"]
        self.sources: dict[str, str] = payload["sources"]
        listening = self.line(START_WAIT)
        assert listening.startswith("listening on "), listening
        self.url = listening.split()[2]
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self, timeout: float) -> str:
        """The next stdout line; fails (with the node's stderr) if none comes."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            self.kill()
            msg = f"node printed nothing more; stderr:\n{self.log()}"
            raise AssertionError(msg)
        return line

    def log(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text()

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        """Wait (bounded) until ``text`` appears on the node's stderr."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                msg = f"{text!r} never appeared; stderr:\n{self.log()}"
                raise AssertionError(msg)
            time.sleep(0.05)

    def send(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the node and wait for its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.close()

    def close(self) -> None:
        if hasattr(self, "http"):
            self.http.close()
        self._stderr.close()
