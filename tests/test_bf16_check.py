"""The widened MLA target's bf16 function check (fixtures.bf16_check through
make_mla_fixtures.function_check), on CPU with a tiny DeepSeek-V3: why two bf16 models that
compute the same function differ, and the check that tells a right widening from a wrong one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_widen_mla import small_model_dir  # noqa: E402

from sglang_ext_tools import widen_mla as wm  # noqa: E402
from sglang_ext_tools.fixtures import make_mla_fixtures as mla  # noqa: E402

# hidden 32 -> 64 (ratio 2: 1/sqrt(2) rounds in bf16) and -> 128 (ratio 4: exact halving);
# the first also grows the latent and the softmax factor (sqrt((48 + 16) / (8 + 8)) = 2)
ROUNDED = wm.MlaShape(64, 32, 128, 48, kv_lora=32, rope=16, nope=24, v=16)
EXACT = wm.MlaShape(128, 64, 256, 64)
CHUNKS = torch.randint(3, 96, (12, 64), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return small_model_dir(tmp_path_factory.mktemp("small"))


@pytest.fixture(scope="module")
def widened(small_dir, tmp_path_factory):
    out = {}
    for name, shape in (("rounded", ROUNDED), ("exact", EXACT)):
        directory = tmp_path_factory.mktemp(name)
        wm.write_widened_mla_target(small_dir, directory / "big", shape)
        out[name] = mla.function_check(small_dir, directory / "big", CHUNKS, "cpu", torch.bfloat16)
    return out


def test_a_right_widening_is_as_close_to_fp32_as_the_small_model(widened):
    for name, check in widened.items():
        verdict = check["fp32_reference"]
        assert check["dtype"] == "bfloat16" and verdict["tokens"] == CHUNKS.numel()
        assert verdict["pass"], (name, verdict)
        lo, hi = verdict["error_ratio_ci95"]
        assert lo <= verdict["error_ratio"] <= hi and hi < 1.5, (name, verdict)


def test_two_bf16_models_of_one_function_differ_by_their_own_roundings(widened):
    """The 2026-12-02 rank-shape target sat top-1 0.984 / max 3.47 from the deep one in bf16,
    the deep one 0.999 / 0.125 from the small one: a ratio that rounds (7168 / 1536, a wider
    latent, the softmax factor) gives the big model a rounding error of its own, as large as
    the small model's against fp32; an exact ratio (the deep target's 4) shares most of them."""
    own = widened["rounded"]["fp32_reference"]["small_vs_fp32"]["mean_abs_diff"]
    assert widened["rounded"]["mean_abs_diff"] > 0.5 * own
    assert widened["exact"]["mean_abs_diff"] < 0.5 * own


def test_a_wrong_widening_fails_the_check(small_dir, tmp_path, monkeypatch):
    """The softmax factor forgotten (q_b_proj left as trained while (nope + rope) ** -0.5
    shrinks): the attention runs at another temperature -- far beyond bf16's error."""
    monkeypatch.setattr(wm.MlaWidening, "factor", lambda self, name: 1.0)
    wm.write_widened_mla_target(small_dir, tmp_path / "big", ROUNDED)
    check = mla.function_check(small_dir, tmp_path / "big", CHUNKS, "cpu", torch.bfloat16)
    verdict = check["fp32_reference"]
    assert not verdict["pass"], verdict
    assert verdict["error_ratio_ci95"][0] > 1.25


def test_fp32_runs_keep_the_plain_comparison(small_dir, tmp_path):
    wm.write_widened_mla_target(small_dir, tmp_path / "big", ROUNDED)
    check = mla.function_check(small_dir, tmp_path / "big", CHUNKS[:2], "cpu")
    assert check["dtype"] == "float32" and "fp32_reference" not in check
    assert check["top1_agreement"] == 1.0 and check["max_abs_diff"] < 1e-3
