"""Does a kernel of another stream, resident on the GPU as the MoE up-projection launches, make
that launch dear? Read per instance off a server's profile trace.

Why: at the seed's rank shape (issue #24) the fused MoE up-projection runs in two modes in
servers, and never dear in twenty standalone processes. On 2026-12-07 (twenty-second session)
one H100 lease traced a dummy-weight no-speculation server and ran the standalone probe
(``moe_mode``) beside it: at one token (grid 128) both compiled the same binary (48 registers,
36,864 B of shared memory), the standalone call took 25.2-27.0 µs and the server's 55.46 µs on
average, while the down-projection took 14.0 µs in both. SGLang's DeepSeek MoE layer
(``DeepseekV2MoE.forward_normal_dual_stream``) forks the shared expert onto a second stream at
the layer's start, so its GEMM can still occupy the SMs when the routed up-projection's 128
blocks are placed. This tool splits the instances of one kernel at one grid by whether a kernel
of another stream was running at the instance's start, and gives each side's count and times:
the dear mode is the resident side if its median is far above the clear side's.

    python -m sglang_ext_tools.moe_overlap --trace T.trace.json.gz [--grid 128] \
        [--kernel fused_moe_kernel] [--out overlap.json] [--slim slim.trace.json.gz]

``--slim`` writes the trace's kernel events and graph launches only, with the arguments read
here and by ``trace_breakdown.kernel_grids``: small enough to commit beside the result and
read again;
``--slim-only`` writes just that (``gpu_node.sh``'s dummy bench slims every server's profile,
so that the traces come back from the node under its 16 MiB a file).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.json_out import emit
from sglang_ext_tools.trace_breakdown import (
    BINARY_ARGS,
    GRAPH_LAUNCH,
    KERNEL_CATEGORIES,
    OCCUPANCY_ARG,
    _stream,
    load_trace,
)

# what this tool and trace_breakdown read of an event: its stream and launch shape, the graph
# launch it belongs to (correlation), and the binary args (binary_args)
KEPT_ARGS = (
    "stream",
    "grid",
    "block",
    "correlation",
    "graph id",
    *(arg for arg, _ in BINARY_ARGS),
    OCCUPANCY_ARG,
)


def kernels(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The trace's GPU kernel events (memcpy and memset too), by start time."""
    events = trace.get("traceEvents", []) if isinstance(trace, Mapping) else trace
    out = [e for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATEGORIES]
    return sorted(out, key=lambda e: e["ts"])


def _grid(event: Mapping[str, Any]) -> list[int]:
    return list((event.get("args") or {}).get("grid") or [])


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median_us": None, "p10_us": None, "p90_us": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "n": len(values),
        "median_us": round(statistics.median(values), 2),
        "p10_us": at(0.10),
        "p90_us": at(0.90),
    }


def overlap(trace: Mapping[str, Any], kernel: str, grid: int) -> dict[str, Any]:
    """Instances of ``kernel`` (a substring of its name) launched at grid (``grid``, 1, 1),
    split by whether another stream's kernel was running at each one's start."""
    events = kernels(trace)
    found = [e for e in events if kernel in e["name"] and _grid(e) == [grid, 1, 1]]
    if not found:
        raise ValueError(f"no {kernel} at grid [{grid}, 1, 1] in the trace")
    stream = _stream(found[0])
    others = [e for e in events if _stream(e) != stream]
    starts = [e["ts"] for e in others]
    # the longest other-stream kernel bounds how far back a resident one can have started
    reach = max((e.get("dur", 0) for e in others), default=0)
    sides: dict[str, dict[str, list]] = {
        side: {"us": [], "left": [], "names": []} for side in ("resident", "clear")
    }
    for event in found:
        start = event["ts"]
        lo = bisect.bisect_left(starts, start - reach)
        hi = bisect.bisect_right(starts, start)
        running = [o for o in others[lo:hi] if o["ts"] + o.get("dur", 0) > start]
        side = sides["resident" if running else "clear"]
        side["us"].append(event.get("dur", 0))
        if running:
            side["left"].append(max(o["ts"] + o.get("dur", 0) for o in running) - start)
            side["names"].extend(o["name"] for o in running)
    out: dict[str, Any] = {
        "kernel": kernel,
        "grid": [grid, 1, 1],
        "stream": stream,
        "instances": len(found),
        "binaries": sorted(
            {
                (
                    (e.get("args") or {}).get("registers per thread"),
                    (e.get("args") or {}).get("shared memory"),
                )
                for e in found
            },
            key=str,
        ),
    }
    out["all"] = _spread([e.get("dur", 0) for e in found])
    for name, side in sides.items():
        out[name] = _spread(side["us"]) | {
            "median_left_us": round(statistics.median(side["left"]), 2) if side["left"] else None,
            "kernels": [
                {"name": n[:120], "count": c} for n, c in Counter(side["names"]).most_common(3)
            ],
        }
    res, clear = out["resident"]["median_us"], out["clear"]["median_us"]
    out["resident_over_clear"] = round(res / clear, 3) if res and clear else None
    return out


