"""Child processes of tests: stopping a server, killing a node with SIGKILL."""

from __future__ import annotations

import pathlib
import select
import signal
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace)


def line_then_kill_9(module: str, *args: str, wait: float = 60.0) -> str:
    """Run ``python -m module args`` from the repository's root, read the first
    line it prints (within ``wait`` seconds, or fail) and kill it with SIGKILL."""
    command = [sys.executable, "-m", module, *args]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], wait)
            assert ready, f"{module} printed nothing in {wait} s"
            line = child.stdout.readline().strip()
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(30)
    assert child.returncode == -signal.SIGKILL
    return line
