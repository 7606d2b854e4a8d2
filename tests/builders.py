"""Checkpoint variants made by the real `speculators` package (0.9.0, sglang_ext.demo builders:
from config, saved with its own `save_pretrained`). Nothing is fetched from a hub."""

from __future__ import annotations

import torch

from sglang_ext.demo import Variant, build_drafter, write_target  # noqa: F401

VARIANTS = {
    "default": Variant(),
    "three_layers": Variant(name="three_layers", num_layers=3),
    "norms_off": Variant(
        name="norms_off", norm_before_residual=False, norm_before_fc=False, norm_output=False
    ),
    "fc_norm": Variant(name="fc_norm", norm_before_fc=False, fc_norm=True),
    "qwen3": Variant(name="qwen3", layer_type="qwen3"),
    "no_d2t": Variant(name="no_d2t", draft_vocab_size=None),
    "small_window": Variant(name="small_window", num_layers=3, sliding_window=16),
    "tiny_window": Variant(name="tiny_window", num_layers=2, sliding_window=4),
    "full_attention": Variant(name="full_attention", sliding_window=None),
    "own_embeddings": Variant(name="own_embeddings", embed_requires_grad=True),
}


def speculators_logits(model, hidden_states: torch.Tensor, input_ids: torch.Tensor):
    """Logits of speculators' own Eagle3DraftModel.forward at TTT step 0 (one step, no loss)."""
    captured = {}
    handle = model.lm_head.register_forward_hook(
        lambda _m, _i, out: captured.setdefault("logits", out)
    )
    try:
        with torch.no_grad():
            model(
                hidden_states=hidden_states[None],
                input_ids=input_ids[None],
                document_ids=torch.zeros_like(input_ids)[None],
                ttt_steps=1,
            )
    finally:
        handle.remove()
    return captured["logits"][0]
