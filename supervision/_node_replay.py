"""A node's recordings, for its user: read one, export it to a file, replay it
(issue 26; ``_recording`` makes them, ``_replay`` runs them again)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path

from sessiontree.protocol import Recording, RecordingError, ReplayReport
from sessiontree.supervision._config import Agent
from sessiontree.supervision._recording import Recorder
from sessiontree.supervision._refs import NodeSessions, SessionIdLike, as_session_id
from sessiontree.supervision._replay import replay_recording

__all__ = ["MAX_RECORDING_BYTES", "NodeReplay", "load_recording"]


MAX_RECORDING_BYTES = 1 << 30
"""The largest recording file ``load_recording`` reads (1 GiB)."""


def load_recording(path: str | os.PathLike[str]) -> Recording:
    """A recording from a file ``export_recording`` wrote. ``RecordingError``
    (``too_large``: past ``MAX_RECORDING_BYTES``, checked before reading;
    ``version``, ``truncated``, ``malformed``) for a file that is not one
    this code reads; ``OSError`` if it cannot be read."""
    file = Path(path)
    size = file.stat().st_size
    if size > MAX_RECORDING_BYTES:
        msg = f"{file} holds {size} bytes; a recording is read up to {MAX_RECORDING_BYTES}"
        raise RecordingError(msg, reason="too_large")
    return Recording.decode(file.read_bytes())


class NodeReplay(NodeSessions):
    """``Node``'s recordings (a spawn with ``record=True`` makes one)."""

    def recording(self, session_id: SessionIdLike, timeout: float | None = 10.0) -> Recording:
        """The recording of the run rooted at ``session_id``, once every session
        of it has ended and it is written (waits up to ``timeout`` real
        seconds for a run still going). ``RecordingError``: ``not_recorded``,
        ``incomplete`` (still running at the timeout, or the node stopped
        before it ended), or why a stored one does not decode."""
        sid = as_session_id(session_id, "session_id")
        tapes = self._runtime.extensions.find(Recorder)
        assert tapes is not None
        return tapes.recording(sid, timeout)

    def export_recording(
        self, session_id: SessionIdLike, path: str | os.PathLike[str], timeout: float | None = 10.0
    ) -> Recording:
        """Write the recording of ``session_id`` to ``path`` (replayable on another
        machine with ``load_recording`` and ``replay``); raises as ``recording``,
        and ``OSError`` if the file cannot be written."""
        recording = self.recording(session_id, timeout)
        Path(path).write_bytes(recording.encode())
        return recording

    def replay(
        self, recording: SessionIdLike | Recording, *, timeout: float = 60.0
    ) -> ReplayReport:
        """Run a recorded subtree again with this node's agents (their code as it
        is now): on a virtual clock, in this process, on a node of its own with
        no store and no network, its inputs from the recording. Returns whether
        the results and events were identical, or where it first diverged (see
        ``ReplayReport``). ``recording``: the recorded root's id (read as
        ``recording`` reads it: a run still going is waited for up to 10 s)
        or a ``Recording`` (``load_recording``).
        ``timeout``: real seconds the replay may take. Raises ``RecordingError``
        as ``recording`` does, and ``unknown_agent`` when this node has no
        agent of the recording's."""
        if not isinstance(recording, Recording):
            recording = self.recording(recording)
        return self.replay_recording(recording, self._runtime.agents.values(), timeout=timeout)

    @classmethod
    def replay_recording(
        cls, recording: Recording, agents: Iterable[Agent], *, timeout: float = 60.0
    ) -> ReplayReport:
        """``replay`` with ``agents`` instead of a running node's (a recording
        from a file, on another machine: ``sessiontree replay --file``)."""
        return replay_recording(cls, recording, agents, timeout=timeout)

    async def areplay(
        self, recording: SessionIdLike | Recording, *, timeout: float = 60.0
    ) -> ReplayReport:
        """Awaitable ``replay`` (it runs on a worker thread)."""
        return await asyncio.to_thread(self.replay, recording, timeout=timeout)
