"""Where the time goes, from a py-spy speedscope profile (one profile per thread).

    py-spy record --threads --gil -r 250 -f speedscope -o prof.json -- \\
        python benchmarks/bench_peers.py --only cpu --systems memory/spawn_many \\
        --trees 15000 --rounds 1
    python benchmarks/_profile.py prof.json [--top 15]

Prints each thread's share of the samples, the hottest frames by self time
(the innermost frame of each sample) with the thread they ran on, and the
hottest sessiontree functions by inclusive time. Samples taken while a
module was being imported (start-up) are left out. With ``--gil`` py-spy
samples only the thread holding the GIL, so the shares are of the Python
time the process had.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from typing import Any

_THREAD = re.compile(r'Thread \d+ "(.*)"')


def thread_of(profile_name: str) -> str:
    """A thread's role from its name (numbered pool threads folded together)."""
    match = _THREAD.match(profile_name)
    name = match.group(1) if match else profile_name
    if not name:
        return "main (the application's loop)"
    return re.sub(r"[-_]\d+$", "-N", name)


def frame_label(frame: dict[str, Any]) -> str:
    path = str(frame.get("file") or "")
    for marker in ("/site-packages/", "/wt-peers-bench/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{frame['name']} ({path}:{frame.get('line')})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a speedscope JSON file written by py-spy")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    with open(args.profile, encoding="utf-8") as fh:
        data = json.load(fh)
    frames = data["shared"]["frames"]
    importing = {i for i, f in enumerate(frames) if f["name"] == "_find_and_load"}
    ours = {
        i
        for i, f in enumerate(frames)
        if any(f"/{p}/" in str(f.get("file")) for p in ("supervision", "actors", "store"))
    }
    per_thread: Counter[str] = Counter()
    self_time: Counter[tuple[int, str]] = Counter()
    inclusive: Counter[int] = Counter()
    for profile in data["profiles"]:
        thread = thread_of(profile["name"])
        weights = profile.get("weights") or [1] * len(profile["samples"])
        for stack, weight in zip(profile["samples"], weights, strict=True):
            if not stack or importing.intersection(stack):
                continue
            per_thread[thread] += weight
            innermost = stack[-1] if len(stack) > 1 else -1  # the thread's own frame only
            self_time[(innermost, thread)] += weight
            for index in set(stack) & ours:
                inclusive[index] += weight
    total = sum(per_thread.values())
    if not total:
        print("no samples")
        return 1
    print(f"{total:.1f} sample weight (start-up left out)")
    print("\nshare per thread:")
    for thread, n in per_thread.most_common():
        print(f"  {n / total:6.1%}  {thread}")
    print(f"\nthe {args.top} hottest frames by self time:")
    for (index, thread), n in self_time.most_common(args.top):
        label = "(no Python frame)" if index < 0 else frame_label(frames[index])
        print(f"  {n / total:6.1%}  {label}  [{thread}]")
    print(f"\nthe {args.top} hottest sessiontree functions, inclusive:")
    for index, n in inclusive.most_common(args.top):
        print(f"  {n / total:6.1%}  {frame_label(frames[index])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
