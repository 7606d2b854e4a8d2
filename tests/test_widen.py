"""Function-preserving widening (sglang_ext_tools.widen): the big model computes the small one's
function, checked with transformers' own Llama and speculators' own Eagle3DraftModel in fp32."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_ext_tools import widen
from sglang_ext_tools.reference import load_drafter
from sglang_ext_tools.widen import Shape, WidenError, Widening
from tests.builders import Variant, build_drafter, write_target

SMALL = dict(hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=48)
BIG = Shape(hidden=64, heads=8, kv_heads=2, head_dim=16, intermediate=96)


def _small_llama(directory, layers=3, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=SMALL["hidden"],
        num_attention_heads=SMALL["heads"],
        num_key_value_heads=SMALL["kv_heads"],
        head_dim=SMALL["head_dim"],
        intermediate_size=SMALL["intermediate"],
        num_hidden_layers=layers,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # so a norm routed to the wrong place cannot hide
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(directory)
    return model


def _load_llama(directory):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def widened(tmp_path_factory):
    root = tmp_path_factory.mktemp("widen")
    small = _small_llama(root / "small")
    info = widen.write_widened_target(root / "small", root / "big", BIG, 7, [0, 3, 5], seed=1)
    return small, _load_llama(root / "big"), info, root


def test_widened_target_has_the_small_targets_logits(widened):
    small, big, info, _ = widened
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = small(ids).logits
        b = big(ids).logits
    assert big.config.num_hidden_layers == 7 and big.config.hidden_size == 64
    assert a.abs().max() > 1.0  # a real signal, not all zeros
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert info["placement"] == [0, 3, 5] and info["ratio"] == 2.0


def test_identity_blocks_cost_like_real_layers_but_add_nothing(widened):
    _, big, _, _ = widened
    layer = big.model.layers[1]  # not in the placement
    assert layer.self_attn.q_proj.weight.abs().sum() > 0
    assert layer.mlp.up_proj.weight.abs().sum() > 0
    assert layer.self_attn.o_proj.weight.abs().sum() == 0
    assert layer.mlp.down_proj.weight.abs().sum() == 0


def test_residual_stream_is_the_small_one_zero_padded(widened):
    small, big, _, _ = widened
    ids = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hs_small = small(ids, output_hidden_states=True).hidden_states
        hs_big = big(ids, output_hidden_states=True).hidden_states
    # entering small layer k == entering big layer map_aux_ids([k]) (k < num small layers)
    for k in (1, 2):
        (big_k,) = widen.map_aux_ids([k], [0, 3, 5])
        torch.testing.assert_close(hs_big[big_k][..., :32], hs_small[k], rtol=1e-5, atol=1e-5)
        assert hs_big[big_k][..., 32:].abs().max() == 0


def test_shard_index_lists_every_tensor(widened):
    _, big, info, root = widened
    index = json.loads((root / "big" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(big.state_dict())
    assert index["metadata"]["total_size"] == info["bytes"]


@pytest.mark.parametrize(
    "big, message",
    [
        (Shape(64, 8, 2, 8, 96), "head_dim 16 -> 8"),
        (Shape(16, 8, 2, 16, 96), "hidden shrinks 32 -> 16"),
        (Shape(64, 4, 4, 16, 96), "query heads per KV head 2 -> 1"),
    ],
)
def test_unwidenable_shapes_are_refused(big, message):
    with pytest.raises(WidenError, match=message):
        Widening(Shape(**SMALL), big)


def test_aux_ids_must_carry_the_same_state():
    placement = [0, 6, 12, 18, 24, 30]
    assert widen.map_aux_ids([1, 3, 5], placement, [2, 16, 29]) == [2, 16, 29]
    assert widen.map_aux_ids([1, 3, 5], placement) == [1, 13, 25]
    message = r"big aux id 19 does not carry small aux id 3: .*\[13, 18\]"
    with pytest.raises(WidenError, match=message):
        widen.map_aux_ids([1, 3, 5], placement, [2, 19, 29])
    with pytest.raises(WidenError, match="strictly increasing"):
        widen.check_placement([0, 0, 3], 8)


def test_unknown_drafter_tensor_is_an_error():
    with pytest.raises(WidenError, match="layers.0.self_attn.q_norm.weight"):
        widen.drafter_layout("layers.0.self_attn.q_norm.weight")


def _speculators_logits_all_steps(model, hidden, ids, steps):
    from sglang_ext_tools.reference import speculators_step_logits

    return speculators_step_logits(
        model, hidden[None], ids[None], torch.zeros_like(ids)[None], steps
    )


def _aux_inputs():
    """Random aux states of the small drafter (3 x 32), token ids, and the same states
    zero-padded to the widened drafter's 3 x 64."""
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(24, 3 * 32, generator=gen)
    ids = torch.randint(0, 256, (24,), generator=gen)
    return hidden, ids, widen.pad_aux_states(hidden, 3, 64)


