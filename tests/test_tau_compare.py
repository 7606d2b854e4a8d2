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
