"""sglang_ext_tools.tau_compare: served vs reference accept length, prompt by prompt."""

from __future__ import annotations

import pytest

from sglang_ext_tools.stats import bootstrap_ci, bootstrap_ratio_ci
from sglang_ext_tools.tau_compare import compare


def served(ids, accepted, verify):
    return {
        "output_ids": ids,
        "meta_info": {
            "spec_verify_ct": verify,
            "spec_accepted_draft_tokens": accepted,
            "completion_tokens": len(ids),
        },
    }


def row(tokens, accepted, cycles):
    return {"tokens": tokens, "accepted": accepted, "cycles": cycles}


def test_identical_prompts_are_compared_like_for_like():
    outputs = [served([1, 2, 3, 4], 2, 2), served([5, 6, 9, 9], 0, 4)]
    rows = [row([1, 2, 3, 4], [1, 1], 2), row([5, 6, 7, 8], [3], 1)]
    result = compare(outputs, rows)
    assert result["prompts"] == 2 and result["identical_prompts"] == 1
    assert result["tau_served_identical"] == result["tau_reference_identical"] == 2.0
    # pooled: served (2 + 0 + 6) / 6, reference (2 + 3 + 3) / 3: different continuations
    assert result["tau_served"] == pytest.approx(8 / 6, abs=1e-4)
    assert result["tau_reference"] == pytest.approx(8 / 3, abs=1e-4)
    low, high = result["ratio_ci95"]
    assert low <= result["ratio"] <= high


def test_no_identical_prompt_and_mismatched_lengths():
    outputs = [served([1, 2], 1, 1), served([3], 0, 1)]
    result = compare(outputs, [row([2], [0], 1), row([4], [0], 1)])
    assert result["identical_prompts"] == 0 and result["tau_served_identical"] is None
    with pytest.raises(ValueError, match="2 served outputs but 1 reference rows"):
        compare([served([1], 0, 1)] * 2, [row([1], [0], 1)])


def test_bootstrap_interval_brackets_a_constant_and_needs_two_items():
    assert bootstrap_ci([3.0, 3.0, 3.0], lambda xs: sum(xs) / len(xs)) == [3.0, 3.0]
    assert bootstrap_ci([1.0], lambda xs: xs[0]) is None
    low, high = bootstrap_ratio_ci([2.0, 4.0, 6.0, 8.0], [1.0, 2.0, 3.0, 4.0])
    assert low == high == 2.0


def _counts(rng, prompts, cycles, accept_p):
    """(accepted, cycles) per prompt for a chain of 3 drafts accepting each with accept_p."""
    out = []
    for _ in range(prompts):
        accepted = 0
        for _ in range(cycles):
            k = 0
            while k < 3 and rng.random() < accept_p:
                k += 1
            accepted += k
        out.append((accepted, cycles))
    return out


def test_equivalence_passes_for_the_same_system_and_fails_for_a_worse_one():
    import random

    from sglang_ext_tools.tau_compare import equivalence

    rng = random.Random(1)
    same_a, same_b = _counts(rng, 64, 50, 0.6), _counts(rng, 64, 50, 0.6)
    ok = equivalence(same_a, same_b)
    assert ok["pass"] and ok["verdict"] == "equivalent", ok
    assert ok["ci95"][0] <= ok["ratio"] <= ok["ci95"][1]
    worse = equivalence(_counts(rng, 64, 50, 0.45), same_b)
    assert not worse["pass"] and worse["verdict"] == "different", worse


def test_equivalence_with_too_few_prompts_is_inconclusive_and_fails():
    from sglang_ext_tools.tau_compare import equivalence

    a = [(10, 10), (40, 10), (0, 10)]
    b = [(30, 10), (5, 10), (20, 10)]
    result = equivalence(a, b)
    assert result["verdict"] == "inconclusive" and not result["pass"]


def test_non_inferiority_reads_the_lower_end():
    import random

    from sglang_ext_tools.tau_compare import non_inferiority

    rng = random.Random(2)
    better, base = _counts(rng, 64, 50, 0.7), _counts(rng, 64, 50, 0.6)
    assert non_inferiority(better, base, 0.95)["pass"]
    assert not non_inferiority(base, better, 0.95)["pass"]


def test_per_position_uses_the_plugins_definition():
    from sglang_ext_tools.tau_compare import per_position, served_per_position

    # cycles accepting 0, 1, 3 drafts of 3: position 1 accepted 2/3, 2: 1/3, 3: 1/3
    assert per_position([[0, 1], [3]], 3) == [0.6667, 0.3333, 0.3333]
    outputs = [
        {
            "meta_info": {
                "spec_accepted_per_position": [2, 1, 0],
                "spec_proposed_per_position": [3, 3, 3],
            }
        },
        {
            "meta_info": {
                "spec_accepted_per_position": [1, 1, 1],
                "spec_proposed_per_position": [1, 1, 1],
            }
        },
    ]
    assert served_per_position(outputs) == [0.75, 0.5, 0.25]
    assert served_per_position([{"meta_info": {}}]) is None


def test_collapse_passes_at_the_no_features_floor_and_fails_for_a_small_fall():
    import random

    from sglang_ext_tools.tau_compare import collapse, share_lost

    rng = random.Random(3)
    trained, floor = _counts(rng, 64, 50, 0.7), _counts(rng, 64, 50, 0.3)
    at_floor = collapse(_counts(rng, 64, 50, 0.3), trained, floor)
    assert at_floor["pass"] and 0.75 <= at_floor["ci95"][0] <= at_floor["share_lost"], at_floor
    below = collapse(_counts(rng, 64, 50, 0.1), trained, floor)
    assert below["pass"] and below["share_lost"] > 1.0, below
    small_fall = collapse(_counts(rng, 64, 50, 0.65), trained, floor)  # the 2026-12-01 case
    assert not small_fall["pass"] and small_fall["share_lost"] < 0.3, small_fall
    assert share_lost(trained, trained, trained) is None  # features that add nothing
    with pytest.raises(ValueError, match="prompt-aligned"):
        collapse(trained[:3], trained, floor)