@pytest.mark.parametrize("nbr", [True, False], ids=["norm_before_residual", "plain_residual"])
def test_widened_drafter_has_the_small_drafters_logits_for_every_step(tmp_path, nbr):
    small_target = write_target(tmp_path / "t", layers=6, hidden=32, vocab=256)
    variant = Variant(name="w", norm_before_residual=nbr, sliding_window=None, aux_ids=(1, 3, 5))
    build_drafter(tmp_path / "d", small_target, variant, seed=2)
    placement = [0, 2, 4, 5, 7, 9]
    big_cfg = widen.widen_llama_config(
        json.loads((small_target / "config.json").read_text()),
        Shape(hidden=64, heads=8, kv_heads=4, head_dim=8, intermediate=64),
        10,
    )
    (tmp_path / "T").mkdir()
    (tmp_path / "T" / "config.json").write_text(json.dumps(big_cfg))
    big = Shape(hidden=64, heads=8, kv_heads=4, head_dim=8, intermediate=64)
    info = widen.write_widened_drafter(
        tmp_path / "d", tmp_path / "D", big, verifier_dir=tmp_path / "T", placement=placement
    )
    assert info["aux_ids"] == [1, 5, 8]
    small = load_drafter(tmp_path / "d", attn_implementation="eager")
    wide = load_drafter(tmp_path / "D", attn_implementation="eager")
    assert wide.config.transformer_layer_config.hidden_size == 64
    assert wide.config.norm_before_residual is nbr

    hidden, ids, padded = _aux_inputs()
    a = _speculators_logits_all_steps(small, hidden, ids, 3)
    b = _speculators_logits_all_steps(wide, padded, ids, 3)
    assert a.shape == b.shape == (3, 24, 128)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------
# Vocabulary widening
# --------------------------------------------------------------------------------------

BIG_VOCAB = Shape(hidden=64, heads=8, kv_heads=2, head_dim=16, intermediate=96, vocab=160)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_widened_vocabulary_keeps_logits_and_argmax(tmp_path, tied):
    small = _small_llama(tmp_path / "small")
    if tied:  # re-save with the lm_head tied to the embeddings
        small.config.tie_word_embeddings = True
        small.tie_weights()
        small.save_pretrained(tmp_path / "small")
    info = widen.write_widened_target(tmp_path / "small", tmp_path / "big", BIG_VOCAB, 7, [0, 3, 5])
    cfg = json.loads((tmp_path / "big" / "config.json").read_text())
    assert cfg["vocab_size"] == 160 and cfg["tie_word_embeddings"] is tied
    assert (info["vocab_size"], info["small_vocab_size"], info["tie_word_embeddings"]) == (
        160,
        97,
        tied,
    )
    big = _load_llama(tmp_path / "big")
    assert big.lm_head.weight.shape == big.model.embed_tokens.weight.shape == (160, 64)
    assert big.model.embed_tokens.weight[97:].abs().max() == 0
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = _load_llama(tmp_path / "small")(ids).logits, big(ids).logits
    torch.testing.assert_close(b[..., :97], a, rtol=1e-4, atol=1e-4)
    assert b[..., 97:].abs().max() == 0  # padded ids: logit exactly 0
    assert a.max(-1).values.min() > 0  # so the full argmax must stay on the real ids
    assert torch.equal(b.argmax(-1), a.argmax(-1))


def test_default_shape_keeps_the_vocabulary(widened):
    _, big, info, root = widened
    assert big.config.vocab_size == 97 and info["vocab_size"] == 97
    assert big.lm_head.weight.shape[0] == 97
    assert info["shape"]["vocab"] is None and info["shape"]["draft_vocab"] is None


def test_vocabulary_cannot_shrink(tmp_path):
    _small_llama(tmp_path / "small")
    shrink = Shape(hidden=64, heads=8, kv_heads=2, head_dim=16, intermediate=96, vocab=50)
    with pytest.raises(WidenError, match="shrinks 97 -> 50"):
        widen.write_widened_target(tmp_path / "small", tmp_path / "big", shrink, 7, [0, 3, 5])


