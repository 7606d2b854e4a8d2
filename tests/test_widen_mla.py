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


def small_model_dir(tmp_path, **config):
    """A tiny 3-layer DeepSeek-V3 (hidden 32, vocab 96; ``config`` overrides) saved to
    ``tmp_path/small``, seeded, its matrices x4: larger weights than the init give logits
    far from a tie."""
    torch.manual_seed(0)
    model = build_dsv3({**dsv3_cfg(3, 32, 64, 16, 2, 4, 16, 16, 8, 8, 8), **config}, 96)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(str(tmp_path / "small"))
    return tmp_path / "small"


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return small_model_dir(tmp_path_factory.mktemp("small"))


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


# DeepSeek's pairs are interleaved (rope_interleave, the default); the neox layout pads each half.
@pytest.mark.parametrize("interleave", [True, False])
def test_the_latent_widens_too_rope_pairs_keep_their_frequencies(tmp_path, interleave):
    small_dir = small_model_dir(tmp_path, rope_interleave=interleave)
    big = wm.MlaShape(64, 32, 128, 48, kv_lora=32, rope=16, nope=48, v=16)
    info = wm.write_widened_mla_target(small_dir, tmp_path / "big", big)
    config = json.loads((tmp_path / "big" / "config.json").read_text())
    latent = [config[k] for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim")]
    assert latent + [config["v_head_dim"]] == [32, 16, 48, 16]
    assert config["rope_parameters"]["rope_theta"] == pytest.approx(1e8)  # theta ** (16/8)
    assert config["rope_interleave"] is interleave
    assert info["softmax_q_factor"] == pytest.approx(2.0)  # sqrt((48 + 16) / (8 + 8))
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    small, widened = logits(small_dir, ids), logits(tmp_path / "big", ids)
    torch.testing.assert_close(widened, small, atol=2e-4, rtol=1e-4)
    assert torch.equal(widened.argmax(-1), small.argmax(-1))


def test_the_shared_experts_grow_as_one_mlp(tmp_path):
    """KIMI_K25_TP8_RANK_SHARED7 (the 2026-12-02 run) matched a Kimi token's 9 experts of MLP
    with the fixture's top-2 routed and a shared MLP of 7: n_shared_experts grows, and the
    function stays."""
    small_dir = small_model_dir(tmp_path)
    big = wm.MlaShape(64, 32, 128, 48, n_shared=3)
    wm.write_widened_mla_target(small_dir, tmp_path / "big", big)
    config = json.loads((tmp_path / "big" / "config.json").read_text())
    assert config["n_shared_experts"] == 3
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        logits(tmp_path / "big", ids), logits(small_dir, ids), atol=2e-4, rtol=1e-4
    )
    # a Kimi-K2.5 token's 9 experts x 256 rows, from the fixture's top-2 either way
    for rank in (wm.KIMI_K25_TP8_RANK_SHARED7, wm.KIMI_K25_TP8_RANK):
        assert rank.moe_intermediate * (2 * rank.expert_split + rank.n_shared) == 2304


@pytest.mark.parametrize("parts", [2, 4])
def test_split_experts_keep_the_function_with_more_experts_per_token(tmp_path, parts):
    """KIMI_K25_TP8_RANK splits each trained expert (split_experts): top-k x parts of
    experts x parts, routed_scaling_factor x parts, the shared MLP as wide as before."""
    small_dir = small_model_dir(tmp_path)
    big = wm.MlaShape(64, 32, 128, 48, expert_split=parts)
    wm.write_widened_mla_target(small_dir, tmp_path / "big", big)
    config = json.loads((tmp_path / "big" / "config.json").read_text())
    assert (config["n_routed_experts"], config["num_experts_per_tok"]) == (4 * parts, 2 * parts)
    assert config["routed_scaling_factor"] == 1.0 * parts
    assert (config["moe_intermediate_size"], config["n_shared_experts"]) == (48, 1)
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        logits(tmp_path / "big", ids), logits(small_dir, ids), atol=2e-4, rtol=1e-4
    )


def test_split_experts_refuses_what_it_cannot_keep(tmp_path):
    small_dir = small_model_dir(tmp_path)
    config = json.loads((small_dir / "config.json").read_text())
    state = {"model.layers.1.mlp.experts.0.gate_proj.weight": torch.zeros(16, 32)}
    with pytest.raises(WidenError, match="must divide moe_intermediate_size 16"):
        wm.split_experts(config, state, 3)
    with pytest.raises(WidenError, match="norm_topk_prob"):
        wm.split_experts({**config, "norm_topk_prob": False}, state, 2)
    with pytest.raises(WidenError, match="grouped routing"):
        wm.split_experts({**config, "n_group": 4, "topk_group": 2}, state, 2)
    split_cfg, split = wm.split_experts(config, state, 2)
    assert sorted(split) == [f"model.layers.1.mlp.experts.{e}.gate_proj.weight" for e in (0, 1)]
    assert split_cfg["n_shared_experts"] == 2  # 2 x 8 rows: the shared MLP stays 16 wide


def test_a_rope_width_change_without_its_theta_breaks_the_function(tmp_path):
    """The theta rule is what keeps the function: the same widening with theta left alone
    moves every trained pair but the first onto another frequency."""
    small_dir = small_model_dir(tmp_path)
    big = wm.MlaShape(64, 32, 128, 48, rope=16)
    wm.write_widened_mla_target(small_dir, tmp_path / "big", big)
    config_path = tmp_path / "big" / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_parameters"]["rope_theta"] = 10000.0
    config_path.write_text(json.dumps(config))
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    gap = (logits(small_dir, ids) - logits(tmp_path / "big", ids)).abs().max()
    assert gap > 1e-2


def test_scaled_rope_is_not_widened(tmp_path):
    small_dir = small_model_dir(tmp_path)
    config_path = small_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    config_path.write_text(json.dumps(config))
    with pytest.raises(WidenError, match="rope_type 'yarn'"):
        wm.write_widened_mla_target(
            small_dir, tmp_path / "big", wm.MlaShape(64, 32, 128, 48, rope=16)
        )
    assert not (tmp_path / "big").exists()  # refused before anything is written
    # the rope width kept: yarn stays as trained, and the widening goes through
    wm.write_widened_mla_target(small_dir, tmp_path / "kept", wm.MlaShape(64, 32, 128, 48))


def test_unknown_tensors_and_shrinking_widths_are_refused(small_dir):
    config = json.loads((small_dir / "config.json").read_text())
    with pytest.raises(WidenError, match="q_lora 16 -> 8"):
        wm.MlaWidening.from_config(config, wm.MlaShape(64, 8, 128, 48))
    with pytest.raises(WidenError, match="kv_lora 16 -> 8"):
        wm.MlaWidening.from_config(config, wm.MlaShape(64, 16, 128, 48, kv_lora=8))
    with pytest.raises(WidenError, match="no declared layout"):
        wm.mla_layout("model.layers.0.mlp.router_bias")
    assert wm.mla_layout("model.layers.2.mlp.experts.3.down_proj.weight") == ("hidden", "minter")
