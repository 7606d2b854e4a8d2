#!/usr/bin/env python
"""A drafter's lm_head at batch 1, in bf16 and in fp8, side by side on one GPU: what the fp8
head (``sglang_ext.serving.draft_head``, ``SGLANG_EXT_DRAFT_FP8_LM_HEAD=1``) can save per
draft step, measured without SGLang.

A chain draft step multiplies one hidden row (1 x K) by the head (N x K), so the head is read
once per step and the step is bound by its bytes: 262 MB in bf16 at a published Llama-3.1-8B
draft vocabulary (32,000 x 4096), half that in fp8. SGLang's online fp8 quantises a linear
layer's weight once (a scale per output row on Hopper) and each call's activation per token,
then runs an fp8 GEMM. Here the same scheme runs on torch's own kernels (``torch._scaled_mm``
with row-wise scales; SGLang calls sgl-kernel's ``fp8_scaled_mm``, which this machine may
not have):

- ``bf16``: ``F.linear`` on the bf16 head;
- ``fp8_gemm``: the fp8 GEMM on an activation quantised beforehand (the kernel SGLang's
  fused per-token quantisation feeds);
- ``fp8_quant_gemm``: the same with the activation quantised in the call by torch's
  elementwise kernels (an upper bound on SGLang's one fused kernel).

Each sample replays one CUDA graph of ``--reps`` back-to-back calls per variant, the variants
in a rotated order, and reads CUDA events: µs per call. Figures are paired by sample: the
ratio of summed times (fp8 / bf16) and the saving per call, each with a bootstrap interval.

    python -m sglang_ext_tools.head_gemv_bench --out-json head.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path
from typing import Any

from sglang_ext_tools.gpu_watch import gpu_info
from sglang_ext_tools.stats import bootstrap_ci, bootstrap_ratio_ci, ratio_of_sums

FP8_MAX = 448.0  # float8_e4m3fn
VARIANTS = ("bf16", "fp8_gemm", "fp8_quant_gemm")


def parse_shape(text: str) -> tuple[int, int]:
    """``NxK``: the head's rows (draft vocabulary) and columns (hidden size)."""
    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected NxK, e.g. 32000x4096") from None
    if n % 16 or k % 16:
        raise argparse.ArgumentTypeError(f"shape {text!r}: fp8 GEMMs need N and K divisible by 16")
    return n, k


