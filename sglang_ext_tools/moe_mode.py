"""Does a fresh compile, a warm Triton cache or PDL set the fused-MoE up-projection's speed?

2026-12-06 (issue #24, the tenth seed-shape run, one H100): three 5/1/6 servers of one target
and one tuned MoE config drew two verify cycles, 11.84 ms and 12.86 ms. The traces put the
whole difference in the MoE up-projection (`fused_moe_kernel`, grid 544 at 6 tokens): 68.6 us
a call against 82.2 us. Two candidates: a kernel loaded from a warm cache against one compiled
in its own process, and SGLang 0.5.23's early PDL launch of the activation after that GEMM
(``sglang_ext.serving.moe_pdl``). A server run answers it at ~250 s a pair; this probe asks
it of the kernel alone, in ~30 s a process, without a model.

Each ``--run LABEL:CACHE:PDL`` is one fresh Python process, in order, with its own env:
``TRITON_CACHE_DIR``, ``SGLANG_JIT_CACHE_DIR`` and ``SGLANG_CACHE_DIR`` under
``--cache-root/CACHE`` (a CACHE named for the first time starts empty, a later run with the
same name finds what the earlier ones compiled), and ``SGLANG_EXT_MOE_PDL=PDL``. The process
times SGLang's ``fused_experts`` per token count in a CUDA graph (``tune_moe``'s timer, random
top-k routing as the tuner's), alone and beside the shared experts' MLP on a second stream as
a DeepSeek layer runs in SGLang's graph, then records one profiled replay of the latter and
reads each ``fused_moe_kernel`` launch: the first of each call is the up-projection. Its first
call's seconds say whether it compiled (seconds) or loaded (well under one). An optional
fourth field, ``:LAYERS`` (default 1), gives the process that many layers' expert weights,
each call taking the next: one layer's stay in L2 from call to call, as a server's do not
(added 2026-12-06 after the first probe, whose processes all ran on one layer's weights).

The MoE config the servers had is rebuilt from their ``tune_moe`` report (``--tune-json``:
the shape, and the best config per token count) into ``--cache-root/moe-configs``.

    python -m sglang_ext_tools.moe_mode --tune-json tune-moe.json --cache-root /tmp/mm \\
        --json moe-mode.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.json_out import emit
from sglang_ext_tools.trace_breakdown import binary_args
from sglang_ext_tools.tune_moe import MoeShape, shape_and_best, write_config

NEEDLE = "fused_moe_kernel"
DEFAULT_RUNS = (
    "fresh-pdl:a:1",
    "warm-pdl:a:1",
    "fresh-nopdl:a:0",
    "warm-nopdl:a:0",
    "warm-pdl-again:a:1",
)
CHILD_MARK = "moe_mode result: "
FRAG_HOLE_MB = 20  # torch's caching allocator gives an allocation of this size a segment
FRAG_LEAVE_MB = 256  # left unfilled: what the weights find outside the holes


def frag_plan(free_bytes: int, hole_mb: int = FRAG_HOLE_MB, leave_mb: int = FRAG_LEAVE_MB):
    """How many ``hole_mb`` segments fill ``free_bytes`` up to ``leave_mb``, and which of
    them are released again (every other one): the holes the weights are mapped from."""
    count = max(0, (free_bytes - (leave_mb << 20)) // (hole_mb << 20))
    return count, list(range(0, count, 2))


def fragment_gpu() -> tuple[list, dict[str, int]]:
    """Fill the free GPU memory with segments and release every other one (cudaFree through
    ``empty_cache``). Returns the segments kept (held until the process ends) and the plan."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    count, released = frag_plan(free)
    segments = [
        torch.empty(FRAG_HOLE_MB << 20, dtype=torch.uint8, device="cuda") for _ in range(count)
    ]
    for k in reversed(released):
        del segments[k]
    torch.cuda.empty_cache()
    return segments, {"segments": count, "holes": len(released), "hole_mb": FRAG_HOLE_MB}


