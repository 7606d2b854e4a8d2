"""Fixture drafters: speculators EAGLE-3 drafters trained on a fixture target's hidden states
(speculators' own model and loss), and a plain SGLang-format EAGLE-3 drafter.

Part of the fixture build (``scripts/make_fixtures.py`` is its CLI); import these names from here.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch
from fixtures_common import (
    BOS_ID,
    EOS_ID,
    LOSS_NAME,
    NUM_SPEC_TOKENS,
    PAD_ID,
    amp_enabled,
    autocast_ctx,
    log,
    lr_at,
    n_params,
    seed_all,
    write_json,
)
from fixtures_data import sample_batch

from sglang_ext_tools import reference as ref

# --------------------------------------------------------------------------------------
# Drafters (speculators)
# --------------------------------------------------------------------------------------


def make_layer_config(
    target_dir: Path,
    num_layers: int,
    draft_arch: str,
    full_attention: bool = False,
    sliding_window: int = 2048,
):
    """speculators' own draft decoder config builder (train/cli.py).

    ``speculators.train.cli`` imports the whole trainer stack; if a dependency of it is
    missing we fall back to an equivalent config built here (recorded in the manifest).
    """
    try:
        from speculators.train.cli import create_transformer_layer_config
    except ImportError as err:  # pragma: no cover - depends on the installed extras
        log(f"speculators.train.cli unavailable ({err}); using the local fallback")
        cfg = _layer_config_fallback(target_dir, num_layers, draft_arch, sliding_window)
        return cfg, f"fallback ({err})"
    cfg = create_transformer_layer_config(
        str(target_dir),
        num_layers,
        draft_arch=draft_arch,
        hidden_act=None,
        sliding_window=sliding_window,
        full_attention_indices=list(range(num_layers)) if full_attention else [],
    )
    return cfg, "speculators.train.cli.create_transformer_layer_config"


def _layer_config_fallback(
    target_dir: Path, num_layers: int, draft_arch: str, sliding_window: int = 2048
):
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
        sliding_window=sliding_window,
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
    sliding_window: int = 2048,
):
    """speculators' Eagle3DraftModel as its trainer builds it (t2d/d2t None: full vocab)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.models.utils import resolve_target_layer_ids
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    # Raises for duplicate / out-of-range explicit ids, exactly like the trainer.
    aux_ids = resolve_target_layer_ids(list(aux_ids), str(target_dir))
    layer_cfg, source = make_layer_config(
        target_dir, num_layers, draft_arch, full_attention, sliding_window
    )
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


def _history_entry(step: int, loss, start: float, metrics, ttt_steps: int) -> dict[str, Any]:
    """One training-history row (built only when logged: ``loss.item()`` syncs the GPU)."""
    return {
        "step": step,
        "loss": round(loss.item(), 4),
        "t": round(time.perf_counter() - start, 2),
        **_step_metrics(metrics, ttt_steps),
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
            return drafter(**batch, ttt_steps=ttt_steps, ttt_step_loss_decay=1.0, loss_config=cfg)

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
            history.append(_history_entry(step, loss, start, metrics, ttt_steps))
        if time_cap is not None and time.perf_counter() - start > time_cap:
            stopped_early = step < steps - 1
            history.append(_history_entry(step, loss, start, metrics, ttt_steps))
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
