"""Widening an MLA + MoE (DeepSeek-V3) target to a wider one that computes the same function
(sglang_ext_tools.widen_mla): a tiny trained-shape model built with transformers, widened,
loaded back, logits compared in fp32."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sglang_ext_tools import reference as ref  # noqa: E402
from sglang_ext_tools import widen_mla as wm  # noqa: E402
from sglang_ext_tools.fixtures.common import dsv3_cfg  # noqa: E402
from sglang_ext_tools.fixtures.targets import build_dsv3  # noqa: E402
from sglang_ext_tools.widen import WidenError  # noqa: E402


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = build_dsv3(dsv3_cfg(3, 32, 64, 16, 2, 4, 16, 16, 8, 8, 8), 96)
    with torch.no_grad():  # larger weights than the init: logits far from a tie
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    directory = tmp_path_factory.mktemp("small")
    model.save_pretrained(str(directory))
    return directory


def logits(directory, ids):
    model = ref.load_target(directory, device="cpu", dtype="float32")
    with torch.no_grad():
        return model(input_ids=ids).logits[0]


@pytest.mark.parametrize("q_lora", [32, 64])  # q rank ratio 2 = the hidden ratio, and 4
def test_the_widened_target_predicts_what_the_small_one_does(small_dir, tmp_path, q_lora):
    big = wm.MlaShape(hidden=64, q_lora=q_lora, intermediate=128, moe_intermediate=48)
    info = wm.write_widened_mla_target(small_dir, tmp_path / "big", big)
    config = json.loads((tmp_path / "big" / "config.json").read_text())
    assert (config["hidden_size"], config["q_lora_rank"]) == (64, q_lora)
    assert config["kv_lora_rank"] == 16 and config["qk_rope_head_dim"] == 8  # latent kept
    assert config["rms_norm_eps"] == pytest.approx(1e-6 / 2)
    assert info["ratio"] == 2
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    small, widened = logits(small_dir, ids), logits(tmp_path / "big", ids)
    assert widened.shape == small.shape
    torch.testing.assert_close(widened, small, atol=2e-4, rtol=1e-4)
    assert torch.equal(widened.argmax(-1), small.argmax(-1))


def test_unknown_tensors_and_shrinking_widths_are_refused(small_dir):
    small = wm.MlaShape.from_config(json.loads((small_dir / "config.json").read_text()))
    with pytest.raises(WidenError, match="q_lora 16 -> 8"):
        wm.MlaWidening(small, wm.MlaShape(64, 8, 128, 48))
    with pytest.raises(WidenError, match="no declared layout"):
        wm.mla_layout("model.layers.0.mlp.router_bias")
    assert wm.mla_layout("model.layers.2.mlp.experts.3.down_proj.weight") == ("hidden", "minter")
