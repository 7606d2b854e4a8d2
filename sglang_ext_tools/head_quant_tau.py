"""A drafter's τ with its lm_head in fp8, against the same drafter's own head, before a server
bench: the accept length the fp8 head (``SGLANG_EXT_DRAFT_FP8_LM_HEAD``) would cost.

The fp8 head saves 0.043 decode steps a 7/1/8 cycle in SGLang (2026-12-06, dummy weights,
one H200); it pays only if τ holds. Its logits differ from bf16 ones by 4-5 % of the largest
on random weights with one weight scale (``head_gemv_bench``), and what matters for τ is how
often that moves a trained drafter's top token. This runs the reference chain loop
(``reference.evaluate_tau``: the target's greedy text, the drafter proposing ``--steps``
tokens a cycle) twice on the same prompts: once with the drafter's head as loaded, once with
the head's numerics as SGLang's online fp8 computes them (``Fp8Head``): the weight in e4m3
with a scale per output row (one for the tensor with ``--weight-scale tensor``), each token's
activation in e4m3 with its own scale, the product accumulated in fp32. Both loops emit the
target's greedy tokens, so the text is the same (checked); only the proposals can differ.
The figure is fp8 τ ÷ reference τ, pooled over prompts (Σ(accepted + cycles) / Σ cycles
each), with a 95 % interval from a bootstrap over prompts.

    python -m sglang_ext_tools.head_quant_tau --target DIR --drafter DIR \\
        --prompts prompts.jsonl --out-json OUT.json [--num-prompts 32 --steps 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sglang_ext_tools import reference as ref
from sglang_ext_tools.head_gemv_bench import e4m3_scale, to_e4m3
from sglang_ext_tools.stats import bootstrap_ci


def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to e4m3 (saturated) and back: the values an fp8 GEMM multiplies."""
    return to_e4m3(x, scale).float() * scale


class Fp8Head(torch.nn.Module):
    """An ``nn.Linear`` head computed as SGLang's online fp8 computes it on Hopper: the weight
    in e4m3 with a scale per output row (``Fp8LinearMethod.process_weights_after_loading``
    quantises per channel where ``cutlass_fp8_supported()``; ``per_row=False``: one scale for
    the tensor, its path elsewhere), a dynamic per-token activation scale, fp32 sums."""

    def __init__(self, head: torch.nn.Linear, per_row: bool = True):
        super().__init__()
        if head.bias is not None:
            raise ValueError("lm_head has a bias; SGLang's drafter heads have none")
        w = head.weight.detach().float()
        self.weight_scale = e4m3_scale(w, dim=-1 if per_row else None)
        self.register_buffer("weight_q", quantize_e4m3(w, self.weight_scale))
        self.out_features = head.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = e4m3_scale(x, dim=-1)
        return (quantize_e4m3(x, scale) @ self.weight_q.t()).to(x.dtype)


def _pooled_tau(rows: Sequence[tuple[int, int]]) -> float:
    """(Σ accepted + Σ cycles) / Σ cycles over (cycles, accepted) rows."""
    cycles = sum(c for c, _ in rows)
    return (sum(a for _, a in rows) + cycles) / cycles


def ratio(rows: Sequence[Sequence[int]]) -> float:
    """fp8 τ ÷ reference τ over per-prompt rows (ref cycles, ref accepted, fp8 cycles, fp8
    accepted), each τ pooled over the rows."""
    return _pooled_tau([(r[2], r[3]) for r in rows]) / _pooled_tau([(r[0], r[1]) for r in rows])


def summarize(rows: Sequence[Sequence[int]], draws: int = 4000) -> dict[str, Any]:
    """Both τ, their ratio and its 95 % interval (bootstrap over prompts) from the rows."""
    rows = [list(r) for r in rows if r[0] and r[2]]
    return {
        "tau_reference": round(_pooled_tau([(r[0], r[1]) for r in rows]), 4),
        "tau_fp8_head": round(_pooled_tau([(r[2], r[3]) for r in rows]), 4),
        "ratio": round(ratio(rows), 4),
        "ratio_ci95": bootstrap_ci(rows, ratio, draws),
        "prompts": len(rows),
    }


def compare(reference: dict[str, Any], fp8: dict[str, Any]) -> dict[str, Any]:
    """The two loops' results (``evaluate_tau``) side by side: the per-prompt counts, their
    summary, the per-position acceptance of each, and whether both emitted the same tokens
    (they must: the target decides every token)."""
    pairs = list(zip(reference["per_prompt"], fp8["per_prompt"], strict=True))
    rows = [[a["cycles"], sum(a["accepted"]), b["cycles"], sum(b["accepted"])] for a, b in pairs]
    return {
        **summarize(rows),
        "per_position_reference": [round(x, 4) for x in reference["per_position_acceptance"]],
        "per_position_fp8_head": [round(x, 4) for x in fp8["per_position_acceptance"]],
        "same_text": all(a["tokens"] == b["tokens"] for a, b in pairs),
        "per_prompt": rows,
        "per_prompt_fields": ["ref_cycles", "ref_accepted", "fp8_cycles", "fp8_accepted"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = [json.loads(line) for line in args.prompts.open() if line.strip()]
    ids = [p["input_ids"] for p in prompts][: args.num_prompts]
    target = ref.load_target(args.target, device=args.device, dtype=args.dtype)
    drafter = ref.load_drafter(args.drafter, device=args.device, dtype=args.dtype)

    def loop() -> dict[str, Any]:
        return ref.evaluate_tau(
            target, drafter, ids, num_steps=args.steps, max_new_tokens=args.max_new_tokens
        )

    with torch.no_grad():
        reference = loop()
        own = drafter.lm_head
        drafter.lm_head = Fp8Head(own, per_row=args.weight_scale == "row").to(args.device)
        try:
            fp8 = loop()
        finally:
            drafter.lm_head = own
    result = compare(reference, fp8)
    return {
        "schema_version": 1,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "dtype": args.dtype,
        "command": "python -m sglang_ext_tools.head_quant_tau " + " ".join(sys.argv[1:]),
        "target": str(args.target),
        "drafter": str(args.drafter),
        "head": {
            "shape": list(own.weight.shape),
            "scheme": f"e4m3, per-{args.weight_scale} weight scale, per-token activation "
            "scale, fp32 sum",
        },
        "steps": args.steps,
        "max_new_tokens": args.max_new_tokens,
        "wall_s": {"reference": reference["wall_s"], "fp8_head": fp8["wall_s"]},
        **result,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--drafter", type=Path, required=True, help="speculators-format drafter")
    p.add_argument("--prompts", type=Path, required=True, help="JSONL with input_ids")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument(
        "--weight-scale",
        default="row",
        choices=("row", "tensor"),
        help="row: SGLang's online fp8 on Hopper (a scale per output row); tensor: one scale",
    )
    p.add_argument("--out-json", type=Path, required=True)
    args = p.parse_args(argv)
    if args.out_json.exists():
        print(f"error: {args.out_json} exists; results are never overwritten", file=sys.stderr)
        return 1
    for what, path in (("target", args.target), ("drafter", args.drafter)):
        if not (path / "config.json").is_file():
            print(f"error: --{what} {path}: no config.json there", file=sys.stderr)
            return 1
    if not args.prompts.is_file():
        print(f"error: --prompts {args.prompts}: no such file", file=sys.stderr)
        return 1
    result = run(args)
    args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("tau_reference", "tau_fp8_head", "ratio",
                                             "ratio_ci95", "prompts", "same_text")}))  # fmt: skip
    return 0 if result["same_text"] else 2


if __name__ == "__main__":
    sys.exit(main())
