"""The host's side of a speculative cycle, from the same SGLang torch-profiler trace that
``trace_breakdown`` reads for the GPU's side.

A cycle runs on the GPU as three CUDA-graph replays and some eager kernels; on the host it is
SGLang's scheduler building the batches, launching them and reading results back. With the
overlap scheduler the two run side by side, and the cycle lasts as long as the slower one.
Which is slower shows in two figures per cycle:

- the GPU's idle time (``trace_breakdown.steady_breakdown``): the GPU waited for the host;
- the host's time inside CUDA's synchronising calls (``sync_ms`` here): the host waited for
  the GPU.

A cycle with GPU idle and no host wait is host-bound: a cheaper kernel only lengthens the
GPU's wait (2026-12-03: the fp8 drafter's kernels saved 0.030 decode steps per 3/1/4 cycle
on fa3 and the cycle stayed where it was). The launches per cycle (eager kernel launches,
graph launches, copies) are what a host-side cut has to take away. The torch profiler slows
the host (2026-12-02: a traced decode step 10.06 ms against 5.00 ms timed), so counts carry
over to the timed runs and host durations only as proportions.

The window is the scheduler thread's: from the launch of the first target graph of the trace
to the launch of its last (whole cycles, as ``steady_breakdown``'s on the GPU).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sglang_ext_tools.trace_breakdown import GRAPH_LAUNCH, graph_launches, tally

# CUDA runtime / driver calls by what they do for the host
SYNC = ("Synchronize", "cudaMemcpy", "cuMemcpyDtoH")  # the host waits (cudaMemcpy: not *Async)
EAGER_LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")
COPY = ("cudaMemcpyAsync", "cudaMemsetAsync", "cuMemcpyAsync", "cuMemsetD")
_VERSION = re.compile(r"_v\d+$")


def api_name(name: str) -> str:
    """A runtime call's name without its version suffix (cudaGraphLaunch_v10000 ->
    cudaGraphLaunch)."""
    return _VERSION.sub("", name)


def kind(name: str) -> str:
    """sync | graph_launch | eager_launch | copy | other, for a runtime call's name."""
    name = api_name(name)
    if name.startswith(GRAPH_LAUNCH):
        return "graph_launch"
    if name.startswith(EAGER_LAUNCH):
        return "eager_launch"
    if any(s in name for s in SYNC) and not name.endswith("Async"):
        return "sync"
    if name.startswith(COPY):
        return "copy"
    return "other"


def host_breakdown(trace: Mapping[str, Any], top: int = 8) -> dict[str, Any] | None:
    """Per cycle, on the thread that launched the target graphs: runtime calls by kind
    (count and ms), the time spent waiting in synchronising calls, the CPU ops (``cpu_op``,
    ATen) and the busiest call names. None with fewer than two target launches."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    # the target graphs' launches, as trace_breakdown groups the GPU's side
    target = [launch for launch, _, is_target in graph_launches(events).launches if is_target]
    if len(target) < 2:
        return None
    thread = (target[0].get("pid"), target[0].get("tid"))
    start, end = target[0]["ts"], target[-1]["ts"]
    cycles = len(target) - 1
    mine = [e for e in events if (e.get("pid"), e.get("tid")) == thread and start <= e["ts"] < end]
    calls = [e for e in mine if e.get("cat") == "cuda_runtime"]
    by_kind = tally(calls, lambda e: kind(e["name"]))
    by_name = tally(calls, lambda e: api_name(e["name"]))
    ops = [e for e in mine if e.get("cat") == "cpu_op"]
    # every other thread that called CUDA in the window (a scheduler that launches from one
    # thread and waits on results in another shows its wait there)
    others: dict[tuple, list[float]] = {}
    for e in events:
        where = (e.get("pid"), e.get("tid"))
        if e.get("cat") == "cuda_runtime" and where != thread and start <= e["ts"] < end:
            entry = others.setdefault(where, [0, 0.0])
            entry[0] += 1
            entry[1] += e.get("dur", 0) if kind(e["name"]) == "sync" else 0.0

    def per(value: float, nd: int = 2) -> float:
        return round(value / cycles, nd)

    kinds = ("graph_launch", "eager_launch", "copy", "sync", "other")
    return {
        "cycles": cycles,
        "window_ms_per_cycle": per((end - start) / 1000, 4),
        "calls_per_cycle": {k: per(by_kind.get(k, [0, 0])[0]) for k in kinds},
        "call_ms_per_cycle": {k: per(by_kind.get(k, [0, 0.0])[1] / 1000, 4) for k in kinds},
        # the host waiting for the GPU (a GPU-bound cycle has it; a host-bound one does not)
        "sync_ms": per(by_kind.get("sync", [0, 0.0])[1] / 1000, 4),
        "cpu_ops_per_cycle": per(len(ops)),
        "top_calls": [
            {"call": name, "per_cycle": per(n), "ms_per_cycle": per(us / 1000, 4)}
            for name, (n, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
        ],
        "other_threads": [
            {"pid": pid, "tid": tid, "calls_per_cycle": per(n), "sync_ms": per(us / 1000, 4)}
            for (pid, tid), (n, us) in sorted(others.items(), key=lambda kv: -kv[1][0])[:top]
        ],
    }
