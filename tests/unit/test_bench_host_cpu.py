"""`bench/host_cpu.py`: the host's busy and stolen shares between two times, from /proc/stat lines written by
hand and from samples set by hand (no thread, no clock)."""

from __future__ import annotations

import pytest

from support.bench_modules import load_bench

host_cpu = load_bench("host_cpu.py")


def test_read_jiffies_sums_the_busy_fields_and_not_idle_or_iowait(tmp_path) -> None:
    stat = tmp_path / "stat"
    #             user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 50 800 20 3 2 20 0 0\ncpu0 50 2 25 400 10 1 1 10 0 0\n")
    assert host_cpu.read_jiffies(str(stat)) == (1000, 160, 20)
    assert host_cpu.read_jiffies(str(tmp_path / "absent")) is None


def test_busy_and_steal_between_come_from_the_samples_at_the_windows_ends() -> None:
    cpu = host_cpu.HostCpu()
    cpu.times = [10.0, 11.0, 12.0, 13.0]
    cpu.samples = [(0, 0, 0), (200, 100, 0), (400, 150, 20), (600, 350, 20)]
    assert cpu.busy_between(10.0, 12.0) == pytest.approx(150 / 400)
    assert cpu.steal_between(11.0, 13.0) == pytest.approx(20 / 400)
    assert cpu.busy_between(12.5, 13.0) == pytest.approx(200 / 200)  # from the last sample at or before 12.5
    assert cpu.busy_between(13.0, 20.0) is None  # one sample in the window: no share to measure
    assert host_cpu.HostCpu().busy_between(0.0, 1.0) is None  # nothing sampled (not Linux, or not started)
