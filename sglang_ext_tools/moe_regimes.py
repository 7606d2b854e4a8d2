"""Is the MoE up-projection's dear mode a property of a server, or of stretches of its steps?
Read per step (one target graph launch) off a server's profile trace.

Why: at the seed's rank shape (issue #24) the fused MoE up-projection runs in two modes, about
26 and 56 µs a call at one token on an H100. Earlier sessions read them as one mode per server
instance. On 2026-12-07 (twenty-third session) a plugin-loaded no-speculation server traced on an
H100 ran its first 11 decode steps with every layer's up-projection dear (57 µs, 8.7 ms a step)
and the next 28 with every one cheap (26 µs, 7.0 ms); the stock baseline in the same lease ran
17 cheap steps, then 22 dear. So a whole step is dear or cheap, all 60 layers alike, and the mode
holds for stretches of steps and flips between them: a timed run reads whatever mix of stretches
it met, and two servers of one configuration can differ by that mix alone. With the shared
expert on the main stream (``SGLANG_EXT_MOE_SHARED_STREAM=0``) no step was dear.

This tool groups one kernel's instances at one grid by the target graph launch that ran them
(``trace_breakdown.group_kernels``), takes each step's median, splits the steps into two regimes
where those medians fall into two clusters (the widest gap between sorted step medians, the
upper cluster's median at least ``MIN_RATIO`` times the lower's), and gives per regime the step
count, the kernel's median, the step period (one target launch's first kernel to the next's),
the MoE span (a step's first instance to its last: the GPU's own time through the MoE layers,
which a host-bound step's period hides), and the runs of consecutive steps.

    python -m sglang_ext_tools.moe_regimes --trace T.trace.json.gz [--grid GRID] \
        [--kernel fused_moe_kernel] [--out regimes.json]

Without ``--grid``, the up-projection's grid as ``up_grid`` reads it (128 at one token, 544 at
the tenth run's six).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from sglang_ext_tools.json_out import emit
from sglang_ext_tools.moe_overlap import _grid, check_paths, trace_parser
from sglang_ext_tools.trace_breakdown import group_kernels, load_trace

# two clusters of step medians count as two regimes only this far apart (the modes seen so far:
# 2.1x at one token, 2.0x at the verify's six)
MIN_RATIO = 1.3


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def split(medians: Sequence[float], min_ratio: float = MIN_RATIO) -> float | None:
    """The threshold between two clusters of step medians (the midpoint of the widest gap), or
    None where they form one cluster (fewer than two steps, or the clusters' medians closer than
    ``min_ratio``)."""
    ordered = sorted(medians)
    if len(ordered) < 2:
        return None
    gap, at = max((ordered[i + 1] - ordered[i], i) for i in range(len(ordered) - 1))
    low, high = ordered[: at + 1], ordered[at + 1 :]
    if gap <= 0 or statistics.median(high) < min_ratio * statistics.median(low):
        return None
    return (ordered[at] + ordered[at + 1]) / 2


def runs(labels: Sequence[str]) -> list[tuple[str, int]]:
    """Consecutive equal labels as (label, length), in order."""
    out: list[tuple[str, int]] = []
    for label in labels:
        if out and out[-1][0] == label:
            out[-1] = (label, out[-1][1] + 1)
        else:
            out.append((label, 1))
    return out


def up_grid(trace: Mapping[str, Any], kernel: str = "fused_moe_kernel") -> int:
    """The routed up-projection's grid x in the trace's target steps: of the ``kernel`` grids a
    target launch runs once a MoE layer (the most instances a launch), the smallest (the
    down-projection's N, the hidden size, is wider than the up-projection's at the rank shape:
    1792 against 128 blocks at one token)."""
    return _up_grid(group_kernels(trace).target, kernel)


def _up_grid(target: Sequence[Sequence[Mapping[str, Any]]], kernel: str) -> int:
    counts: dict[int, int] = {}
    for group in target:
        per: dict[int, int] = {}
        for k in group:
            grid = _grid(k)
            if kernel in k["name"] and grid[1:] == [1, 1]:
                per[grid[0]] = per.get(grid[0], 0) + 1
        for x, n in per.items():
            counts[x] = max(counts.get(x, 0), n)
    if not counts:
        raise ValueError(f"no target graph launch ran {kernel}")
    most = max(counts.values())
    return min(x for x, n in counts.items() if n == most)


def regimes(trace: Mapping[str, Any], kernel: str, grid: int | None = None) -> dict[str, Any]:
    """The steps (target graph launches) that ran ``kernel`` (a substring of its name) at grid
    (``grid``, 1, 1), split into a cheap and a dear regime where their medians part; without
    ``grid``, at the up-projection's (``up_grid``, read off the same grouping)."""
    graphs = group_kernels(trace)
    if grid is None:
        grid = _up_grid(graphs.target, kernel)
    steps = []
    for group in graphs.target:
        found = [k for k in group if kernel in k["name"] and _grid(k) == [grid, 1, 1]]
        if found:
            starts = [k["ts"] for k in found]
            steps.append(
                {
                    "start": min(k["ts"] for k in group),
                    "us": [k.get("dur", 0) for k in found],
                    # first instance's start to the last's: the GPU's own time through the
                    # MoE layers, whatever the host added between steps
                    "span_ms": (max(starts) - min(starts)) / 1000,
                }
            )
    if not steps:
        raise ValueError(f"no target graph launch ran {kernel} at grid [{grid}, 1, 1]")
    steps.sort(key=lambda s: s["start"])
    for step, nxt in zip(steps, steps[1:], strict=False):
        step["period_ms"] = (nxt["start"] - step["start"]) / 1000
    medians = [statistics.median(s["us"]) for s in steps]
    threshold = split(medians)
    labels = [
        "one" if threshold is None else ("dear" if m > threshold else "cheap") for m in medians
    ]
    stretches = runs(labels)
    out: dict[str, Any] = {
        "kernel": kernel,
        "grid": [grid, 1, 1],
        "steps": len(steps),
        "per_step": len(steps[0]["us"]),
        "threshold_us": None if threshold is None else round(threshold, 2),
        "sequence": "".join({"cheap": "c", "dear": "D", "one": "."}[x] for x in labels),
        "runs": [{"regime": r, "steps": n} for r, n in stretches],
        "flips": len(stretches) - 1,
        "regimes": {},
    }
    for regime in dict.fromkeys(labels):
        mine = [s for s, label in zip(steps, labels, strict=True) if label == regime]
        periods = [s["period_ms"] for s in mine if "period_ms" in s]
        out["regimes"][regime] = {
            "steps": len(mine),
            "kernel_median_us": _median([u for s in mine for u in s["us"]]),
            "step_period_median_ms": _median(periods),
            "moe_span_median_ms": _median([s["span_ms"] for s in mine]),
        }
    cheap, dear = (
        out["regimes"].get(r, {}).get("step_period_median_ms") for r in ("cheap", "dear")
    )
    out["dear_over_cheap_period"] = round(dear / cheap, 3) if cheap and dear else None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = trace_parser("moe_regimes", __doc__.split("\n\n")[0], None)
    args = p.parse_args(argv)
    check_paths(p, args.trace, args.out)
    try:
        trace = load_trace(args.trace)
        result = {"trace": args.trace.name} | regimes(trace, args.kernel, args.grid)
    except ValueError as exc:
        p.exit(2, f"moe_regimes: {args.trace}: {exc}\n")
    return emit(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
