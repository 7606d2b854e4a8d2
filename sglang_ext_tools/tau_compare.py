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

Verdicts are intervals, not points: ``equivalence`` passes when the 95 % paired bootstrap
interval of the τ ratio lies inside a stated band (default [0.95, 1.05]), fails when it lies
outside, and is inconclusive (a failing test: too few prompts) when it straddles an edge;
``non_inferiority`` passes when the interval's lower end is at least a stated floor;
``collapse`` passes when a drafter loses at least a stated share of what its features add
(judged against the same drafter with no features, on the same text).
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_ext.metrics.acceptance import per_position_from_steps, pooled_per_position
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


EQUIVALENCE_BAND = (0.95, 1.05)


def _ratio_of_sums(picks) -> float:
    return tau([a for a, _ in picks]) / tau([b for _, b in picks])


def ratio_interval(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> dict:
    """τ(a) / τ(b) over prompt-paired (accepted, cycles) counts, with its 95 % paired
    bootstrap interval (prompts resampled)."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} counts on one side but {len(b)} on the other")
    pairs = list(zip(a, b, strict=True))
    return {
        "prompts": len(pairs),
        "tau_a": round(tau(a), 4),
        "tau_b": round(tau(b), 4),
        "ratio": round(_ratio_of_sums(pairs), 4),
        "ci95": bootstrap_ci(pairs, _ratio_of_sums),
    }


def equivalence(
    a: Sequence[tuple[int, int]],
    b: Sequence[tuple[int, int]],
    band: tuple[float, float] = EQUIVALENCE_BAND,
) -> dict:
    """Equivalence of τ(a) and τ(b): pass iff the ratio's 95 % interval is inside ``band``."""
    out = ratio_interval(a, b)
    low, high = out["ci95"] or (float("nan"), float("nan"))
    inside = band[0] <= low and high <= band[1]
    outside = high < band[0] or low > band[1]
    out.update(
        band=list(band),
        verdict="equivalent" if inside else "different" if outside else "inconclusive",
        ci95_width=round(high - low, 4) if out["ci95"] else None,
        **{"pass": inside},
    )
    return out


def non_inferiority(
    a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]], floor: float
) -> dict:
    """τ(a) not below ``floor`` x τ(b): pass iff the ratio's 95 % interval starts at or
    above ``floor``."""
    out = ratio_interval(a, b)
    out.update(floor=floor, **{"pass": bool(out["ci95"]) and out["ci95"][0] >= floor})
    return out


COLLAPSE_SHARE = 0.75


def share_lost(
    shifted: Sequence[tuple[int, int]],
    trained: Sequence[tuple[int, int]],
    floor: Sequence[tuple[int, int]],
) -> float | None:
    """How much of what the features add a drafter loses: (τ(trained) - τ(shifted)) /
    (τ(trained) - τ(floor)), the floor being the drafter with no features (fc zeroed); 1 at the
    floor, above it below the floor. None where the features add nothing."""
    gain = tau(trained) - tau(floor)
    return (tau(trained) - tau(shifted)) / gain if gain > 0 else None


def collapse(
    shifted: Sequence[tuple[int, int]],
    trained: Sequence[tuple[int, int]],
    floor: Sequence[tuple[int, int]],
    share: float = COLLAPSE_SHARE,
) -> dict:
    """Whether acceptance collapses: the three drafters on the same text (prompt-aligned
    counts), pass iff the 95 % paired bootstrap interval of ``share_lost`` starts at or above
    ``share`` (the drafter keeps at most 1 - share of the features' gain)."""
    if not len(shifted) == len(trained) == len(floor):
        raise ValueError("shifted, trained and floor counts must be prompt-aligned")
    triples = list(zip(shifted, trained, floor, strict=True))

    def lost(picks) -> float:
        value = share_lost(
            [a for a, _, _ in picks], [b for _, b, _ in picks], [c for *_, c in picks]
        )
        return float("-inf") if value is None else value

    point = share_lost(shifted, trained, floor)
    ci = bootstrap_ci(triples, lost)
    return {
        "prompts": len(triples),
        "tau_shifted": round(tau(shifted), 4),
        "tau_trained": round(tau(trained), 4),
        "tau_floor": round(tau(floor), 4),
        "share_lost": None if point is None else round(point, 4),
        "ci95": ci,
        "share": share,
        "pass": bool(ci) and ci[0] >= share,
    }


def per_position(rows: Sequence[Sequence[int]], positions: int) -> list[float | None]:
    """Pooled acceptance per draft position from per-cycle accepted counts, by the plugin's
    own definition (`sglang_ext.metrics.acceptance.per_position_from_steps`)."""
    accepted, proposed = per_position_from_steps([a for cycles in rows for a in cycles], positions)
    return [round(a / p, 4) if p else None for a, p in zip(accepted, proposed, strict=True)]


def served_per_position(outputs: Sequence[dict]) -> list[float | None] | None:
    """Pooled per-position acceptance of served outputs (sglang_ext's meta_info counts),
    pooled as the plugin pools them (`acceptance.pooled_per_position`); None when any output
    lacks the counts."""
    metas = [o["meta_info"] for o in outputs]
    keys = ("spec_accepted_per_position", "spec_proposed_per_position")
    if not metas or any(m.get(k) is None for m in metas for k in keys):
        return None
    pooled = pooled_per_position(
        {"accepted_per_position": m[keys[0]], "proposed_per_position": m[keys[1]]} for m in metas
    )
    return [None if r is None else round(r, 4) for r in pooled]


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