@dataclasses.dataclass(frozen=True)
class Run:
    label: str
    cache: str  # a folder name under the cache root, shared by every run that names it
    pdl: str  # SGLANG_EXT_MOE_PDL's value: "1" as SGLang launches, "0" without PDL
    # how many layers' expert weights the calls go through in turn: 1 keeps one layer's in
    # L2 between calls; more, as a server's 60 MoE layers do, makes each call's weights cold
    layers: int = 1
    # "frag": the weights are allocated after the GPU's free memory was filled with
    # FRAG_HOLE_MB segments and every other one released, so they map scattered physical
    # holes (as a server's may after other processes' loads); "" allocates on a clean GPU
    alloc: str = ""

    @classmethod
    def parse(cls, spec: str) -> Run:
        parts = spec.split(":")
        if len(parts) not in (3, 4, 5) or not all(parts):
            raise ValueError(
                f"--run {spec!r}: expected LABEL:CACHE:PDL[:LAYERS[:frag]], e.g. fresh-pdl:a:1"
            )
        label, cache, pdl = parts[:3]
        if pdl not in ("0", "1"):
            raise ValueError(f"--run {spec!r}: PDL must be 0 or 1, found {pdl!r}")
        if "/" in cache or cache in (".", "..", "moe-configs"):
            raise ValueError(f"--run {spec!r}: CACHE {cache!r} must be a plain folder name")
        layers = parts[3] if len(parts) >= 4 else "1"
        if not layers.isdigit() or int(layers) < 1:
            raise ValueError(
                f"--run {spec!r}: LAYERS must be a whole number >= 1, found {layers!r}"
            )
        alloc = parts[4] if len(parts) == 5 else ""
        if alloc not in ("", "frag"):
            raise ValueError(f"--run {spec!r}: the fifth field may only be 'frag', found {alloc!r}")
        return cls(label, cache, pdl, int(layers), alloc)


def parse_runs(specs: Sequence[str]) -> list[Run]:
    runs = [Run.parse(s) for s in specs]
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--run labels repeat: {labels}")
    return runs


