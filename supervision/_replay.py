"""Replaying a recorded subtree (issue 26).

``replay_recording`` runs the recorded root's spawn again on a node of its
own: in this process, on a virtual clock, with no store and no network.
Every session gets a ``PlayTape`` that hands its skill what the recording
says it met — clock readings, the random seed, model replies after the
time they took (the provider is never called) — reports its children's
run ends in the order their results arrived, files their results in the
takes the recording made, and keeps a cancellation from the skill until
the call where it reached it then. One that has not come by then is made
there (an operator's cancel, a TTL, a parent's ``cancel_child`` that the
replay has not reached yet), except a parent's end, which is waited for:
at that call a cancellation goes through. The clock moves only when every
skill waits: it jumps to the next timer, so model latencies, sleeps,
timeouts, TTLs and grace periods pass as they did, in no real time.

The first thing a session does that its tape does not hold is the
divergence: the replay stops there (the subtree is ended by force) and
reports the session, the step, what was recorded and what happened. A
replay that ran through compares each session's events and result with the
recording; the first difference is the divergence.

On failure: ``RecordingError`` (``incomplete``: the run never finished;
``unknown_agent``: no agent of the recording's id was given) before
anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from sessiontree.actors import RealClock, Session, VirtualClock
from sessiontree.protocol import Recording, RecordingError, ReplayReport, SessionKind
from sessiontree.supervision._config import Agent, NodeConfig
from sessiontree.supervision._playback import Player
from sessiontree.supervision._providers import Price, Provider
from sessiontree.supervision._recording import Recorder

__all__ = ["replay_recording"]

_MAIN = "__replay_main__"  # the replay's Main takes the root's result and does nothing
_HOLD = "__replay_hold__"  # a Branch standing in for an ancestor of a deeper root
_NOWHERE = "http://127.0.0.1:9/v1"  # a replay's provider: never called (its tape answers)
_SLACK = 3600.0  # clock seconds a replay may run past the recorded run before it stalls
_IDLE_WAIT = 5.0  # real seconds of one wait for the replay's skills to settle


def _absorb(session: Session) -> None:
    """The replay's Main: it takes the root's result and does nothing more."""


def _hold(session: Session) -> None:
    """An ancestor of a deeper root: it waits while the replay runs."""
    session.sleep(_SLACK * 1000)


def _replay_agent(agent: Agent) -> Agent:
    skills = {**agent.skills, _MAIN: _absorb, _HOLD: _hold}
    return dataclasses.replace(agent, skills=skills, main_skill=_MAIN)


def _providers(recording: Recording, agent: Agent) -> tuple[Provider, ...]:
    """Providers named as the recording's were, with its prices; never called."""
    names = set(recording.prices)
    if agent.models:
        names.add(agent.provider or "default")
    return tuple(
        Provider(
            base_url=_NOWHERE,
            name=name,
            prices={m: Price(*p) for m, p in recording.prices.get(name, {}).items()},
        )
        for name in sorted(names)
    )


def _span(recording: Recording) -> float:
    """How long the recorded run took, in clock seconds."""
    ends = [
        s.result.timings.ended_at
        for s in recording.sessions
        if s.result is not None
        and s.result.timings is not None
        and s.result.timings.ended_at is not None
    ]
    return max(ends, default=recording.started_at) - recording.started_at


def replay_recording(
    make_node: Callable[..., Any],
    recording: Recording,
    agents: Iterable[Agent],
    *,
    timeout: float = 60.0,
) -> ReplayReport:
    """Run ``recording`` again with ``agents``' code on a node ``make_node``
    makes (``Node``; see the module's docstring); ``timeout``: real seconds
    it may take at most (past it, it is reported as a divergence: the run
    did not end). ``RecordingError`` for an incomplete recording, one
    without a root, or a missing agent."""
    if not recording.complete:
        msg = f"the recording of {recording.recording_id} is incomplete"
        raise RecordingError(msg, reason="incomplete", session_id=recording.recording_id)
    agent = next((a for a in agents if a.agent_id == recording.agent_id), None)
    if agent is None:
        msg = f"no agent {recording.agent_id!r} to replay {recording.recording_id} with"
        raise RecordingError(msg, reason="unknown_agent", session_id=recording.recording_id)
    recording.root  # noqa: B018 - raises for a recording without one
    clock = VirtualClock(start=recording.started_at)
    config = NodeConfig(
        grace=recording.grace,
        providers=_providers(recording, agent),
        memory_probe=False,  # this machine's memory pressure must not suspend a replayed branch
    )
    node = make_node([_replay_agent(agent)], config, clock=clock)
    try:
        player = Player(recording, node, clock)
        extensions = node._runtime.extensions
        extensions.replace(extensions.find(Recorder), player)
        _start(node, agent.agent_id, player, config.max_ttl)
        if not player.stopped.is_set():
            _drive(node, clock, player, _span(recording) + 2 * recording.grace + _SLACK, timeout)
    finally:
        node.shutdown(grace=0.0)
    return player.report()


def _start(node: Any, agent_id: str, player: Player, ttl: float) -> None:
    """Spawn the recorded root at its depth: under the replay's Main, below a
    stand-in Branch for each ancestor it had between (a refusal is the
    divergence)."""
    recording = player.run
    parent = node.main(agent_id, f"replay:main:{recording.recording_id.hex}").session_id
    for _ in range(recording.depth - 1):
        holder = node.spawn(parent, kind=SessionKind.BRANCH, skill=_HOLD, ttl=ttl)
        if holder.session_id is None:
            player.stall(f"a stand-in for an ancestor was refused: {holder.error}")
            return
        parent = holder.session_id
    spawned = node.spawn(parent, recording.spec)
    if spawned.error is not None:
        player.stall(f"its spawn was refused: {spawned.error.message}")


def _drive(node: Any, clock: VirtualClock, player: Player, span: float, timeout: float) -> None:
    """Let the replay run; whenever every skill waits, jump to the next timer."""
    real = RealClock()
    give_up = real.monotonic() + timeout
    limit = clock.monotonic() + span
    while not player.stopped.is_set():
        left = give_up - real.monotonic()
        if left <= 0:
            player.stall(f"the replay did not end in {timeout} s")
            return
        idle = node.wait_idle(min(left, _IDLE_WAIT))
        if player.stopped.is_set():
            return
        if not idle:
            continue
        due = clock.next_timer
        if due is None or due > limit:
            player.stall("it waited for ever: nothing was left to wait for")
            return
        clock.advance(max(0.0, due - clock.monotonic()))
