"""Served accept length against the offline reference, prompt by prompt.

Pooled τ over all prompts mixes two things: how faithfully the drafter path is served, and
which continuation each side verified. In bf16 the served target and the offline one part at
near-ties on many prompts (MoE routing makes that most of them), after which each side
verifies a different text. So next to the pooled ratio this reports a paired bootstrap
interval of it (prompts resampled), and τ over the prompts whose served tokens equal the
reference's: the same verification sequence, like for like.

Served outputs are SGLang ``/generate`` results (``output_ids``, ``meta_info`` with
``spec_verify_ct`` and sglang_ext's ``spec_accepted_draft_tokens``); reference rows are the
fixtures' per-prompt reference lines (``tokens``, ``accepted`` per cycle, ``cycles``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_ext_tools.stats import bootstrap_ci


def served_counts(output: dict) -> tuple[int, int]:
    """(accepted draft tokens, verify steps) of one served request. `spec_accepted_draft_tokens`
    is added by sglang_ext's metrics (and by the patch series); without it, (completion_tokens
    - 1) counts the same tokens except where the last verify step was cut at max_new_tokens."""
    meta = output["meta_info"]
    verify = meta["spec_verify_ct"]
    accepted = meta.get("spec_accepted_draft_tokens", meta["completion_tokens"] - 1 - verify)
    return accepted, verify


def reference_counts(row: dict) -> tuple[int, int]:
    return sum(row["accepted"]), row["cycles"]


def tau(counts: Sequence[tuple[int, int]]) -> float | None:
    """(accepted + cycles) / cycles over (accepted, cycles) pairs; None without a cycle."""
    cycles = sum(c for _, c in counts)
    return (sum(a for a, _ in counts) + cycles) / cycles if cycles else None


def compare(outputs: Sequence[dict], rows: Sequence[dict]) -> dict:
    """``outputs[i]`` and ``rows[i]`` belong to the same prompt."""
    if len(outputs) != len(rows):
        raise ValueError(f"{len(outputs)} served outputs but {len(rows)} reference rows")
    pairs = [(served_counts(o), reference_counts(r)) for o, r in zip(outputs, rows, strict=True)]
    same = [
        pair
        for pair, o, r in zip(pairs, outputs, rows, strict=True)
        if list(o["output_ids"]) == list(r["tokens"])
    ]

    def ratio(picks) -> float:
        return tau([s for s, _ in picks]) / tau([r for _, r in picks])

    tau_s, tau_r = tau([s for s, _ in pairs]), tau([r for _, r in pairs])
    return {
        "prompts": len(pairs),
        "tau_served": round(tau_s, 4),
        "tau_reference": round(tau_r, 4),
        "ratio": round(tau_s / tau_r, 4),
        "ratio_ci95": bootstrap_ci(pairs, ratio),
        "identical_prompts": len(same),
        "tau_served_identical": round(tau([s for s, _ in same]), 4) if same else None,
        "tau_reference_identical": round(tau([r for _, r in same]), 4) if same else None,
    }
