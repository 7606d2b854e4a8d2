"""fixtures.distill_source_check's arithmetic, and its committed CPU result read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools.fixtures import distill_source_check as dsc

ROOT = Path(__file__).resolve().parents[1]


def test_pooled_tau_is_evaluate_taus_tau():
    # (accepted, cycles) per prompt, pooled: (accepted + cycles) / cycles over all prompts
    rows = [(6, 4), (0, 10)]
    assert dsc.pooled_tau(rows) == pytest.approx((6 + 0 + 4 + 10) / 14)


def test_tau_ratio_pairs_the_prompts():
    train = [(4, 4), (2, 4), (8, 4), (0, 4)]
    split = [(6, 4), (4, 4), (8, 4), (2, 4)]
    out = dsc.tau_ratio({"train": train, "split": split})
    assert out["ratio"] == pytest.approx(round((36 / 16) / (30 / 16), 4))
    lo, hi = out["ratio_ci95"]
    assert lo <= out["ratio"] <= hi
    with pytest.raises(ValueError):
        dsc.tau_ratio({"train": train, "split": split[:-1]})


def test_committed_result_is_consistent():
    path = ROOT / "tests/results/distill-source-2026-12-02-cpu.json"
    result = json.loads(path.read_text())
    assert result["command"].startswith("python -m sglang_ext_tools.fixtures.distill_source_check")
    tau = result["tau"]
    assert result["ratio"] == pytest.approx(tau["split"] / tau["train"], abs=2e-4)
    lo, hi = result["ratio_ci95"]
    assert lo <= result["ratio"] <= hi
    seeds = result["setting"]["seeds"]
    assert set(result["drafters"]) == {f"{s}-seed{n}" for s in dsc.SOURCES for n in seeds}
