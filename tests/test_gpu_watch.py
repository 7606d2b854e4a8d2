"""gpu_watch: the GPU's clock, power and clock-event reasons while a measurement ran, against
a stand-in for NVML (CPU machines have none)."""

from __future__ import annotations

import time

from sglang_ext_tools import gpu_watch as gw


class FakeNvml:
    """NVML's calls the watch makes; clocks drop and a power cap appears after 3 samples."""

    NVML_CLOCK_SM = 0
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.fail_after = fail_after

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802 - NVML's names
        return f"gpu{index}"

    def nvmlDeviceGetClockInfo(self, handle, kind):  # noqa: N802
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return 1980 if self.calls <= 3 else 1500

    def nvmlDeviceGetPowerUsage(self, handle):  # noqa: N802
        return 650_000  # mW

    def nvmlDeviceGetTemperature(self, handle, sensor):  # noqa: N802
        return 40 + self.calls

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):  # noqa: N802
        return 0x4 if self.calls > 3 else 0x0


def _watch(nvml, samples: int) -> gw.GpuWatch:
    with gw.GpuWatch(interval=0.01, nvml=nvml) as watch:
        deadline = time.time() + 5
        while nvml.calls < samples and time.time() < deadline and watch.error is None:
            time.sleep(0.005)
    return watch


def test_a_capped_clock_shows_in_the_summary_with_its_reason():
    summary = _watch(FakeNvml(), 6).summary()
    assert summary["samples"] >= 6
    assert summary["sm_mhz_min"] == 1500 and summary["power_w_median"] == 650.0
    assert summary["clock_event_reasons"] == ["sw_power_cap"]
    assert summary["temp_c_max"] >= 46


def test_a_failing_sample_ends_the_watch_and_says_why():
    watch = _watch(FakeNvml(fail_after=2), 5)
    summary = watch.summary()
    assert summary["samples"] == 2 and "GPU_IS_LOST" in summary["error"]


def test_no_samples_no_summary():
    assert gw.summarize_samples([]) is None


def test_reason_bits_are_named_and_unknown_ones_kept():
    assert gw.reason_names(0x41) == ["gpu_idle", "hw_thermal_slowdown"]
    assert gw.reason_names(0x10000) == ["0x10000"]
