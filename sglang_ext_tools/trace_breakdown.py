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
from typing import Any, NamedTuple

KERNEL_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
GRAPH_LAUNCH = ("cudaGraphLaunch",)  # also matches versioned names (cudaGraphLaunch_v10000)
# A graph with at least this fraction of the largest graph's kernels is a target forward.
TARGET_GRAPH_FRACTION = 0.5


def load_trace(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def _interval(kernel: Mapping[str, Any]) -> tuple[float, float]:
    """A kernel's (start, end) in the trace's µs."""
    return kernel["ts"], kernel["ts"] + kernel.get("dur", 0)


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


class Graphs(NamedTuple):
    """A trace's kernels grouped by the CUDA graph launch that ran them: every analysis
    below takes a trace or this, so a caller running several groups the trace once."""

    kernels: list
    target: list  # one kernel list per target-graph launch, in launch order
    drafter: list  # likewise, the drafter's graphs
    loose: list  # kernels outside any graph


class Launches(NamedTuple):
    """A trace's graph launches with the kernels each replayed, in launch order, and whether
    each ran a target forward (the largest graphs: at least TARGET_GRAPH_FRACTION of the
    largest one's kernels); the kernels outside any graph apart."""

    kernels: list
    launches: list  # (the cudaGraphLaunch event, its kernels, is_target), in launch order
    loose: list


def graph_launches(events: Iterable[Mapping[str, Any]]) -> Launches:
    """The complete events of a trace grouped by the ``cudaGraphLaunch`` that ran them (CUPTI
    gives each replayed kernel its launch's correlation id)."""
    events = list(events)
    kernels = [e for e in events if e.get("cat") in KERNEL_CATEGORIES]
    by_corr = {
        (e.get("args") or {}).get("correlation"): e
        for e in events
        if e.get("cat") == "cuda_runtime" and str(e.get("name", "")).startswith(GRAPH_LAUNCH)
    }
    by_corr.pop(None, None)
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    loose = []
    for k in kernels:
        corr = (k.get("args") or {}).get("correlation")
        (groups.setdefault(corr, []) if corr in by_corr else loose).append(k)
    largest = max((len(g) for g in groups.values()), default=0)
    launches = [
        (by_corr[c], groups[c], len(groups[c]) >= TARGET_GRAPH_FRACTION * largest)
        for c in sorted(groups, key=lambda c: by_corr[c]["ts"])
    ]
    return Launches(kernels, launches, loose)


def group_kernels(trace: Mapping[str, Any] | Graphs) -> Graphs:
    """(all kernels, target-graph groups, drafter-graph groups, kernels outside any graph);
    a group is the kernels of one ``cudaGraphLaunch``, in launch order. A ``Graphs`` is
    returned as it is."""
    if isinstance(trace, Graphs):
        return trace
    kernels, launches, loose = graph_launches(
        e for e in trace.get("traceEvents", []) if e.get("ph") == "X"
    )
    if not kernels:
        raise ValueError("the trace has no GPU kernels (was it recorded with activities GPU?)")
    target = [group for _, group, is_target in launches if is_target]
    first = next((k for k, (_, _, is_target) in enumerate(launches) if is_target), len(launches))
    # A prefill CUDA graph (SGLang's breakable one: a burst of small launches) runs before the
    # first target decode graph and is no drafter's; its kernels count as an eager prefill's
    # do, outside the graphs. A smaller launch there whose kernel count a later drafter launch
    # repeats is the first cycle's draft. (2026-12-06: a no-speculation server's trace
    # counted 62 "drafter" launches, its prefill graph's.)
    later = {len(group) for _, group, is_target in launches[first:] if not is_target}
    drafter, prefill = [], []
    for k, (_, group, is_target) in enumerate(launches):
        if not is_target:
            (drafter if k >= first or len(group) in later else prefill).append(group)
    loose = sorted(loose + [kern for g in prefill for kern in g], key=lambda kern: kern["ts"])
    return Graphs(kernels, target, drafter, loose)


def _gpu_us(kernels: Iterable[Mapping[str, Any]]) -> float:
    return sum(k.get("dur", 0) for k in kernels)


def _classes(target: list, drafter: list) -> dict[int, str]:
    classes = {id(k): "target_graph" for g in target for k in g}
    classes.update({id(k): "drafter_graph" for g in drafter for k in g})
    return classes


def _sweep(
    kernels: Iterable[Mapping[str, Any]], classes: Mapping[int, str], start: float, end: float
) -> tuple[dict[str, float], dict[str, float], float]:
    """The GPU's time from ``start`` to ``end`` split once among the kernel classes, and its
    idle time by what it waited to start: (busy, idle, where the last kernel ended). Where
    kernels overlap, the time goes to the one that started first. Two ways they do at
    SGLang's shapes: a second stream (DeepSeek's shared expert), and programmatic dependent
    launch on one stream (SGLang 0.5.23's Triton fused MoE releases the activation after it
    as it starts, so the activation is recorded from the GEMM's start). Summing durations
    instead counted that time twice: before 2026-12-06's fifteenth session the seed's rank
    shape read a target verify of 1.4-2.1 decode steps and a negative host share
    (``bench_speed.cycle_breakdown``). ``graph_streams`` keeps the summed times
    (``kernel_ms``) beside the busy ones."""
    busy = {"target_graph": 0.0, "drafter_graph": 0.0, "other_kernels": 0.0}
    idle = dict.fromkeys(busy, 0.0)
    reached = start
    for k in sorted((k for k in kernels if start <= k["ts"] < end), key=lambda k: k["ts"]):
        cls = classes.get(id(k), "other_kernels")
        k_end = k["ts"] + k.get("dur", 0)
        busy[cls] += max(min(k_end, end) - max(k["ts"], reached), 0.0)
        if k["ts"] > reached:
            idle[cls] += k["ts"] - reached
        reached = max(reached, k_end)
    return busy, idle, reached


def breakdown(trace: Mapping[str, Any] | Graphs) -> dict[str, Any]:
    """Per-cycle milliseconds over the trace's window: target graphs, drafter graphs, other
    kernels (each kernel's time counted once, ``_sweep``), GPU idle."""
    kernels, target, drafter, _ = group_kernels(trace)
    window_start = min(k["ts"] for k in kernels)
    window = max(k["ts"] + k.get("dur", 0) for k in kernels) - window_start
    own, idle, _ = _sweep(kernels, _classes(target, drafter), window_start, float("inf"))
    idle_us = sum(idle.values())
    cycles = len(target)

    def per_cycle(us: float) -> float | None:
        return round(us / cycles / 1000, 4) if cycles else None

    return {
        "window_ms": round(window / 1000, 3),
        "gpu_busy_fraction": round((window - idle_us) / window, 4) if window else None,
        "target_graph_launches": cycles,
        "drafter_graph_launches": len(drafter),
        "kernels_per_target_graph": (
            round(sum(len(g) for g in target) / cycles, 1) if cycles else 0
        ),
        "per_cycle_ms": {
            "total": per_cycle(window),
            "target_graph_kernels": per_cycle(own["target_graph"]),
            "drafter_graph_kernels": per_cycle(own["drafter_graph"]),
            "other_kernels": per_cycle(own["other_kernels"]),
            "gpu_idle": per_cycle(idle_us),
        },
        "drafter_graphs_per_cycle": round(len(drafter) / cycles, 2) if cycles else None,
    }


def steady_breakdown(trace: Mapping[str, Any] | Graphs) -> dict[str, Any] | None:
    """Per-cycle milliseconds over whole decode cycles only: from the first target graph's
    first kernel to the last one's (cycles = target launches - 1). The request's prefill, the
    drafter's first draft and the tail after the last target graph stay out of it (their GPU
    time: ``before_first_cycle_ms``), where ``breakdown`` spreads them over its window (on
    2026-12-02 the prefill was most of its "other kernels"). The GPU's idle time is split by
    what it waited to start: a target graph, a drafter graph or a kernel outside any graph
    (where the host falls behind, the wait lands before the launch it was late with). None
    with fewer than two target graphs."""
    kernels, target, drafter, _ = group_kernels(trace)
    if len(target) < 2:
        return None
    start, end = min(k["ts"] for k in target[0]), min(k["ts"] for k in target[-1])
    cycles = len(target) - 1
    busy, idle, reached = _sweep(kernels, _classes(target, drafter), start, end)
    idle["target_graph"] += max(end - reached, 0.0)  # the wait for the window's last verify
    before = [k for k in kernels if k["ts"] < start]

    def ms(us: float) -> float:
        return round(us / cycles / 1000, 4)

    return {
        "cycles": cycles,
        "per_cycle_ms": {
            "total": ms(end - start),
            "target_graph_kernels": ms(busy["target_graph"]),
            "drafter_graph_kernels": ms(busy["drafter_graph"]),
            "other_kernels": ms(busy["other_kernels"]),
            "gpu_idle": ms(sum(idle.values())),
        },
        "gpu_idle_before_ms": {cls: ms(us) for cls, us in idle.items()},
        "before_first_cycle_ms": {
            "gpu_kernels": round(_gpu_us(before) / 1000, 3),
            "wall": round((start - min(k["ts"] for k in kernels)) / 1000, 3),
        },
    }


def newest_trace(directory: str | Path, patterns: Sequence[str] = ("*.trace.json.gz",)) -> Path:
    found = [p for pattern in patterns for p in Path(directory).rglob(pattern)]
    if not found:
        raise FileNotFoundError(f"no torch-profiler trace under {directory}")
    return max(found, key=lambda p: p.stat().st_mtime)


def _graph_classes(trace: Mapping[str, Any] | Graphs) -> tuple[int, list[tuple[str, list]]]:
    """The cycles (target launches, at least 1) and each graph class with its kernels."""
    _, target, drafter, _ = group_kernels(trace)
    classes = [("target_graph", target), ("drafter_graph", drafter)]
    return max(len(target), 1), [(cls, [k for g in groups for k in g]) for cls, groups in classes]


def tally(events: Iterable[Mapping[str, Any]], key) -> dict[Any, list[float]]:
    """key(event) -> [count, µs] of the events (kernels, runtime calls), in first-seen
    order; events whose key is None left out."""
    out: dict[Any, list[float]] = {}
    for k in events:
        name = key(k)
        if name is not None:
            entry = out.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += k.get("dur", 0)
    return out


def top_kernels(trace: Mapping[str, Any] | Graphs, n: int = 6) -> dict[str, list[dict[str, Any]]]:
    """The costliest kernels per cycle in the target graphs and in the drafter graphs: time
    (µs) and launches per cycle."""
    cycles, classes = _graph_classes(trace)
    return {cls: _costliest(kernels, cycles, n) for cls, kernels in classes}


def _costliest(kernels: Iterable[Mapping[str, Any]], cycles: int, n: int) -> list[dict[str, Any]]:
    """The n kernels (by name) with the most time: time (µs) and launches per cycle."""
    bucket = tally(kernels, lambda k: k["name"])
    return [
        {
            "kernel": name[:80],
            "us_per_cycle": round(us / cycles, 1),
            "calls_per_cycle": round(calls / cycles, 2),
        }
        for name, (calls, us) in sorted(bucket.items(), key=lambda kv: -kv[1][1])[:n]
    ]


# Kernel families whose count says which attention path ran: FA3's kernels (sgl_kernel's
# flash_ops are in the flash:: namespace: FlashAttnFwdSm90, its split-KV FlashAttnFwdCombine
# and prepare_varlen_num_blocks_kernel, so one FA3 call may count more than one launch) and the
# merge that only cascade attention launches (topk > 1: prefix and tree parts merged;
# sgl_kernel's merge_state_v2 runs merge_attn_states_kernel, its symbol in
# sgl_kernel/sm90/common_ops.abi3.so).
KERNEL_FAMILIES: dict[str, tuple[str, ...]] = {
    "flash_attention": ("flash::", "flash_fwd", "flashattn"),
    "merge_state": ("merge_attn_states", "merge_state"),
}


def kernel_families(
    trace: Mapping[str, Any] | Graphs, families: Mapping[str, Sequence[str]] = KERNEL_FAMILIES
) -> dict[str, dict[str, dict[str, float]]]:
    """Per graph class, each family's launches and time per cycle (case-insensitive
    substrings of the kernel name)."""
    cycles, classes = _graph_classes(trace)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for cls, kernels in classes:
        out[cls] = {}
        for family, needles in families.items():
            hits = [k for k in kernels if any(n in k["name"].lower() for n in needles)]
            out[cls][family] = {
                "calls_per_cycle": round(len(hits) / cycles, 2),
                "us_per_cycle": round(sum(k.get("dur", 0) for k in hits) / cycles, 1),
            }
    return out


# Kernels whose launch grid says which kernel config ran: the Triton fused-MoE kernel's grid
# is its token blocks times its N blocks, so a tuned config's block N shows in it. At the seed's
# rank shape SGLang 0.5.23 served the tuned M=4 entry with block N 32 and the M=6 entry with
# 64 (`fused_moe_triton_config.try_get_optimal_moe_config`: the nearest M key), the one
# difference the MoE path makes between 3/1/4's and 5/1/6's verify.
GRID_KERNELS: tuple[str, ...] = ("fused_moe_kernel",)
# What CUPTI records of the binary each launch ran (Kineto's kernel args): two launches of
# one grid with different registers or shared memory ran different compiled kernels (another
# Triton specialization, say); the same binary at a lower achieved occupancy ran beside other
# work. Recorded per launch shape where the trace has them (issue #24's cheap and dear modes
# of one grid).
BINARY_ARGS: tuple[tuple[str, str], ...] = (
    ("registers per thread", "registers"),
    ("shared memory", "shared_memory"),
    ("blocks per SM", "blocks_per_sm"),
)
OCCUPANCY_ARG = "est. achieved occupancy %"
# the keys binary_args gives (as kernel_grids' rows carry them)
BINARY_KEYS: tuple[str, ...] = (*(key for _, key in BINARY_ARGS), "occupancy_pct")
# the keys that say which compiled kernel ran (occupancy and blocks per SM are how it ran)
COMPILED_KEYS: tuple[str, ...] = ("registers", "shared_memory")


def binary_args(kernels: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The distinct values of BINARY_ARGS among ``kernels`` (sorted lists) and their mean
    achieved occupancy, for the args the trace has."""
    out: dict[str, Any] = {}
    for arg, key in BINARY_ARGS:
        seen = {(k.get("args") or {}).get(arg) for k in kernels} - {None}
        if seen:
            out[key] = sorted(seen)
    occ = [(k.get("args") or {}).get(OCCUPANCY_ARG) for k in kernels]
    occ = [o for o in occ if isinstance(o, (int, float))]
    if occ:
        out["occupancy_pct"] = round(sum(occ) / len(occ), 1)
    return out


def compiled_binaries(binaries: Iterable[Mapping[str, Any] | None]) -> list[tuple[str, ...]]:
    """Each recorded binary (``binary_args``' keys; None or without registers where the trace
    had none: skipped) as (registers, shared memory); occupancy is how it ran, not what was
    compiled."""
    return [
        tuple(json.dumps(b.get(k)) for k in COMPILED_KEYS)
        for b in (u or {} for u in binaries)
        if "registers" in b
    ]


def kernel_grids(
    trace: Mapping[str, Any] | Graphs, needles: Sequence[str] = GRID_KERNELS
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per graph class and matching kernel (case-insensitive substrings of the name): each
    distinct launch shape (CUPTI's ``grid`` and ``block`` args) with its launches and time
    per cycle, the most-called first."""

    def shape(k: Mapping[str, Any]) -> tuple[str, tuple, tuple] | None:
        needle = next((n for n in needles if n in k["name"].lower()), None)
        if needle is None:
            return None
        args = k.get("args") or {}
        return needle, tuple(args.get("grid") or ()), tuple(args.get("block") or ())

    cycles, classes = _graph_classes(trace)
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for cls, kernels in classes:
        # each launch shape's kernels, grouped once, in first-seen order
        shapes: dict[tuple, list[Mapping[str, Any]]] = {}
        for k in kernels:
            key = shape(k)
            if key is not None:
                shapes.setdefault(key, []).append(k)
        out[cls] = {}
        for (needle, grid, block), launches in sorted(shapes.items(), key=lambda kv: -len(kv[1])):
            out[cls].setdefault(needle, []).append(
                {
                    "grid": list(grid),
                    "block": list(block),
                    "calls_per_cycle": round(len(launches) / cycles, 2),
                    "us_per_cycle": round(sum(k.get("dur", 0) for k in launches) / cycles, 1),
                    **binary_args(launches),
                }
            )
    return out


def _stream(kernel: Mapping[str, Any]) -> Any:
    """The CUDA stream a kernel ran on (CUPTI's ``stream`` arg; the trace's tid otherwise)."""
    return (kernel.get("args") or {}).get("stream", kernel.get("tid"))


def graph_streams(trace: Mapping[str, Any] | Graphs, n: int = 3) -> dict[str, Any] | None:
    """The target graphs on the GPU's clock, per cycle (target launch), in ms: ``span``, from
    a launch's first kernel start to its last kernel end (what the launch costs the cycle);
    ``busy``, the time some kernel of it ran; ``overlap``, the per-stream busy times summed
    less ``busy`` (time two streams ran at once); and per stream its busy time, its kernels'
    summed time, ``overlap_ms`` (the two's difference: time two of its own kernels were both
    on the GPU) and its costliest kernels (as ``top_kernels`` gives them). Kernels overlap two
    ways, and summed kernel times count both twice (the cycle splits count them once,
    ``_sweep``): a model that runs a second stream (SGLang's DeepSeek layers put the shared
    expert there), and, on one stream, programmatic dependent launch (PDL). SGLang 0.5.23's
    Triton fused MoE GEMM releases the kernel after it as it starts (``GDC_EARLY``), so the
    activation that follows is recorded from the GEMM's start: its time contains the GEMM's.
    2026-12-03, the seed's rank shape: 12.6 ms of target-graph kernels summed in an 8.5 ms
    decode step; on 2026-12-06 the main stream alone summed 12.03 ms in 8.34 ms busy. None
    without a target graph."""
    _, target, _, _ = group_kernels(trace)
    if not target:
        return None
    span = busy = 0.0
    streams: dict[Any, list[Mapping[str, Any]]] = {}
    stream_busy: dict[Any, float] = {}
    for group in target:
        intervals = [_interval(k) for k in group]
        span += max(b for _, b in intervals) - min(a for a, _ in intervals)
        busy += _union_us(intervals)
        own: dict[Any, list[Mapping[str, Any]]] = {}
        for k in group:
            own.setdefault(_stream(k), []).append(k)
        for stream, kernels in own.items():
            streams.setdefault(stream, []).extend(kernels)
            stream_busy[stream] = stream_busy.get(stream, 0.0) + _union_us(map(_interval, kernels))
    cycles = len(target)

    def ms(us: float) -> float:
        return round(us / cycles / 1000, 4)

    return {
        "span_ms": ms(span),
        "busy_ms": ms(busy),
        "overlap_ms": ms(sum(stream_busy.values()) - busy),
        "streams": {
            str(stream): {
                "busy_ms": ms(stream_busy[stream]),
                "kernel_ms": ms(summed := _gpu_us(kernels)),
                "overlap_ms": ms(summed - stream_busy[stream]),
                "kernels_per_cycle": round(len(kernels) / cycles, 2),
                "top": _costliest(kernels, cycles, n),
            }
            for stream, kernels in sorted(streams.items(), key=lambda kv: -stream_busy[kv[0]])
        },
    }


def summarize(paths: Sequence[str | Path], **meta: Any) -> dict[str, Any]:
    """Breakdown, top kernels, kernel families and grids, the target graphs' streams, and
    provenance (file, sha256, device) for each trace."""
    import hashlib

    out: dict[str, Any] = {"schema_version": 1, **meta, "traces": {}}
    for path in map(Path, paths):
        trace = load_trace(path)
        props = (trace.get("deviceProperties") or [{}])[0]
        out["traces"][path.name] = {
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "bytes": path.stat().st_size,
            "device": {k: props.get(k) for k in ("name", "totalGlobalMem", "numSms")},
            "cuda_driver_api_version": trace.get("cuda_driver_version"),
            "cuda_runtime_version": trace.get("cuda_runtime_version"),
            "breakdown": breakdown(graphs := group_kernels(trace)),
            "steady": steady_breakdown(graphs),
            "top_kernels": top_kernels(graphs),
            "kernel_families": kernel_families(graphs),
            "kernel_grids": kernel_grids(graphs),
            "graph_streams": graph_streams(graphs),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="per-cycle time split of SGLang traces")
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--out", help="write the summary JSON here (else stdout)")
    parser.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="provenance to record (date, command, versions...)",
    )
    args = parser.parse_args(argv)
    meta = dict(item.split("=", 1) for item in args.meta)
    text = json.dumps(summarize(args.traces, **meta), indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
