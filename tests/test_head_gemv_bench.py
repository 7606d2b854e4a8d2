"""head_gemv_bench on CPU: its shapes, its paired figures from given timings, and its refusal
without a GPU (the timings themselves run on the node)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sglang_ext_tools import head_gemv_bench as hb


def test_a_shape_is_rows_by_columns_and_must_suit_an_fp8_gemm():
    assert hb.parse_shape("32000x4096") == (32000, 4096)
    with pytest.raises(argparse.ArgumentTypeError, match="divisible by 16"):
        hb.parse_shape("32001x4096")
    with pytest.raises(argparse.ArgumentTypeError, match="expected NxK"):
        hb.parse_shape("32000")


def test_the_paired_figures_are_summed_time_ratios_and_mean_savings_with_intervals():
    base = [90.0, 92.0, 88.0, 91.0, 89.0, 90.0]
    fp8 = [50.0, 51.0, 49.0, 50.0, 50.0, 50.0]
    out = hb.summarize({"bf16": base, "fp8_gemm": fp8, "fp8_quant_gemm": [t + 8 for t in fp8]})
    assert out["samples"] == 6
    assert out["fp8_gemm"]["vs_bf16"] == round(sum(fp8) / sum(base), 4)
    lo, hi = out["fp8_gemm"]["vs_bf16_ci95"]
    assert lo <= out["fp8_gemm"]["vs_bf16"] <= hi
    assert out["fp8_gemm"]["saved_us"] == pytest.approx(40.0, abs=0.01)
    assert out["fp8_quant_gemm"]["saved_us"] == pytest.approx(32.0, abs=0.01)
    lo, hi = out["fp8_quant_gemm"]["saved_us_ci95"]
    assert lo <= 32.0 <= hi
    assert out["us_per_call_median"]["bf16"] == 90.0


def test_the_bytes_a_call_reads_halve_in_fp8():
    assert hb.bytes_read(32000, 4096) == {"bf16": 262_144_000, "fp8": 131_072_000}


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "head.json"
    assert hb.main(["--out-json", str(out)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


def _flat(value):
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _flat(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    return [value]


RESULT = Path(__file__).resolve().parent / "gpu" / "results"


@pytest.mark.parametrize("path", sorted(RESULT.glob("head-gemv-*.json")), ids=lambda p: p.name)
def test_a_committed_result_is_what_its_own_timings_give(path):
    """Every figure of a committed run is recomputed from the per-sample timings it holds, and
    it names its GPU, versions, backend and command."""
    data = json.loads(path.read_text())
    assert data["gpu"]["name"] and data["versions"]["torch"] and data["command"]
    assert data["backend"]
    for head in data["heads"]:
        times = head["times_us"]
        again = hb.summarize(times)
        # the file keeps each timing to 1 ns, the run summed them unrounded: 1e-3 µs, 1e-4
        for key in ("us_per_call_median", "samples", "fp8_gemm", "fp8_quant_gemm"):
            assert _flat(head[key]) == pytest.approx(_flat(again[key]), abs=2e-3), key
        n, k = head["shape"]["n"], head["shape"]["k"]
        assert head["bytes"] == hb.bytes_read(n, k)
        med = head["us_per_call_median"]
        assert head["effective_tb_s"]["bf16"] == round(2 * n * k / med["bf16"] / 1e6, 3)
        assert len(times["bf16"]) == len(times["fp8_gemm"]) == head["samples"]
