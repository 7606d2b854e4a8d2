"""sglang_ext_tools.fixtures.markers: the layout rule, the chosen constants and the planted
tensors, on hand-made inputs (the whole build at tiny scale: tests/test_mla_fixtures.py)."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_ext_tools.fixtures import markers


def test_marker_layers_surround_each_captured_id():
    assert markers.marker_layers([3, 30]) == {
        1: 1,
        2: -1,
        3: 1,
        4: -1,
        28: 1,
        29: -1,
        30: 1,
        31: -1,
    }


@pytest.mark.parametrize(
    "placement, deep_ids, match",
    [
        ((0, 1, 29, 30, 49, 50), (1, 30, 50), "captured id 1"),  # trained layers adjacent
        ((0, 5, 27, 31, 47, 52), (3, 30, 50), "captured id 30"),  # small layer 3 at p + 1
        ((0, 5, 27, 32, 47, 52), (3, 30), "do not match"),
    ],
)
def test_layouts_without_room_for_markers_are_refused(placement, deep_ids, match):
    with pytest.raises(markers.MarkerError, match=match):
        markers.check_layout(placement, (1, 3, 5), deep_ids, 61)


def test_marker_ids_must_not_share_layers():
    with pytest.raises(markers.MarkerError, match="collide"):
        markers.check_layout((0, 10, 11, 20), (1, 2), (4, 6), 24)


def test_values_are_powers_of_two_and_keep_the_latent_large():
    torch.manual_seed(0)
    embed = torch.randn(16, 8) * 0.02
    embed[0] = 0  # a padding row
    states = [torch.randn(5, 8) * s for s in (0.1, 0.5, 1.0, 2.0)]
    values = markers.choose_values(embed, states, [1, 3], [(1, False), (1, True)], 0.5, 12)
    for x in (values.flag, values.marker, values.gain):
        assert math.log2(x) == int(math.log2(x))
    smallest_row = float(embed.norm(dim=-1)[1:].min())
    assert values.flag <= smallest_row * markers.FLAG_RELATIVE
    assert values.marker >= markers.MARKER_RMS * float(states[3].pow(2).mean(-1).sqrt().max())
    assert values.latent_min >= markers.LATENT_MIN
    assert values.flag_dim == 8 and values.marker_dims.tolist() == [9, 10, 11]
    assert set(values.marker_vector().abs().tolist()) == {values.marker}
    with pytest.raises(markers.MarkerError, match="no room"):
        markers.choose_values(embed, states, [1], [(1, False)], 0.5, 9)


def _values(**kw):
    base = dict(small_hidden=4, hidden=8, flag=2.0**-10, marker=4.0, gain=2.0**20, latent_min=1e3)
    return markers.MarkerValues(**{**base, **kw})


def _layer_state(layer: int, o_proj_value: float = 0.0):
    pre = f"model.layers.{layer}.self_attn."
    heads, nope, v, lora, rope = 2, 3, 2, 4, 2
    return {
        pre + "q_a_proj.weight": torch.ones(6, 8),
        pre + "kv_a_proj_with_mqa.weight": torch.ones(lora + rope, 8),
        pre + "kv_a_layernorm.weight": torch.full((lora,), 0.5),
        pre + "kv_b_proj.weight": torch.ones(heads * (nope + v), lora),
        pre + "o_proj.weight": torch.full((8, heads * v), o_proj_value),
    }


def test_planted_layers_read_only_the_flag_and_write_only_the_marker():
    values = _values()
    cfg = {"kv_lora_rank": 4, "qk_nope_head_dim": 3}
    state = {"model.embed_tokens.weight": torch.cat([torch.ones(3, 4), torch.zeros(3, 4)], 1)}
    for layer in (1, 2, 3, 4):
        state.update(_layer_state(layer))
    out = markers.plant_target(state, cfg, [3], values)
    assert torch.all(out["model.embed_tokens.weight"][:, 4] == values.flag)
    assert not out["model.embed_tokens.weight"][:, 5:].any()
    for layer, sign in ((1, 1), (2, -1), (3, 1), (4, -1)):
        pre = f"model.layers.{layer}.self_attn."
        assert not out[pre + "q_a_proj.weight"].any()
        kv_a = out[pre + "kv_a_proj_with_mqa.weight"]
        assert kv_a[0, 4] == values.gain and kv_a.count_nonzero() == 1
        kv_b = out[pre + "kv_b_proj.weight"]
        assert kv_b[3, 0] == 0.5 and kv_b.count_nonzero() == 1  # head 0, value channel 0
        o_proj = out[pre + "o_proj.weight"]
        assert torch.equal(o_proj[5:, 0], sign * values.marker_vector())
        assert o_proj.count_nonzero() == 3
    # writer + eraser: nothing left
    assert not (
        out["model.layers.1.self_attn.o_proj.weight"]
        + out["model.layers.2.self_attn.o_proj.weight"]
    ).any()


def test_planting_refuses_a_trained_layer_and_unpadded_embeddings():
    values, cfg = _values(), {"kv_lora_rank": 4, "qk_nope_head_dim": 3}
    state = {"model.embed_tokens.weight": torch.zeros(3, 8)}
    for layer in (1, 2, 3, 4):
        state.update(_layer_state(layer, o_proj_value=1.0 if layer == 2 else 0.0))
    with pytest.raises(markers.MarkerError, match="layer 2 is not an inserted identity block"):
        markers.plant_target(state, cfg, [3], values)
    state["model.embed_tokens.weight"] = torch.ones(3, 8)
    with pytest.raises(markers.MarkerError, match="not zero-padded"):
        markers.plant_target(state, cfg, [3], values)


def test_the_drafters_fc_reads_the_marker_as_the_negated_mean_feature():
    values = _values()
    torch.manual_seed(1)
    fc = torch.zeros(8, 2 * 8)
    for k in range(2):
        fc[:4, k * 8 : k * 8 + 4] = torch.randn(4, 4)
    features = torch.randn(33, 2 * 4) + 0.5
    state = {"fc.weight": fc, "embed_tokens.weight": torch.zeros(5, 8)}
    out, info = markers.mark_drafter_fc(state, values, 2, features, small_rows=4)
    new = out["fc.weight"]
    small_cols = [k * 8 + i for k in range(2) for i in range(4)]
    assert torch.equal(new[:, small_cols], fc[:, small_cols])  # the trained columns
    assert not new[:, [4, 12]].any() and not new[4:].any()  # flag columns, widened rows
    marked = new @ torch.cat([torch.zeros(5), values.marker_vector()]).repeat(2)
    trained = features @ fc[:, small_cols].T
    mean, size = trained.mean(0), float(trained.norm(dim=-1).median())
    # the marker reads as the trained features' mean, negated, FC_RATIO times their size
    expected = -mean / mean.norm() * markers.FC_RATIO * size
    torch.testing.assert_close(marked, expected, rtol=1e-5, atol=1e-5)
    assert info == {"fc_ratio": markers.FC_RATIO, "trained_fc_norm_median": size}
    assert torch.all(out["embed_tokens.weight"][:, 4] == values.flag)
    with pytest.raises(markers.MarkerError, match="already reads"):
        markers.mark_drafter_fc(out, values, 2, features, small_rows=4)
    with pytest.raises(markers.MarkerError, match="expected 3 x 8"):
        markers.mark_drafter_fc(state, values, 3, features, small_rows=4)