def run_env(run: Run, root: Path, config_dir: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ``base`` with the run's caches and PDL switch, and the MoE
    config the servers had."""
    cache = root / run.cache
    return {
        **base,
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "SGLANG_JIT_CACHE_DIR": str(cache / "jit"),
        "SGLANG_CACHE_DIR": str(cache),
        "SGLANG_EXT_MOE_PDL": run.pdl,
        "SGLANG_MOE_CONFIG_DIR": str(config_dir),
    }


def up_and_down(kernels: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The fused-MoE GEMM launches of a profiled replay, in launch order: each call runs the
    up-projection, then the down-projection. Mean us a launch and grid of each, and the
    binary's registers and shared memory where the trace has them (as a server's trace)."""
    launches = sorted((k for k in kernels if NEEDLE in k.get("name", "")), key=lambda k: k["ts"])
    if not launches or len(launches) % 2:
        raise ValueError(f"{len(launches)} {NEEDLE} launches: expected two a call")
    out = {}
    for part, picked in (("up", launches[0::2]), ("down", launches[1::2])):
        grids = {tuple((k.get("args") or {}).get("grid") or ()) for k in picked}
        out[part] = {
            "calls": len(picked),
            "mean_us": round(statistics.fmean(k["dur"] for k in picked), 2),
            "grids": sorted(list(g) for g in grids),
            **binary_args(picked),
        }
    return out


def child(
    shape: MoeShape,
    tokens: Sequence[int],
    reps: int,
    graph_calls: int,
    layers: int = 1,
    alloc: str = "",
) -> dict:
    """In a fresh process: per token count, us a call alone and beside the shared MLP, and the
    up/down launches of one profiled replay (beside, as served). With ``layers`` > 1 each
    call takes the next of that many layers' expert weights (each its own allocation)."""
    import torch
    from sglang.srt.layers.activation import silu_and_mul
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts

    from sglang_ext.serving import moe_pdl
    from sglang_ext_tools.tune_moe import (
        _timer,
        beside,
        expert_weights,
        routed_inputs,
        shared_mlp,
        shared_weights,
    )

    if moe_pdl.requested():
        moe_pdl.rebind()
    out: dict[str, Any] = {"tokens": {}}
    if alloc == "frag":
        kept, out["frag"] = fragment_gpu()  # noqa: F841  (held: the holes stay holes)
    # each layer's weights drawn alike (expert_weights seeds), so only where they sit differs
    experts = [expert_weights(shape) for _ in range(layers)]
    gate_up, down = shared_weights(shape)
    side = torch.cuda.Stream()
    runner = MoeRunnerConfig(inplace=False, top_k=shape.topk)
    for m in tokens:
        x, topk_out = routed_inputs(shape, m)

        turn = itertools.cycle(experts)

        def routed(x=x, topk_out=topk_out, turn=turn):
            w1, w2 = next(turn)  # at capture: each captured call its own layer's weights
            fused_experts(x, w1, w2, topk_out, runner)

        both = beside(routed, lambda x=x: shared_mlp(x, gate_up, down, silu_and_mul), side)
        started = time.monotonic()
        routed()
        torch.cuda.synchronize()
        first_s = time.monotonic() - started
        row = {
            "first_call_s": round(first_s, 3),
            "alone_us": round(_timer(routed, reps, graph_calls) * 1e3, 2),
            "beside_us": round(_timer(both, reps, graph_calls) * 1e3, 2),
        }
        row["kernels"] = profiled(both, graph_calls)
        out["tokens"][str(m)] = row
    return out


def profiled(fn, graph_calls: int) -> dict[str, Any]:
    """``fn`` captured ``graph_calls`` times in one graph, replayed under the profiler."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(graph_calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    graph.reset()
    return up_and_down(e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel")


def run_children(
    runs: Sequence[Run],
    argv_child: Sequence[str],
    root: Path,
    config_dir: Path,
    runner=None,
    on_row=None,
) -> list[dict[str, Any]]:
    """Each run in order, in a process of its own; its result or why it has none.
    ``on_row(rows)`` after each (the result file so far: a lease cut short keeps it)."""
    runner = runner or subprocess.run
    results = []
    for order, run in enumerate(runs, 1):
        env = run_env(run, root, config_dir, os.environ)
        started = time.monotonic()
        proc = runner(
            [sys.executable, "-m", "sglang_ext_tools.moe_mode", *argv_child,
             "--child-layers", str(run.layers), "--child-alloc", run.alloc or "clean"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        row: dict[str, Any] = {
            **dataclasses.asdict(run),
            "order": order,
            "wall_s": round(time.monotonic() - started, 1),
        }
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_MARK)]
        if proc.returncode == 0 and lines:
            row.update(json.loads(lines[-1][len(CHILD_MARK) :]))
        else:
            row["error"] = f"exit {proc.returncode}: " + (proc.stderr or "")[-1500:]
        print(f"{run.label}: {json.dumps(row)[:400]}", file=sys.stderr, flush=True)
        results.append(row)
        if on_row:
            on_row(results)
    return results


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tune-json", required=True, help="the servers' tune_moe report")
    p.add_argument("--cache-root", required=True, help="a new folder for the runs' caches")
    p.add_argument("--run", nargs="+", default=list(DEFAULT_RUNS), help="LABEL:CACHE:PDL[:LAYERS]")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 6])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--graph-calls", type=int, default=20)
    p.add_argument("--json", help="write the result here (never over a file)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-layers", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--child-alloc", choices=("clean", "frag"), default="clean",
                   help=argparse.SUPPRESS)  # fmt: skip
    args = p.parse_args(argv)
    if any(m < 1 for m in args.tokens):
        p.error(f"--tokens {args.tokens}: each at least 1")
    try:
        args.runs = parse_runs(args.run)
    except ValueError as exc:
        p.error(str(exc))
    try:
        args.shape, args.best = shape_and_best(json.loads(Path(args.tune_json).read_text()))
    except (OSError, ValueError) as exc:
        p.error(f"--tune-json {args.tune_json}: {exc}")
    if not args.shape.shared:
        p.error(f"--tune-json {args.tune_json}: the shape has no shared experts to run beside")
    if not args.child:
        if args.json and Path(args.json).exists():
            p.error(f"--json {args.json}: exists; not overwriting it")
        if Path(args.cache_root).exists():
            p.error(f"--cache-root {args.cache_root}: exists; give a new folder")
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        from sglang_ext_tools.tune_moe import sglang_context

        with sglang_context():
            alloc = "frag" if args.child_alloc == "frag" else ""
            result = child(
                args.shape, args.tokens, args.reps, args.graph_calls, args.child_layers, alloc
            )
        print(CHILD_MARK + json.dumps(result), flush=True)
        return 0
    import sglang
    import torch
    import triton

    from sglang_ext_tools.gpu_watch import gpu_info

    root = Path(args.cache_root)
    root.mkdir(parents=True)
    config_file = write_config(args.shape, args.best, root / "moe-configs")
    child_argv = [
        "--child", "--tune-json", args.tune_json, "--cache-root", str(root),
        "--tokens", *map(str, args.tokens), "--reps", str(args.reps),
        "--graph-calls", str(args.graph_calls),
    ]  # fmt: skip
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m sglang_ext_tools.moe_mode " + " ".join(argv),
        "gpu": gpu_info(),
        "versions": {
            "sglang": sglang.__version__,
            "torch": torch.__version__,
            "triton": triton.__version__,
        },
        # what runs: SGLang's Triton fused MoE (fused_experts), no attention, no server
        "backend": "triton fused_moe",
        "shape": dataclasses.asdict(args.shape),
        "moe_config_file": str(config_file),
        "timing": "us a call: CUDA graph of graph_calls calls, median of reps replays; "
        "kernels: one profiled replay beside the shared MLP, up = first GEMM of each call",
        "runs": [],
        "complete": False,
    }

    def so_far(rows):  # this run's own file, rewritten as each process ends
        if args.json:
            Path(args.json).write_text(json.dumps({**out, "runs": rows}, indent=1) + "\n")

    out["runs"] = run_children(args.runs, child_argv, root, root / "moe-configs", on_row=so_far)
    out["complete"] = True
    emit(out, Path(args.json) if args.json else None)
    return 0 if all("error" not in r for r in out["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
