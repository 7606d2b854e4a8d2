"""Numerical parity: the drafter as the plugin builds it from SGLang's layers vs speculators'
own Eagle3DraftModel, step-0 forward on the same inputs, fp32 on CPU.

SGLang's attention cannot run on CPU, so attention is evaluated by tests/sglang_cpu.py's
ReferenceAttention (plain causal attention using SGLang's sliding-window convention); every
other operation is SGLang's own (RMSNorm, QKVParallelLinear, rotary embedding, MLP, the eagle3
decoder layer). The GPU tests cover the full path with SGLang's attention backends.
"""

from __future__ import annotations

import pytest
import torch
from builders import VARIANTS, speculators_logits
from safetensors.torch import load_file
from sglang_cpu import forward_batch, use_reference_attention

T = 12


def plugin_model(directory, reference):
    from sglang_ext.models.llama_eagle3 import Eagle3DraftModel
    from sglang_ext.speculators_format import load_drafter_spec, to_sglang_config

    spec = load_drafter_spec(directory)
    model = Eagle3DraftModel(to_sglang_config(spec))
    model.load_weights(load_file(str(directory / "model.safetensors")).items())
    # What SGLang's EAGLE worker does at startup: share the target's embedding table. The
    # speculators model holds the verifier's table (a drafter trained with frozen embeddings
    # was trained against exactly that one); a drafter with its own embeddings must keep its.
    shared = reference.embed_tokens.weight.detach().clone()
    if spec.embed_requires_grad:
        shared = torch.zeros_like(shared)
    model.set_embed(torch.nn.Parameter(shared))
    use_reference_attention(model)
    return spec, model.eval()


def step0(model, spec, seed=1):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, spec.expected_target_feature_width, generator=generator)
    ids = torch.randint(0, spec.vocab_size, (T,), generator=generator)
    with torch.no_grad():
        normed, _ = model.model(ids, torch.arange(1, T + 1), forward_batch("EXTEND", hidden))
    return hidden, ids, normed @ model.lm_head.weight.T


# tiny_window (window 4 < 12 tokens) is the documented exception, tested below.
@pytest.mark.parametrize("name", sorted(set(VARIANTS) - {"tiny_window"}))
def test_step0_logits_match_speculators(sglang_env, drafter, name):
    directory, reference = drafter(name)
    spec, model = plugin_model(directory, reference)
    hidden, ids, got = step0(model, spec)
    want = speculators_logits(reference, hidden, ids)
    assert got.shape == want.shape == (T, spec.draft_vocab_size or spec.vocab_size)
    assert want.abs().mean() > 1e-2  # a real signal, not all zeros
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_norm_before_residual_changes_the_output(sglang_env, drafter):
    """The parity above would catch a dropped norm_before_residual (speculators' default)."""
    directory, reference = drafter("default")
    spec, model = plugin_model(directory, reference)
    assert spec.norm_before_residual
    hidden, ids, _ = step0(model, spec)
    want = speculators_logits(reference, hidden, ids)
    for layer in model.model.layers:
        layer.norm_before_residual = False
    _, _, got = step0(model, spec)
    assert (got - want).abs().max() > 1e-2


def test_sliding_window_is_served_as_full_attention_and_said_so(sglang_env, drafter, caplog):
    """SGLang's EAGLE draft decode cannot apply a per-layer window (the triton multi-step
    draft backend has no window buffers; on the H200 a drafter-level window crashed the first
    draft decode), so the plugin serves the window as full attention and warns at startup.
    Below the window length that is speculators' math exactly (the parity test above, window
    16 > 12 tokens); beyond it, it is speculators' math without the window, as shown here."""
    directory, reference = drafter("tiny_window")
    with caplog.at_level("WARNING"):
        spec, model = plugin_model(directory, reference)
    assert spec.sliding_window == 4 and T > spec.sliding_window
    assert "trained with sliding_window=4" in caplog.text and "full context" in caplog.text
    assert all(layer.self_attn.attn.sliding_window_size in (None, -1)
               for layer in model.model.layers)
    hidden, ids, got = step0(model, spec)
    windowed = speculators_logits(reference, hidden, ids)
    assert (got - windowed).abs().max() > 1e-3  # the divergence beyond the window is real
    saved = (reference.sliding_window_indices, reference.uses_sliding_window_attn,
             reference.uses_full_attn)
    try:  # the same speculators model with its window switched off (a shared fixture)
        reference.sliding_window_indices = []
        reference.uses_sliding_window_attn, reference.uses_full_attn = False, True
        unwindowed = speculators_logits(reference, hidden, ids)
    finally:
        (reference.sliding_window_indices, reference.uses_sliding_window_attn,
         reference.uses_full_attn) = saved
    torch.testing.assert_close(got, unwindowed, atol=1e-4, rtol=0)


def test_own_embeddings_survive_set_embed(sglang_env, drafter):
    directory, reference = drafter("own_embeddings")
    spec, model = plugin_model(directory, reference)
    torch.testing.assert_close(
        model.model.embed_tokens.weight,
        load_file(str(directory / "model.safetensors"))["embed_tokens.weight"],
    )


def test_d2t_becomes_hot_token_ids(sglang_env, drafter):
    directory, reference = drafter("default")
    _, model = plugin_model(directory, reference)
    chosen = torch.nonzero(reference.t2d).flatten()
    assert torch.equal(model.hot_token_id, chosen)
    directory, reference = drafter("no_d2t")
    _, model = plugin_model(directory, reference)
    assert model.hot_token_id is None
