"""The built-in memory probe: how much of the memory this process may use is in use.

Where the process's cgroup has a memory limit (a container, a systemd unit
with ``MemoryMax``), that limit and the cgroup's use: cgroup v2
(``memory.max``, ``memory.current``) or v1 (``memory.limit_in_bytes``,
``memory.usage_in_bytes``), in the cgroup ``/proc/self/cgroup`` names and
each of its ancestors (a parent's limit binds its children too); the most
pressing level is the reading. Use counts only what the kernel cannot simply
drop: the inactive file cache (``inactive_file`` in ``memory.stat``;
``total_inactive_file`` in v1) is taken off, as the "working set" of
Kubernetes and cAdvisor is, because a node's own LMDB file pages would
otherwise fill any limit without any pressure. A limit of ``max`` (v2), one
no smaller than the machine's memory (v1 writes "no limit" as about 2**63),
or no limit anywhere: the machine's memory instead, from ``/proc/meminfo``
(``MemTotal`` less ``MemAvailable``).

A cgroup path that does not exist under the mount (a container without its
own cgroup namespace sees the host's path) is walked up to the mount's root,
which is then the container's own cgroup.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryProbe", "MemoryReading"]

log = logging.getLogger("sessiontree.memory")


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One reading: ``used`` of ``limit`` bytes, and where it came from
    (``cgroup v2 DIR``, ``cgroup v1 DIR`` or ``meminfo``)."""

    used: int
    limit: int
    source: str

    @property
    def fraction(self) -> float:
        """``used / limit``: 0.0 is empty, 1.0 full (briefly more is possible)."""
        return self.used / self.limit


# (limit file, usage file, the memory.stat line of reclaimable file cache)
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


class MemoryProbe:
    """Reads the memory in use as a fraction of what the process may use (see
    the module docstring); the paths are injectable for tests.

    ``read()`` returns a ``MemoryReading``, or None when nothing could be read
    (no cgroup limit and no ``/proc/meminfo``): said once in the log at
    WARNING, and again only after a reading succeeded in between. Calling the
    probe gives the fraction (or None), which is what ``NodeConfig``'s
    ``memory_pressure`` takes. It never raises; it runs on the Cortex's
    thread every ``check_interval`` and reads a handful of small files.
    """

    def __init__(
        self,
        *,
        proc_cgroup: Path | str = "/proc/self/cgroup",
        cgroup_root: Path | str = "/sys/fs/cgroup",
        meminfo: Path | str = "/proc/meminfo",
    ) -> None:
        self.proc_cgroup = Path(proc_cgroup)
        self.cgroup_root = Path(cgroup_root)
        self.meminfo = Path(meminfo)
        self._silent = False  # said once that nothing could be read

    def __call__(self) -> float | None:
        reading = self.read()
        return None if reading is None else reading.fraction

    def read(self) -> MemoryReading | None:
        """The most pressing reading of the cgroup's limits, else the machine's."""
        machine = self._machine()
        reading = self._cgroup(machine.limit if machine is not None else None) or machine
        if reading is None:
            if not self._silent:
                log.warning(
                    "memory probe: no cgroup memory limit under %s (per %s) and no readable %s; "
                    "memory pressure is not watched",
                    self.cgroup_root,
                    self.proc_cgroup,
                    self.meminfo,
                )
                self._silent = True
            return None
        self._silent = False
        return reading

    # -- the machine ----------------------------------------------------------------------

    def _machine(self) -> MemoryReading | None:
        try:
            text = self.meminfo.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            return None
        fields: dict[str, int] = {}
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
        total, available = fields.get("MemTotal"), fields.get("MemAvailable")
        if not total or available is None:
            return None
        return MemoryReading(used=max(0, total - available), limit=total, source="meminfo")

    # -- the cgroup -----------------------------------------------------------------------

    def _cgroup(self, machine: int | None) -> MemoryReading | None:
        """The highest fraction over the cgroup's levels that have a limit
        below ``machine`` (any limit when the machine's memory is unknown)."""
        best: MemoryReading | None = None
        for directory, files, version in self._levels():
            reading = _level(directory, files, version)
            if reading is None or (machine is not None and reading.limit >= machine):
                continue
            if best is None or reading.fraction > best.fraction:
                best = reading
        return best

    def _levels(self) -> list[tuple[Path, tuple[str, str, str], str]]:
        """Each directory from the process's cgroup up to its mount's root,
        v2 first, then the v1 memory hierarchy."""
        try:
            lines = self.proc_cgroup.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return []
        levels: list[tuple[Path, tuple[str, str, str], str]] = []
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            hierarchy, controllers, path = parts
            if hierarchy == "0" and controllers == "":
                mount, files, version = self.cgroup_root, _V2, "v2"
            elif "memory" in controllers.split(","):
                mount, files, version = self.cgroup_root / "memory", _V1, "v1"
            else:
                continue
            relative = [p for p in path.split("/") if p and p not in (".", "..")]
            for depth in range(len(relative), -1, -1):
                levels.append((mount.joinpath(*relative[:depth]), files, version))
        return levels


def _level(directory: Path, files: tuple[str, str, str], version: str) -> MemoryReading | None:
    """One cgroup directory's reading, or None without a readable limit."""
    limit_file, usage_file, inactive_name = files
    try:
        raw_limit = (directory / limit_file).read_text(encoding="ascii").strip()
        if raw_limit == "max":
            return None
        limit = int(raw_limit)
        used = int((directory / usage_file).read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if limit <= 0 or used < 0:
        return None
    inactive = _stat(directory / "memory.stat", inactive_name)
    used = max(0, used - min(inactive, used))
    reading = MemoryReading(used=used, limit=limit, source=f"cgroup {version} {directory}")
    return reading if math.isfinite(reading.fraction) else None


def _stat(path: Path, name: str) -> int:
    """One counter of a ``memory.stat`` file (0 when it cannot be read)."""
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return max(0, int(value.strip()))
    except (OSError, ValueError, UnicodeDecodeError):
        return 0
    return 0
