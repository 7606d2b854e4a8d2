"""Does where the experts' weights sit in GPU memory set the fused-MoE kernel's speed?

2026-12-06 (issue #24, the eighth seed-shape run, one H100): the traced requests of two
no-speculation servers of one target and one tuned MoE config file spent 1,978 and 3,288 us
a decode step in the one-token up-projection (`fused_moe_kernel`, 128 blocks: one per SM),
and 845 and 839 us in the down-projection (1,792 blocks). 5/1/6's verify cycle on the H200 moves
by the same 1.3 ms between servers (timed, not traced). One suspect is placement. With one
block per SM, each block streams its own 458 KB slice of an expert's weights at a fixed
stride. Whether those strides hit the memory partitions evenly depends on the tensor's base
address, which each server's allocations set.

Three arms, each timing SGLang's ``fused_experts`` (``tune_moe``'s CUDA-graph timer, the
config SGLang would pick: ``SGLANG_MOE_CONFIG_DIR`` as the server had it) per token count:
- ``offsets``: the same weights copied to one buffer at several base offsets (multiples of
  ``--align`` bytes), every token routed to expert 0;
- ``experts``: offset 0, every token routed to one expert, for each expert (each sits at
  another place in the stacked tensor);
- ``draws``: fresh allocations through PyTorch's caching allocator, as a server gets them.
If placement sets the speed, an arm's slowest over fastest is well above 1 (the servers'
1.66 at one token); near 1.0, the servers' difference is not the weights' placement.

    python -m sglang_ext_tools.moe_placement --model WIDE_TARGET --tokens 1 4 6 \\
        --json moe-placement.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.gpu_watch import gpu_info
from sglang_ext_tools.json_out import emit
from sglang_ext_tools.tune_moe import MoeShape, _timer, expert_weights, sglang_context

ARMS = ("offsets", "experts", "draws")


def offsets_bytes(count: int, max_mib: float, align: int, seed: int = 0) -> list[int]:
    """``count`` base offsets in bytes: 0 first, then distinct multiples of ``align`` below
    ``max_mib`` MiB drawn with ``seed`` (the same list on every run), sorted."""
    if count < 1 or align < 16 or align % 16:
        raise ValueError(f"count {count} >= 1 and align {align} a multiple of 16 (>= 16)")
    slots = int(max_mib * (1 << 20)) // align
    if slots < count:
        raise ValueError(f"--max-offset-mib {max_mib}: fewer than {count} slots of {align} B")
    rng = random.Random(seed)
    picks = rng.sample(range(1, slots), count - 1)
    return [0, *sorted(p * align for p in picks)]


def spread(times_us: Mapping[Any, float]) -> dict[str, Any]:
    """An arm's timings at one token count: fastest, slowest, median, slowest / fastest, and
    which key each extreme was."""
    if not times_us:
        raise ValueError("no timings")
    lo = min(times_us, key=times_us.get)
    hi = max(times_us, key=times_us.get)
    return {
        "min_us": round(times_us[lo], 2),
        "max_us": round(times_us[hi], 2),
        "median_us": round(statistics.median(times_us.values()), 2),
        "max_over_min": round(times_us[hi] / times_us[lo], 4),
        "fastest": lo,
        "slowest": hi,
    }


def summarized(rows: Mapping[int, Mapping[Any, float]]) -> dict[int, dict[str, Any]]:
    """An arm's timings per token count, each with its ``spread``."""
    return {m: {"us": dict(r), **spread(r)} for m, r in rows.items()}


def routed_ids(m: int, topk: int, experts: int, expert: int, device: str = "cpu"):
    """Top-k ids sending every one of ``m`` tokens to ``expert`` and, where ``topk`` > 1, the
    experts after it (wrapping): the weights read sit at one place (int32, as SGLang's)."""
    import torch

    ids = (torch.arange(topk, device=device) + expert) % experts
    return ids.expand(m, -1).to(torch.int32).contiguous()


def placed(buf, offset_bytes: int, shape: Sequence[int]):
    """A view of ``buf`` (bf16) starting ``offset_bytes`` in, of ``shape``."""
    start = offset_bytes // buf.element_size()
    return buf[start : start + math.prod(shape)].view(*shape)


