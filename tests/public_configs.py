"""The public-config corpus (tests/data/public_configs/): published drafters' and targets'
config.json, scaled down by one rule, built into tiny checkpoints in their published key layout.

THE RULE (also in README.md beside the configs), applied to every nested config:
- width fields (WIDTH_FIELDS) become ceil(value / 64) rounded up to a multiple of 16 (MLA's
  kv_lora_rank and qk_rope_head_dim are kept: the served latent width must stay kernel-valid;
  q_lora_rank is then rounded up to a multiple of 64, ALIGNED_FIELDS: the kv latent after it
  must stay 128-byte aligned);
- head counts become the largest power of two <= value / 16 (at least 2; kv heads at most
  that, dividing it); an explicit head_dim becomes hidden_size / heads;
- expert counts are capped (EXPERT_CAPS) and a target's depth at TARGET_MAX_LAYERS;
- every other field is kept as published: max_position_embeddings, rope settings, aux ids,
  norm flags, architectures, dtype, a drafter's layer count, token ids, ...
Nothing is fetched: configs come from the files, weights are random.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch

CORPUS = Path(__file__).resolve().parent / "data" / "public_configs"
WIDTH_DIVISOR = 64
WIDTH_MULTIPLE = 16
WIDTH_FIELDS = (
    "hidden_size", "intermediate_size", "moe_intermediate_size", "vocab_size",
    "draft_vocab_size", "target_hidden_size", "q_lora_rank",
    "qk_nope_head_dim", "v_head_dim",
)
# kv_lora_rank and qk_rope_head_dim stay as published (512 + 64): SGLang's MLA decode kernels
# serve only some latent widths (triton: 576 or 288), so scaling them would make every MLA
# config fail at CUDA-graph capture for a reason no published checkpoint has.
# q_lora_rank, scaled, is then rounded up to a multiple of 64: SGLang fuses q_a and kv_a into
# one projection whose output holds the q latent first, and flashinfer's rmsnorm on the kv
# latent slice after it needs 128-byte alignment ("Misaligned Tensor data ... expected data
# alignment=128 bytes" with 32, H200, 2026-12-01); published ranks (1536) are multiples of 64.
ALIGNED_FIELDS = {"q_lora_rank": 64}
EXPERT_CAPS = {"n_routed_experts": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
               "experts_per_token": 2, "n_group": 1, "topk_group": 1}
TARGET_MAX_LAYERS = 64


def manifest() -> dict:
    return json.loads((CORPUS / "manifest.json").read_text())


def scaled_width(value: int) -> int:
    return WIDTH_MULTIPLE * math.ceil(math.ceil(value / WIDTH_DIVISOR) / WIDTH_MULTIPLE)


def scaled_heads(value: int) -> int:
    return max(2, 2 ** int(math.log2(max(1, value // 16))))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def scale_config(config: dict, *, target: bool = False) -> dict:
    """The one rule, applied recursively (speculators' transformer_layer_config, text_config)."""
    out = copy.deepcopy(config)

    def walk(node: dict) -> None:
        for key, value in list(node.items()):
            if isinstance(value, dict):
                walk(value)
            elif key in WIDTH_FIELDS and _is_int(value):
                align = ALIGNED_FIELDS.get(key, 1)
                node[key] = align * math.ceil(scaled_width(value) / align)
            elif key in EXPERT_CAPS and _is_int(value):
                node[key] = min(value, EXPERT_CAPS[key])
        if _is_int(node.get("num_attention_heads")):
            heads = node["num_attention_heads"] = scaled_heads(node["num_attention_heads"])
            if _is_int(node.get("num_key_value_heads")):
                node["num_key_value_heads"] = min(node["num_key_value_heads"], heads)
                if heads % node["num_key_value_heads"]:
                    node["num_key_value_heads"] = 1
            if _is_int(node.get("head_dim")) and _is_int(node.get("hidden_size")):
                node["head_dim"] = node["hidden_size"] // heads
        if target and _is_int(node.get("num_hidden_layers")):
            node["num_hidden_layers"] = min(node["num_hidden_layers"], TARGET_MAX_LAYERS)

    walk(out)
    return out


def _vocab(config: dict) -> tuple[int, int]:
    layer = config.get("transformer_layer_config", config)
    vocab = layer["vocab_size"]
    return vocab, config.get("draft_vocab_size") or vocab


def _vocab_mapping(vocab: int, draft_vocab: int) -> dict[str, torch.Tensor]:
    if draft_vocab == vocab:
        return {}
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:draft_vocab] = True
    return {"d2t": torch.zeros(draft_vocab, dtype=torch.int64), "t2d": t2d}


