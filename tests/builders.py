"""Checkpoint variants made by the real `speculators` package (0.9.0, sglang_ext.demo builders:
from config, saved with its own `save_pretrained`). Nothing is fetched from a hub."""

from __future__ import annotations

import json

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


# A tiny SGLang-format EAGLE-3 drafter config (64 wide, one layer, a 128-token draft vocab).
TINY_SGLANG_DRAFTER_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "draft_vocab_size": 128,
    "max_position_embeddings": 512,
}


def sglang_format_drafter(directory, aux_ids=None):
    """A config-only SGLang-format EAGLE-3 drafter (64 wide, 1 layer); `aux_ids` goes into
    eagle_config.eagle_aux_hidden_state_layer_ids, None leaves eagle_config out (SGLang's
    default capture)."""
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "draft_vocab_size": 256,
    }
    if aux_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory
