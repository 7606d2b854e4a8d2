"""Fusion decided by capture (forward mode), not by width; width mismatch fails loudly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_cpu import forward_batch, use_reference_attention

from sglang_ext.serving.fusion import FusionError, FusionPolicy, check_algorithm

POLICY = FusionPolicy(drafter="d", num_aux_hidden_states=3, fc_input_hidden_size=64, hidden_size=64)


def mode(name):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return getattr(ForwardMode, name)


@pytest.mark.parametrize("name", ["EXTEND", "MIXED", "DRAFT_EXTEND_V2"])
def test_target_feature_modes_fuse(sglang_env, name):
    assert POLICY.applies(mode(name), 192) is True


def test_draft_decode_never_fuses(sglang_env):
    assert POLICY.applies(mode("DECODE"), 64) is False


def test_one_layer_as_wide_as_the_drafter_is_an_error_not_a_skip(sglang_env):
    """The seed's failure: 7168-wide features for a 3x7168 fc were silently not fused."""
    with pytest.raises(FusionError) as info:
        POLICY.applies(mode("EXTEND"), 64)
    message = str(info.value)
    assert "64 wide" in message and "3 x 64 = 192" in message
    assert "aux capture is not active" in message
    assert "--speculative-algorithm EAGLE3" in message
    assert "set_eagle3_layers_to_capture" in message


def test_two_layers_named_in_error(sglang_env):
    with pytest.raises(FusionError, match=r"128 wide \(2 target layers\)"):
        POLICY.applies(mode("DRAFT_EXTEND_V2"), 128)


def test_decode_with_target_width_is_an_error(sglang_env):
    with pytest.raises(FusionError, match="draft decode step"):
        POLICY.applies(mode("DECODE"), 192)


def test_idle_batches_follow_the_prepared_width(sglang_env):
    assert POLICY.applies(mode("IDLE"), 192) is True
    assert POLICY.applies(mode("IDLE"), 64) is False


def test_algorithm_check():
    check_algorithm(None, "d")
    check_algorithm("EAGLE3", "d")
    with pytest.raises(FusionError, match="needs --speculative-algorithm EAGLE3"):
        check_algorithm("EAGLE", "d")


class FcSpy(torch.nn.Module):
    def __init__(self, fc):
        super().__init__()
        self.fc, self.calls = fc, 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x)


def llama_drafter(directory):
    from safetensors.torch import load_file

    from sglang_ext.drafter.speculators_format import load_drafter_spec, to_sglang_config
    from sglang_ext.models.llama_eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel(to_sglang_config(load_drafter_spec(directory)))
    model.load_weights(load_file(str(directory / "model.safetensors")).items())
    use_reference_attention(model)
    model.model.fc = FcSpy(model.model.fc)
    return model


def test_llama_model_fuses_on_extend_not_on_decode(sglang_env, drafter):
    directory, _ = drafter("default")
    model = llama_drafter(directory)
    ids, pos = torch.arange(5), torch.arange(5)
    with torch.no_grad():
        out, aux = model.model(ids, pos, forward_batch("EXTEND", torch.randn(5, 192)))
        assert model.model.fc.calls == 1
        model.model(ids, pos, forward_batch("DECODE", aux[0]))
        assert model.model.fc.calls == 1  # the drafter's own state is never re-fused
        model.model(ids, pos, forward_batch("DRAFT_EXTEND_V2", torch.randn(5, 192)))
        assert model.model.fc.calls == 2
        with pytest.raises(FusionError, match="64 wide"):
            model.model(ids, pos, forward_batch("DRAFT_EXTEND_V2", torch.randn(5, 64)))


def test_stock_sglang_silently_skips_fusion_on_equal_width(sglang_env, drafter):
    """Documents the upstream behaviour the plugin fixes (llama_eagle3.py:LlamaModel.forward):
    one 64-wide target layer for a 192-wide fc runs without fusion and without an error."""
    from sglang.srt.models.llama_eagle3 import LlamaModel

    directory, _ = drafter("default")
    model = llama_drafter(directory)
    stock = model.model
    stock.__class__ = LlamaModel
    for layer in stock.layers:
        layer.__class__ = layer.__class__.__mro__[1]  # SGLang's own decoder layer
    with torch.no_grad():
        stock(torch.arange(5), torch.arange(5), forward_batch("EXTEND", torch.randn(5, 64)))
    assert stock.fc.calls == 0


def mla_drafter(num_aux=3):
    from mla_drafters import mla_config

    from sglang_ext.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    config = mla_config(num_aux=num_aux)
    model = Eagle3DeepseekV2ForCausalLM(config)

    class Midlayer(torch.nn.Module):  # MLA attention needs a GPU backend; record the input
        def forward(self, positions, embeds, hidden, forward_batch, scratch):
            self.seen = hidden.shape[-1]
            return hidden, hidden

    model.model.midlayer = Midlayer()
    model.model.fc.forward = FcSpy(lambda x: (x[..., :64], None)).forward
    return model


def test_mla_drafter_fusion_policy(sglang_env):
    model = mla_drafter()
    ids = torch.arange(4)
    with torch.no_grad():
        model.model(ids, ids, forward_batch("EXTEND", torch.randn(4, 192)))
        assert model.model.midlayer.seen == 64
        model.model(ids, ids, forward_batch("DECODE", torch.randn(4, 64)))
        with pytest.raises(FusionError, match=r"3 x 64 = 192"):
            model.model(ids, ids, forward_batch("EXTEND", torch.randn(4, 64)))


def test_mla_drafter_refuses_eagle_algorithm(sglang_env, monkeypatch):
    from sglang_ext import compat

    monkeypatch.setattr(
        compat, "server_args", lambda: SimpleNamespace(speculative_algorithm="EAGLE")
    )
    with pytest.raises(FusionError, match="EAGLE3"):
        mla_drafter()