def slim(trace: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel events and the graph launches that ran them, with only the arguments this
    tool and ``trace_breakdown``'s grid reading use (``kernel_grids`` reads a slim trace as it
    reads the whole one)."""
    launches = [
        e
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X"
        and e.get("cat") == "cuda_runtime"
        and str(e.get("name", "")).startswith(GRAPH_LAUNCH)
    ]
    return {
        "traceEvents": [
            {k: e[k] for k in ("ph", "cat", "name", "ts", "dur") if k in e}
            | {"args": {k: v for k, v in (e.get("args") or {}).items() if k in KEPT_ARGS}}
            for e in sorted([*launches, *kernels(trace)], key=lambda e: e["ts"])
        ]
    }


def around(trace: Mapping[str, Any], kernel: str) -> dict[str, Any]:
    """A slim trace cut to what this tool and ``moe_regimes`` read of ``kernel`` (a substring
    of its name): its instances, every kernel running as one of them starts, each graph
    launch's first kernel (a step's start) and the graph launches: a fifth of the slim trace
    at the rank shape, so several servers' traces can be committed (the device call's 64 MiB
    carries the checkout beside each wheel part)."""
    events = slim(trace)["traceEvents"]
    kern = [e for e in events if e.get("cat") in KERNEL_CATEGORIES]
    starts = sorted(e["ts"] for e in kern if kernel in e["name"])
    first: dict[Any, float] = {}
    for e in kern:
        corr = (e.get("args") or {}).get("correlation")
        first[corr] = min(first.get(corr, e["ts"]), e["ts"])

    def kept(e: Mapping[str, Any]) -> bool:
        if e.get("cat") not in KERNEL_CATEGORIES:
            return True  # a graph launch
        if kernel in e["name"] or first.get((e.get("args") or {}).get("correlation")) == e["ts"]:
            return True
        lo = bisect.bisect_left(starts, e["ts"])  # an instance starting while e runs
        return lo < len(starts) and starts[lo] < e["ts"] + e.get("dur", 0)

    return {"traceEvents": [e for e in events if kept(e)]}


def trace_parser(prog: str, description: str, grid_default: int | None) -> argparse.ArgumentParser:
    """The command line of a tool that reads one kernel at one grid in a profile trace:
    ``--trace``, ``--kernel``, ``--grid`` and ``--out`` (moe_overlap, moe_regimes)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--trace", type=Path, required=True, help="a profile trace (.json or .json.gz)")
    p.add_argument("--kernel", default="fused_moe_kernel", help="a substring of the kernel name")
    p.add_argument("--grid", type=int, default=grid_default,
                   help="the launch grid's x (y = z = 1)")  # fmt: skip
    p.add_argument("--out", type=Path, help="also write the result here (never overwritten)")
    return p


def check_paths(p: argparse.ArgumentParser, trace: Path, *outputs: Path | None) -> None:
    """Stop naming an output that exists (never written over) or a trace that does not."""
    for path in outputs:
        if path and path.exists():
            p.error(f"{path}: exists; not overwriting it")
    if not trace.is_file():
        p.error(f"--trace {trace}: no such file")


def main(argv: Sequence[str] | None = None) -> int:
    p = trace_parser("moe_overlap", __doc__.split("\n\n")[0], 128)
    p.add_argument("--slim", type=Path, help="write the slim trace here (never overwritten)")
    p.add_argument(
        "--slim-only",
        action="store_true",
        help="write --slim and read nothing (a trace with no instance at the grid is fine)",
    )
    p.add_argument(
        "--around",
        action="store_true",
        help="cut the --slim trace to --kernel's instances and what ran beside them (around)",
    )
    args = p.parse_args(argv)
    if args.slim_only and not args.slim:
        p.error("--slim-only needs --slim")
    if args.around and not args.slim:
        p.error("--around needs --slim")
    check_paths(p, args.trace, args.out, args.slim)
    trace = load_trace(args.trace)
    kernel = args.kernel if args.around else None
    if args.slim_only:
        write_slim(trace, args.slim, kernel)
        return 0
    try:
        result = {"trace": args.trace.name} | overlap(trace, args.kernel, args.grid)
    except ValueError as exc:
        p.exit(2, f"moe_overlap: {args.trace}: {exc}\n")
    if args.slim:
        write_slim(trace, args.slim, kernel)
    return emit(result, args.out)


def write_slim(trace: Mapping[str, Any], path: Path, kernel: str | None = None) -> None:
    """The slim trace, or with ``kernel`` the one cut ``around`` it, gzipped to ``path``."""
    with gzip.open(path, "wt") as fh:
        json.dump(around(trace, kernel) if kernel else slim(trace), fh, separators=(",", ":"))


if __name__ == "__main__":
    raise SystemExit(main())
