"""README's GPU table is rendered from a committed results JSON (sglang_ext_tools.results_table):
the renderer on a synthetic result, and README's block against the file it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools import results_table

ROOT = Path(__file__).resolve().parents[1]


def synthetic() -> dict:
    lossless = {
        "tokens_checked": 8192,
        "max_gap": 0.0625,
        "tolerance": 0.125,
        "nonzero_gap_fraction": 0.01,
        "self_nonzero_gap_fraction": 0.012,
        "pass": True,
    }
    tau = {"ratio": 1.01, "ci95": [0.99, 1.03], "prompts": 64, "tau_a": 2.3, "tau_b": 2.28}
    return {
        "date": "2026-12-01T12:00:00+00:00",
        "gpu": {"name": "NVIDIA H200", "uuid": "GPU-x"},
        "sglang_version": "0.5.23",
        "outcomes": {
            "test_a": "passed",
            "test_b": "failed",
            "test_c": "not run",
            "test_d": "skipped",
        },
        "lossless": {"plugin": lossless, "mla_chain": {**lossless, "pass": False}},
        "lossless_tolerance": {"llama": {"tolerance_from_tokens": 16384}},
        "tau_equivalence": {"llama": {**tau, "band": [0.95, 1.05], "pass": True}},
    }


def test_render_states_each_verdict_and_the_failures():
    block = results_table.render(synthetic(), "r.json")
    assert block.startswith(results_table.BEGIN) and block.endswith(results_table.END)
    assert "From `r.json`" in block
    assert "1 passed, 1 failed, 1 skipped, 1 not run (the session ended first)" in block
    assert "Not run: `test_c`." in block and "Skipped: `test_d`." in block
    assert "lossless `plugin`" in block and "**FAIL**" in block
    assert "ratio 1.0100, 95 % CI [0.990, 1.030] over 64 prompts" in block
    assert "Failed: `test_b`." in block


def test_bench_row_states_both_intervals_and_the_rule():
    data = synthetic()
    data["outcomes"][results_table.BENCH_TEST] = "passed"
    data["bench"] = {
        "bench_speedup": 0.914,
        "bench_speedup_ci95": [0.85, 0.98],
        "suite_speedup": 0.88,
        "suite_speedup_ci95": [0.8, 0.95],
        "bench_vs_suite": {
            "ratio": 1.0386, "ci95": [0.98, 1.1], "band": [0.9091, 1.1], "prompts": 16,
            "agree": True,
        },
        "bench_tau": 2.42,
        "suite_tau": 2.42,
    }  # fmt: skip
    row = next(x for x in results_table.render(data, "r.json").splitlines() if "bench" in x)
    assert "0.914 (CI [0.850, 0.980]) vs 0.880 (CI [0.800, 0.950])" in row
    assert "ratio 1.039 (CI [0.980, 1.100], paired over 16 prompts)" in row
    assert "wholly outside [0.909, 1.100]" in row and row.endswith("**pass** |")


def test_replace_block_and_source():
    text = f"intro\n{results_table.BEGIN}\nFrom `old.json`:\nx\n{results_table.END}\nafter\n"
    assert results_table.block_source(text) == "old.json"
    new = results_table.replace_block(text, results_table.render(synthetic(), "r.json"))
    assert new.startswith("intro\n") and new.endswith("\nafter\n")
    assert results_table.block_source(new) == "r.json"
    with pytest.raises(ValueError, match="no"):
        results_table.replace_block("no block", "x")


def test_readme_block_is_the_rendering_of_the_file_it_names():
    readme = (ROOT / "README.md").read_text()
    source = results_table.block_source(readme)
    assert source, "README has no rendered GPU results block"
    data = json.loads((ROOT / source).read_text())
    block = results_table.render(data, source)
    assert results_table.replace_block(readme, block) == readme, (
        f"README's GPU block differs from {source}: "
        f"python -m sglang_ext_tools.results_table {source} --write README.md"
    )


def test_the_off_by_one_row_reads_the_same_text_figures_and_the_floor():
    data = synthetic()
    same = {"ratio": 0.975, "ci95": [0.96, 0.988], "tau_a": 2.5, "tau_b": 2.6}
    data["outcomes"][results_table.OFF_BY_ONE_TEST] = "passed"
    data["off_by_one"] = {
        "prompts": 64,
        "plus1_vs_trained_same_text": same,
        "minus1_vs_trained_same_text": {**same, "ratio": 0.939, "ci95": [0.918, 0.958]},
        "no_features_vs_trained_same_text": {**same, "ratio": 0.8, "ci95": [0.77, 0.83]},
    }
    row = next(r for r in results_table.render(data, "r.json").splitlines() if "±1" in r)
    assert "+1 0.975 (CI [0.960, 0.988]), -1 0.939 (CI [0.918, 0.958])" in row
    assert "no features at all 0.800 (CI [0.770, 0.830])" in row and row.endswith("**pass** |")
    assert "gain lost" not in row  # runs before the marker layers recorded no collapse
    collapse = {"share_lost": 1.04, "ci95": [0.93, 1.15], "share": 0.75}
    data["off_by_one"].update(plus1_collapse=collapse, minus1_collapse=collapse)
    row = next(r for r in results_table.render(data, "r.json").splitlines() if "±1" in r)
    assert "gain lost: +1 1.04 (CI [0.930, 1.150]), -1 1.04" in row and "≥ 0.75" in row
    lossless = dict(data["lossless"]["plugin"], ladder=[{"above": 0.5}], ladder_over=[0.5])
    data["lossless"]["plugin"] = lossless
    block = results_table.render(data, "r.json")
    assert "ladder: over the self rate above 0.5" in block
