"""sglang_ext_tools.trace_host on synthetic torch-profiler traces: a cycle whose host waits for
the GPU and one whose GPU waits for the host, told apart by the host's synchronising calls."""

from __future__ import annotations

import pytest

from sglang_ext_tools.trace_host import api_name, host_breakdown, kind

SCHED, OTHER = (1, 7), (1, 9)


def _trace(cycles: int, sync_us: float, eager: int = 12) -> dict:
    """Per cycle on the scheduler thread: a drafter graph launch (4 kernels), `eager` kernel
    launches, a target graph launch (40 kernels), an async copy, a stream synchronize of
    `sync_us` and three ATen ops; a launch on another thread that is not the scheduler's."""
    events, t, corr = [], 0.0, 0

    def call(name: str, dur: float, thread=SCHED, kernels: int = 0, cat="cuda_runtime"):
        nonlocal t, corr
        corr += 1
        pid, tid = thread
        events.append({"ph": "X", "cat": cat, "name": name, "ts": t, "dur": dur, "pid": pid,
                       "tid": tid, "args": {"correlation": corr}})
        for k in range(kernels):
            events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": t + 10 + k,
                           "dur": 1, "pid": 0, "tid": 0, "args": {"correlation": corr}})
        t += dur + 5

    for _ in range(cycles):
        call("cudaGraphLaunch_v10000", 8, kernels=4)
        for _ in range(eager):
            call("cudaLaunchKernel", 4, kernels=1)
        call("cudaGraphLaunch_v10000", 8, kernels=40)
        call("cudaMemcpyAsync", 6)
        call("cudaStreamSynchronize", sync_us)
        for _ in range(3):
            call("aten::copy_", 2, cat="cpu_op")
        call("cudaLaunchKernel", 4, thread=OTHER, kernels=1)
    return {"traceEvents": events}


def test_calls_per_cycle_on_the_scheduler_thread():
    out = host_breakdown(_trace(cycles=4, sync_us=0.0))
    assert out["cycles"] == 3  # launches of the first and the last target graph bound it
    calls = out["calls_per_cycle"]
    assert calls["graph_launch"] == 2.0 and calls["eager_launch"] == 12.0
    assert calls["copy"] == 1.0 and calls["sync"] == 1.0
    assert out["cpu_ops_per_cycle"] == 3.0  # the other thread's launch is not counted
    assert out["other_threads"] == [{"pid": 1, "tid": 9, "calls_per_cycle": 1.0, "sync_ms": 0.0}]
    assert out["sync_ms"] == 0.0


def test_a_host_waiting_for_the_gpu_shows_its_wait():
    host_bound = host_breakdown(_trace(cycles=4, sync_us=0.0))
    gpu_bound = host_breakdown(_trace(cycles=4, sync_us=900.0))
    assert gpu_bound["sync_ms"] == pytest.approx(0.9)
    assert gpu_bound["window_ms_per_cycle"] - host_bound["window_ms_per_cycle"] == (
        pytest.approx(0.9)
    )
    assert gpu_bound["top_calls"][0] == {
        "call": "cudaStreamSynchronize", "per_cycle": 1.0, "ms_per_cycle": 0.9,
    }


def test_fewer_than_two_target_launches_give_nothing():
    assert host_breakdown(_trace(cycles=1, sync_us=0.0)) is None
    assert host_breakdown({"traceEvents": []}) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cudaGraphLaunch_v10000", "graph_launch"),
        ("cudaLaunchKernel", "eager_launch"),
        ("cuLaunchKernelEx", "eager_launch"),
        ("cudaStreamSynchronize", "sync"),
        ("cudaEventSynchronize", "sync"),
        ("cudaMemcpy", "sync"),  # the blocking copy
        ("cudaMemcpyAsync", "copy"),
        ("cudaMemsetAsync", "copy"),
        ("cudaStreamWaitEvent", "other"),  # a GPU-side wait: the host goes on
        ("cudaEventRecord", "other"),
    ],
)
def test_runtime_calls_by_kind(name, expected):
    assert kind(name) == expected
    assert api_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
