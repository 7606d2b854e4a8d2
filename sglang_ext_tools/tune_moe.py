#!/usr/bin/env python
"""A tuned fused-MoE kernel config for one MoE shape on this GPU, where SGLang ships none.

SGLang's Triton MoE runner looks up ``E=..,N=..,device_name=...json`` under
``$SGLANG_MOE_CONFIG_DIR/configs/triton_<version>/`` (``fused_moe_triton_config.py:
get_moe_configs``) and, finding none, logs "Using default MoE kernel config. Performance
might be sub-optimal!" and runs ``get_default_config``. Every server of the seed-shape run
(2026-12-03: E=32, N=256 on the H200) did. Its verify forward of 4-8 tokens routes each to 8
of 32 experts, so its MoE reads about three times the expert rows of a decode step: the
MoE fan-out that put the trained cycle 0.25-0.47 decode steps above the dummy one.

This times ``fused_moe`` under ``override_config`` for each candidate config at each token
count in --tokens (decode 1, verify = draft tokens x batch), each call inside a CUDA graph
so the host's launch cost stays out, keeps the fastest per token count and writes the table
where SGLang looks. Token counts not searched (prefill's) carry SGLang's own default config
for that count, so the file changes nothing the search did not time. Then serve with
``SGLANG_MOE_CONFIG_DIR=OUT``.

    python -m sglang_ext_tools.tune_moe --model TARGET_DIR --out /tmp/moe-configs \\
        --json tune-moe.json

The report (--json) has, per token count, the default config's time, the best one's, and
the saving per forward over the model's MoE layers: the prediction to hold the served
cycle against.

``--beside-shared`` times each candidate as a server runs it: ``fused_experts`` on the
current stream and the shared experts' MLP on a second stream issued after it, forked and
joined inside the graph (SGLang 0.5.23's ``deepseek_v2.py:DeepseekV2MoE.
forward_normal_dual_stream``). Alone, the kernel was timed equal at block N 32 and 64 for 6
tokens (89.5 and 90.6 us) on 2026-12-03, while the served 5/1/6 cycle was 0.17 decode steps
cheaper in the run that served 64. The guess was that the shared expert's small kernels wait
for SMs the routed kernel's CTAs hold; served side by side in one group later that day
(the sixth seed-shape run), block N 64 was 1.5 % slower after the first token, so the gap
was between sessions, not configs. Each count's timings of every candidate are in the
report (``timed``), so the two modes can be set side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Token counts a batch-1 server runs through the MoE: decode, the verify forwards of chains
# 3/1/4 .. 7/1/8 and trees of 5 and 8 draft tokens, and a few batches of them.
DEFAULT_TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
# Counts past the search keep SGLang's default there (nearest-key lookup): prefill's.
DEFAULT_FILL = (48, 64, 128, 256, 512, 1024, 2048, 4096)
SMEM_BYTES = 227 * 1024  # Hopper's opt-in shared memory per block


@dataclasses.dataclass(frozen=True)
class MoeShape:
    experts: int  # E, routed experts on this rank
    intermediate: int  # N, each expert's intermediate width on this rank
    hidden: int  # K
    topk: int
    layers: int  # MoE layers per forward (the saving multiplies by it)
    shared: int = 0  # the shared experts' intermediate width on this rank (0: none)

    @classmethod
    def from_config(cls, config: dict[str, Any], tp: int = 1) -> MoeShape:
        """DeepSeek-V3-style config.json (n_routed_experts, moe_intermediate_size,
        num_experts_per_tok, first_k_dense_replace)."""
        missing = [
            k
            for k in ("n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")
            if k not in config
        ]
        if missing:
            raise ValueError(
                f"config.json has no {', '.join(missing)}: not a DeepSeek-V3-style MoE "
                "model; give --experts --intermediate --hidden --topk instead"
            )
        if config["moe_intermediate_size"] % tp:
            raise ValueError(
                f"moe_intermediate_size {config['moe_intermediate_size']} does not split "
                f"over tp {tp}"
            )
        dense = config.get("first_k_dense_replace", 0)
        freq = config.get("moe_layer_freq", 1)
        layers = sum(1 for i in range(config["num_hidden_layers"]) if i >= dense and i % freq == 0)
        shared = (config.get("n_shared_experts") or 0) * config["moe_intermediate_size"]
        return cls(
            experts=config["n_routed_experts"],
            intermediate=config["moe_intermediate_size"] // tp,
            hidden=config["hidden_size"],
            topk=config["num_experts_per_tok"],
            layers=layers,
            shared=shared // tp,
        )


def candidate_configs(quick: bool = False) -> list[dict[str, int]]:
    """bf16 configs for small token counts that fit Hopper's shared memory."""
    block_m = (16, 32) if quick else (16, 32, 64)
    block_n = (32, 64, 128) if quick else (32, 64, 128, 256)
    block_k = (64, 128, 256)
    warps = (4,) if quick else (4, 8)
    stages = (3, 4) if quick else (2, 3, 4, 5)
    out = []
    for m, n, k, w, s in itertools.product(block_m, block_n, block_k, warps, stages):
        if (m * k + k * n) * 2 * s > SMEM_BYTES:
            continue
        out.append(
            {
                "BLOCK_SIZE_M": m,
                "BLOCK_SIZE_N": n,
                "BLOCK_SIZE_K": k,
                "GROUP_SIZE_M": 1,
                "num_warps": w,
                "num_stages": s,
            }
        )
    return out


