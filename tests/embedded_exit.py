"""Scripts that embed a node and end as a person's script does, for
``tests/test_embedded_exit.py``. Run as ``python -m tests.embedded_exit MODE
[STORE_DIR]``; each prints ``ready`` (or one JSON line) once it is where the
test wants it.

- ``stuck``: ``with Node(...)``, three workers that never reach a checkpoint
  (so never wrap up: the shutdown would wait the whole 30 s grace), and the
  main thread waiting for one of them: for Ctrl-C, twice.
- ``wraps_up``: the same with workers that wrap up at their checkpoint: one
  Ctrl-C ends it.
- ``no_shutdown STORE``: a node on the store, a worker run, a branch left
  running at a checkpoint; prints what recovery found as JSON and ends
  without ``shutdown()``.
- ``killed STORE``: a node on the store that prints ``ready`` and waits to
  be killed with SIGKILL.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from sessiontree.supervision import Agent, Node, NodeConfig

WORKERS = 3


def idle_main(session: Any) -> None:
    return None


def main() -> None:
    mode = sys.argv[1]
    started = threading.Semaphore(0)

    def stuck(session: Any) -> str:
        started.release()
        while True:  # no checkpoint: a cancel is never seen here
            time.sleep(0.05)

    def wraps_up(session: Any) -> str:
        started.release()
        session.sleep(3600)  # a checkpoint: a cancel ends it at once
        return "done"

    def quick(session: Any) -> str:
        return "ok"

    skills = {"main": idle_main, "stuck": stuck, "wraps_up": wraps_up, "quick": quick}
    agent = Agent("agent", skills, main_skill="main")
    config = NodeConfig()
    if mode in ("stuck", "wraps_up"):
        with Node([agent], config) as node:
            main_ref = node.main("agent")
            workers = [main_ref.spawn(kind="worker", skill=mode).ref for _ in range(WORKERS)]
            for _ in range(WORKERS):
                started.acquire()
            print("ready", flush=True)
            workers[0].wait()  # where a Ctrl-C finds the script
        return
    node = Node([agent], config, store=sys.argv[2])
    if mode == "killed":
        print("ready", flush=True)
        threading.Event().wait()
    assert node.main("agent").run(kind="worker", skill="quick").ok
    node.main("agent").spawn(kind="branch", skill="wraps_up")
    started.acquire()
    print(
        json.dumps({"replay_held": node.recovery.replay_held, **node.recovery.figures}), flush=True
    )
    # ends here: no shutdown(), no with block


if __name__ == "__main__":
    main()