def measure(
    shape: MoeShape,
    tokens: Sequence[int],
    offsets: Sequence[int],
    draws: int,
    reps: int,
    graph_calls: int,
    arms: Sequence[str] = ARMS,
) -> dict[str, Any]:
    """Per arm and token count: every timing (us per call) and its ``spread``."""
    import torch
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    dev, dt = "cuda", torch.bfloat16
    e, k = shape.experts, shape.hidden
    w1, w2 = expert_weights(shape)
    runner = MoeRunnerConfig(inplace=False, top_k=shape.topk)

    def call(m: int, a, b, expert: int):
        x = torch.randn(m, k, device=dev, dtype=dt)
        ids = routed_ids(m, shape.topk, e, expert, dev)
        weights = torch.full((m, shape.topk), 1.0 / shape.topk, device=dev)
        topk_out = StandardTopKOutput(weights, ids, torch.empty(0, device=dev))
        return lambda: fused_experts(x, a, b, topk_out, runner)

    def timed(fn) -> float:
        return round(_timer(fn, reps, graph_calls) * 1e3, 3)

    out: dict[str, Any] = {}
    if "offsets" in arms:
        top = max(offsets)
        buf1 = torch.empty(w1.numel() + top // 2, device=dev, dtype=dt)
        buf2 = torch.empty(w2.numel() + top // 2, device=dev, dtype=dt)
        rows: dict[int, dict[int, float]] = {m: {} for m in tokens}
        for off in offsets:
            a, b = placed(buf1, off, w1.shape), placed(buf2, off, w2.shape)
            a.copy_(w1)
            b.copy_(w2)
            for m in tokens:
                rows[m][off] = timed(call(m, a, b, 0))
        del buf1, buf2
        out["offsets"] = summarized(rows)
    if "experts" in arms:
        rows = {m: {x: timed(call(m, w1, w2, x)) for x in range(e)} for m in tokens}
        out["experts"] = summarized(rows)
    if "draws" in arms:
        rows = {m: {} for m in tokens}
        keep = []  # each draw's tensors stay allocated, so the next lands elsewhere
        for d in range(draws):
            a, b = torch.empty_like(w1), torch.empty_like(w2)
            a.copy_(w1)
            b.copy_(w2)
            keep.append((a, b))
            for m in tokens:
                rows[m][d] = timed(call(m, a, b, 0))
        out["draws"] = summarized(rows)
        out["draw_addresses"] = [a.data_ptr() for a, _ in keep]
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a DeepSeek-V3-style model dir (config.json)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 6])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--offsets", type=int, default=16, help="base offsets timed (0 first)")
    p.add_argument("--max-offset-mib", type=float, default=8.0)
    p.add_argument("--align", type=int, default=256, help="offsets are multiples of this (B)")
    p.add_argument("--draws", type=int, default=8, help="fresh allocations timed")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--graph-calls", type=int, default=20)
    p.add_argument("--json", help="write the result here (never over a file)")
    args = p.parse_args(argv)
    if any(m < 1 for m in args.tokens):
        p.error(f"--tokens {args.tokens}: each at least 1")
    if args.json and Path(args.json).exists():
        p.error(f"--json {args.json}: exists; not overwriting it")
    try:
        args.offset_list = offsets_bytes(args.offsets, args.max_offset_mib, args.align)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = json.loads((Path(args.model) / "config.json").read_text())
        shape = MoeShape.from_config(config)
    except (OSError, ValueError) as exc:
        print(f"error: {args.model}/config.json: {exc}", file=sys.stderr)
        return 2
    import sglang
    import torch

    with sglang_context():
        result = measure(
            shape, args.tokens, args.offset_list, args.draws, args.reps, args.graph_calls,
            args.arms,
        )  # fmt: skip
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m sglang_ext_tools.moe_placement "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "gpu": gpu_info(),
        "versions": {"sglang": sglang.__version__, "torch": torch.__version__},
        "model": args.model,
        "shape": dataclasses.asdict(shape),
        # the config file SGLang picks per token count, as the servers had it
        "moe_config_dir": os.environ.get("SGLANG_MOE_CONFIG_DIR"),
        "offsets_bytes": args.offset_list,
        **result,
    }
    emit(out, Path(args.json) if args.json else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