def sglang_checkpoint(config: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random weights in the published SGLang layout (one draft layer as `midlayer.*`, as
    lmsys'/SpecForge's exports; MLA drafters as `layers.0.*`, as Kimi's)."""

    def w(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    vocab, draft_vocab = _vocab(config)
    eagle = config.get("eagle_config") or {}
    aux = eagle.get("eagle_aux_hidden_state_layer_ids") or config.get(
        "eagle_aux_hidden_state_layer_ids"
    )
    num_aux = len(aux) if aux else 3
    target_hidden = config.get("target_hidden_size") or hidden
    tensors = {
        "fc.weight": w(hidden, num_aux * target_hidden),
        "norm.weight": ones(hidden),
        "lm_head.weight": w(draft_vocab, hidden),
        **_vocab_mapping(vocab, draft_vocab),
    }
    if target_hidden != hidden:
        tensors["embed_tokens.weight"] = w(vocab, hidden)
    if eagle.get("norm_before_fc") or config.get("norm_before_fc"):
        tensors["input_norm.weight"] = ones(num_aux * target_hidden)
    if config["architectures"][0] == "Eagle3DeepseekV2ForCausalLM":
        p = "layers.0."
        q_lora, kv_lora = config["q_lora_rank"], config["kv_lora_rank"]
        nope, rope, v = (config[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        tensors.update({
            p + "self_attn.q_a_proj.weight": w(q_lora, 2 * hidden),
            p + "self_attn.q_a_layernorm.weight": ones(q_lora),
            p + "self_attn.q_b_proj.weight": w(heads * (nope + rope), q_lora),
            p + "self_attn.kv_a_proj_with_mqa.weight": w(kv_lora + rope, 2 * hidden),
            p + "self_attn.kv_a_layernorm.weight": ones(kv_lora),
            p + "self_attn.kv_b_proj.weight": w(heads * (nope + v), kv_lora),
            p + "self_attn.o_proj.weight": w(hidden, heads * v),
        })
        layers = [p]
    else:
        hd = config.get("head_dim") or hidden // heads
        n_layers = config["num_hidden_layers"]
        layers = ["midlayer."] if n_layers == 1 else [f"layers.{n}." for n in range(n_layers)]
        for n, p in enumerate(layers):
            width = 2 * hidden if n == 0 else hidden
            tensors.update({
                p + "self_attn.q_proj.weight": w(heads * hd, width),
                p + "self_attn.k_proj.weight": w(kv * hd, width),
                p + "self_attn.v_proj.weight": w(kv * hd, width),
                p + "self_attn.o_proj.weight": w(hidden, heads * hd),
            })
    for p in layers:
        tensors.update({
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
            p + "input_layernorm.weight": ones(hidden),
            p + "hidden_norm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
        })
    return tensors


def write_sglang_drafter(
    config: dict, directory: Path, seed: int = 0, weights: str = "model.safetensors"
) -> Path:
    """``weights``: the published file; "pytorch_model.bin" (the original EAGLE-3 releases)
    is written with torch.save, a plain state dict that PyTorch's weights_only loader reads."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = sglang_checkpoint(config, torch.Generator().manual_seed(seed))
    if weights == "pytorch_model.bin":
        torch.save(tensors, directory / weights)
    elif weights == "model.safetensors":
        save_file(tensors, str(directory / weights))
    else:
        raise ValueError(f"corpus weights file {weights!r}: model.safetensors or pytorch_model.bin")
    return directory


def write_speculators_drafter(config: dict, directory: Path, seed: int = 0) -> Path:
    """speculators' own classes: the config through Eagle3SpeculatorConfig, the model built
    from it, randomised, saved with its save_pretrained (no verifier is loaded: the config
    carries its name only, and no hub path is touched)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    data = copy.deepcopy(config)
    data.pop("auto_map", None)
    data["transformer_layer_config"]["_attn_implementation"] = "eager"
    spec_config = Eagle3SpeculatorConfig.from_dict(data)
    torch.manual_seed(seed)
    model = Eagle3DraftModel(spec_config)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.normal_(0, 0.02)
    vocab, draft_vocab = _vocab(config)
    for name, value in _vocab_mapping(vocab, draft_vocab).items():
        getattr(model, name).copy_(value)
    model.save_pretrained(str(directory))
    return directory


def write_target_config(config: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def build(name: str, root: Path) -> tuple[Path, Path, dict]:
    """(drafter dir, target dir, manifest entry) of corpus entry `name`, built under root."""
    entry = manifest()["drafters"][name]
    drafter_config = scale_config(json.loads((CORPUS / entry["config"]).read_text()))
    target_config = scale_config(
        json.loads((CORPUS / entry["target"]).read_text()), target=True
    )
    target = write_target_config(target_config, root / f"{name}-target")
    if entry["format"] == "speculators":
        drafter = write_speculators_drafter(drafter_config, root / f"{name}-drafter")
    else:
        drafter = write_sglang_drafter(
            drafter_config,
            root / f"{name}-drafter",
            weights=entry.get("weights", "model.safetensors"),
        )
    return drafter, target, entry


# -- the GPU check's pure logic (tests/gpu/test_public_configs.py; CPU-tested) ---------------


def doctor_outcome(verdict: str) -> str:
    """What doctor's verdict predicts for the plugin's server: OK starts, ERROR refuses."""
    return "starts" if verdict == "OK" else "fails"


def server_outcome(status: str) -> str:
    """launch.Server.wait's status as a startup outcome ("ready" or exited/timeout)."""
    return "starts" if status == "ready" else "fails"


def requests_ok(responses: list) -> bool:
    """Every request answered with generated tokens."""
    return bool(responses) and all(
        isinstance(r, dict) and r.get("output_ids") and "meta_info" in r for r in responses
    )


def record(doctor_verdict: str, status: str, responses: list | None) -> dict:
    """One RESULTS["public_configs"] entry."""
    return {
        "doctor": doctor_outcome(doctor_verdict),
        "server": server_outcome(status),
        "status": status,
        "requests_ok": None if responses is None else requests_ok(responses),
    }
