"""The built-in memory probe on fake cgroup v2, cgroup v1 and /proc/meminfo
files (and once on this machine's own)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sessiontree.supervision import MemoryProbe, MemoryReading

MIB = 1024 * 1024
UNLIMITED_V1 = "9223372036854771712"  # what cgroup v1 writes for "no limit"


class Host:
    """A fake /proc/self/cgroup, cgroup mount and /proc/meminfo under tmp_path."""

    def __init__(self, root: Path) -> None:
        self.proc_cgroup = root / "proc-self-cgroup"
        self.cgroup_root = root / "cgroup"
        self.meminfo = root / "meminfo"
        self.cgroup_root.mkdir()

    def probe(self) -> MemoryProbe:
        return MemoryProbe(
            proc_cgroup=self.proc_cgroup, cgroup_root=self.cgroup_root, meminfo=self.meminfo
        )

    def member_of(self, *lines: str) -> None:
        self.proc_cgroup.write_text("".join(line + "\n" for line in lines))

    def machine(self, total_kib: int, available_kib: int) -> None:
        self.meminfo.write_text(
            f"MemTotal:       {total_kib} kB\nMemFree:        1 kB\n"
            f"MemAvailable:   {available_kib} kB\nBuffers:        0 kB\n"
        )

    def cgroup(self, path: str, **files: str | int) -> None:
        directory = self.cgroup_root / path
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name.replace("_", ".", 1)).write_text(f"{text}\n")


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


GIB_KIB = 1024 * 1024  # a 1 GiB machine, in kB


def test_cgroup_v2_limit_and_use_without_the_inactive_file_cache(host: Host) -> None:
    host.member_of("0::/app.slice/node.service")
    host.machine(total_kib=16 * GIB_KIB, available_kib=15 * GIB_KIB)
    host.cgroup(
        "app.slice/node.service",
        memory_max=1000 * MIB,
        memory_current=900 * MIB,
        memory_stat=f"anon {700 * MIB}\nfile {200 * MIB}\ninactive_file {100 * MIB}\n",
    )
    reading = host.probe().read()
    assert reading == MemoryReading(
        used=800 * MIB,
        limit=1000 * MIB,
        source=f"cgroup v2 {host.cgroup_root / 'app.slice/node.service'}",
    )
    assert reading.fraction == 0.8
    assert host.probe()() == 0.8


def test_cgroup_v2_a_parents_tighter_limit_binds(host: Host) -> None:
    host.member_of("0::/pod/app")
    host.machine(total_kib=16 * GIB_KIB, available_kib=15 * GIB_KIB)
    host.cgroup("pod", memory_max=1000 * MIB, memory_current=950 * MIB)
    host.cgroup("pod/app", memory_max="max", memory_current=600 * MIB)
    reading = host.probe().read()
    assert reading is not None
    assert reading.fraction == 0.95
    assert reading.source.endswith("pod")


def test_cgroup_v2_a_path_missing_under_the_mount_is_walked_up_to_its_root(host: Host) -> None:
    host.member_of("0::/docker/0123abcd")  # the host's path, seen without a cgroup namespace
    host.machine(total_kib=16 * GIB_KIB, available_kib=15 * GIB_KIB)
    host.cgroup(".", memory_max=2000 * MIB, memory_current=500 * MIB)
    assert host.probe()() == 0.25


def test_cgroup_v2_without_a_limit_reads_the_machines_memory(host: Host) -> None:
    host.member_of("0::/user.slice")
    host.machine(total_kib=1000, available_kib=250)
    host.cgroup("user.slice", memory_max="max", memory_current=900 * MIB)
    assert host.probe().read() == MemoryReading(
        used=750 * 1024, limit=1000 * 1024, source="meminfo"
    )


def test_cgroup_v1_limit_and_use_without_the_inactive_file_cache(host: Host) -> None:
    host.member_of("12:pids:/docker/abc", "4:memory:/docker/abc", "1:name=systemd:/docker/abc")
    host.machine(total_kib=16 * GIB_KIB, available_kib=15 * GIB_KIB)
    host.cgroup(
        "memory/docker/abc",
        memory_limit_in_bytes=512 * MIB,
        memory_usage_in_bytes=500 * MIB,
        memory_stat=f"cache {100 * MIB}\ntotal_inactive_file {116 * MIB}\n",
    )
    reading = host.probe().read()
    assert reading is not None
    assert reading.fraction == 0.75
    assert reading.source == f"cgroup v1 {host.cgroup_root / 'memory/docker/abc'}"


def test_cgroup_v1_no_limit_reads_the_machines_memory(host: Host) -> None:
    host.member_of("4:memory:/system.slice")
    host.machine(total_kib=1000, available_kib=100)
    host.cgroup(
        "memory/system.slice",
        memory_limit_in_bytes=UNLIMITED_V1,
        memory_usage_in_bytes=500 * MIB,
    )
    host.cgroup("memory", memory_limit_in_bytes=UNLIMITED_V1, memory_usage_in_bytes=900 * MIB)
    reading = host.probe().read()
    assert reading is not None
    assert (reading.source, reading.fraction) == ("meminfo", 0.9)


def test_a_cgroup_limit_above_the_machines_memory_is_no_limit(host: Host) -> None:
    host.member_of("0::/big")
    host.machine(total_kib=1000, available_kib=500)
    host.cgroup("big", memory_max=64 * 1024 * MIB, memory_current=1 * MIB)
    reading = host.probe().read()
    assert reading is not None
    assert (reading.source, reading.fraction) == ("meminfo", 0.5)


def test_unreadable_or_garbled_cgroup_files_fall_back_to_the_machine(host: Host) -> None:
    host.member_of("0::/odd", "not a cgroup line")
    host.machine(total_kib=1000, available_kib=800)
    host.cgroup("odd", memory_max="lots", memory_current=1)
    assert host.probe()() == pytest.approx(0.2)


def test_a_probe_that_reads_nothing_says_so_once_and_reports_no_reading(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sessiontree.memory")
    probe = host.probe()  # no /proc/self/cgroup, no meminfo
    assert [probe(), probe(), probe()] == [None, None, None]
    assert len(caplog.records) == 1
    assert "memory pressure is not watched" in caplog.records[0].getMessage()
    assert str(host.meminfo) in caplog.records[0].getMessage()
    host.machine(total_kib=1000, available_kib=500)
    assert probe() == 0.5
    host.meminfo.write_text("MemTotal: 1000 kB\n")  # no MemAvailable: unreadable again
    assert probe() is None
    assert len(caplog.records) == 2  # said again after it had read well in between


def test_this_machines_memory_reads_as_a_fraction() -> None:
    reading = MemoryProbe().read()
    assert reading is not None, "no cgroup limit and no /proc/meminfo on this machine"
    assert 0.0 < reading.fraction < 1.0
    assert reading.limit > 0
