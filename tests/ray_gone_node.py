"""A node whose Ray cluster disappears under a running step (issue: "a node
whose Ray cluster disappears marks the affected sessions failed with
``backend_unavailable`` and keeps serving the rest").

Run as ``python -m tests.ray_gone_node WORK_DIR`` from the repository root.
The node starts its own local Ray cluster (``ray_address="local"``: never
the test session's), runs one step on it and one
inline session, then SIGKILLs every process of the cluster (every
descendant of this process: GCS, raylet, workers). It prints one JSON line
of what it saw and exits 0 if the node lived through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sessiontree.actors.backends import RayBackend
from sessiontree.protocol import SessionKind
from sessiontree.supervision import Agent, Node, NodeConfig
from tests import _remote_skills as skills

WAIT = 60.0


def _main(session: Any) -> None:
    return None


def _descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def main(work: Path) -> int:
    skills.quiet_ray()
    agent = Agent(
        "agent",
        {"main": _main, "wraps_up": skills.wraps_up, "answer": skills.answer},
        main_skill="main",
    )
    node = Node([agent], NodeConfig(backend="ray", ray_address="local", ray_num_cpus=0))
    pool = node.backends.get("ray")
    assert isinstance(pool, RayBackend)
    assert pool.wait_ready(WAIT), "the Ray pool never came up"
    main_ref = node.main("agent")
    meta = {"dir": str(work)}
    step = node.spawn(main_ref, kind=SessionKind.WORKER, skill="wraps_up", metadata=meta).ref
    assert step is not None
    if skills.started_pid(work, step.session_id, WAIT) is None:
        msg = f"step {step.session_id} never started"
        raise TimeoutError(msg)
    killed = _descendants(os.getpid())
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    result = step.wait(WAIT)
    after = node.run(
        main_ref,
        kind=SessionKind.WORKER,
        skill="answer",
        backend="inline",
        metadata=meta,
        timeout=WAIT,
    )
    refused = node.spawn(main_ref, kind=SessionKind.WORKER, skill="answer", metadata=meta)
    let_go = pool.disconnected.wait(WAIT)
    report = {
        "killed": len(killed),
        "status": None if result is None else result.status.value,
        "code": None if result is None or result.error is None else result.error.code.value,
        "message": None if result is None or result.error is None else result.error.message,
        "inline_after": None if after is None else after.status.value,
        "refused": None if refused.error is None else refused.error.code.value,
        "disconnected": let_go,
    }
    node.shutdown(grace=0)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
