"""Where a speculative-decoding cycle spends its time, from a torch-profiler trace that SGLang
wrote (``POST /start_profile`` with ``activities: ["CPU", "GPU"]``).

SGLang replays each step kind from its own CUDA graph: the target's forward (decode, or the
verify of the draft tokens), the drafter's multi-step decode, and the drafter's extend after
verify. CUPTI records each replayed kernel with the correlation id of its ``cudaGraphLaunch``,
so kernels group by launch. The target's graph is by far the largest (one kernel set per
target layer), which separates it from the drafter's graphs without knowing their names.
Whatever part of the window no kernel covers is time the GPU waited on the host: SGLang's
scheduler, sampling bookkeeping and Python.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

KERNEL_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
GRAPH_LAUNCH = ("cudaGraphLaunch",)  # also matches versioned names (cudaGraphLaunch_v10000)
# A graph with at least this fraction of the largest graph's kernels is a target forward.
TARGET_GRAPH_FRACTION = 0.5


def load_trace(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, None
    start = None
    for a, b in sorted(intervals):
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end is not None:
        total += end - start
    return total


def breakdown(trace: Mapping[str, Any]) -> dict[str, Any]:
    """Per-cycle milliseconds: target graphs, drafter graphs, other kernels, GPU idle."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") in KERNEL_CATEGORIES]
    if not kernels:
        raise ValueError("the trace has no GPU kernels (was it recorded with activities GPU?)")
    launches = {
        (e.get("args") or {}).get("correlation"): e
        for e in events
        if e.get("cat") == "cuda_runtime" and str(e.get("name", "")).startswith(GRAPH_LAUNCH)
    }
    launches.pop(None, None)
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    loose = []
    for k in kernels:
        corr = (k.get("args") or {}).get("correlation")
        (groups.setdefault(corr, []) if corr in launches else loose).append(k)
    window_start = min(k["ts"] for k in kernels)
    window_end = max(k["ts"] + k.get("dur", 0) for k in kernels)
    window = window_end - window_start
    busy = _union_us((k["ts"], k["ts"] + k.get("dur", 0)) for k in kernels)

    largest = max((len(g) for g in groups.values()), default=0)
    target, drafter = [], []
    for corr in sorted(groups, key=lambda c: launches[c]["ts"]):
        group = groups[corr]
        span = (
            max(k["ts"] + k.get("dur", 0) for k in group) - min(k["ts"] for k in group)
        )
        record = (len(group), sum(k.get("dur", 0) for k in group), span)
        big = largest and len(group) >= TARGET_GRAPH_FRACTION * largest
        (target if big else drafter).append(record)
    cycles = len(target)

    def per_cycle(us: float) -> float | None:
        return round(us / cycles / 1000, 4) if cycles else None

    return {
        "window_ms": round(window / 1000, 3),
        "gpu_busy_fraction": round(busy / window, 4) if window else None,
        "target_graph_launches": cycles,
        "drafter_graph_launches": len(drafter),
        "kernels_per_target_graph": round(sum(r[0] for r in target) / cycles, 1) if cycles else 0,
        "per_cycle_ms": {
            "total": per_cycle(window),
            "target_graph_kernels": per_cycle(sum(r[1] for r in target)),
            "drafter_graph_kernels": per_cycle(sum(r[1] for r in drafter)),
            "other_kernels": per_cycle(sum(k.get("dur", 0) for k in loose)),
            "gpu_idle": per_cycle(window - busy),
        },
        "drafter_graphs_per_cycle": round(len(drafter) / cycles, 2) if cycles else None,
    }


def newest_trace(directory: str | Path, patterns: Sequence[str] = ("*.trace.json.gz",)) -> Path:
    found = [p for pattern in patterns for p in Path(directory).rglob(pattern)]
    if not found:
        raise FileNotFoundError(f"no torch-profiler trace under {directory}")
    return max(found, key=lambda p: p.stat().st_mtime)
