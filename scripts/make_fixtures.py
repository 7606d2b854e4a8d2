#!/usr/bin/env python
"""Build the deterministic model fixtures used by the sglang_ext tests and benchmarks.

Everything is trained from scratch on text that exists on every machine: the Python
standard library's own source files. Nothing is downloaded.

Fixture layout (``--out DIR``)::

    DIR/
      fixtures.json                 manifest (versions, seeds, timings, losses, tau, ...)
      prompts.jsonl                 >= 64 held-out prompts {"id","input_ids","text","source"}
      splits.json                   train / held-out stdlib file lists (relative paths)
      tokenizer/                    byte-level BPE tokenizer (tokenizer.json + config)
      vocab/{t2d.pt,d2t.pt}         draft-vocab mapping shared by all drafters
      reference/<drafter>.jsonl     offline reference tokens / acceptance per prompt
      llama-target/                 LlamaForCausalLM (+ tokenizer files)          [llama]
      llama-drafter/                speculators Eagle3DraftModel, 1 llama layer   [llama]
      llama-drafter-3layer/         same, 3 draft layers                          [llama3layer]
      random-drafter/               llama-drafter config, untrained weights       [random]
      qwen3-target/ qwen3-drafter/  Qwen3ForCausalLM + qwen3-layer drafter        [qwen3]
      dsv3-target/ dsv3-drafter/    random DeepseekV3ForCausalLM (MLA+MoE)        [dsv3]
      llama4layer-target/           4-layer llama                                 [sglang4layer]
      llama4layer-sglang-drafter/   plain SGLang-format EAGLE-3 drafter (midlayer.*,
                                    no eagle_config -> SGLang default aux ids collapse)

Aux hidden-state ids (``eagle_aux_hidden_state_layer_ids``) follow the speculators /
vLLM convention: id ``k`` is the residual stream ENTERING decoder layer ``k``, i.e.
transformers ``output_hidden_states[k]``; id ``num_layers`` would be the last decoder
output before the final norm. Drafter training targets use that pre-norm last hidden state
(speculators applies ``verifier_norm`` + ``verifier_lm_head`` itself); note transformers 5
returns the POST-norm state as ``output_hidden_states[-1]``, so we capture the input of
the final norm instead (``sglang_ext_tools.reference.collect_hidden_states``).

Determinism: every stage reseeds python/torch RNGs from ``--seed`` and a per-stage
offset, so a stage's result does not depend on which other variants are built. The CPU
(tiny) build is bitwise reproducible for a given torch build; CUDA training is seeded
but not bitwise deterministic (``torch.use_deterministic_algorithms`` is not enabled
because some SDPA/index backward kernels have no deterministic variant and it would
slow training down).

Usage::

    python scripts/make_fixtures.py --out /tmp/fixtures --scale tiny --device cpu \\
        --variants llama,random,sglang4layer
    python scripts/make_fixtures.py --out fixtures --scale full --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sglang_ext_tools import reference as ref  # noqa: E402

VARIANTS = ("llama", "llama3layer", "random", "qwen3", "dsv3", "sglang4layer")
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
    dsv3=dict(
        num_hidden_layers=6,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_attention_heads=8,
        num_key_value_heads=8,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        q_lora_rank=96,
        kv_lora_rank=64,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
    ),
    drafter_train={
        "llama-drafter": dict(steps=1200, chunks=8, lr=2e-3),
        "llama-drafter-3layer": dict(steps=600, chunks=8, lr=1.5e-3),
        "qwen3-drafter": dict(steps=400, chunks=8, lr=2e-3),
        "dsv3-drafter": dict(steps=40, chunks=4, lr=2e-3),
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
    },
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
    dsv3=dict(
        num_hidden_layers=6,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
    ),
    drafter_train={
        "llama-drafter": dict(steps=30, chunks=4, lr=5e-3),
        "llama-drafter-3layer": dict(steps=15, chunks=4, lr=3e-3),
        "qwen3-drafter": dict(steps=15, chunks=4, lr=3e-3),
        "dsv3-drafter": dict(steps=5, chunks=2, lr=3e-3),
    },
    heldout_eval_chunks=8,
    ref_prompts_main=4,
    ref_prompts_other=2,
    ref_prompts_random=2,
    ref_max_new_tokens=16,
    ref_lossless_prompts=2,
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


# --------------------------------------------------------------------------------------
# Data: stdlib sources, split, tokenizer, token streams, prompts
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Corpus:
    root: str
    train: list[tuple[str, str]]  # (relative path, text)
    heldout: list[tuple[str, str]]
    skipped: int


def collect_sources() -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip_dirs = {"site-packages", "dist-packages", "__pycache__"}
    train, heldout, skipped = [], [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            try:
                text = full.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                skipped += 1
                continue
            if not text.strip():
                continue
            (heldout if heldout_split(rel) else train).append((rel, text))
    return Corpus(root=str(root), train=train, heldout=heldout, skipped=skipped)


def select_training_subset(corpus: Corpus, budget: int | None) -> list[tuple[str, str]]:
    if budget is None:
        return corpus.train
    ordered = sorted(corpus.train, key=lambda rt: hashlib.sha256(rt[0].encode()).hexdigest())
    chosen, total = [], 0
    for rel, text in ordered:
        if total >= budget:
            break
        chosen.append((rel, text))
        total += len(text)
    return sorted(chosen)


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    save_tokenizer(hf_tok, out_dir)
    return hf_tok


def save_tokenizer(hf_tok, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(str(out_dir))
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    # A class name every transformers version resolves (v5 maps it to TokenizersBackend).
    cfg.update(
        tokenizer_class="PreTrainedTokenizerFast",
        model_max_length=4096,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        add_bos_token=False,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
    )
    write_json(cfg_path, cfg)


def _backend(hf_tok):
    """The underlying ``tokenizers.Tokenizer`` (fast batch encoding, no special tokens)."""
    return getattr(hf_tok, "backend_tokenizer", None) or hf_tok._tokenizer


def encode_stream(hf_tok, texts: list[str]) -> torch.Tensor:
    encs = _backend(hf_tok).encode_batch(texts)
    ids: list[int] = []
    for enc in encs:
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.int32)


def make_prompts(hf_tok, heldout: list[tuple[str, str]], scale: Scale, seed: int):
    rng = random.Random(seed)
    lo, hi = scale.prompt_len
    encoded = [
        (rel, enc.ids)
        for (rel, _), enc in zip(
            heldout, _backend(hf_tok).encode_batch([t for _, t in heldout]), strict=True
        )
    ]
    prompts: list[dict[str, Any]] = []
    per_file_cursor = {rel: 0 for rel, _ in encoded}
    # Round-robin over held-out files so prompts come from many different files.
    while len(prompts) < scale.num_prompts:
        progressed = False
        for rel, ids in encoded:
            if len(prompts) >= scale.num_prompts:
                break
            length = rng.randint(lo, hi)
            start = per_file_cursor[rel]
            if start + length > len(ids):
                continue
            chunk = ids[start : start + length]
            per_file_cursor[rel] = start + length
            prompts.append(
                {
                    "id": f"p{len(prompts):03d}",
                    "input_ids": chunk,
                    "text": hf_tok.decode(chunk),
                    "source": rel,
                    "offset": start,
                }
            )
            progressed = True
        if not progressed:
            raise RuntimeError(
                f"held-out split too small for {scale.num_prompts} prompts of {lo}-{hi} tokens"
            )
    return prompts


def sample_batch(
    stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator, device: str
) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len)[None]
    return stream[idx].long().to(device)


def heldout_chunks(stream: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    n = min(n, len(stream) // seq_len)
    return stream[: n * seq_len].reshape(n, seq_len).long()


# --------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------


def token_kwargs(vocab_size: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab_size,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    )


def build_llama(scale_cfg: dict[str, Any], vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        **scale_cfg,
        **token_kwargs(vocab_size),
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    return LlamaForCausalLM(cfg)


def build_qwen3(scale_cfg: dict[str, Any], vocab_size: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        **scale_cfg,
        **token_kwargs(vocab_size),
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    return Qwen3ForCausalLM(cfg)


def build_dsv3(scale_cfg: dict[str, Any], vocab_size: int):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        **scale_cfg,
        **token_kwargs(vocab_size),
        rms_norm_eps=1e-6,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=True,
        num_nextn_predict_layers=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    return ref.use_eager_experts(DeepseekV3ForCausalLM(cfg))


def train_causal_lm(
    model,
    stream: torch.Tensor,
    *,
    steps: int,
    batch: int,
    seq_len: int,
    lr: float,
    device: str,
    seed: int,
    time_cap: float | None,
):
    model.to(device).train()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=lr,
        betas=(0.9, 0.95),
        weight_decay=0.1,
        **({"fused": True} if device == "cuda" else {}),
    )
    history = []
    start = time.perf_counter()
    log_every = max(1, steps // 20)
    stopped_early = False
    step = 0
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        x = sample_batch(stream, batch, seq_len, gen, device)
        with autocast_ctx(device):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            history.append(
                {
                    "step": step,
                    "loss": round(loss.item(), 4),
                    "t": round(time.perf_counter() - start, 2),
                }
            )
        if time_cap is not None and time.perf_counter() - start > time_cap:
            history.append(
                {
                    "step": step,
                    "loss": round(loss.item(), 4),
                    "t": round(time.perf_counter() - start, 2),
                }
            )
            stopped_early = step < steps - 1
            break
    model.eval()
    return {
        "steps_planned": steps,
        "steps_done": step + 1,
        "batch": batch,
        "seq_len": seq_len,
        "lr": lr,
        "tokens_seen": (step + 1) * batch * seq_len,
        "stopped_by_time_cap": stopped_early,
        "history": history,
        "first_loss": history[0]["loss"],
        "last_loss": history[-1]["loss"],
        "wall_s": round(time.perf_counter() - start, 2),
    }


@torch.no_grad()
def eval_causal_lm(model, chunks: torch.Tensor, device: str) -> dict[str, float]:
    model.eval()
    total_loss, total_correct, total = 0.0, 0, 0
    for i in range(0, len(chunks), 8):
        x = chunks[i : i + 8].to(device)
        with autocast_ctx(device):
            logits = model(input_ids=x, use_cache=False).logits
        logits = logits[:, :-1].float()
        tgt = x[:, 1:]
        total_loss += F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="sum").item()
        total_correct += (logits.argmax(-1) == tgt).sum().item()
        total += tgt.numel()
    loss = total_loss / total
    return {
        "loss": round(loss, 4),
        "perplexity": round(math.exp(loss), 3),
        "next_token_acc": round(total_correct / total, 4),
        "tokens": total,
    }


def save_target(model, out_dir: Path, hf_tok, bf16: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu")
    if bf16:
        model = model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir))
    save_tokenizer(hf_tok, out_dir)
    dtype = "bfloat16" if bf16 else "float32"
    patch_config(out_dir, dtype=dtype, torch_dtype=dtype)


def target_summary(model) -> dict[str, Any]:
    cfg = model.config
    return {
        "architecture": type(model).__name__,
        "model_type": cfg.model_type,
        "num_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "params": n_params(model),
    }


# --------------------------------------------------------------------------------------
# Draft vocabulary
# --------------------------------------------------------------------------------------


def build_vocab_mapping(stream: torch.Tensor, vocab_size: int, draft_vocab_size: int):
    """Most frequent ``draft_vocab_size`` target tokens (ties -> lower id), ascending.

    ``d2t[i] + i`` is the target id of draft id ``i`` and ``t2d`` marks the kept target
    ids -- the same layout as speculators' ``build_vocab_mappings_from_distribution``.
    """
    counts = torch.bincount(stream.long(), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))
    selected = torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
    d2t = selected - torch.arange(draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[selected] = True
    coverage = counts[selected].sum().item() / max(1, counts.sum().item())
    return t2d, d2t, coverage


# --------------------------------------------------------------------------------------
# Drafters (speculators)
# --------------------------------------------------------------------------------------


def make_layer_config(
    target_dir: Path, num_layers: int, draft_arch: str, full_attention: bool = False
):
    """speculators' own draft decoder config builder (train/cli.py).

    ``speculators.train.cli`` imports the whole trainer stack; if a dependency of it is
    missing we fall back to an equivalent config built here (recorded in the manifest).
    """
    try:
        from speculators.train.cli import create_transformer_layer_config
    except ImportError as err:  # pragma: no cover - depends on the installed extras
        log(f"speculators.train.cli unavailable ({err}); using the local fallback")
        return _layer_config_fallback(target_dir, num_layers, draft_arch), f"fallback ({err})"
    cfg = create_transformer_layer_config(
        str(target_dir),
        num_layers,
        draft_arch=draft_arch,
        hidden_act=None,
        sliding_window=2048,
        full_attention_indices=list(range(num_layers)) if full_attention else [],
    )
    return cfg, "speculators.train.cli.create_transformer_layer_config"


def _layer_config_fallback(target_dir: Path, num_layers: int, draft_arch: str):
    from copy import deepcopy

    from transformers import AutoConfig, LlamaConfig, Qwen3Config

    ver = AutoConfig.from_pretrained(str(target_dir))
    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[draft_arch]
    inter = getattr(ver, "intermediate_size", None) or 3 * ver.hidden_size
    cfg = cls(
        vocab_size=ver.vocab_size,
        hidden_size=ver.hidden_size,
        intermediate_size=inter,
        num_hidden_layers=num_layers,
        num_attention_heads=ver.num_attention_heads,
        num_key_value_heads=ver.num_key_value_heads,
        hidden_act=ver.hidden_act,
        max_position_embeddings=ver.max_position_embeddings,
        initializer_range=ver.initializer_range,
        rms_norm_eps=ver.rms_norm_eps,
        head_dim=getattr(ver, "head_dim", None),
        tie_word_embeddings=False,
        sliding_window=2048,
        use_sliding_window=True,
        layer_types=["sliding_attention"] * num_layers,
    )
    rope = deepcopy(getattr(ver, "rope_parameters", None))
    if isinstance(rope, dict):
        rope.pop("partial_rotary_factor", None)
        cfg.rope_parameters = rope
    return cfg


def build_drafter(
    target_dir: Path,
    *,
    num_layers: int,
    draft_arch: str,
    aux_ids: list[int],
    t2d: torch.Tensor | None,
    d2t: torch.Tensor | None,
    attn_impl: str,
    seed: int,
    norm_before_residual: bool = True,
    full_attention: bool = False,
    num_spec_tokens: int = NUM_SPEC_TOKENS,
):
    """speculators' Eagle3DraftModel as its trainer builds it (t2d/d2t None: full vocab)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.models.utils import resolve_target_layer_ids
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    # Raises for duplicate / out-of-range explicit ids, exactly like the trainer.
    aux_ids = resolve_target_layer_ids(list(aux_ids), str(target_dir))
    layer_cfg, source = make_layer_config(target_dir, num_layers, draft_arch, full_attention)
    layer_cfg._attn_implementation = attn_impl
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_cfg,
        draft_vocab_size=int(d2t.numel()) if d2t is not None else layer_cfg.vocab_size,
        norm_before_residual=norm_before_residual,
        norm_before_fc=True,
        fc_norm=False,
        norm_output=True,
        embed_requires_grad=False,
        eagle_aux_hidden_state_layer_ids=list(aux_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=num_spec_tokens)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(target_dir)),
        ),
    )
    seed_all(seed)
    model = Eagle3DraftModel(config)
    if t2d is not None:
        model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()
    return model, source


