"""Shared pieces of the fixture build: scales (sizes, steps), variants, token ids, the
held-out split rule, seeding, autocast, JSON writing, logging.

Part of the fixture build (``scripts/make_fixtures.py`` is its CLI); import these names from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

VARIANTS = ("llama", "llama3layer", "random", "qwen3", "dsv3", "sglang4layer", "window")
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
HELDOUT_PERCENT = 5
SPLIT_SALT = "sglang-ext-fixtures-v1"
NUM_SPEC_TOKENS = 3
LOSS_NAME = "kl_div"  # speculators' default eagle3 loss (TrainConfig: loss_fn -> "kl_div")

# --------------------------------------------------------------------------------------
# Scales
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scale:
    name: str
    vocab_size: int
    seq_len: int
    train_char_budget: int | None  # None: all training files
    llama: dict[str, Any]
    llama_train: dict[str, Any]
    qwen3: dict[str, Any]
    qwen3_train: dict[str, Any]
    llama4: dict[str, Any]
    llama4_train: dict[str, Any]
    dsv3: dict[str, Any]
    drafter_train: dict[str, dict[str, Any]]
    heldout_eval_chunks: int
    num_prompts: int = 64
    prompt_len: tuple[int, int] = (128, 256)
    ref_prompts_main: int = 64
    ref_prompts_other: int = 16
    ref_prompts_random: int = 8
    ref_max_new_tokens: int = 128
    ref_lossless_prompts: int = 8
    time_caps: dict[str, float] = dataclasses.field(default_factory=dict)
    # The `window` variant (fixtures_window): a drafter trained with a binding sliding
    # window on long sequences, and its long held-out prompts.
    window: dict[str, Any] = dataclasses.field(default_factory=dict)


def dsv3_cfg(layers, hidden, inter, moe_inter, heads, experts, q_lora, kv_lora, rope, nope, v):
    """A DeepseekV3 (MLA + MoE) geometry: top-2 of `experts` routed + 1 shared, first layer
    dense, as many KV heads as heads."""
    return dict(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=inter,
        moe_intermediate_size=moe_inter,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        n_routed_experts=experts,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        q_lora_rank=q_lora,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        v_head_dim=v,
    )


def _llama_cfg(layers, hidden, heads, kv, inter):
    return dict(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
    )


FULL = Scale(
    name="full",
    vocab_size=8192,
    seq_len=512,
    train_char_budget=None,
    llama=_llama_cfg(6, 512, 8, 4, 1536),
    llama_train=dict(steps=1000, batch=64, lr=1.5e-3),
    qwen3=dict(
        num_hidden_layers=4,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
    ),
    qwen3_train=dict(steps=300, batch=32, lr=2e-3),
    llama4=_llama_cfg(4, 256, 4, 2, 768),
    llama4_train=dict(steps=150, batch=32, lr=2e-3),
    dsv3=dsv3_cfg(6, 256, 512, 128, 8, 8, 96, 64, 16, 32, 32),
    drafter_train={
        "llama-drafter": dict(steps=1200, chunks=8, lr=2e-3),
        "llama-drafter-3layer": dict(steps=600, chunks=8, lr=1.5e-3),
        "qwen3-drafter": dict(steps=400, chunks=8, lr=2e-3),
        "dsv3-drafter": dict(steps=40, chunks=4, lr=2e-3),
        "window-drafter": dict(steps=500, chunks=4, lr=2e-3),
    },
    heldout_eval_chunks=64,
    # Wall-clock guards (s) per training stage; the planned step counts are expected to
    # finish well inside them on one H200 (see the report in fixtures.json "stages").
    time_caps={
        "llama-target": 120,
        "qwen3-target": 25,
        "llama4layer-target": 15,
        "llama-drafter": 60,
        "llama-drafter-3layer": 40,
        "qwen3-drafter": 25,
        "dsv3-drafter": 10,
        "window-drafter": 100,
    },
    window=dict(
        sliding_window=256,
        seq_len=1280,  # training sequences: 5 windows long
        prompts=24,
        prompt_len=(1100, 1500),
        max_new_tokens=128,
    ),
)

TINY = Scale(
    name="tiny",
    vocab_size=512,
    seq_len=128,
    train_char_budget=400_000,
    llama=_llama_cfg(4, 64, 4, 2, 128),
    llama_train=dict(steps=60, batch=16, lr=1e-2),
    qwen3=dict(
        num_hidden_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
    ),
    qwen3_train=dict(steps=30, batch=16, lr=3e-3),
    llama4=_llama_cfg(4, 64, 4, 2, 128),
    llama4_train=dict(steps=20, batch=16, lr=3e-3),
    dsv3=dsv3_cfg(6, 64, 128, 32, 4, 4, 32, 16, 8, 16, 16),
    drafter_train={
        "llama-drafter": dict(steps=30, chunks=4, lr=5e-3),
        "llama-drafter-3layer": dict(steps=15, chunks=4, lr=3e-3),
        "qwen3-drafter": dict(steps=15, chunks=4, lr=3e-3),
        "dsv3-drafter": dict(steps=5, chunks=2, lr=3e-3),
        "window-drafter": dict(steps=10, chunks=2, lr=5e-3),
    },
    heldout_eval_chunks=8,
    ref_prompts_main=4,
    ref_prompts_other=2,
    ref_prompts_random=2,
    ref_max_new_tokens=16,
    ref_lossless_prompts=2,
    window=dict(sliding_window=16, seq_len=96, prompts=2, prompt_len=(80, 100), max_new_tokens=16),
)

SCALES = {"full": FULL, "tiny": TINY}

# Aux ids (speculators convention). speculators' default [2, L//2, L-3] is invalid for
# 4- and 6-layer targets (duplicates), so they are explicit.
AUX_IDS = {
    "llama-target": [1, 3, 4],  # 6 layers (full); the tiny llama has 4 -> see _aux_ids
    "qwen3-target": [1, 2, 3],  # 4 layers
    "dsv3-target": [1, 3, 4],  # 6 layers; first id 1 -> SGLang deepseek_v2 "+1" rule
}

# --------------------------------------------------------------------------------------
# Small utilities
# --------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[make_fixtures {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def n_params(module: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_AMP = {"cpu": False}  # --cpu-autocast: exercise the CUDA bf16 dtype path on CPU


def autocast_ctx(device: str):
    if device == "cuda" or _AMP["cpu"]:
        return torch.autocast(device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def amp_enabled(device: str) -> bool:
    return device == "cuda" or _AMP["cpu"]


def lr_at(step: int, steps: int, base: float) -> float:
    warmup = max(1, steps // 20)
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def heldout_split(rel_path: str) -> bool:
    digest = hashlib.sha256(f"{SPLIT_SALT}:{rel_path}".encode()).hexdigest()
    return int(digest[:8], 16) % 100 < HELDOUT_PERCENT


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    if torch.is_tensor(obj):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj)}")


def _clean_floats(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_floats(v) for v in obj]
    return obj


def patch_config(path: Path, **updates) -> None:
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(updates)
    write_json(cfg_path, cfg)


def versions() -> dict[str, str]:
    """The library versions a fixture manifest records."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("transformers", "tokenizers", "speculators", "safetensors", "triton"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out