def test_vocab_mapping_of_a_full_vocabulary_drafter_is_the_identity_prefix():
    d2t, t2d = widen.widen_vocab_mapping(None, 8, big_vocab=32, big_draft=16)
    assert d2t.dtype == torch.int64 and d2t.shape == (16,) and d2t.abs().max() == 0
    assert t2d.dtype == torch.bool and t2d.shape == (32,)
    assert t2d[:16].all() and not t2d[16:].any()
    # full vocabulary both sides: speculators registers no d2t/t2d
    assert widen.widen_vocab_mapping(None, 8, big_vocab=16, big_draft=16) is None
    with pytest.raises(WidenError, match="draft vocabulary 40 exceeds the target's 32"):
        widen.widen_vocab_mapping(None, 8, big_vocab=32, big_draft=40)


def test_vocab_mapping_keeps_a_pruned_drafters_ids():
    small_targets = torch.tensor([0, 2, 3, 7])
    small_d2t = small_targets - torch.arange(4)
    d2t, t2d = widen.widen_vocab_mapping(small_d2t, 8, big_vocab=12, big_draft=7)
    targets = d2t + torch.arange(7)
    assert targets.tolist() == [0, 2, 3, 7, 8, 9, 10]  # new draft ids -> new target ids
    assert torch.equal(t2d.nonzero().flatten(), targets)


def _widen_vocab_drafter(tmp_path, draft_vocab_size, big_vocab, big_draft):
    small_target = write_target(tmp_path / "t", layers=6, hidden=32, vocab=256)
    variant = Variant(
        name="v", sliding_window=None, aux_ids=(1, 3, 5), draft_vocab_size=draft_vocab_size
    )
    build_drafter(tmp_path / "d", small_target, variant, seed=2)
    big = Shape(hidden=64, heads=8, kv_heads=4, head_dim=8, intermediate=64)
    big = Shape(**{**big.__dict__, "vocab": big_vocab, "draft_vocab": big_draft})
    (tmp_path / "T").mkdir()
    big_cfg = widen.widen_llama_config(
        json.loads((small_target / "config.json").read_text()), big, 10
    )
    (tmp_path / "T" / "config.json").write_text(json.dumps(big_cfg))
    info = widen.write_widened_drafter(
        tmp_path / "d",
        tmp_path / "D",
        big,
        verifier_dir=tmp_path / "T",
        placement=[0, 2, 4, 5, 7, 9],
    )
    small = load_drafter(tmp_path / "d", attn_implementation="eager")
    wide = load_drafter(tmp_path / "D", attn_implementation="eager")  # strict key check
    return small, wide, info


def _proposals(model, hidden, ids, steps):
    from sglang_ext_tools.reference import drafter_to_target_ids

    logits = _speculators_logits_all_steps(model, hidden, ids, steps)
    return logits, drafter_to_target_ids(model, logits.argmax(-1))


@pytest.mark.parametrize(
    "draft_vocab_size, big_draft", [(None, 384), (128, 192)], ids=["full_vocab", "pruned"]
)
def test_widened_draft_vocabulary_keeps_proposals(tmp_path, draft_vocab_size, big_draft):
    small, wide, info = _widen_vocab_drafter(tmp_path, draft_vocab_size, 512, big_draft)
    small_draft = draft_vocab_size or 256
    assert (info["vocab_size"], info["draft_vocab_size"]) == (512, big_draft)
    assert wide.config.draft_vocab_size == big_draft
    assert wide.config.transformer_layer_config.vocab_size == 512
    assert wide.embed_tokens.weight.shape == (512, 64)
    assert wide.lm_head.weight.shape == (big_draft, 64)
    assert wide.lm_head.weight[small_draft:].abs().max() == 0
    assert wide.d2t.dtype == torch.int64 and wide.d2t.shape == (big_draft,)
    assert wide.t2d.dtype == torch.bool and wide.t2d.shape == (512,)
    targets = wide.d2t + torch.arange(big_draft)
    assert torch.equal(wide.t2d.nonzero().flatten(), targets.sort().values)
    small_targets = torch.arange(small_draft) + (0 if small.d2t is None else small.d2t)
    assert torch.equal(targets[:small_draft], small_targets)
    if draft_vocab_size is None:  # draft id i -> target id i
        assert wide.d2t.abs().max() == 0 and wide.t2d[:big_draft].all()
        assert not wide.t2d[big_draft:].any()
    else:  # the new draft ids take unused target ids above the mapped ones, in order
        assert targets[small_draft:].min() > small_targets.max()
        assert torch.equal(targets, targets.sort().values)

    hidden, ids, padded = _aux_inputs()
    a, proposed_small = _proposals(small, hidden, ids, 3)
    b, proposed_wide = _proposals(wide, padded, ids, 3)
    torch.testing.assert_close(b[..., :small_draft], a, rtol=1e-4, atol=1e-4)
    assert b[..., small_draft:].abs().max() == 0
    assert a.max(-1).values.min() > 0
    assert torch.equal(proposed_wide, proposed_small)