def config_table(
    best: dict[int, dict[str, int]], default_for, fill: tuple[int, ...] = DEFAULT_FILL
) -> dict[str, dict[str, int]]:
    """SGLang's file layout: {"M": config}, the searched counts with their best config and
    the fill counts with ``default_for(M)`` (what SGLang runs there without a file)."""
    table = {m: dict(cfg) for m, cfg in best.items()}
    for m in fill:
        if m not in table and m > max(best, default=0):
            table[m] = dict(default_for(m))
    return {str(m): table[m] for m in sorted(table)}


def config_path(out: Path, triton_version: str, file_name: str) -> Path:
    return out / "configs" / f"triton_{triton_version.replace('.', '_')}" / file_name


def check_out_dir(out: Path) -> None:
    """OUT must be new or empty: the tool never writes over a config someone keeps."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty directory; give a new one")


def default_config_for(shape: MoeShape):
    """M -> the config SGLang runs at M tokens for this shape when it finds no file."""
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (
        get_default_config,
    )

    e, n, k, topk = shape.experts, shape.intermediate, shape.hidden, shape.topk
    return lambda m: get_default_config(m, e, n, k, topk, None, False, None)


def shape_and_best(report: Mapping[str, Any]) -> tuple[MoeShape, dict[int, dict[str, int]]]:
    """A ``tune_moe`` report's shape and its best config per token count."""
    try:
        shape = MoeShape(**report["shape"])
        best = {int(m): dict(r["best"]) for m, r in report["tokens"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a tune_moe report (shape, tokens[M].best): {exc!r}") from exc
    if not best:
        raise ValueError("the tune_moe report has no token counts")
    return shape, best


def write_config(shape: MoeShape, best: Mapping[int, Mapping[str, int]], out: Path) -> Path:
    """The servers' MoE config file, rebuilt as ``tune_moe`` wrote it, under ``out``."""
    import triton
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (
        get_config_file_name,
    )

    with sglang_context():  # SGLang's default config reads the published server args
        table = config_table(dict(best), default_config_for(shape))
    name = get_config_file_name(shape.experts, shape.intermediate, None)
    path = config_path(out, triton.__version__, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=2) + "\n")
    return path


class OneRank:
    """The tensor-parallel group of a process that is the whole model (one GPU, no peers):
    SGLang's MoE code reads the group before it decides whether to allocate its output in
    NCCL symmetric memory (``fused_moe.py:fused_experts_impl``), which at one rank it never
    does."""

    world_size = 1
    rank_in_group = 0
    device_group = None
    cpu_group = None


@contextlib.contextmanager
def sglang_context():
    """SGLang 0.5.23's kernels read the published server config (``get_exec()``) and the
    parallel context (``get_parallel().tp_group``); outside a server, publish its dummy
    config and one rank for the time of the call. (2026-12-03 on the H200: without the
    rank, every ``fused_experts`` call stopped with "parallel name 'tp_group' has not been
    written in this process".)"""
    try:
        from sglang.srt.runtime_context import get_context, get_parallel
    except ImportError:  # SGLang before the runtime context (0.5.17)
        yield
        return
    with get_context().override_server_args(), get_parallel().override(tp_group=OneRank()):
        yield


def _timer(fn, reps: int, graph_calls: int) -> float:
    """Median ms of one call of ``fn``: ``graph_calls`` calls captured in one CUDA graph,
    the graph replayed ``reps`` times."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(graph_calls):
            fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / graph_calls)
    graph.reset()
    times.sort()
    return times[len(times) // 2]


def beside(routed, shared, side, cuda=None):
    """One call that runs ``routed()`` on the current stream and ``shared()`` on ``side``,
    issued after it: ``side`` waits for the current stream first (the fork) and the current
    stream for ``side`` last (the join), so inside a captured graph the two run
    concurrently, in the order SGLang 0.5.23 issues a DeepSeek MoE layer's two branches.
    ``cuda``: ``torch.cuda`` (a stand-in in CPU tests)."""
    if cuda is None:
        import torch

        cuda = torch.cuda

    def both():
        main = cuda.current_stream()
        side.wait_stream(main)
        routed()
        with cuda.stream(side):
            shared()
        main.wait_stream(side)

    return both


def shared_mlp(x, gate_up, down, silu_and_mul):
    """The shared experts' MLP as SGLang runs it in bf16: gate_up GEMM, ``silu_and_mul(h,
    out)`` (the tuner passes SGLang's fused kernel), down GEMM."""
    import torch
    import torch.nn.functional as F

    h = F.linear(x, gate_up)
    act = torch.empty(h.shape[:-1] + (h.shape[-1] // 2,), dtype=h.dtype, device=h.device)
    silu_and_mul(h, act)
    return F.linear(act, down)


def shared_weights(shape: MoeShape, device: str = "cuda"):
    """Random bf16 weights of the shared experts' MLP: gate-up (2S, K) and down (K, S), scaled
    by fan-in (torch's generator as it stands)."""
    import torch

    k, s = shape.hidden, shape.shared
    gate_up = torch.randn(2 * s, k, device=device, dtype=torch.bfloat16) * k**-0.5
    down = torch.randn(k, s, device=device, dtype=torch.bfloat16) * s**-0.5
    return gate_up, down


def routed_inputs(shape: MoeShape, m: int, device: str = "cuda"):
    """``m`` random bf16 tokens and SGLang's top-k output sending each to ``topk`` distinct
    experts drawn at random (the fan-out of real routing), with softmaxed weights."""
    import torch
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    x = torch.randn(m, shape.hidden, device=device, dtype=torch.bfloat16)
    ids = torch.rand(m, shape.experts, device=device).topk(shape.topk, dim=-1).indices
    weights = torch.softmax(torch.randn(m, shape.topk, device=device), -1)
    return x, StandardTopKOutput(weights, ids.to(torch.int32), torch.empty(0, device=device))


def expert_weights(shape: MoeShape, device: str = "cuda"):
    """Seeded random bf16 expert weights of ``shape`` as SGLang's fused MoE takes them: the
    gate-up projection (E, 2N, K) and the down projection (E, K, N), scaled by fan-in. Seeds
    torch's generator (0), as the timings that follow it expect."""
    import torch

    torch.manual_seed(0)
    e, n, k = shape.experts, shape.intermediate, shape.hidden
    w1 = torch.randn(e, 2 * n, k, device=device, dtype=torch.bfloat16) * k**-0.5
    w2 = torch.randn(e, k, n, device=device, dtype=torch.bfloat16) * n**-0.5
    return w1, w2


def tune(
    shape: MoeShape,
    tokens,
    configs,
    reps: int,
    graph_calls: int,
    time_limit: float,
    beside_shared: bool = False,
):
    """Per token count: (default config, its ms, best config, its ms, configs timed, every
    timing). ``beside_shared``: each call with the shared experts' MLP beside it (``beside``)."""
    import torch
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils import override_config
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts

    w1, w2 = expert_weights(shape)
    runner = MoeRunnerConfig(inplace=False, top_k=shape.topk)
    if beside_shared:
        from sglang.srt.layers.activation import silu_and_mul

        gate_up, down = shared_weights(shape)
        side = torch.cuda.Stream()
    calls = {m: routed_inputs(shape, m) for m in tokens}

    def timed_ms(cfg, m):
        x, topk_out = calls[m]

        def fn():
            with override_config(cfg):
                fused_experts(x, w1, w2, topk_out, runner)

        if beside_shared:
            fn = beside(fn, lambda: shared_mlp(x, gate_up, down, silu_and_mul), side)
        return _timer(fn, reps, graph_calls)

    results = search(tokens, configs, timed_ms, default_config_for(shape), time_limit)
    for m, r in results.items():
        print(
            f"M={m}: default {r['default_ms'] * 1e3:.1f} us, best {r['best_ms'] * 1e3:.1f} us "
            f"({r['configs_timed']} configs)",
            flush=True,
        )
    return results


def search(tokens, configs, timed_ms, default_for, time_limit: float, clock=time.monotonic):
    """The fastest config per token count: ``timed_ms(config, m)`` for SGLang's default at
    each count, then each candidate, configs outside and counts inside, so a time limit cuts
    every count's search alike. A candidate the kernel refuses (``timed_ms`` raises: too much
    shared memory, a block shape it cannot compile) is skipped; the default never is."""
    results = {}
    for m in tokens:
        default = default_for(m)
        ms = timed_ms(default, m)
        results[m] = {"default": default, "default_ms": ms, "best": dict(default), "best_ms": ms}
        results[m]["configs_timed"] = 0
        results[m]["timed"] = []
    deadline = clock() + time_limit
    for cfg in configs:
        if clock() > deadline:
            break
        for m in tokens:
            try:
                ms = timed_ms(cfg, m)
            except Exception:  # noqa: BLE001 - a config the kernel or the GPU refuses
                break
            r = results[m]
            r["configs_timed"] += 1
            r["timed"].append({"config": dict(cfg), "ms": round(ms, 5)})
            if ms < r["best_ms"]:
                r["best"], r["best_ms"] = dict(cfg), ms
    for r in results.values():
        r["default_ms"], r["best_ms"] = round(r["default_ms"], 5), round(r["best_ms"], 5)
    return results


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="target directory (config.json)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size it is served at")
    p.add_argument("--experts", type=int)
    p.add_argument("--intermediate", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--topk", type=int)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    p.add_argument("--quick", action="store_true", help="a smaller search (33 configs against 224)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--graph-calls", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=300.0, help="search seconds, all counts")
    p.add_argument("--out", required=True, help="new or empty directory: SGLANG_MOE_CONFIG_DIR")
    p.add_argument("--json", help="report file")
    p.add_argument(
        "--beside-shared",
        action="store_true",
        help="time each config with the shared experts' MLP on a second stream beside it, as "
        "a DeepSeek-V3 layer runs in SGLang's captured graph",
    )
    p.add_argument("--shared", type=int, default=0, help="without --model: shared width")
    p.add_argument(
        "--from-report",
        help="time nothing: rebuild the config an earlier --json report picked (its shape and "
        "best config per token count) under --out, to serve a run with exactly that config",
    )
    return p.parse_args(argv)


def shape_from_args(args) -> MoeShape:
    if args.model:
        config = json.loads((Path(args.model) / "config.json").read_text())
        return MoeShape.from_config(config, args.tp)
    given = [args.experts, args.intermediate, args.hidden, args.topk]
    if any(v is None for v in given):
        raise ValueError("give --model, or all of --experts --intermediate --hidden --topk")
    return MoeShape(
        args.experts, args.intermediate, args.hidden, args.topk, args.layers, args.shared
    )


def rebuild(report_path: Path, out: Path, json_out: Path | None, argv: Sequence[str]) -> int:
    """``--from-report``: the report's config under ``out``; ``json_out`` gets the report as it
    was (the tuning that picked the configs: its date, GPU, timings) with ``rebuilt`` added."""
    try:
        report = json.loads(report_path.read_text())
        shape, best = shape_and_best(report)
        check_out_dir(out)
        if json_out and json_out.exists():
            raise ValueError(f"--json {json_out}: exists; not overwriting it")
    except (ValueError, OSError) as exc:
        print(f"error: --from-report {report_path}: {exc}", file=sys.stderr)
        return 2
    path = write_config(shape, best, out)
    print(f"wrote {path} from {report_path}; serve with SGLANG_MOE_CONFIG_DIR={out}")
    if json_out:
        report["rebuilt"] = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": "python -m sglang_ext_tools.tune_moe " + " ".join(argv),
            "from": str(report_path),
            "config_file": str(path),
        }
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = Path(args.out)
    if args.from_report:
        return rebuild(Path(args.from_report), out, Path(args.json) if args.json else None, argv)
    try:
        shape = shape_from_args(args)
        if args.beside_shared and not shape.shared:
            where = f"{args.model}/config.json" if args.model else "--shared"
            raise ValueError(
                f"--beside-shared: {where} gives no shared experts (n_shared_experts "
                "0 or missing), so there is nothing to run beside the routed ones"
            )
        check_out_dir(out)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch
    import triton

    if not torch.cuda.is_available():
        print("error: tune_moe times kernels on a GPU; none is visible", file=sys.stderr)
        return 2
    started = time.time()
    with sglang_context():
        results = tune(
            shape,
            sorted(set(args.tokens)),
            candidate_configs(args.quick),
            args.reps,
            args.graph_calls,
            args.time_limit,
            args.beside_shared,
        )
    path = write_config(shape, {m: r["best"] for m, r in results.items()}, out)
    print(f"wrote {path}; serve with SGLANG_MOE_CONFIG_DIR={out}")
    if args.json:
        for r in results.values():
            r["saving_ms_per_forward"] = round((r["default_ms"] - r["best_ms"]) * shape.layers, 4)
        report = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(),
            "versions": {"torch": torch.__version__, "triton": triton.__version__},
            "shape": dataclasses.asdict(shape),
            "config_file": str(path),
            "command": "python -m sglang_ext_tools.tune_moe " + " ".join(argv),
            "wall_s": round(time.time() - started, 1),
            "timing": "fused_experts beside the shared experts' MLP on a second stream"
            if args.beside_shared
            else "fused_experts alone",
            "tokens": {str(m): r for m, r in results.items()},
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
