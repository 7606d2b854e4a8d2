"""A tiny, well-formed MLA EAGLE-3 drafter in SGLang's layout (kimi_k25_eagle3.py:
Eagle3DeepseekV2ForCausalLM), as a Kimi-K2.x drafter directory holds it: a DeepSeek-V3 config
with the drafter's architecture, and safetensors named as SGLang's load_weights reads them
(`layers.0.*`, separate q_a_proj / kv_a_proj_with_mqa and gate / up projections)."""

from __future__ import annotations

from pathlib import Path

import torch

# DeepSeek-style rope for tiny MLA configs (SGLang's MLA attention builds yarn scaling).
YARN_ROPE = {
    "rope_type": "yarn",
    "factor": 1.0,
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 512,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

GEOMETRY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    tie_word_embeddings=False,
    max_position_embeddings=512,
    rope_parameters=YARN_ROPE,
)


def mla_config(num_aux: int = 3, draft_vocab_size: int | None = 128, **fields):
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(**{**GEOMETRY, **fields})
    config.architectures = ["Eagle3DeepseekV2ForCausalLM"]
    if draft_vocab_size is not None:
        config.draft_vocab_size = draft_vocab_size
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(range(1, num_aux + 1))}
    return config


def mla_checkpoint(config, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden, heads = config.hidden_size, config.num_attention_heads
    q_lora, kv_lora = config.q_lora_rank, config.kv_lora_rank
    rope, nope, v = config.qk_rope_head_dim, config.qk_nope_head_dim, config.v_head_dim
    inter = config.intermediate_size
    num_aux = len(config.eagle_config["eagle_aux_hidden_state_layer_ids"])
    shapes = {
        "embed_tokens.weight": (config.vocab_size, hidden),
        "fc.weight": (hidden, num_aux * hidden),
        "norm.weight": (hidden,),
        "layers.0.self_attn.q_a_proj.weight": (q_lora, 2 * hidden),
        "layers.0.self_attn.kv_a_proj_with_mqa.weight": (kv_lora + rope, 2 * hidden),
        "layers.0.self_attn.q_a_layernorm.weight": (q_lora,),
        "layers.0.self_attn.q_b_proj.weight": (heads * (nope + rope), q_lora),
        "layers.0.self_attn.kv_a_layernorm.weight": (kv_lora,),
        "layers.0.self_attn.kv_b_proj.weight": (heads * (nope + v), kv_lora),
        "layers.0.self_attn.o_proj.weight": (hidden, heads * v),
        "layers.0.mlp.gate_proj.weight": (inter, hidden),
        "layers.0.mlp.up_proj.weight": (inter, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, inter),
        "layers.0.input_layernorm.weight": (hidden,),
        "layers.0.hidden_norm.weight": (hidden,),
        "layers.0.post_attention_layernorm.weight": (hidden,),
    }
    if getattr(config, "fc_norm", False):
        shapes.update({f"fc_norm.{i}.weight": (hidden,) for i in range(num_aux)})
    draft_vocab = getattr(config, "draft_vocab_size", None)
    if draft_vocab is not None:
        shapes["lm_head.weight"] = (draft_vocab, hidden)
    tensors = {name: torch.randn(shape, generator=g) * 0.05 for name, shape in shapes.items()}
    if draft_vocab is not None and draft_vocab < config.vocab_size:
        target_ids = torch.randperm(config.vocab_size, generator=g)[:draft_vocab].sort().values
        tensors["d2t"] = target_ids - torch.arange(draft_vocab)
        tensors["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool)
        tensors["t2d"][target_ids] = True
    return tensors


def write_mla_drafter(directory: Path, config=None, tensors=None) -> Path:
    from safetensors.torch import save_file

    config = config if config is not None else mla_config()
    tensors = tensors if tensors is not None else mla_checkpoint(config)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    save_file({k: t.contiguous() for k, t in tensors.items()}, str(directory / "model.safetensors"))
    return directory
