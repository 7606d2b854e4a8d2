"""The hook-cost benchmark runs, reports both variants and their ratio, and keeps a result
file it finds (a tool never overwrites)."""

from __future__ import annotations

import json

import pytest

from sglang_ext_tools import bench_metrics_hook


def test_bench_reports_both_variants_and_their_ratio(tmp_path, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    out = tmp_path / "cost.json"
    args = ["--rounds", "3", "--requests", "4", "--evict-mb", "0", "--out", str(out)]
    assert bench_metrics_hook.main(args) == 0
    result = json.loads(out.read_text())
    ms = result["ms_per_request"]
    assert ms["in_hook"] > 0 and ms["queued"] > 0
    assert result["ratio_queued_vs_in_hook"] == pytest.approx(
        sum(result["per_round_ms"]["queued"]) / sum(result["per_round_ms"]["in_hook"]), rel=1e-3
    )
    low, high = result["ratio_ci95"]
    assert low <= high
    assert result["command"].endswith(" ".join(args))
    with pytest.raises(SystemExit):
        bench_metrics_hook.main(args)  # the file is there now: refused, not overwritten
    assert json.loads(out.read_text()) == result
