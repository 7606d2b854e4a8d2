"""Fixture reference tau: the offline EAGLE-3 chain loop (``sglang_ext_tools.reference``)
over held-out prompts, per drafter, written as JSONL.

Part of the fixture build (``scripts/make_fixtures.py`` is its CLI); import these names from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fixtures_common import NUM_SPEC_TOKENS, Scale, _clean_floats, log

from sglang_ext_tools import reference as ref

# --------------------------------------------------------------------------------------
# Reference tau
# --------------------------------------------------------------------------------------


def run_reference(
    out: Path,
    name: str,
    target_dir: Path,
    drafter_dir: Path,
    prompts: list[dict[str, Any]],
    n_prompts: int,
    args,
    scale: Scale,
    lossless: int,
) -> dict[str, Any]:
    device = args.device
    target = ref.load_target(target_dir, device=device, dtype=args.ref_dtype)
    drafter = ref.load_drafter(drafter_dir, device=device, dtype=args.ref_dtype)
    chosen = prompts[:n_prompts]
    summary = ref.evaluate_tau(
        target,
        drafter,
        [p["input_ids"] for p in chosen],
        num_steps=NUM_SPEC_TOKENS,
        max_new_tokens=args.max_new_tokens or scale.ref_max_new_tokens,
        lossless_check_prompts=lossless,
    )
    ref_dir = out / "reference"
    ref_dir.mkdir(exist_ok=True)
    with (ref_dir / f"{name}.jsonl").open("w") as fh:
        for prompt, res in zip(chosen, summary["per_prompt"], strict=True):
            fh.write(json.dumps(_clean_floats({"id": prompt["id"], **res})) + "\n")
    summary = {k: v for k, v in summary.items() if k != "per_prompt"}
    summary.update(
        dtype=str(args.ref_dtype), device=device, per_prompt_file=f"reference/{name}.jsonl"
    )
    log(
        f"reference {name}: tau={summary['tau']:.3f} over {summary['num_prompts']} prompts "
        f"({summary['wall_s']}s), lossless mismatches={summary['lossless_check']}"
    )
    return summary
