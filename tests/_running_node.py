"""A standalone node as a real subprocess (``sessiontree node start``), for tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_WAIT = 60.0  # real seconds a node may take to start listening


class RunningNode:
    """``sessiontree node start --port 0`` in a subprocess; ``url`` once it listens.
    ``program`` is how ``sessiontree`` is run (``python -m``, or the console script).

        The effective-config line is parsed into ``config``/``sources``. Both
        output streams are read by threads of their own, so a chatty node never
        blocks on a pipe and a test waits for a log line on an Event, not a sleep.
    """

    def __init__(
        self,
        store: Path,
        *args: str,
        env: dict[str, str] | None = None,
        agents: str = "tests.node_agents:agents",
        port: int | None = 0,
        cwd: Path = ROOT,
        program: tuple[str, ...] = (sys.executable, "-m", "sessiontree.cli"),
    ) -> None:
        command = [*program, "-v", "node", "start"]
        command += ["--store", str(store), "--agents", agents, *args]
        command += [] if port is None else ["--port", str(port)]  # None: the default port
        self.proc = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._log: list[str] = []
        self._logged = threading.Condition()
        self._log_ended = False
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._read_log, args=(self.proc.stderr,), daemon=True).start()
        payload = json.loads(self.line(START_WAIT))
        self.config: dict[str, Any] = payload["effective_config"]
        self.sources: dict[str, str] = payload["sources"]
        listening = self.line(START_WAIT)
        assert listening.startswith("listening on "), listening
        self.url = listening.split()[2]
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def _read(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _read_log(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                with self._logged:
                    self._log.append(line)
                    self._logged.notify_all()
        with self._logged:
            self._log_ended = True
            self._logged.notify_all()

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
        """What the node wrote to stderr so far."""
        with self._logged:
            return "".join(self._log)

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        """Wait (bounded) until ``text`` appears on the node's stderr."""
        with self._logged:
            found = self._logged.wait_for(
                lambda: self._log_ended or text in "".join(self._log), timeout
            )
            if not found or text not in "".join(self._log):
                msg = f"{text!r} never appeared; stderr:\n{''.join(self._log)}"
                raise AssertionError(msg)

    def send(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the node and wait for its exit code (and the end of its stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout)
            with self._logged:
                self._logged.wait_for(lambda: self._log_ended, 10.0)
            return code
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
