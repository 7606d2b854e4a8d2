"""What the GPU did while one measurement ran: its SM clock, power, temperature and the
reasons NVML gives for holding the clock down, sampled from a thread (NVML, no CUDA context).

Why: on 2026-12-03 the same server configuration (5/1/6, the same fused-MoE config, the same
drafter and prompts) measured a decode cycle of 1.43 decode steps in one session and 1.29 in
another, while 3/1/4 beside it held within 1 %. Each session gets a machine afresh; a GPU
held at a lower clock, or capped by power, would show here, per measurement, and a slow
server on a GPU at full clock would rule that out.

    with GpuWatch() as watch:
        ...  # the requests
    measurement["gpu_watch"] = watch.summary()
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence
from typing import Any

# NVML's clock-event reason bits (nvmlClocksEventReason*), by the names a reader knows
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def reason_names(mask: int) -> list[str]:
    """The named bits of an NVML clock-event mask (unknown bits as hex)."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return names + ([hex(rest)] if rest else [])


def summarize_samples(samples: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """One measurement's samples -> medians, extremes and every clock-event reason seen."""
    if not samples:
        return None

    def values(key: str) -> list[float]:
        return [s[key] for s in samples if s.get(key) is not None]

    sm, power, temp = values("sm_mhz"), values("power_w"), values("temp_c")
    seen: set[str] = set()
    for s in samples:
        seen.update(reason_names(s.get("reasons") or 0))
    return {
        "samples": len(samples),
        "sm_mhz_median": statistics.median(sm) if sm else None,
        "sm_mhz_min": min(sm) if sm else None,
        "power_w_median": round(statistics.median(power), 1) if power else None,
        "temp_c_max": max(temp) if temp else None,
        "clock_event_reasons": sorted(seen),
    }


class GpuWatch:
    """Samples GPU 0 every ``interval`` seconds between ``__enter__`` and ``__exit__``.
    Without NVML (no driver, no pynvml: CPU machines) it samples nothing and its summary is
    None; a sample that fails ends the sampling, the measurement goes on."""

    def __init__(self, interval: float = 0.1, nvml: Any = None, index: int = 0):
        self.interval = interval
        self.index = index
        self._nvml = nvml
        self._samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._owns_nvml = False

    def _sample(self, handle: Any) -> dict[str, Any]:
        nv = self._nvml
        return {
            "sm_mhz": nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
            "power_w": nv.nvmlDeviceGetPowerUsage(handle) / 1000,
            "temp_c": nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
            "reasons": nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        }

    def _loop(self) -> None:
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(self.index)
            while True:
                self._samples.append(self._sample(handle))
                if self._stop.wait(self.interval):
                    break
        except Exception as exc:  # noqa: BLE001 - the watch is a witness, not the measurement
            self.error = repr(exc)

    def __enter__(self) -> GpuWatch:
        if self._nvml is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml, self._owns_nvml = pynvml, True
            except Exception as exc:  # noqa: BLE001 - no NVML here: nothing to watch
                self.error = repr(exc)
                return self
        self._thread = threading.Thread(target=self._loop, name="gpu-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._owns_nvml:
            self._nvml.nvmlShutdown()

    def summary(self) -> dict[str, Any] | None:
        out = summarize_samples(self._samples)
        if out is not None and self.error:
            out["error"] = self.error
        return out


# The GPU a run used, read once at its start (NVML): bench_speed's and head_gemv_bench's
# `gpu` record.
def gpu_info() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {"name": None, "error": "pynvml (nvidia-ml-py) is not installed"}
    try:
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)

            def text(v: Any) -> str:
                return v.decode() if isinstance(v, bytes) else v

            clock = pynvml.nvmlDeviceGetClockInfo
            clock_max = pynvml.nvmlDeviceGetMaxClockInfo
            sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
            return {
                "name": text(pynvml.nvmlDeviceGetName(h)),
                "driver": text(pynvml.nvmlSystemGetDriverVersion()),
                "memory_total_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
                # which GPU of the fleet: each session's machine is a fresh one
                "uuid": text(pynvml.nvmlDeviceGetUUID(h)),
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
                "clocks": {
                    "sm_mhz": clock(h, sm),
                    "sm_max_mhz": clock_max(h, sm),
                    "mem_mhz": clock(h, mem),
                    "mem_max_mhz": clock_max(h, mem),
                },
            }
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - no driver: the run still reports
        return {"name": None, "error": repr(exc)}