def drafter_batch(target, x: torch.Tensor, aux_ids: list[int], device: str):
    """Target features for a [B, L] token batch, aligned like speculators ``shift_batch``.

    Per sequence: input_ids[1:], hidden_states[:-1], verifier_last_hidden_states[1:],
    position_ids[1:] (so positions start at 1); sequences are packed into one row with
    ``document_ids`` = sequence index.
    """
    with torch.no_grad(), autocast_ctx(device):
        _, hidden = ref.collect_hidden_states(target, x, logits_to_keep=1)
    feat_dtype = torch.bfloat16 if amp_enabled(device) else torch.float32
    aux = torch.cat([hidden[k] for k in aux_ids], dim=-1).to(feat_dtype)
    last = hidden[-1].to(feat_dtype)  # pre-norm output of the last decoder layer
    b, seq = x.shape
    positions = torch.arange(seq, device=x.device).expand(b, seq)
    docs = torch.arange(b, device=x.device)[:, None].expand(b, seq - 1)
    return {
        "input_ids": x[:, 1:].reshape(1, -1),
        "hidden_states": aux[:, :-1].reshape(1, b * (seq - 1), -1),
        "verifier_last_hidden_states": last[:, 1:].reshape(1, b * (seq - 1), -1),
        "position_ids": positions[:, 1:].reshape(1, -1),
        "document_ids": docs.reshape(1, -1),
        "loss_mask": torch.ones(1, b * (seq - 1), dtype=torch.bool, device=x.device),
    }


