"""head_quant_tau: a drafter's τ with its lm_head computed as SGLang's online fp8 computes it,
against its own head, on the same prompts; and the committed run's figures recomputed from
its own per-prompt counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

from sglang_ext_tools import head_quant_tau as hq  # noqa: E402
from sglang_ext_tools.head_gemv_bench import FP8_MAX  # noqa: E402

RESULTS = Path(__file__).parent / "gpu" / "results"


def _head(out_features=96, in_features=64, seed=0):
    torch.manual_seed(seed)
    head = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        head.weight.normal_(0, 0.02)
    return head


def test_the_fp8_head_multiplies_e4m3_values_and_stays_near_the_head():
    head = _head()
    with torch.no_grad():
        head.weight[3] *= 50.0  # one loud row must not coarsen the others' grid
    x = torch.randn(5, 64)
    exact = head(x)
    errors = {}
    for per_row in (True, False):
        fp8 = hq.Fp8Head(head, per_row=per_row)
        # already on the e4m3 grid of its scales: quantising again changes nothing
        assert torch.equal(hq.quantize_e4m3(fp8.weight_q, fp8.weight_scale), fp8.weight_q)
        w = fp8.weight_q / fp8.weight_scale
        row_max = w.abs().amax(dim=-1)
        if per_row:  # SGLang's on Hopper: every row reaches the format's largest value
            assert torch.allclose(row_max, torch.full_like(row_max, FP8_MAX))
        else:  # one scale: only the loud row does
            assert row_max.max().item() == pytest.approx(FP8_MAX) and row_max[0] < 100
        quiet = [i for i in range(96) if i != 3]
        got = fp8(x)
        errors[per_row] = (got - exact)[:, quiet].abs().max() / exact[:, quiet].abs().max()
    assert 0 < errors[True] < 0.08  # e4m3 keeps 3 mantissa bits: a few per cent, never exact
    assert errors[True] < errors[False]  # a scale per row keeps the quiet rows' precision


def test_each_token_gets_its_own_activation_scale():
    fp8 = hq.Fp8Head(_head())
    x = torch.randn(2, 64)
    x[1] *= 1000.0  # a large row must not flush the small row's values to zero
    got = fp8(x)
    assert torch.allclose(got[0], fp8(x[:1])[0])
    assert got[0].abs().max() > 0


def test_a_head_with_a_bias_is_refused():
    with pytest.raises(ValueError, match="bias"):
        hq.Fp8Head(torch.nn.Linear(8, 4, bias=True))


def test_the_ratio_pools_each_side_over_prompts():
    rows = [[10, 20, 10, 18], [20, 30, 20, 30]]  # ref tau (50+30)/30, fp8 (48+30)/30
    got = hq.summarize(rows)
    assert got["tau_reference"] == pytest.approx(80 / 30, abs=1e-4)
    assert got["tau_fp8_head"] == pytest.approx(78 / 30, abs=1e-4)
    assert got["ratio"] == pytest.approx(78 / 80, abs=1e-4)
    lo, hi = got["ratio_ci95"]
    assert lo <= got["ratio"] <= hi <= 1.0
    assert hq.summarize([*rows, [0, 0, 0, 0]])["prompts"] == 2  # no cycle: left out


def _loop_result(rows, tokens):
    return {
        "per_prompt": [
            {"cycles": c, "accepted": [a], "tokens": t}
            for (c, a), t in zip(rows, tokens, strict=True)
        ],
        "per_position_acceptance": [0.5, 0.25],
    }


def test_different_text_from_the_two_loops_is_reported():
    same = hq.compare(_loop_result([(4, 3)], [[1, 2]]), _loop_result([(4, 2)], [[1, 2]]))
    assert same["same_text"] and same["per_prompt"] == [[4, 3, 4, 2]]
    other = hq.compare(_loop_result([(4, 3)], [[1, 2]]), _loop_result([(4, 3)], [[1, 3]]))
    assert not other["same_text"]


def test_bad_paths_are_refused_before_anything_loads(tmp_path, capsys):
    out = tmp_path / "out.json"
    out.write_text("{}")
    base = ["--target", str(tmp_path), "--drafter", str(tmp_path), "--prompts",
            str(tmp_path / "p.jsonl")]  # fmt: skip
    assert hq.main([*base, "--out-json", str(out)]) == 1
    assert "never overwritten" in capsys.readouterr().err
    assert out.read_text() == "{}"
    assert hq.main([*base, "--out-json", str(tmp_path / "new.json")]) == 1
    err = capsys.readouterr().err
    assert "--target" in err and "no config.json" in err


@pytest.mark.parametrize("scale", ["per-row", "per-tensor"])
def test_the_committed_runs_are_what_their_counts_give(scale):
    """2026-12-06, CPU, the seed-shape session's trained small MLA pair (8,192 × 384 head),
    the weight scaled per row (SGLang's on Hopper) and, first, per tensor: the figures of
    each committed file recomputed from its per-prompt counts."""
    suffix = "" if scale == "per-row" else "-per-tensor"
    path = RESULTS / f"head-quant-tau-2026-12-06-cpu-mla-small{suffix}.json"
    result = json.loads(path.read_text())
    assert result["same_text"] is True
    assert result["head"]["scheme"].startswith(f"e4m3, {scale} weight scale")
    again = hq.summarize(result["per_prompt"])
    for key in ("tau_reference", "tau_fp8_head", "ratio", "ratio_ci95", "prompts"):
        assert again[key] == result[key]
