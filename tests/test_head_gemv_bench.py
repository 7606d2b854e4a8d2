"""head_gemv_bench on CPU: its shapes, its paired figures from given timings, and its refusal
without a GPU (the timings themselves run on the node)."""

from __future__ import annotations

import argparse

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
