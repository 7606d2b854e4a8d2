"""Fixture targets: small Llama / Qwen3 / DeepSeek-V3 (MLA+MoE) causal LMs built with
transformers, trained on the stdlib token stream, evaluated, saved.

Part of the fixture build (``scripts/make_fixtures.py`` is its CLI); import these names from here.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from fixtures_common import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    autocast_ctx,
    lr_at,
    n_params,
    patch_config,
)
from fixtures_data import sample_batch, save_tokenizer

from sglang_ext_tools import reference as ref

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
