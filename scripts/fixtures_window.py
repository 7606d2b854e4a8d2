"""The ``window`` fixture: long held-out prompts and the offline tau of a drafter trained
with a binding sliding window, computed with that window and with full attention.

speculators trains draft layers of ``layer_types`` ``sliding_attention`` with the mask
``k <= q and k > q - sliding_window`` (``create_combined_mask_mod``). The fixture drafter is
trained on sequences several windows long, so at prompts longer than the window a server
that attends to the full context drafts differently from one that applies the window; the
GPU test (tests/gpu/test_window.py) compares the served tau with both references.

Part of the fixture build (``scripts/make_fixtures.py`` is its CLI); import these names from here.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from fixtures_common import NUM_SPEC_TOKENS, _clean_floats, log
from fixtures_data import _backend

from sglang_ext_tools import reference as ref

WINDOW_DRAFTER = "window-drafter"
WINDOW_PROMPTS = "window-prompts.jsonl"
CHAIN = {"num_steps": NUM_SPEC_TOKENS, "topk": 1, "num_draft_tokens": NUM_SPEC_TOKENS + 1}


def make_long_prompts(
    hf_tok, heldout: list[tuple[str, str]], count: int, length: tuple[int, int], seed: int
) -> list[dict[str, Any]]:
    """``count`` prompts of ``length[0]..length[1]`` tokens from the held-out files (split
    order): first one per file long enough, from a seeded offset; when that is not enough
    (the node's stdlib differs from this machine's), further chunks of the longest files,
    each disjoint from the chunks already taken from that file."""
    rng = random.Random(seed)
    lo, hi = length
    encoded = _backend(hf_tok).encode_batch([text for _, text in heldout])
    taken: dict[str, list[tuple[int, int]]] = {}
    prompts: list[dict[str, Any]] = []

    def add(rel: str, ids: list[int], start: int, size: int) -> None:
        chunk = list(ids[start : start + size])
        taken.setdefault(rel, []).append((start, start + size))
        prompts.append(
            {
                "id": f"w{len(prompts):03d}",
                "input_ids": chunk,
                "text": hf_tok.decode(chunk),
                "source": rel,
                "offset": start,
            }
        )

    for (rel, _), enc in zip(heldout, encoded, strict=True):
        if len(prompts) == count:
            break
        size = rng.randint(lo, hi)
        if len(enc.ids) >= size:
            add(rel, enc.ids, rng.randint(0, len(enc.ids) - size), size)
    by_length = sorted(zip(heldout, encoded, strict=True), key=lambda pair: -len(pair[1].ids))
    progress = True
    while len(prompts) < count and progress:
        progress = False
        for (rel, _), enc in by_length:
            if len(prompts) == count:
                break
            spans = sorted(taken.get(rel, []))
            size = rng.randint(lo, hi)
            after = spans[-1][1] if spans else 0
            if len(enc.ids) - after >= size:
                add(rel, enc.ids, after, size)
                progress = True
            elif spans and spans[0][0] >= size:
                add(rel, enc.ids, spans[0][0] - size, size)
                progress = True
    if len(prompts) < count:
        raise RuntimeError(
            f"only {len(prompts)} disjoint {lo}..{hi}-token chunks in the held-out files; "
            f"{count} needed"
        )
    return prompts


def write_prompts(path: Path, prompts: list[dict[str, Any]]) -> dict[str, Any]:
    with path.open("w") as fh:
        for prompt in prompts:
            fh.write(json.dumps(prompt) + "\n")
    lengths = [len(p["input_ids"]) for p in prompts]
    return {
        "path": path.name,
        "count": len(prompts),
        "min_len": min(lengths),
        "mean_len": round(sum(lengths) / len(lengths), 1),
        "max_len": max(lengths),
    }


def check_positions(target_dir: Path, prompts: list[dict[str, Any]], max_new: int) -> None:
    """The target must hold the longest prompt, its generation and one draft chain."""
    cfg = json.loads((target_dir / "config.json").read_text())
    need = max(len(p["input_ids"]) for p in prompts) + max_new + CHAIN["num_draft_tokens"]
    if cfg["max_position_embeddings"] < need:
        raise SystemExit(
            f"{target_dir} max_position_embeddings={cfg['max_position_embeddings']} < {need} "
            "(longest window prompt + generation + draft tokens)"
        )


def _tau_run(target, drafter, prompts, max_new: int, out_file: Path) -> dict[str, Any]:
    summary = ref.evaluate_tau(
        target,
        drafter,
        [p["input_ids"] for p in prompts],
        num_steps=CHAIN["num_steps"],
        max_new_tokens=max_new,
    )
    with out_file.open("w") as fh:
        for prompt, res in zip(prompts, summary["per_prompt"], strict=True):
            fh.write(json.dumps(_clean_floats({"id": prompt["id"], **res})) + "\n")
    brief = {k: v for k, v in summary.items() if k != "per_prompt"}
    brief["per_prompt_file"] = f"reference/{out_file.name}"
    return brief


def window_reference(
    out: Path, target_name: str, prompts: list[dict[str, Any]], args, max_new: int
) -> dict[str, Any]:
    """Offline tau of the window drafter on the long prompts: with its trained window
    (speculators' mask, what a window-applying server computes) and with full attention
    (what a server that ignores the window computes). Same chain as the GPU servers."""
    device, dtype = args.device, args.ref_dtype
    target = ref.load_target(out / target_name, device=device, dtype=dtype)
    drafter = ref.load_drafter(out / WINDOW_DRAFTER, device=device, dtype=dtype)
    ref_dir = out / "reference"
    ref_dir.mkdir(exist_ok=True)
    window = _tau_run(target, drafter, prompts, max_new, ref_dir / f"{WINDOW_DRAFTER}.jsonl")
    with ref.full_attention(drafter):
        full = _tau_run(target, drafter, prompts, max_new, ref_dir / f"{WINDOW_DRAFTER}-full.jsonl")
    result = {
        "trained_window": drafter.sliding_window,
        "sliding_layers": list(drafter.sliding_window_indices),
        "chain": dict(CHAIN),
        "dtype": str(dtype),
        "device": device,
        "prompts_file": WINDOW_PROMPTS,
        "tau_reference_window": window["tau"],
        "tau_reference_full": full["tau"],
        "window": window,
        "full": full,
        "mask": "speculators create_combined_mask_mod: key k visible from query q iff "
        "k <= q and k > q - sliding_window (window keys include the query's own)",
    }
    log(
        f"reference {WINDOW_DRAFTER}: tau window={window['tau']:.3f} full={full['tau']:.3f} "
        f"over {window['num_prompts']} prompts ({window['wall_s'] + full['wall_s']:.1f}s)"
    )
    return result
