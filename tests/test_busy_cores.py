"""harness.busy_cores: the node's busy cores while a timed GPU test ran (tests/gpu/harness.py),
from /proc/stat."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import harness  # noqa: E402


def _stat(busy: int, idle: int, iowait: int = 0) -> str:
    # cpu user nice system idle iowait irq softirq steal
    per_cpu = "".join(f"cpu{k} 1 0 0 1 0 0 0 0\n" for k in range(4))
    return f"cpu  {busy} 0 0 {idle} {iowait} 0 0 0\n{per_cpu}intr 0\n"


def test_busy_cores_counts_busy_jiffies_over_all(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(_stat(100, 900, 50))
    record = {}
    with harness.busy_cores(record, "pass", str(stat)):
        stat.write_text(_stat(100 + 300, 900 + 600, 50 + 100))  # 300 busy of 1,000
    assert record["pass"] == pytest.approx(0.3 * 4, abs=0.01)  # of the 4 CPUs it lists


def test_busy_cores_is_none_where_proc_stat_cannot_be_read(tmp_path):
    record = {}
    with harness.busy_cores(record, "pass", str(tmp_path / "missing")):
        pass
    assert record == {"pass": None}


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc/stat")
def test_a_spinning_thread_reads_as_a_busy_core():
    record = {}
    with harness.busy_cores(record, "spin"):
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
    assert record["spin"] >= 0.6, record  # this loop alone keeps one core busy
