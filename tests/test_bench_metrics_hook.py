"""The hook-cost benchmark runs, reports both variants and their ratio, and keeps a result
file it finds (a tool never overwrites)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run_bench(args):
    # Its own process: the benchmark puts prometheus_client in multiprocess mode, which a
    # process cannot leave (the value class is chosen at import).
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    command = [sys.executable, "-m", "sglang_ext_tools.bench_metrics_hook", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_bench_reports_both_variants_and_their_ratio(tmp_path):
    out = tmp_path / "cost.json"
    args = ["--rounds", "3", "--requests", "4", "--evict-mb", "0", "--out", str(out)]
    proc = run_bench(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    ms = result["ms_per_request"]
    assert ms["in_hook"] > 0 and ms["queued"] > 0
    assert result["ratio_queued_vs_in_hook"] == pytest.approx(
        sum(result["per_round_ms"]["queued"]) / sum(result["per_round_ms"]["in_hook"]), rel=1e-3
    )
    low, high = result["ratio_ci95"]
    assert low <= high
    assert result["command"].endswith(" ".join(args))
    proc = run_bench(args)  # the file is there now: refused, not overwritten
    assert proc.returncode != 0 and "does not overwrite" in proc.stderr
    assert json.loads(out.read_text()) == result
