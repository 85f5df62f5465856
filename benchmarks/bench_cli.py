"""Benchmark: the CPU a ``sessiontree`` command costs, start-up included.

    python benchmarks/bench_cli.py [--quick]

Each figure is the user + system CPU of a real subprocess running the
console script (``sessiontree`` beside this interpreter; ``python -m
sessiontree.cli`` if there is none), read from the kernel's accounting of
the child once it has exited, the median of the runs. The read commands run
against a real node (``sessiontree node start --store DIR --port 0`` on
127.0.0.1, the built-in ``assistant`` agent) holding one Main and a few
finished workers, so they parse a real answer.

* ``cli_version_cpu_s`` — ``sessiontree --version``;
* ``cli_help_cpu_s`` — ``sessiontree --help``;
* ``cli_ls_cpu_s`` — ``sessiontree sessions ls --node URL``;
* ``cli_show_cpu_s`` — ``sessiontree sessions show ID --node URL``;
* ``cli_status_cpu_s`` — ``sessiontree node status --node URL``;
* ``python_cpu_s`` — the interpreter alone (``python -c pass``), the floor
  every figure above includes;
* ``target_cpu_s`` — 0.4, the figure each command should stay under.

``--quick``: 3 runs of each (full: 15).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from _common import log

TARGET_CPU_S = 0.4
WORKERS = 5  # finished workers under the Main, so ``ls`` has rows to print


def _command() -> list[str]:
    script = Path(sys.executable).parent / "sessiontree"
    return [str(script)] if script.exists() else [sys.executable, "-m", "sessiontree.cli"]


def _cpu(argv: list[str]) -> float:
    """User + system CPU seconds of one run of ``argv`` (exit 0 expected)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        msg = f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}"
        raise SystemExit(msg)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _median_cpu(argv: list[str], runs: int) -> float:
    figures = [_cpu(argv) for _ in range(runs)]
    return round(statistics.median(figures), 3)


def _start_node(store: str) -> tuple[subprocess.Popen[str], str]:
    command = [*_command(), "node", "start", "--store", store, "--port", "0", "--no-memory-probe"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, line.split()[2]
    msg = f"the node did not start (exit {proc.wait()})"
    raise SystemExit(msg)


def _populate(url: str) -> str:
    """One Main with ``WORKERS`` finished workers under it; the Main's id."""
    with httpx.Client(base_url=url, timeout=30.0) as http:
        main = http.post("/v1/sessions", json={"agent_id": "assistant"}).raise_for_status()
        main_id = str(main.json()["info"]["session_id"])
        for _ in range(WORKERS):
            child = http.post(
                f"/v1/sessions/{main_id}/children", json={"kind": "worker", "task": "0"}
            ).raise_for_status()
            child_id = child.json()["info"]["session_id"]
            http.get(f"/v1/sessions/{child_id}/result", params={"timeout": 10}).raise_for_status()
    return main_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = 3 if args.quick else 15
    cli = _command()
    load_before = os.getloadavg()[0]
    store = tempfile.mkdtemp(prefix="bench-cli-")
    node, url = _start_node(os.path.join(store, "node"))
    try:
        main_id = _populate(url)
        log(f"node at {url}; {runs} runs of each command ({' '.join(cli)})")
        figures = {
            "python_cpu_s": _median_cpu([sys.executable, "-c", "pass"], runs),
            "cli_version_cpu_s": _median_cpu([*cli, "--version"], runs),
            "cli_help_cpu_s": _median_cpu([*cli, "--help"], runs),
            "cli_ls_cpu_s": _median_cpu([*cli, "sessions", "ls", "--node", url], runs),
            "cli_show_cpu_s": _median_cpu([*cli, "sessions", "show", main_id, "--node", url], runs),
            "cli_status_cpu_s": _median_cpu([*cli, "node", "status", "--node", url], runs),
        }
        for name, value in figures.items():
            log(f"  {name}: {value:.3f} s")
    finally:
        node.terminate()
        node.wait(60)
        shutil.rmtree(store, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "cli",
                **figures,
                "target_cpu_s": TARGET_CPU_S,
                "runs": runs,
                "load_avg_before": round(load_before, 2),
                "load_avg_after": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
