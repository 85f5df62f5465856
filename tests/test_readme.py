"""The README's examples run and print what the README says they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_readme_quick_start_is_exactly_two_make_commands() -> None:
    blocks = re.findall(
        r"## Quick start\n+```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL
    )
    assert blocks == ["make demo\nmake test\n"]


@pytest.mark.parametrize(
    "number",
    [0, 1, 2, 3, 4, 5, 6, 7, 8],
    ids=[
        "embedding",
        "shared-client",
        "application-loop",
        "scaling-out",
        "conversations",
        "one-context",
        "patterns",
        "recording",
        "model-calls",
    ],
)
@pytest.mark.timeout(120)  # the example's own bound (90 s, for process pools under load) first
def test_readme_example_prints_what_it_promises(tmp_path: Path, number: int) -> None:
    blocks = python_blocks()
    assert len(blocks) == 9
    example = blocks[number]
    promised = [line.split("# -> ", 1)[1] for line in example.splitlines() if "# -> " in line]
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == promised
