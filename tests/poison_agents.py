"""Agents for ``tests/test_poison.py`` (``--agents tests.poison_agents:agents``).

The Main logs every cycle it completes as one JSON line, ``{"text", "attempt"}``,
to the file ``POISON_LOG`` names (fsync'd, so a kill right after loses none).
A message ``{"text": ..., "poison": true}`` kills the node's process with
SIGKILL while the file ``POISON_FLAG`` names exists: the poison message of a
death spiral, until the operator "fixes" it by removing the flag. A message
with ``"gate": true`` waits (bounded) until the file ``POISON_GATE`` names
exists, so a test can queue messages behind it.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from sessiontree.protocol import SessionResult
from sessiontree.supervision import Agent


def agents() -> list[Agent]:
    log = Path(os.environ["POISON_LOG"])  # read once, at start-up, never by a skill
    flag = Path(os.environ["POISON_FLAG"])
    gate = Path(os.environ["POISON_GATE"])

    def main(session: Any) -> None:
        message = session.message
        if isinstance(message, SessionResult):
            text = f"result {message.session_id}"
        else:
            if message.get("poison") and flag.exists():
                os.kill(os.getpid(), signal.SIGKILL)
            for _ in range(3000):  # at most 30 s
                if not message.get("gate") or gate.exists():
                    break
                session.sleep(0.01)
            text = message["text"]
        line = json.dumps({"text": text, "attempt": session.attempt}) + "\n"
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    return [Agent("poison", {"main": main}, main_skill="main")]
