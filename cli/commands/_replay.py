"""``sessiontree replay``: run a recorded subtree again, on this machine.

A run spawned with ``record=True`` is recorded in its node's store. This
command reads the recording from a store directory (``--store``, read-only,
also while a node runs) or from a file an earlier ``--export`` wrote
(``--file``), and replays it with the agents ``--agents`` names (their code
as it is now) on a virtual clock, in this process, with no network. It
prints whether the replay was identical or where it first diverged: the
session (its place in the subtree, ``0`` the root, ``0.2`` its third
child), the step, what was recorded and what happened. Without an ID it
lists the store's recordings; ``--export FILE`` writes one to a file
instead of replaying it.

Exit codes: 0 identical (or listed, exported); 1 the replay diverged, or the
recording cannot be read (one line on stderr says why: not recorded,
incomplete, another format, truncated); 2 a usage error (``--agents`` that
cannot be loaded among them).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import click
import msgspec

from sessiontree.cli._agents import BUILTIN, AgentLoadError, load_agents
from sessiontree.cli._client import STORE_OPTION, resolve_source
from sessiontree.cli._exits import failure
from sessiontree.cli._ids import resolve_id, store_candidates
from sessiontree.cli._text import echo, shown
from sessiontree.cli._times import iso, utc
from sessiontree.cli._words import plural
from sessiontree.protocol import Recording, ReplayReport, SessionTreeError
from sessiontree.store import RecordingRecord, Store
from sessiontree.supervision import Node, load_recording, stored_recording

__all__ = ["replay_cmd"]


def _records(store_dir: Path) -> list[RecordingRecord]:
    try:
        with Store(store_dir, readonly=True) as store:
            return store.recordings()
    except (SessionTreeError, OSError) as exc:
        raise failure(exc, f"cannot read store {store_dir}: ") from None


def _from_store(store_dir: Path, text: str) -> Recording:
    try:
        store = Store(store_dir, readonly=True)
    except (SessionTreeError, OSError) as exc:
        raise failure(exc, f"cannot read store {store_dir}: ") from None
    with store:
        candidates = store_candidates(store, db="recordings")
        full = resolve_id(text, candidates, what="recording", hint="ID")
        try:
            return stored_recording(store, uuid.UUID(full))
        except (SessionTreeError, OSError) as exc:
            raise failure(exc) from None


def _listing(store_dir: Path, as_json: bool) -> None:
    records = _records(store_dir)
    if as_json:
        plain = [
            {
                "recording_id": str(r.recording_id),
                "agent_id": r.agent_id,
                "started_at": iso(r.started_at),
                "complete": r.complete,
            }
            for r in records
        ]
        echo(json.dumps(plain))
        return
    if not records:
        echo("no recordings")
    for r in records:
        state = "complete" if r.complete else "incomplete"
        echo(shown(f"{r.recording_id}  {utc(r.started_at)}  {r.agent_id}  {state}"))


def _say(report: ReplayReport) -> str:
    if report.identical:
        return (
            f"identical: {plural(report.sessions, 'session')}, {plural(report.steps, 'step')} "
            "replayed in "
            f"{report.replayed_s:.3f} clock seconds (recorded: {report.recorded_s:.3f}; "
            f"recording {report.recording_id})"
        )
    found = report.divergence
    assert found is not None
    return "\n".join(
        (
            shown(
                f"diverged at session {found.session} ({found.skill}, recorded as "
                f"{found.session_id}), step {found.step}"
            ),
            f"  recorded: {shown(found.recorded)}",
            f"  happened: {shown(found.happened)}",
        )
    )


@click.command("replay")
@click.argument("recording_id", metavar="[ID]", required=False)
@STORE_OPTION
@click.option(
    "--file",
    "file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Replay a recording an --export wrote (instead of one in a store).",
)
@click.option(
    "--agents",
    default=BUILTIN,
    show_default=True,
    metavar="MODULE:OBJECT",
    help="The agents whose code replays it (an Agent, a list, or a callable returning either).",
)
@click.option(
    "--export",
    "export",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the recording to this file instead of replaying it.",
)
@click.option(
    "--timeout", default=60.0, show_default=True, help="Real seconds the replay may take."
)
@click.option("--json", "as_json", is_flag=True, help="Only JSON on stdout.")
def replay_cmd(
    recording_id: str | None,
    store_dir: Path | None,
    file: Path | None,
    agents: str,
    export: Path | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Replay a recorded run (or list the store's recordings, or export one)."""
    if file is not None:
        if recording_id is not None:
            raise click.UsageError("give an ID or --file, not both")
        try:
            recording = load_recording(file)
        except (SessionTreeError, OSError) as exc:
            raise failure(exc, f"cannot read {file}: ") from None
    else:
        source = resolve_source(None, store_dir)
        if source.store_dir is None:
            raise click.UsageError("replay reads a store: give --store DIR (or --file FILE)")
        if recording_id is None:
            _listing(source.store_dir, as_json)
            return
        recording = _from_store(source.store_dir, recording_id)
    if export is not None:
        try:
            export.write_bytes(recording.encode())
        except OSError as exc:
            raise failure(exc, f"cannot write {export}: ") from None
        echo(f"exported recording {recording.recording_id} to {export}")
        return
    try:
        loaded = load_agents(agents)
    except AgentLoadError as exc:  # the value given cannot be loaded: a usage error
        raise click.UsageError(str(exc)) from None
    try:
        report = Node.replay_recording(recording, loaded, timeout=timeout)
    except SessionTreeError as exc:
        raise failure(exc) from None
    echo(msgspec.json.encode(report).decode() if as_json else _say(report))
    if not report.identical:
        click.get_current_context().exit(1)
