"""``node.recordings``: a node's recordings, for its user: read one, export it
to a file, replay it (issue 26; ``_recording`` makes them, ``_replay`` runs
them again). The group is not called ``replay``: that word already names
what recovery does after a crash (``node.recovery.replay_held``)."""

from __future__ import annotations

import os
from pathlib import Path

from sessiontree.protocol import Recording, RecordingError, ReplayReport
from sessiontree.supervision._faces import offloaded
from sessiontree.supervision._node_core import NodeCore
from sessiontree.supervision._recording import Recorder
from sessiontree.supervision._refs import SessionIdLike, as_session_id
from sessiontree.supervision._replay import replay_recording

__all__ = ["MAX_RECORDING_BYTES", "Recordings", "load_recording"]


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


class Recordings:
    """``node.recordings``: the node's recordings (a spawn with ``record=True``
    makes one). Reading one waits on the calling thread; ``areplay`` runs a
    replay on a worker thread."""

    __slots__ = ("_node",)

    def __init__(self, node: NodeCore) -> None:
        self._node = node

    def recording(self, session_id: SessionIdLike, timeout: float | None = 10.0) -> Recording:
        """The recording of the run rooted at ``session_id``, once every session
        of it has ended and it is written (waits up to ``timeout`` real
        seconds for a run still going). ``RecordingError``: ``not_recorded``,
        ``incomplete`` (still running at the timeout, or the node stopped
        before it ended), or why a stored one does not decode."""
        sid = as_session_id(session_id, "session_id")
        tapes = self._node._runtime.extensions.find(Recorder)
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
        node = self._node  # a ``Node``: the replay makes another of its class
        agents = node._runtime.agents.values()
        return replay_recording(type(node), recording, agents, timeout=timeout)

    areplay = offloaded(replay)
