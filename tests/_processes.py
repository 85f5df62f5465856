"""Stopping a server a test started as a child process."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace)
