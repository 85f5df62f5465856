"""The examples run as a user would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_asyncio_example_prints_every_result() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "asyncio_app.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines() == [
        "completed: found 'how do supervisors restart children? in docs'",
        "completed: found 'how do supervisors restart children? in issues'",
        "failed: crashed",
    ]