def _step_metrics(metrics: dict[str, torch.Tensor], ttt_steps: int) -> dict[str, list]:
    """Per-TTT-step loss / accuracies from speculators' ``compute_metrics`` output."""

    def ratio(prefix, k):
        tot = float(metrics[f"{prefix}_{k}_total"])
        return round(float(metrics[f"{prefix}_{k}_sum"]) / tot, 4) if tot else None

    return {
        "loss_per_step": [round(float(metrics[f"loss_{k}_sum"]), 4) for k in range(ttt_steps)],
        "full_acc_per_step": [ratio("full_acc", k) for k in range(ttt_steps)],
        "cond_acc_per_step": [ratio("cond_acc", k) for k in range(ttt_steps)],
    }


def _compile_stance(compile_drafter: bool):
    if compile_drafter or not hasattr(torch.compiler, "set_stance"):
        return contextlib.nullcontext()
    # speculators wraps Eagle3DraftModel.forward in torch.compile whenever CUDA is
    # available; compiling costs far more than it saves for these tiny drafters.
    return torch.compiler.set_stance("force_eager")


def train_drafter(
    drafter,
    target,
    stream: torch.Tensor,
    heldout: torch.Tensor,
    *,
    steps: int,
    chunks: int,
    seq_len: int,
    lr: float,
    device: str,
    seed: int,
    loss_impl: str,
    compile_drafter: bool,
    time_cap: float | None,
    ttt_steps: int = NUM_SPEC_TOKENS,
    sample_fn=None,
):
    """speculators' forward + loss; batches of raw text, or of ``sample_fn(gen)`` [B, L]."""
    from speculators.losses import resolve_loss_config

    aux_ids = list(drafter.config.eagle_aux_hidden_state_layer_ids)
    drafter.to(device).train()
    target.to(device).eval()
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    loss_config = resolve_loss_config(LOSS_NAME, loss_impl)
    used_impl = loss_impl
    history = []
    log_every = max(1, steps // 20)
    start = time.perf_counter()
    stopped_early = False
    step = -1

    def fwd(batch, cfg):
        with autocast_ctx(device), _compile_stance(compile_drafter):
            return drafter(
                **batch, ttt_steps=ttt_steps, ttt_step_loss_decay=1.0, loss_config=cfg
            )

    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        if sample_fn is not None:
            tokens = sample_fn(gen)
        else:
            tokens = sample_batch(stream, chunks, seq_len, gen, device)
        batch = drafter_batch(target, tokens, aux_ids, device)
        opt.zero_grad(set_to_none=True)
        try:
            _, loss, metrics = fwd(batch, loss_config)
            loss.backward()
        except Exception as err:  # noqa: BLE001 - fused Triton loss may be unavailable
            if step != 0 or used_impl != "fused":
                raise
            log(f"fused loss failed ({type(err).__name__}: {err}); falling back to eager")
            used_impl = "eager (fused failed: " + type(err).__name__ + ")"
            loss_config = resolve_loss_config(LOSS_NAME, "eager")
            opt.zero_grad(set_to_none=True)
            _, loss, metrics = fwd(batch, loss_config)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            entry = {
                "step": step,
                "loss": round(loss.item(), 4),
                "t": round(time.perf_counter() - start, 2),
            }
            entry.update(_step_metrics(metrics, ttt_steps))
            history.append(entry)
        if time_cap is not None and time.perf_counter() - start > time_cap:
            stopped_early = step < steps - 1
            entry = {
                "step": step,
                "loss": round(loss.item(), 4),
                "t": round(time.perf_counter() - start, 2),
            }
            entry.update(_step_metrics(metrics, ttt_steps))
            history.append(entry)
            break
    drafter.eval()
    result: dict[str, Any] = {
        "steps_planned": steps,
        "steps_done": step + 1,
        "chunks_per_step": chunks,
        "seq_len": seq_len,
        "lr": lr,
        "ttt_steps": ttt_steps,
        "ttt_step_loss_decay": 1.0,
        "loss_fn": LOSS_NAME,
        "loss_implementation": used_impl,
        "optimizer": "AdamW(betas=(0.9,0.95), wd=0.01), warmup+cosine, clip 1.0",
        "stopped_by_time_cap": stopped_early,
        "history": history,
        "wall_s": round(time.perf_counter() - start, 2),
    }
    if history:
        result["first_loss"], result["last_loss"] = history[0]["loss"], history[-1]["loss"]
    result["heldout"] = eval_drafter(
        drafter, target, heldout, device, loss_config, compile_drafter, ttt_steps
    )
    # 1 + sum_k P(steps 0..k all correct) under teacher forcing: an offline tau estimate.
    result["heldout"]["tau_estimate"] = round(1.0 + sum(result["heldout"]["full_acc_per_step"]), 4)
    return result


@torch.no_grad()
def eval_drafter(
    drafter,
    target,
    chunks: torch.Tensor,
    device: str,
    loss_config,
    compile_drafter: bool,
    ttt_steps: int = NUM_SPEC_TOKENS,
) -> dict[str, Any]:
    aux_ids = list(drafter.config.eagle_aux_hidden_state_layer_ids)
    drafter.to(device).eval()
    sums: dict[str, list[float]] = {}
    n = 0
    for i in range(0, len(chunks), 4):
        batch = drafter_batch(target, chunks[i : i + 4].to(device), aux_ids, device)
        with autocast_ctx(device), _compile_stance(compile_drafter):
            _, loss, metrics = drafter(
                **batch, ttt_steps=ttt_steps, ttt_step_loss_decay=1.0, loss_config=loss_config
            )
        m = _step_metrics(metrics, ttt_steps)
        m["loss"] = [float(loss)]
        for key, vals in m.items():
            vals = [v if v is not None else 0.0 for v in vals]
            prev = sums.get(key)
            sums[key] = vals if prev is None else [a + b for a, b in zip(prev, vals, strict=True)]
        n += 1
    out: dict[str, Any] = {k: [round(v / max(n, 1), 4) for v in vals] for k, vals in sums.items()}
    out["loss"] = out["loss"][0] if out.get("loss") else None
    out["chunks"] = int(len(chunks))
    return out


def save_drafter(drafter, out_dir: Path, bf16: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    drafter = drafter.to("cpu")
    if bf16:
        drafter = drafter.to(torch.bfloat16)
    drafter.save_pretrained(str(out_dir))


def drafter_summary(drafter, target_name: str, source: str) -> dict[str, Any]:
    cfg = drafter.config
    tl = cfg.transformer_layer_config
    return {
        "format": "speculators",
        "target": target_name,
        "num_layers": tl.num_hidden_layers,
        "draft_arch": tl.model_type,
        "aux_layer_ids": list(cfg.eagle_aux_hidden_state_layer_ids),
        "aux_ids_convention": "speculators/vLLM: id k = hidden state entering decoder "
        "layer k = transformers output_hidden_states[k]",
        "hf_hidden_states_indices": list(cfg.eagle_aux_hidden_state_layer_ids),
        # SGLang's capture at layer c records the residual stream entering layer c, so a
        # correct SGLang run must end up with layers_to_capture == these ids.
        "sglang_layers_to_capture_needed": list(cfg.eagle_aux_hidden_state_layer_ids),
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "norm_output": cfg.norm_output,
        "sliding_window": getattr(tl, "sliding_window", None),
        "layer_types": list(getattr(tl, "layer_types", []) or []),
        "transformer_layer_config_source": source,
        "params": n_params(drafter),
        "trainable_params": sum(
            p.numel()
            for n, p in drafter.named_parameters()
            if not n.startswith(("embed_tokens", "lm_head", "verifier_"))
        ),
    }


# --------------------------------------------------------------------------------------
# Plain SGLang-format EAGLE-3 drafter (for the 4-layer aux-id collapse repro)
# --------------------------------------------------------------------------------------


def write_sglang_eagle3_drafter(
    out_dir: Path, target, t2d: torch.Tensor, d2t: torch.Tensor, bf16: bool, seed: int
) -> dict[str, Any]:
    from safetensors.torch import save_file

    cfg = target.config
    h, inter = cfg.hidden_size, cfg.intermediate_size
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    dtype = torch.bfloat16 if bf16 else torch.float32
    lm_head = target.lm_head.weight.detach().float().cpu()[t2d]
    tensors = {
        "fc.weight": rnd(h, 3 * h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rnd(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": rnd(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": rnd(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": rnd(inter, h),
        "midlayer.mlp.up_proj.weight": rnd(inter, h),
        "midlayer.mlp.down_proj.weight": rnd(h, inter),
        "norm.weight": torch.ones(h),
        "lm_head.weight": lm_head,
    }
    tensors = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    tensors["d2t"] = d2t.clone().contiguous()
    tensors["t2d"] = t2d.clone().contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    dtype_name = "bfloat16" if bf16 else "float32"
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": 10000.0,
        "initializer_range": 0.02,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": int(d2t.numel()),
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": dtype_name,
        "use_cache": True,
    }
    write_json(out_dir / "config.json", config)
    n = cfg.num_hidden_layers
    return {
        "format": "sglang-eagle3 (midlayer.*, no eagle_config)",
        "target": "llama4layer-target",
        "hidden_size": h,
        "fc_weight_shape": [h, 3 * h],
        "weights": "random (seeded) except lm_head = target lm_head rows kept by t2d",
        "sglang_default_aux_layers": [2, n // 2, n - 3],
        "expected_stock_sglang_error": (
            f"mat1 and mat2 shapes cannot be multiplied (Nx{2 * h} and {3 * h}x{h})"
        ),
    }


# --------------------------------------------------------------------------------------
# Reference tau
# --------------------------------------------------------------------------------------


def run_reference(
    out: Path,
    name: str,
    target_dir: Path,
    drafter_dir: Path,
    prompts: list[dict[str, Any]],
    n_prompts: int,
    args,
    scale: Scale,
    lossless: int,
) -> dict[str, Any]:
    device = args.device
    target = ref.load_target(target_dir, device=device, dtype=args.ref_dtype)
    drafter = ref.load_drafter(drafter_dir, device=device, dtype=args.ref_dtype)
    chosen = prompts[:n_prompts]
    summary = ref.evaluate_tau(
        target,
        drafter,
        [p["input_ids"] for p in chosen],
        num_steps=NUM_SPEC_TOKENS,
        max_new_tokens=args.max_new_tokens or scale.ref_max_new_tokens,
        lossless_check_prompts=lossless,
    )
    ref_dir = out / "reference"
    ref_dir.mkdir(exist_ok=True)
    with (ref_dir / f"{name}.jsonl").open("w") as fh:
        for prompt, res in zip(chosen, summary["per_prompt"], strict=True):
            fh.write(json.dumps(_clean_floats({"id": prompt["id"], **res})) + "\n")
    summary = {k: v for k, v in summary.items() if k != "per_prompt"}
    summary.update(
        dtype=str(args.ref_dtype), device=device, per_prompt_file=f"reference/{name}.jsonl"
    )
    log(
        f"reference {name}: tau={summary['tau']:.3f} over {summary['num_prompts']} prompts "
        f"({summary['wall_s']}s), lossless mismatches={summary['lossless_check']}"
    )
    return summary


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


class Manifest:
    def __init__(self, path: Path, base: dict[str, Any]):
        self.path = path
        self.data = base
        self.flush()

    def flush(self) -> None:
        write_json(self.path, _clean_floats(self.data))


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("transformers", "tokenizers", "speculators", "safetensors", "triton"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--scale", choices=tuple(SCALES), default="full")
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma list from {VARIANTS} (default: all)"
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace fixture subdirectories that already exist in --out",
    )
    p.add_argument("--skip-reference", action="store_true", help="skip the offline tau runs")
    p.add_argument("--ref-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument(
        "--ref-prompts",
        type=int,
        default=None,
        help="prompts for the llama-drafter reference run (default per scale)",
    )
    p.add_argument("--ref-prompts-other", type=int, default=None)
    p.add_argument(
        "--draft-attn-impl", choices=("sdpa", "eager", "simple_flex_attention"), default="sdpa"
    )
    p.add_argument(
        "--compile-drafter",
        action="store_true",
        help="let speculators torch.compile the drafter forward (CUDA only)",
    )
    p.add_argument("--loss-impl", choices=("auto", "fused", "eager"), default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 with --device cpu, where tiny "
        "matmuls are dominated by thread-pool overhead; torch default "
        "with --device cuda)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="cap every training stage at this many steps (smoke tests)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="plumbing check of any scale: 1 step, batch 2, 1 reference prompt",
    )
    p.add_argument(
        "--cpu-autocast",
        action="store_true",
        help="debug: run the bf16-autocast (CUDA) code path on CPU",
    )
    p.add_argument(
        "--time-cap-scale",
        type=float,
        default=1.0,
        help="multiply the per-stage wall-clock caps (0 disables caps)",
    )
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda requested but CUDA is not available")
    if args.draft_attn_impl == "simple_flex_attention" and args.device != "cuda":
        p.error("simple_flex_attention needs CUDA")
    return args


def main(argv=None) -> int:  # noqa: C901 - a linear sequence of stages
    args = parse_args(argv)
    scale = SCALES[args.scale]
    _AMP["cpu"] = args.cpu_autocast

    if args.smoke:
        args.max_steps = 1
        args.ref_prompts = args.ref_prompts or 1
        args.ref_prompts_other = args.ref_prompts_other or 1
        args.max_new_tokens = args.max_new_tokens or 6
        scale = dataclasses.replace(
            scale,
            heldout_eval_chunks=2,
            ref_lossless_prompts=1,
            llama_train={**scale.llama_train, "batch": 2},
            qwen3_train={**scale.qwen3_train, "batch": 2},
            llama4_train={**scale.llama4_train, "batch": 2},
            drafter_train={k: {**v, "chunks": 1} for k, v in scale.drafter_train.items()},
        )

    def steps_for(n: int) -> int:
        return n if args.max_steps is None else max(1, min(n, args.max_steps))

    device = args.device
    bf16 = scale.name == "full"
    loss_impl = (
        args.loss_impl if args.loss_impl != "auto" else ("fused" if device == "cuda" else "eager")
    )
    variants = set(args.variants)
    need_llama = bool(variants & {"llama", "llama3layer", "random"})
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    owned = [
        "tokenizer",
        "vocab",
        "reference",
        "llama-target",
        "llama-drafter",
        "llama-drafter-3layer",
        "random-drafter",
        "qwen3-target",
        "qwen3-drafter",
        "dsv3-target",
        "dsv3-drafter",
        "llama4layer-target",
        "llama4layer-sglang-drafter",
    ]
    existing = [d for d in owned if (out / d).exists()]
    if existing and not args.overwrite:
        raise SystemExit(f"{out} already has {existing}; pass --overwrite to replace them")
    for d in existing:
        shutil.rmtree(out / d)

    def cap(name: str) -> float | None:
        c = scale.time_caps.get(name)
        return None if c is None or args.time_cap_scale <= 0 else c * args.time_cap_scale

    t_start = time.perf_counter()
    threads = args.threads or (1 if device == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    torch.set_float32_matmul_precision("high")  # TF32 for fp32 parts of training
    manifest = Manifest(
        out / "fixtures.json",
        {
            "schema_version": 1,
            "created_unix": int(time.time()),
            "scale": scale.name,
            "device": device,
            "device_name": torch.cuda.get_device_name(0)
            if device == "cuda"
            else (platform.processor() or platform.machine()),
            "seed": args.seed,
            "seeds": {
                "stage_offsets": {
                    "data": 0,
                    "llama-target": 1,
                    "qwen3-target": 2,
                    "dsv3-target": 3,
                    "llama4layer-target": 4,
                    "llama-drafter": 11,
                    "llama-drafter-3layer": 12,
                    "random-drafter": 13,
                    "qwen3-drafter": 14,
                    "dsv3-drafter": 15,
                    "llama4layer-sglang-drafter": 16,
                },
                "rule": "each stage calls seed_all(seed + offset) and uses "
                "torch.Generator(seed + offset) for batch sampling",
            },
            "versions": versions(),
            "variants": sorted(variants),
            "determinism": (
                "seeded everywhere; CPU builds are bitwise reproducible for a given torch "
                "build; CUDA training is seeded but torch.use_deterministic_algorithms is not "
                "enabled, so bf16 CUDA results can differ in the last bits between runs"
            ),
            "conventions": {
                "aux_layer_ids": "speculators/vLLM: id k = residual stream entering decoder "
                "layer k = transformers output_hidden_states[k] "
                "(0 = embeddings, num_layers = last layer output, pre-norm)",
                "verifier_last_hidden_states": "pre-norm output of the last decoder layer "
                "(input of model.norm); transformers 5 "
                "output_hidden_states[-1] is post-norm",
                "drafter_alignment": "speculators shift_batch: input_ids[1:], "
                "hidden_states[:-1], verifier_last_hidden_states[1:], "
                "position_ids[1:] (start at 1)",
                "reference_positions": "drafter pair (x_{i+1}, g_i) at RoPE position i "
                "(SGLang); relative RoPE makes offset 1 equivalent",
            },
            "config": {
                "num_speculative_tokens": NUM_SPEC_TOKENS,
                "draft_attn_impl": args.draft_attn_impl,
                "compile_drafter": args.compile_drafter,
                "loss_fn": LOSS_NAME,
                "loss_implementation": loss_impl,
                "train_dtype": "bf16 autocast, fp32 master" if amp_enabled(device) else "fp32",
                "saved_dtype": "bfloat16" if bf16 else "float32",
                "ref_dtype": args.ref_dtype,
            },
            "stages": {},
            "targets": {},
            "drafters": {},
        },
    )

    def stage_done(name: str, t0: float) -> None:
        manifest.data["stages"][name] = {"wall_s": round(time.perf_counter() - t0, 2)}
        manifest.flush()

    # ---------------- data ----------------
    t0 = time.perf_counter()
    seed_all(args.seed)
    corpus = collect_sources()
    train_files = select_training_subset(corpus, scale.train_char_budget)
    train_chars = sum(len(t) for _, t in train_files)
    if train_chars < (2_000_000 if scale.name == "full" else 100_000):
        raise SystemExit(
            f"only {train_chars} characters of stdlib source found under "
            f"{corpus.root}; is this a Python without .py sources?"
        )
    log(
        f"stdlib {corpus.root}: {len(corpus.train)} train / {len(corpus.heldout)} held-out "
        f"files ({corpus.skipped} unreadable); using {len(train_files)} for training"
    )
    hf_tok = train_tokenizer([t for _, t in train_files], scale.vocab_size, out / "tokenizer")
    train_stream = encode_stream(hf_tok, [t for _, t in train_files])
    heldout_stream = encode_stream(hf_tok, [t for _, t in corpus.heldout])
    prompts = make_prompts(hf_tok, corpus.heldout, scale, args.seed)
    with (out / "prompts.jsonl").open("w") as fh:
        for pr in prompts:
            fh.write(json.dumps(pr) + "\n")
    write_json(
        out / "splits.json",
        {
            "rule": f"sha256('{SPLIT_SALT}:' + relpath)[:8] as int % 100 < {HELDOUT_PERCENT} "
            "-> held-out",
            "stdlib_root": corpus.root,
            "train_used": [r for r, _ in train_files],
            "train_all": [r for r, _ in corpus.train],
            "heldout": [r for r, _ in corpus.heldout],
        },
    )
    heldout_eval = heldout_chunks(heldout_stream, scale.seq_len, scale.heldout_eval_chunks)
    draft_vocab = scale.vocab_size // 2
    t2d, d2t, coverage = build_vocab_mapping(train_stream, scale.vocab_size, draft_vocab)
    (out / "vocab").mkdir(exist_ok=True)
    torch.save(t2d, out / "vocab" / "t2d.pt")
    torch.save(d2t, out / "vocab" / "d2t.pt")
    manifest.data["data"] = {
        "stdlib_root": corpus.root,
        "python_version": platform.python_version(),
        "train_files": len(corpus.train),
        "train_files_used": len(train_files),
        "heldout_files": len(corpus.heldout),
        "unreadable_files": corpus.skipped,
        "split_rule": f"sha256('{SPLIT_SALT}:'+relpath) % 100 < {HELDOUT_PERCENT} -> held-out",
        "train_tokens": int(train_stream.numel()),
        "heldout_tokens": int(heldout_stream.numel()),
        "tokenizer": {
            "type": "byte-level BPE (tokenizers)",
            "vocab_size": scale.vocab_size,
            "special_tokens": dict(zip(SPECIAL_TOKENS, range(3), strict=True)),
            "sha256": sha256_file(out / "tokenizer" / "tokenizer.json"),
        },
        "seq_len": scale.seq_len,
    }
    manifest.data["prompts"] = {
        "path": "prompts.jsonl",
        "count": len(prompts),
        "min_len": min(len(p["input_ids"]) for p in prompts),
        "max_len": max(len(p["input_ids"]) for p in prompts),
        "source_files": len({p["source"] for p in prompts}),
    }
    manifest.data["vocab_mapping"] = {
        "draft_vocab_size": draft_vocab,
        "t2d_sum": int(t2d.sum()),
        "train_token_coverage": round(coverage, 4),
        "rule": "top draft_vocab_size training-token frequencies (ties -> lower id), "
        "ascending; d2t[i] + i = target id",
    }
    stage_done("data", t0)
    log(f"data: {train_stream.numel()} train tokens, {len(prompts)} prompts")

    targets: dict[str, Any] = {}

    def make_target(
        name: str, builder, cfg: dict[str, Any], train_cfg: dict[str, Any] | None, offset: int
    ):
        t0 = time.perf_counter()
        seed_all(args.seed + offset)
        model = builder(cfg, scale.vocab_size)
        info = target_summary(model)
        if train_cfg is not None:
            info["train"] = train_causal_lm(
                model,
                train_stream,
                steps=steps_for(train_cfg["steps"]),
                batch=train_cfg["batch"],
                seq_len=scale.seq_len,
                lr=train_cfg["lr"],
                device=device,
                seed=args.seed + offset,
                time_cap=cap(name),
            )
        else:
            model.to(device).eval()
            info["train"] = None
            info["weights"] = "random (seeded), untrained"
        info["heldout"] = eval_causal_lm(model, heldout_eval, device)
        save_target(model, out / name, hf_tok, bf16)
        if model.config.model_type == "deepseek_v3":
            # Router fields that the original DeepSeek-V3 config.json carries and SGLang's
            # deepseek_v2 reads unconditionally; they describe what transformers'
            # DeepseekV3 MoE computes (sigmoid scores + e_score_correction_bias group top-k).
            patch_config(
                out / name,
                topk_method="noaux_tc",
                scoring_func="sigmoid",
                moe_layer_freq=1,
                ep_size=1,
            )
        info["dir"] = name
        info["dtype"] = "bfloat16" if bf16 else "float32"
        manifest.data["targets"][name] = info
        stage_done(name, t0)
        log(f"{name}: held-out {info['heldout']}")
        model.to(device).float().eval()  # fp32 copy for feature extraction
        targets[name] = model
        return model

    def make_drafter(
        name: str,
        target_name: str,
        num_layers: int,
        arch: str,
        aux_ids: list[int],
        train: bool,
        offset: int,
    ):
        t0 = time.perf_counter()
        drafter, source = build_drafter(
            out / target_name,
            num_layers=num_layers,
            draft_arch=arch,
            aux_ids=aux_ids,
            t2d=t2d,
            d2t=d2t,
            attn_impl=args.draft_attn_impl,
            seed=args.seed + offset,
        )
        info = drafter_summary(drafter, target_name, source)
        if train:
            tc = scale.drafter_train[name]
            info["train"] = train_drafter(
                drafter,
                targets[target_name],
                train_stream,
                heldout_eval,
                steps=steps_for(tc["steps"]),
                chunks=tc["chunks"],
                seq_len=scale.seq_len,
                lr=tc["lr"],
                device=device,
                seed=args.seed + offset,
                loss_impl=loss_impl,
                compile_drafter=args.compile_drafter,
                time_cap=cap(name),
            )
            log(
                f"{name}: train loss {info['train'].get('first_loss')} -> "
                f"{info['train'].get('last_loss')}, held-out {info['train']['heldout']}"
            )
        else:
            from speculators.losses import resolve_loss_config

            info["train"] = None
            info["weights"] = (
                "untrained: fc/layers/norms from HF init, embed_tokens and "
                "lm_head copied from the verifier (speculators default init)"
            )
            info["heldout"] = eval_drafter(
                drafter,
                targets[target_name],
                heldout_eval,
                device,
                resolve_loss_config(LOSS_NAME, "eager"),
                args.compile_drafter,
            )
        save_drafter(drafter, out / name, bf16)
        info["dir"] = name
        info["dtype"] = "bfloat16" if bf16 else "float32"
        manifest.data["drafters"][name] = info
        stage_done(name, t0)
        return info

    # ---------------- llama family ----------------
    llama_aux = AUX_IDS["llama-target"] if scale.llama["num_hidden_layers"] == 6 else [1, 2, 3]
    if need_llama:
        make_target("llama-target", build_llama, scale.llama, scale.llama_train, 1)
    if "llama" in variants:
        make_drafter("llama-drafter", "llama-target", 1, "llama", llama_aux, True, 11)
    if "llama3layer" in variants:
        make_drafter("llama-drafter-3layer", "llama-target", 3, "llama", llama_aux, True, 12)
    if "random" in variants:
        make_drafter("random-drafter", "llama-target", 1, "llama", llama_aux, False, 13)

    # ---------------- qwen3 ----------------
    if "qwen3" in variants:
        make_target("qwen3-target", build_qwen3, scale.qwen3, scale.qwen3_train, 2)
        make_drafter("qwen3-drafter", "qwen3-target", 1, "qwen3", AUX_IDS["qwen3-target"], True, 14)

    # ---------------- deepseek v3 ----------------
    if "dsv3" in variants:
        make_target("dsv3-target", build_dsv3, scale.dsv3, None, 3)
        make_drafter("dsv3-drafter", "dsv3-target", 1, "llama", AUX_IDS["dsv3-target"], True, 15)
        ids = AUX_IDS["dsv3-target"]
        manifest.data["drafters"]["dsv3-drafter"]["sglang_note"] = (
            "first aux id is 1: stock SGLang deepseek_v2.set_eagle3_layers_to_capture adds "
            f"+1 to every id only in that case, so passing {ids} verbatim captures "
            f"{[k + 1 for k in ids]} while passing {[k - 1 for k in ids]} captures "
            f"{[k - 1 for k in ids]}; neither equals the needed {ids}"
        )

    # ---------------- 4-layer llama + plain SGLang drafter ----------------
    if "sglang4layer" in variants:
        model = make_target("llama4layer-target", build_llama, scale.llama4, scale.llama4_train, 4)
        t0 = time.perf_counter()
        info = write_sglang_eagle3_drafter(
            out / "llama4layer-sglang-drafter", model, t2d, d2t, bf16, args.seed + 16
        )
        info["dir"] = "llama4layer-sglang-drafter"
        manifest.data["drafters"]["llama4layer-sglang-drafter"] = info
        stage_done("llama4layer-sglang-drafter", t0)

    # free training copies before the reference runs
    targets.clear()
    if device == "cuda":
        torch.cuda.empty_cache()

    # ---------------- offline reference tau ----------------
    if not args.skip_reference:
        torch.set_float32_matmul_precision("highest")
        t0 = time.perf_counter()
        n_main = args.ref_prompts or scale.ref_prompts_main
        n_other = args.ref_prompts_other or scale.ref_prompts_other
        plan = [
            ("llama-drafter", "llama-target", n_main, scale.ref_lossless_prompts),
            ("llama-drafter-3layer", "llama-target", n_other, 0),
            (
                "random-drafter",
                "llama-target",
                min(n_other, args.ref_prompts_other or scale.ref_prompts_random),
                0,
            ),
            ("qwen3-drafter", "qwen3-target", n_other, 0),
            ("dsv3-drafter", "dsv3-target", n_other, 0),
        ]
        for dname, tname, n, lossless in plan:
            if dname not in manifest.data["drafters"]:
                continue
            manifest.data["drafters"][dname]["reference"] = run_reference(
                out, dname, out / tname, out / dname, prompts, n, args, scale, lossless
            )
            manifest.flush()
        stage_done("reference", t0)

    manifest.data["total_wall_s"] = round(time.perf_counter() - t_start, 2)
    manifest.flush()
    log(f"done in {manifest.data['total_wall_s']}s -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