def summarize(times_us: dict[str, list[float]]) -> dict[str, Any]:
    """Per-variant medians and, against ``bf16``, the paired ratio and saving per call."""
    base = times_us["bf16"]
    out: dict[str, Any] = {
        "us_per_call_median": {
            v: round(sorted(t)[len(t) // 2], 3) for v, t in times_us.items() if t
        },
        "samples": len(base),
    }
    for v in VARIANTS[1:]:
        if not times_us.get(v):
            continue
        t = times_us[v]
        diffs = [b - a for a, b in zip(t, base, strict=True)]
        out[v] = {
            "vs_bf16": round(ratio_of_sums(t, base), 4),
            "vs_bf16_ci95": bootstrap_ratio_ci(t, base),
            "saved_us": round(sum(diffs) / len(diffs), 3),
            "saved_us_ci95": bootstrap_ci(diffs, lambda d: sum(d) / len(d)),
        }
    return out


def e4m3_scale(x, dim: int | None = None):
    """The fp32 scale that maps x's largest magnitude (along ``dim``, kept; over the whole
    tensor for None) to e4m3's largest value."""
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    return (amax.float() / FP8_MAX).clamp(min=1e-12)


def to_e4m3(x, scale):
    """x / scale in e4m3, saturated: what an fp8 GEMM reads."""
    import torch

    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def bytes_read(n: int, k: int) -> dict[str, int]:
    return {"bf16": 2 * n * k, "fp8": n * k}


def measure(n: int, k: int, reps: int, samples: int) -> dict[str, Any]:  # pragma: no cover - GPU
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    torch.manual_seed(0)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    # a scale per output row, as SGLang's online fp8 quantises on Hopper
    # (Fp8LinearMethod.process_weights_after_loading where cutlass_fp8_supported(); the runs of
    # 2026-12-06 used one scale for the tensor, which leaves the timings alone and overstates
    # the logit error)
    w_scale = e4m3_scale(w, dim=1)
    wq = to_e4m3(w, w_scale)
    # row-wise scales as torch._scaled_mm takes them: (M, 1) for the activation, (1, N) for
    # the weight
    w_scale_row = w_scale.reshape(1, n).contiguous()
    t_scale = e4m3_scale(w)
    wq_tensor = to_e4m3(w, t_scale)

    def quant(a):
        s = e4m3_scale(a, dim=-1)
        return to_e4m3(a, s), s

    xq, x_scale = quant(x)
    mm = torch._scaled_mm

    def gemm_rowwise(aq, a_scale):
        return mm(aq, wq.t(), scale_a=a_scale, scale_b=w_scale_row, out_dtype=torch.bfloat16)

    def gemm_tensor(aq, a_scale):
        return mm(aq, wq_tensor.t(), scale_a=a_scale.reshape(()), scale_b=t_scale.reshape(()),
                  out_dtype=torch.bfloat16)  # fmt: skip

    # row-wise where this torch runs it at M = 1, else one scale per tensor (recorded)
    try:
        gemm_rowwise(xq, x_scale)
        gemm, scaling = gemm_rowwise, "row-wise"
    except RuntimeError as exc:
        gemm, scaling = gemm_tensor, f"per-tensor (row-wise refused: {str(exc)[:120]})"

    calls = {
        "bf16": lambda: F.linear(x, w),
        "fp8_gemm": lambda: gemm(xq, x_scale),
        "fp8_quant_gemm": lambda: gemm(*quant(x)),
    }
    # the fp8 output against bf16's: the same logits to fp8's rounding (a check, not a bench)
    ref = calls["bf16"]().float()
    err = (calls["fp8_gemm"]().float() - ref).abs().max().item() / ref.abs().max().item()
    graphs = {}
    stream = torch.cuda.Stream()
    for name, fn in calls.items():
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        graphs[name] = g
    for g in graphs.values():  # warm
        g.replay()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    for s in range(samples):
        rot = order[s % len(order) :] + order[: s % len(order)]
        for name in rot:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000.0 / reps)
    out = summarize(times)
    b = bytes_read(n, k)
    med = out["us_per_call_median"]
    out.update(
        shape={"n": n, "k": k},
        bytes=b,
        effective_tb_s={
            "bf16": round(b["bf16"] / med["bf16"] / 1e6, 3),
            "fp8_gemm": round(b["fp8"] / med["fp8_gemm"] / 1e6, 3),
        },
        fp8_max_rel_error=round(err, 5),
        fp8_scaling=scaling,
        times_us={v: [round(t, 3) for t in ts] for v, ts in times.items()},
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        default=[(32000, 4096), (8192, 7168)],
        help="heads as NxK: the 8B-shape speed fixture's, the seed shape's",
    )
    ap.add_argument("--reps", type=int, default=50, help="calls per CUDA graph replay")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--out-json", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("head_gemv_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    result = {
        "schema_version": 1,
        "date": dt.date.today().isoformat(),
        "gpu": gpu_info(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "backend": "torch (F.linear; torch._scaled_mm, row-wise scales)",
        "command": " ".join(["python -m sglang_ext_tools.head_gemv_bench", *sys.argv[1:]]),
        "reps": args.reps,
        "heads": [measure(n, k, args.reps, args.samples) for n, k in args.shapes],
    }
    args.out_json.write_text(json.dumps(result, indent=1))
    for h in result["heads"]:
        print(json.dumps({k: v for k, v in h.items() if k != "times_us"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
