"""Does a kernel captured on a high-priority stream keep its priority when the CUDA graph that
holds it replays? A pure-torch probe of ``SGLANG_EXT_MOE_SHARED_STREAM=high``'s premise, no
SGLang.

Why: the switch gives SGLang's DeepSeek MoE layers a shared-expert stream of the highest
priority, so that at each layer's fork the shared expert's kernels are dispatched before the
routed branch's (issue #24: the routed up-projection is 2.1x dearer in the stretches of steps
where the shared expert's last GEMM runs beside it). SGLang serves from CUDA graphs; PyTorch
instantiates them with ``cudaGraphInstantiateFlagUseNodePriority``, under which each captured
kernel keeps its capturing stream's priority. This probe checks that on the card and torch at
hand.

Each step forks as SGLang's layer does: a large GEMM on the main stream (many waves of blocks),
then a small GEMM on a second stream issued after it, joined back. Where the small GEMM's
stream has the default priority its blocks queue behind the large one's and it ends near the
large one's end; where its stream has the highest priority its blocks go first as SMs free, and
it ends early. ``small_end_fraction`` = (small end − large start) / large duration, per step,
read from a profiler trace; eager and graph-replayed steps, each priority.

Ran 2026-12-07 (twenty-fourth session, H100, torch 2.11):
``tests/gpu/results/stream-priority-probe-2026-12-07-nvidia-h100.json``. The small GEMM ended at
0.947-0.948 of the large one's span on either stream, eager and replayed: the registered "≤ 0.3
at the highest priority" missed, so this probe could not tell whether replay keeps a node's
priority (``graph_keeps_priority`` false reads "no difference to keep"). The likeliest reading,
not checked: cuBLAS runs an 8192³ bf16 GEMM on Hopper as a persistent kernel, one block per SM
looping over tiles, so no SM frees up for the small GEMM's blocks before its end, whatever
their priority. The servers answered the switch's question instead: its ``high`` servers ran
every step dear, and ``=high`` is gone (``docs/seed-shape.md``).

    python -m sglang_ext_tools.stream_priority_probe [--steps 20] [--out probe.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.json_out import emit
from sglang_ext_tools.trace_breakdown import load_trace

HIGHEST = -(2**10)  # past any device's range: PyTorch maps it to the highest priority
LARGE = 8192  # a LARGE^3 bf16 GEMM: ~1.5 ms on an H100, hundreds of waves of blocks
SMALL = (64, 4096, 4096)


def steps_of(kernels: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The kernels grouped by step: the steps are synchronized, so a kernel that starts after
    every kernel so far has ended opens the next step."""
    groups: list[list[Mapping[str, Any]]] = []
    end = None
    for e in sorted(kernels, key=lambda e: e["ts"]):
        if end is None or e["ts"] >= end:
            groups.append([])
            end = e["ts"]
        groups[-1].append(e)
        end = max(end, e["ts"] + e["dur"])
    return groups


def fractions(kernels: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per step, (small end − large start) / large duration: the step's longest kernel is the
    large GEMM, and the small GEMM's end is the last end among the rest (cuBLAS may add a
    reduction kernel to it)."""
    out = []
    for group in steps_of(kernels):
        if len(group) < 2:
            raise ValueError(f"a step of {len(group)} kernel(s): expected the two GEMMs")
        large, *rest = sorted(group, key=lambda e: -e["dur"])
        small_end = max(e["ts"] + e["dur"] for e in rest)
        out.append(round((small_end - large["ts"]) / large["dur"], 4))
    return out


def _kernels(trace_path: Path) -> list[dict[str, Any]]:
    events = load_trace(trace_path).get("traceEvents", [])
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def measure(mode: str, priority: int, steps: int) -> dict[str, Any]:
    """``steps`` forked steps in ``mode`` (eager or graph) with the second stream at
    ``priority``; the per-step fractions and their median."""
    import torch

    a = torch.randn(LARGE, LARGE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(LARGE, LARGE, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(SMALL[0], SMALL[1], device="cuda", dtype=torch.bfloat16)
    w = torch.randn(SMALL[1], SMALL[2], device="cuda", dtype=torch.bfloat16)
    second = torch.cuda.Stream(priority=priority)
    outs: dict[str, torch.Tensor] = {}

    def step() -> None:
        main = torch.cuda.current_stream()
        second.wait_stream(main)
        outs["large"] = a @ b
        with torch.cuda.stream(second):
            outs["small"] = x @ w
        main.wait_stream(second)

    run = step
    if mode == "graph":
        capture = torch.cuda.Stream()
        capture.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(capture):
            for _ in range(3):
                step()  # warm: cuBLAS picks and allocates outside the capture
        torch.cuda.current_stream().wait_stream(capture)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                run()
                torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
        found = fractions(_kernels(path))
    return {
        "mode": mode,
        "priority_asked": priority,
        "priority": second.priority,
        "steps": len(found),
        "small_end_fraction_median": statistics.median(found),
        "small_end_fraction": found,
    }


def reading(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per mode, the default-priority median over the highest-priority one's (> 1: the
    priority moved the small GEMM ahead), and whether the graph kept what eager showed."""
    med = {(r["mode"], r["priority_asked"] == 0): r["small_end_fraction_median"] for r in runs}
    out: dict[str, Any] = {}
    for mode in ("eager", "graph"):
        low, high = med.get((mode, True)), med.get((mode, False))
        out[f"{mode}_default_over_high"] = round(low / high, 3) if low and high else None
    e, g = out["eager_default_over_high"], out["graph_default_over_high"]
    out["graph_keeps_priority"] = None if not e or not g else (g >= 2 and e >= 2)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stream_priority_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per condition")
    p.add_argument("--out", type=Path, help="also write the result here (never overwritten)")
    args = p.parse_args(argv)
    if args.out and args.out.exists():
        p.error(f"{args.out}: exists; not overwriting it")
    import torch

    if not torch.cuda.is_available():
        p.exit(2, "stream_priority_probe: needs a CUDA GPU\n")
    runs = [measure(m, pr, args.steps) for m in ("eager", "graph") for pr in (0, HIGHEST)]
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": " ".join(["python -m sglang_ext_tools.stream_priority_probe", *sys.argv[1:]]),
        "large_gemm": [LARGE] * 3,
        "small_gemm": list(SMALL),
        "runs": runs,
        **reading(runs),
    }
    return emit(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
