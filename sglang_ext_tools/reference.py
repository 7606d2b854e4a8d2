"""Offline reference for EAGLE-3 chain speculative decoding (greedy, topk=1).

This module is the ground truth that SGLang's measured acceptance length is compared
against. It is a small, deliberately naive plain-PyTorch loop:

* the **target** is a transformers ``*ForCausalLM`` run on the whole sequence every cycle
  (no KV cache: every forward is a full causal recompute, which is mathematically what a
  KV-cached server computes);
* the **drafter** is a speculators ``Eagle3DraftModel`` whose *modules* (``embed_tokens``,
  ``input_norm``/``fc_norm``, ``fc``, ``layers``, ``rotary_emb``, ``norm``, ``lm_head``,
  ``d2t``) are driven by our own chain loop -- NOT by speculators' teacher-forced training
  ``forward``. The drafter is also recomputed causally from scratch for every draft step.

Semantics (mirrors SGLang's EAGLE-3 worker with ``--speculative-eagle-topk 1``):

1. Prefill: the target runs on the prompt ``x_0..x_{n-1}``; its greedy next token ``t``
   is the first emitted token; aux features ``g_i`` (i < n) are the concatenation of
   ``hidden_states[k]`` for each aux id ``k``. Aux ids use the speculators / vLLM
   convention: id ``k`` is the hidden state *entering* decoder layer ``k``, i.e. HF
   ``output_hidden_states[k]`` (id ``num_layers`` = final decoder output *before* the
   final norm).
2. Draft: the drafter pair at sequence index ``i`` is ``(embed(x_{i+1}), fc(norm(g_i)))``
   -- tokens shifted left by one with the newest token appended. The argmax at the last
   pair gives ``d_1`` (draft-vocab id ``d`` maps to target id ``d + d2t[d]``). Each of the
   ``S - 1`` further steps appends the pair ``(embed(d_j), h_j)`` causally after the
   context, where ``h_j`` is the drafter's own output hidden state of the previous step
   (post-norm if ``norm_output`` else pre-norm); the fc is not re-applied.
3. Verify: the target runs on ``seq + [d_1..d_S]``; the longest prefix of drafts that
   matches the target's greedy predictions is accepted, followed by the target's bonus
   token. ``accepted + 1`` tokens are emitted per cycle; the last cycle is truncated at
   ``max_new_tokens`` (like SGLang, the prefill token counts towards ``max_new_tokens``).

RoPE positions: the drafter pair ``(x_{i+1}, g_i)`` is placed at position
``i + position_offset``. SGLang uses the position of ``g_i`` (offset 0, the default here);
speculators' training (``shift_batch``) uses the position of ``x_{i+1}`` (offset 1).
RoPE only sees relative positions, so both give the same attention up to float rounding;
the unit tests use offset 1 to compare bit-for-bit against speculators' ``forward``.

Numerics: ties between near-equal logits can flip greedy argmaxes between two correct
implementations in bf16 (different kernels, accumulation order). For the tiny fixture
targets fp32 is cheap, so fp32 is the default everywhere; bf16 is available for speed.

Import cost: only ``torch`` is imported at module import; transformers / speculators /
safetensors are imported lazily inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "ChainOutput",
    "SpecResult",
    "aux_hidden_states",
    "batched_hidden_states",
    "collect_hidden_states",
    "default_aux_layer_ids",
    "draft_chain",
    "draft_every_position",
    "drafter_aux_layer_ids",
    "drafter_fc",
    "drafter_to_target_ids",
    "evaluate_tau",
    "full_attention",
    "greedy_decode",
    "load_drafter",
    "load_target",
    "speculative_generate",
    "target_forward",
    "teacher_forced_acceptance",
    "teacher_forced_rows",
    "teacher_forced_rows_shared",
    "speculators_step_logits",
    "use_eager_experts",
]

# Keys of a speculators Eagle3DraftModel state dict that are never saved by its
# save_pretrained (see Eagle3DraftModel._keys_to_ignore_on_save); they are only used by
# the training loss, not for drafting.
_TRAINING_ONLY_KEYS = frozenset({"verifier_lm_head.weight", "verifier_norm.weight"})

Proposer = Callable[[list[int], torch.Tensor, int], list[int]]


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
    }[dtype]


def load_target(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
):
    """Load a transformers causal LM from a local directory (never from the Hub)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=_as_dtype(dtype),
        attn_implementation=attn_implementation,
        local_files_only=True,
    )
    return use_eager_experts(model).to(device).eval()


def use_eager_experts(model):
    """Run MoE experts with transformers' plain per-expert loop (any dtype / device).

    transformers 5 defaults MoE experts to ``grouped_mm``, whose availability depends on
    dtype, device and torch version; the fixtures' MoE targets are tiny, so the eager loop
    is both fast enough and the most portable choice. No-op for dense models.
    """
    cfg = _text_config(model.config)
    is_moe = any(
        getattr(cfg, k, None) for k in ("n_routed_experts", "num_experts", "num_local_experts")
    )
    if is_moe and hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except (ValueError, NotImplementedError):
            pass
    return model


def load_drafter(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
):
    """Build a speculators ``Eagle3DraftModel`` from a local speculators-format directory.

    The config is read from ``config.json`` and the model is constructed from it; the
    weights are then loaded from ``model.safetensors`` with a strict key check. This does
    not touch the verifier (``speculators_config.verifier.name_or_path``), so fixtures can
    be moved between machines, and it never goes through any Hub-loading code path.
    """
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    path = Path(path)
    config_dict = json.loads((path / "config.json").read_text())
    if config_dict.get("speculators_model_type") != "eagle3":
        raise ValueError(f"{path} is not a speculators eagle3 checkpoint")
    config = Eagle3SpeculatorConfig.from_dict(config_dict)
    config.transformer_layer_config._attn_implementation = attn_implementation
    model = Eagle3DraftModel(config)

    state: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    expected = set(model.state_dict().keys())
    missing = sorted(expected - set(state) - _TRAINING_ONLY_KEYS)
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"drafter checkpoint {path} does not match Eagle3DraftModel: "
            f"missing={missing} unexpected={unexpected}"
        )
    model.load_state_dict(state, strict=False)
    model = model.to(device=device, dtype=_as_dtype(dtype)).eval()
    for name in ("embed_tokens", "lm_head", "fc"):
        if torch.isnan(getattr(model, name).weight).any():
            raise ValueError(f"drafter {path}: {name}.weight contains NaN (never loaded)")
    return model


# --------------------------------------------------------------------------------------
# Target
# --------------------------------------------------------------------------------------


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """speculators' default aux ids (``resolve_target_layer_ids``): [2, L//2, L-3]."""
    return [2, num_layers // 2, num_layers - 3]


def drafter_aux_layer_ids(drafter, target=None) -> list[int]:
    ids = drafter.config.eagle_aux_hidden_state_layer_ids
    if ids:
        return list(ids)
    if target is None:
        raise ValueError("drafter has no eagle_aux_hidden_state_layer_ids; pass the target")
    return default_aux_layer_ids(_text_config(target.config).num_hidden_layers)


def _text_config(config):
    return getattr(config, "text_config", None) or config


def _final_norm(model) -> torch.nn.Module:
    base = getattr(model, "model", None)
    norm = getattr(base, "norm", None)
    if norm is None:
        raise ValueError(f"cannot find the final norm of {type(model).__name__}")
    return norm


def collect_hidden_states(model, input_ids: torch.Tensor, **forward_kwargs):
    """Run ``model`` and return ``(logits, hidden_states)``.

    ``hidden_states`` has ``num_layers + 1`` entries with the vLLM / speculators meaning:
    entry ``k`` is the residual stream entering decoder layer ``k`` (entry 0 = token
    embeddings) and entry ``num_layers`` is the output of the last decoder layer BEFORE
    the final norm. transformers (v5, ``capture_outputs(tie_last_hidden_states=True)``)
    replaces ``output_hidden_states[-1]`` with the post-norm ``last_hidden_state``; we undo
    that by capturing the input of the final norm with a forward pre-hook.
    """
    captured: list[torch.Tensor] = []
    handle = _final_norm(model).register_forward_pre_hook(
        lambda _module, args: captured.append(args[0])
    )
    try:
        out = model(
            input_ids=input_ids, output_hidden_states=True, use_cache=False, **forward_kwargs
        )
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"final norm ran {len(captured)} times, expected 1")
    hidden = list(out.hidden_states)
    num_layers = _text_config(model.config).num_hidden_layers
    if len(hidden) != num_layers + 1:
        raise RuntimeError(f"expected {num_layers + 1} hidden states, got {len(hidden)}")
    hidden[-1] = captured[0]
    return out.logits, hidden


@torch.no_grad()
def target_forward(
    target, ids: Sequence[int] | torch.Tensor, aux_layer_ids: Sequence[int], states=None
):
    """Full causal target forward. Returns ``(logits [N, V] fp32, aux [N, K*H])``.
    ``states``: :func:`collect_hidden_states`' result for these ids, computed already (one
    forward shared by several drafters on the same text, whatever their aux ids)."""
    if states is None:
        device = next(target.parameters()).device
        input_ids = torch.as_tensor(
            list(ids) if not torch.is_tensor(ids) else ids, dtype=torch.long, device=device
        ).reshape(1, -1)
        states = collect_hidden_states(target, input_ids)
    logits, hidden = states
    aux = torch.cat([hidden[k][0] for k in aux_layer_ids], dim=-1)
    return logits[0].float(), aux


@torch.no_grad()
def aux_hidden_states(
    target, ids: Sequence[int] | torch.Tensor, aux_layer_ids: Sequence[int]
) -> dict[int, torch.Tensor]:
    """The target's hidden states at speculators aux ids for one prompt: ``{k: [N, H]}``.

    ``k`` is the residual stream entering decoder layer ``k`` (``k = num_layers``: the last
    layer's output before the final norm), in the model's dtype -- what an SGLang target
    captures for the drafter at that id (``layers_to_capture`` = the same boundaries). E.g.
    ``aux_hidden_states(load_target(dir, "cuda", "bfloat16"), prompt_ids, [1, 30, 50])`` to
    set against SGLang's captured aux states on the same prompt (the suite's target-feature
    check).
    """
    device = next(target.parameters()).device
    input_ids = torch.as_tensor(
        list(ids) if not torch.is_tensor(ids) else ids, dtype=torch.long, device=device
    ).reshape(1, -1)
    _, hidden = collect_hidden_states(target, input_ids)
    return {int(k): hidden[k][0] for k in aux_layer_ids}


# --------------------------------------------------------------------------------------
# Drafter (built from speculators' modules, our own chain semantics)
# --------------------------------------------------------------------------------------


@torch.no_grad()
def speculators_step_logits(
    drafter, hidden_states, input_ids, document_ids, ttt_steps: int, position_ids=None
) -> torch.Tensor:
    """speculators' own teacher-forced forward (``Eagle3DraftModel.forward``, its training
    path) and the lm_head output of each TTT step: ``[ttt_steps, N, draft vocab]`` fp32, for
    the first sequence of the batch. What this module's loop and the widened drafters are
    held against."""
    captured: list[torch.Tensor] = []
    hook = drafter.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
    try:
        drafter(
            hidden_states=hidden_states,
            input_ids=input_ids,
            document_ids=document_ids,
            position_ids=position_ids,
            ttt_steps=ttt_steps,
        )
    finally:
        hook.remove()
    return torch.stack(captured).float()


def drafter_fc(drafter, aux: torch.Tensor) -> torch.Tensor:
    """Project concatenated aux states ``[..., K*H]`` to the drafter width ``[..., H]``."""
    h = aux.to(drafter.fc.weight.dtype)
    if drafter.input_norm is not None:  # norm_before_fc
        h = drafter.input_norm(h)
    if drafter.fc_norm is not None:  # per-aux-chunk norm
        chunks = h.chunk(len(drafter.fc_norm), dim=-1)
        h = torch.cat([norm(c) for norm, c in zip(drafter.fc_norm, chunks, strict=True)], -1)
    return drafter.fc(h)


def drafter_to_target_ids(drafter, draft_ids: torch.Tensor) -> torch.Tensor:
    """Map draft-vocab ids to target ids: ``target = d + d2t[d]`` (identity without d2t)."""
    if drafter.d2t is None:
        return draft_ids
    return draft_ids + drafter.d2t[draft_ids]


def _layer_masks(drafter, seq_len: int, dtype: torch.dtype, device) -> list[torch.Tensor]:
    """Additive causal masks ``[1, 1, T, T]`` per drafter layer (sliding window per config)."""
    q = torch.arange(seq_len, device=device).unsqueeze(1)
    k = torch.arange(seq_len, device=device).unsqueeze(0)
    positions = torch.arange(seq_len, device=device)
    return _masks_from_visibility(drafter, k <= q, positions, dtype)


def _masks_from_visibility(
    drafter, visible: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> list[torch.Tensor]:
    """Additive masks ``[1, 1, T, T]`` per drafter layer from a boolean ``visible[q, k]``,
    narrowed on sliding-window layers by the tokens' RoPE ``positions``.

    Window semantics follow speculators' ``create_combined_mask_mod``: key ``k`` is visible
    from query ``q`` iff ``k <= q`` and ``k > q - sliding_window`` (positions, so a token
    appended after a context attends as it would at the end of that context).
    """
    cache: dict[bool, torch.Tensor] = {}
    masks = []
    for idx in range(len(drafter.layers)):
        sliding = idx in drafter.sliding_window_indices and drafter.sliding_window is not None
        if sliding not in cache:
            allowed = visible
            if sliding:
                allowed = visible & (
                    positions[None, :] > positions[:, None] - drafter.sliding_window
                )
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            mask.masked_fill_(~allowed, float("-inf"))
            cache[sliding] = mask[None, None]
        masks.append(cache[sliding])
    return masks


@contextlib.contextmanager
def full_attention(drafter) -> Iterator[None]:
    """Run ``drafter`` as if every layer were full attention (no sliding window).

    What a server that ignores the trained window computes; the fixtures record both taus.
    """
    saved = drafter.sliding_window_indices
    drafter.sliding_window_indices = []
    try:
        yield
    finally:
        drafter.sliding_window_indices = saved


def _drafter_backbone(
    drafter,
    token_ids: torch.Tensor,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pass of the drafter decoder stack over pairs ``(token_ids[i], hidden[i])``.

    Returns the pre-norm output ``[T, H]``. Layer 0 is speculators' Eagle3 first layer
    (cat(input_layernorm(embeds), hidden_norm(hidden)), residual = hidden or normalized
    hidden if ``norm_before_residual``); layers >= 1 are ordinary decoder layers.
    ``visible[q, k]`` (bool ``[T, T]``) says which pairs attend to which; default causal.
    """
    embeds = drafter.embed_tokens(token_ids)[None]
    x = torch.cat([embeds, hidden[None].to(embeds.dtype)], dim=-1)
    pos = positions[None]
    position_embeddings = drafter.rotary_emb(x, pos)
    if visible is None:
        masks = _layer_masks(drafter, x.shape[1], x.dtype, x.device)
    else:
        masks = _masks_from_visibility(drafter, visible, positions, x.dtype)
    for layer, mask in zip(drafter.layers, masks, strict=True):
        out = layer(
            x, attention_mask=mask, position_ids=pos, position_embeddings=position_embeddings
        )
        x = out[0] if isinstance(out, tuple) else out
    return x[0]


def _drafter_head(drafter, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(logits over the draft vocab, hidden fed to the next step)``."""
    normed = drafter.norm(x)
    logits = drafter.lm_head(normed)
    feed = normed if drafter.config.norm_output else x
    return logits, feed


@dataclass
class ChainOutput:
    target_ids: list[int]  # S proposed tokens, target vocab
    draft_ids: list[int]  # S proposed tokens, draft vocab
    logits: list[torch.Tensor]  # S tensors [draft_vocab] (fp32), last-position logits


@torch.no_grad()
def draft_chain(
    drafter,
    seq_ids: Sequence[int],
    aux: torch.Tensor,
    num_steps: int,
    position_offset: int = 0,
    forced_tokens: Sequence[int] | None = None,
) -> ChainOutput:
    """Propose ``num_steps`` tokens after ``seq_ids`` with a topk=1 chain.

    ``seq_ids`` = ``x_0..x_N`` (the newest token ``x_N`` has no aux state yet) and ``aux``
    = ``[N, K*H]`` aux states of ``x_0..x_{N-1}``. ``forced_tokens`` (target ids) replaces
    the drafter's own proposals as the *inputs* of steps 2..S (teacher forcing; used by the
    tests to compare with speculators' training forward).
    """
    n_ctx = len(seq_ids) - 1
    if aux.shape[0] != n_ctx:
        raise ValueError(f"aux has {aux.shape[0]} rows, expected len(seq_ids)-1={n_ctx}")
    device = drafter.fc.weight.device
    tokens = torch.as_tensor(list(seq_ids[1:]), dtype=torch.long, device=device)
    hidden = drafter_fc(drafter, aux.to(device))
    positions = torch.arange(n_ctx, device=device) + position_offset

    out = ChainOutput(target_ids=[], draft_ids=[], logits=[])
    for step in range(num_steps):
        x = _drafter_backbone(drafter, tokens, hidden, positions)
        logits, feed = _drafter_head(drafter, x[-1])
        draft_id = int(torch.argmax(logits).item())
        target_id = int(drafter_to_target_ids(drafter, torch.tensor(draft_id, device=device)))
        out.draft_ids.append(draft_id)
        out.target_ids.append(target_id)
        out.logits.append(logits.float())
        if step + 1 == num_steps:
            break
        next_token = target_id if forced_tokens is None else int(forced_tokens[step])
        tokens = torch.cat([tokens, torch.tensor([next_token], device=device)])
        hidden = torch.cat([hidden, feed[None].to(hidden.dtype)])
        positions = torch.cat([positions, positions[-1:] + 1])
    return out


@torch.no_grad()
def draft_every_position(
    drafter,
    seq_ids: Sequence[int],
    aux: torch.Tensor,
    num_steps: int,
    position_offset: int = 0,
) -> list[list[int]]:
    """:func:`draft_chain`'s proposals for every cycle start of one sequence, at once.

    Row ``b`` is ``draft_chain(drafter, seq_ids[: b + 2], aux[: b + 1], num_steps)``'s
    ``target_ids`` (the cycle whose newest token is ``seq_ids[b + 1]``), for ``b`` in
    ``0 .. len(seq_ids) - 2``. Instead of one causal recompute per cycle and step, step
    ``s`` runs once over the ``N`` context pairs plus ``s - 1`` blocks of ``N`` appended
    pairs: the pair appended at step ``r`` for start ``b`` sits at position ``b + r``, sees
    the context pairs ``0..b``, the pairs appended for the same start before it and itself
    -- what a causal pass over ``context[: b + 1] + appended`` computes, so the proposals
    are the chain's (up to float summation order). Cost: ``num_steps`` drafter passes of at
    most ``num_steps * N`` tokens per sequence instead of ~``cycles * num_steps`` passes.
    """
    n_ctx = len(seq_ids) - 1
    if aux.shape[0] != n_ctx:
        raise ValueError(f"aux has {aux.shape[0]} rows, expected len(seq_ids)-1={n_ctx}")
    if n_ctx < 1:
        return []
    device = drafter.fc.weight.device
    base_tokens = torch.as_tensor(list(seq_ids[1:]), dtype=torch.long, device=device)
    base_hidden = drafter_fc(drafter, aux.to(device))
    base_pos = torch.arange(n_ctx, device=device) + position_offset
    idx = torch.arange(n_ctx, device=device)
    context_visible = idx[None, :] <= idx[:, None]  # [query b, key j]: j <= b
    same_start = torch.eye(n_ctx, dtype=torch.bool, device=device)
    # Blocks: the context, then one per appended step. Step s reads the top-left (s + 1)
    # blocks of the same matrix: block r sees the context up to its start and the blocks
    # 1..r appended for that start.
    size = num_steps * n_ctx
    visible = torch.zeros(size, size, dtype=torch.bool, device=device)
    for r in range(num_steps):
        rows = slice(r * n_ctx, (r + 1) * n_ctx)
        visible[rows, :n_ctx] = context_visible
        for r2 in range(1, r + 1):
            visible[rows, r2 * n_ctx : (r2 + 1) * n_ctx] = same_start
    tokens, hidden, positions = [base_tokens], [base_hidden], [base_pos]
    proposals: list[torch.Tensor] = []
    for step in range(num_steps):
        width = (step + 1) * n_ctx
        x = _drafter_backbone(
            drafter,
            torch.cat(tokens),
            torch.cat(hidden),
            torch.cat(positions),
            visible[:width, :width],
        )
        logits, feed = _drafter_head(drafter, x[step * n_ctx :])
        target_ids = drafter_to_target_ids(drafter, torch.argmax(logits, dim=-1))
        proposals.append(target_ids)
        tokens.append(target_ids)
        hidden.append(feed.to(base_hidden.dtype))
        positions.append(base_pos + step + 1)
    return torch.stack(proposals, dim=1).tolist()


# --------------------------------------------------------------------------------------
# Speculative decoding loop
# --------------------------------------------------------------------------------------


@dataclass
class SpecResult:
    prompt_len: int
    tokens: list[int]  # emitted tokens (prefill token first), truncated at max_new_tokens
    num_cycles: int  # verify forwards
    accepted_per_cycle: list[int]  # accepted drafts per cycle (before truncation)
    emitted_per_cycle: list[int]  # tokens actually emitted per cycle (after truncation)
    num_steps: int
    tau: float  # (sum accepted + cycles) / cycles
    sglang_accept_length: float  # completion_tokens / verify_ct (SGLang meta_info)
    accept_rate: float  # sum accepted / (cycles * S) (SGLang spec_accept_rate)
    per_position_acceptance: list[float] = field(default_factory=list)  # P(draft j accepted)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _summarize(prompt_len, tokens, accepted, emitted, num_steps) -> SpecResult:
    cycles = len(accepted)
    total_acc = sum(accepted)
    per_pos = [
        (sum(1 for a in accepted if a > j) / cycles) if cycles else float("nan")
        for j in range(num_steps)
    ]
    return SpecResult(
        prompt_len=prompt_len,
        tokens=list(tokens),
        num_cycles=cycles,
        accepted_per_cycle=list(accepted),
        emitted_per_cycle=list(emitted),
        num_steps=num_steps,
        tau=(total_acc + cycles) / cycles if cycles else float("nan"),
        sglang_accept_length=len(tokens) / cycles if cycles else float("nan"),
        accept_rate=total_acc / (cycles * num_steps) if cycles else float("nan"),
        per_position_acceptance=per_pos,
    )


@torch.no_grad()
def speculative_generate(
    target,
    drafter,
    prompt_ids: Sequence[int],
    num_steps: int = 3,
    max_new_tokens: int = 128,
    aux_layer_ids: Sequence[int] | None = None,
    eos_token_id: int | None = None,
    ignore_eos: bool = True,
    position_offset: int = 0,
    proposer: Proposer | None = None,
) -> SpecResult:
    """Greedy chain speculative decoding of one prompt (batch size 1).

    ``proposer(seq_ids, aux, S) -> S target ids`` replaces the drafter (tests use it to
    inject oracles with known acceptance); by default :func:`draft_chain` is used.
    """
    if num_steps < 1:
        raise ValueError("num_steps must be >= 1")
    if aux_layer_ids is None:
        aux_layer_ids = drafter_aux_layer_ids(drafter, target)
    seq = [int(t) for t in prompt_ids]
    prompt_len = len(seq)
    emitted: list[int] = []
    accepted: list[int] = []
    emitted_per_cycle: list[int] = []
    if max_new_tokens <= 0:
        return _summarize(prompt_len, emitted, accepted, emitted_per_cycle, num_steps)

    logits, aux = target_forward(target, seq, aux_layer_ids)
    first = int(torch.argmax(logits[-1]).item())
    seq.append(first)
    emitted.append(first)
    finished = (not ignore_eos) and eos_token_id is not None and first == eos_token_id

    while not finished and len(emitted) < max_new_tokens:
        if proposer is None:
            drafts = draft_chain(drafter, seq, aux, num_steps, position_offset).target_ids
        else:
            drafts = [int(t) for t in proposer(list(seq), aux, num_steps)]
        if len(drafts) != num_steps:
            raise ValueError(f"proposer returned {len(drafts)} drafts, expected {num_steps}")
        logits, aux_full = target_forward(target, seq + drafts, aux_layer_ids)
        preds = torch.argmax(logits[len(seq) - 1 :], dim=-1).tolist()  # S + 1 predictions
        n_acc = 0
        while n_acc < num_steps and drafts[n_acc] == preds[n_acc]:
            n_acc += 1
        new = drafts[:n_acc] + [preds[n_acc]]
        accepted.append(n_acc)
        new = new[: max_new_tokens - len(emitted)]
        if not ignore_eos and eos_token_id is not None and eos_token_id in new:
            new = new[: new.index(eos_token_id) + 1]
            finished = True
        emitted_per_cycle.append(len(new))
        emitted.extend(new)
        seq.extend(new)
        # aux of every position except the newest token is the verify pass' aux:
        # seq[:-1] is a prefix of the verified sequence.
        aux = aux_full[: len(seq) - 1]
    return _summarize(prompt_len, emitted, accepted, emitted_per_cycle, num_steps)


@torch.no_grad()
def teacher_forced_acceptance(
    target,
    drafter,
    prompt_ids: Sequence[int],
    continuation_ids: Sequence[int],
    num_steps: int = 3,
    aux_layer_ids: Sequence[int] | None = None,
    position_offset: int = 0,
    proposer: Proposer | None = None,
    judge_past_end: bool = True,
    states=None,
) -> dict[str, Any]:
    """The chain loop of :func:`speculative_generate`, teacher-forced on a given continuation
    (e.g. the tokens a server emitted), so served and reference acceptance are counted on the
    same text.

    One target forward over ``prompt + continuation`` gives the aux states at every position
    (causal: what a KV-cached server computes). ``continuation[0]`` is the prefill's token;
    from there, each cycle the drafter proposes ``num_steps`` tokens from the context so far
    (:func:`draft_chain`, or ``proposer``), ``accepted`` is the longest prefix of proposals
    equal to the continuation's next tokens, and the loop advances ``accepted + 1`` tokens,
    the last cycle cut at the continuation's end (``speculative_generate`` at
    ``max_new_tokens = len(continuation)``). Where a cycle's proposals reach past the end
    with every in-range one accepted, the rest are judged as ``speculative_generate`` judges
    them, by the target's greedy tokens after ``prompt + continuation + proposals`` (one
    verify forward, that cycle only; ``judge_past_end=False`` stops counting at the end
    instead). So on the target's own greedy output the result is speculative_generate's.

    Returns one row in the per-prompt reference format (``tokens``, ``accepted`` per cycle,
    ``cycles``, ``tau``; see tau_compare.reference_counts) plus ``emitted`` per cycle,
    ``accepted_per_position`` / ``proposed_per_position`` (acceptance.py's counts: a cycle
    that accepted ``a`` counts positions 1..a accepted, every position proposed),
    ``per_position`` (their ratio, positions 1..S: P(draft j accepted), cumulative, the
    definition of the served per-position logs), ``per_position_conditional`` (accepted at
    j / cycles that accepted j - 1; None where no cycle reached j), and
    ``target_disagreements``: continuation positions where the target's greedy token
    differs from the given one (0 for a lossless server up to near-ties).

    ``states``: the target's :func:`collect_hidden_states` over ``prompt + continuation``,
    when the caller has it (:func:`teacher_forced_rows_shared`); else computed here.
    """
    loop = _teacher_forced_loop(
        target, drafter, prompt_ids, continuation_ids, num_steps, aux_layer_ids,
        position_offset, proposer, states,
    )  # fmt: skip
    if judge_past_end and loop.pending is not None:
        verify, _ = target_forward(target, loop.pending.ids, loop.aux_layer_ids)
        loop.judge(torch.argmax(verify[loop.pending.start :], dim=-1).tolist())
    return loop.row()


@dataclass
class _PendingJudge:
    """A last cycle whose proposals reach past the continuation's end, every in-range one
    accepted: the target's greedy tokens after ``ids`` from index ``start`` on judge the
    rest (``drafts[left:]``)."""

    ids: list[int]  # prompt + continuation + drafts[left:]
    start: int  # len(prompt) + len(continuation) - 1: the first prediction past the end
    drafts: list[int]
    left: int


@dataclass
class _TeacherForcedLoop:
    """:func:`teacher_forced_acceptance`'s loop, before the past-end judgement (``pending``,
    which a caller may batch with others) and the row."""

    prompt: list[int]
    cont: list[int]
    num_steps: int
    aux_layer_ids: list[int]
    accepted: list[int]
    emitted: list[int]
    disagreements: int
    pending: _PendingJudge | None

    def judge(self, preds: Sequence[int]) -> None:
        """Count the past-end proposals the target's greedy ``preds`` (from the pending
        ``start``) agree with, as speculative_generate's verify does."""
        p = self.pending
        n_acc = self.accepted[-1]
        while n_acc < self.num_steps and p.drafts[n_acc] == preds[n_acc - p.left]:
            n_acc += 1
        self.accepted[-1] = n_acc
        self.pending = None

    def row(self) -> dict[str, Any]:
        accepted, num_steps = self.accepted, self.num_steps
        cycles = len(accepted)
        acc_pp = [sum(1 for a in accepted if a > j) for j in range(num_steps)]
        reached = [sum(1 for a in accepted if a >= j) for j in range(num_steps)]
        return {
            "prompt_len": len(self.prompt),
            "tokens": self.cont,
            "accepted": accepted,
            "cycles": cycles,
            "emitted": self.emitted,
            "num_steps": num_steps,
            "tau": (sum(accepted) + cycles) / cycles if cycles else None,
            "accepted_per_position": acc_pp,
            "proposed_per_position": [cycles] * num_steps,
            "per_position": [a / cycles for a in acc_pp] if cycles else [None] * num_steps,
            "per_position_conditional": [
                (a / r) if r else None for a, r in zip(acc_pp, reached, strict=True)
            ],
            "target_disagreements": self.disagreements,
        }


def _teacher_forced_loop(
    target,
    drafter,
    prompt_ids: Sequence[int],
    continuation_ids: Sequence[int],
    num_steps: int,
    aux_layer_ids: Sequence[int] | None,
    position_offset: int,
    proposer: Proposer | None,
    states,
) -> _TeacherForcedLoop:
    if num_steps < 1:
        raise ValueError("num_steps must be >= 1")
    if aux_layer_ids is None:
        aux_layer_ids = drafter_aux_layer_ids(drafter, target)
    prompt = [int(t) for t in prompt_ids]
    cont = [int(t) for t in continuation_ids]
    accepted: list[int] = []
    emitted_per_cycle: list[int] = []
    disagreements = 0
    pending = None
    if cont:
        logits, aux_all = target_forward(target, prompt + cont, aux_layer_ids, states)
        greedy = torch.argmax(logits[len(prompt) - 1 : -1], dim=-1).tolist()
        disagreements = sum(int(g != t) for g, t in zip(greedy, cont, strict=True))
    if cont and proposer is None:
        # Every cycle start's proposals in num_steps batched passes (draft_every_position).
        table = draft_every_position(
            drafter, prompt + cont, aux_all[: len(prompt) + len(cont) - 1], num_steps,
            position_offset,
        )  # fmt: skip
    done = 1  # continuation tokens emitted so far (the prefill's first)
    while 0 < done < len(cont):
        seq = prompt + cont[:done]
        left = len(cont) - done
        if proposer is None:
            drafts = table[len(seq) - 2]
        else:
            drafts = [int(t) for t in proposer(list(seq), aux_all[: len(seq) - 1], num_steps)]
            if len(drafts) != num_steps:
                raise ValueError(f"proposer returned {len(drafts)} drafts, expected {num_steps}")
        n_acc = 0
        while n_acc < min(len(drafts), left) and drafts[n_acc] == cont[done + n_acc]:
            n_acc += 1
        if n_acc == left < num_steps:  # the last cycle; the rest is judged by the target
            ids = prompt + cont + drafts[left:]
            pending = _PendingJudge(ids, len(prompt) + len(cont) - 1, drafts, left)
        accepted.append(n_acc)
        step = min(n_acc + 1, left)
        emitted_per_cycle.append(step)
        done += step
    return _TeacherForcedLoop(
        prompt, cont, num_steps, list(aux_layer_ids), accepted, emitted_per_cycle,
        disagreements, pending,
    )  # fmt: skip


def teacher_forced_rows(
    target,
    drafter,
    prompts: Sequence[Sequence[int] | dict],
    outputs: Sequence[dict],
    num_steps: int = 3,
    aux_layer_ids: Sequence[int] | None = None,
    position_offset: int = 0,
) -> list[dict[str, Any]]:
    """Teacher-forced reference rows for a batch of served outputs, one per prompt (the target
    run on several prompts at once: :func:`teacher_forced_rows_shared`).

    ``prompts[i]``: token ids, or a prompts.jsonl record (``input_ids``, optional ``id``);
    ``outputs[i]``: its SGLang ``/generate`` result (``output_ids``; ``meta_info`` is read
    only for ``spec_verify_ct``, copied as ``served_cycles``). Rows are
    :func:`teacher_forced_acceptance`'s, with ``id`` where the prompt has one, so
    ``tau_compare.compare(outputs, rows)`` sets them against the served counts on the same
    text (every prompt identical) and ``acceptance.pooled_per_position(rows)`` pools the
    per-position counts.
    """
    rows = teacher_forced_rows_shared(
        target, {"": drafter}, prompts, outputs, num_steps, aux_layer_ids, position_offset
    )
    return rows[""]


def _served_row(prompt, output: dict, row: dict[str, Any]) -> dict[str, Any]:
    """A teacher-forced row with the prompt's ``id`` and the server's cycle count."""
    if isinstance(prompt, dict) and "id" in prompt:
        row = {"id": prompt["id"], **row}
    verify = output.get("meta_info", {}).get("spec_verify_ct")
    if verify is not None:
        row["served_cycles"] = verify
    return row


# Sequences per target forward in teacher_forced_rows_shared. The GPU suite's eager 61-layer
# MoE target should be launch-bound at one sequence of ~250 tokens, so 16 should cost little
# more than 1 (not measured yet: the suite's phase_s timings will say).
TARGET_BATCH = 16


def _right_padded(seqs: Sequence[Sequence[int]], device) -> torch.Tensor:
    ids = torch.zeros(len(seqs), max(len(q) for q in seqs), dtype=torch.long, device=device)
    for b, q in enumerate(seqs):
        ids[b, : len(q)] = torch.as_tensor(list(q), dtype=torch.long)
    return ids


def batched_hidden_states(target, seqs: Sequence[Sequence[int]]) -> list[tuple]:
    """:func:`collect_hidden_states` for several sequences in one right-padded forward: item
    ``b`` has its shape and meaning for ``seqs[b]`` alone (``[1, len, ...]``). Causal
    attention keeps padding after a sequence from reaching it, and positions start at 0 for
    every row; only float summation order may differ from one forward per sequence."""
    device = next(target.parameters()).device
    logits, hidden = collect_hidden_states(target, _right_padded(seqs, device))
    return [
        (logits[b : b + 1, : len(q)], [h[b : b + 1, : len(q)] for h in hidden])
        for b, q in enumerate(seqs)
    ]


def _batched_greedy(target, seqs: Sequence[Sequence[int]], starts: Sequence[int]) -> list:
    """The target's greedy tokens for each sequence from index ``starts[b]`` to its end."""
    device = next(target.parameters()).device
    logits = target(input_ids=_right_padded(seqs, device), use_cache=False).logits
    return [
        torch.argmax(logits[b, start : len(q)].float(), dim=-1).tolist()
        for b, (q, start) in enumerate(zip(seqs, starts, strict=True))
    ]


@torch.no_grad()
def teacher_forced_rows_shared(
    target,
    drafters: Mapping[str, Any],
    prompts: Sequence[Sequence[int] | dict],
    outputs: Sequence[dict],
    num_steps: int = 3,
    aux_layer_ids: Sequence[int] | None = None,
    position_offset: int = 0,
    batch: int = TARGET_BATCH,
) -> dict[str, list[dict[str, Any]]]:
    """:func:`teacher_forced_rows` for several drafters on the same served text: the target
    runs once per ``batch`` prompts for all of them (each drafter reads its own aux ids from
    the same states), and the last cycles judged past the text's end are verified in
    batches too. The rows are :func:`teacher_forced_acceptance`'s for each prompt and
    drafter (held equal by a CPU test). 64 prompts take 4 target forwards instead of 64, and
    the past-end verifies (at most one per prompt and drafter) one per 16 instead of one each.
    """
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} served outputs")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    texts = [
        (
            [int(t) for t in (p["input_ids"] if isinstance(p, dict) else p)],
            [int(t) for t in o["output_ids"]],
        )
        for p, o in zip(prompts, outputs, strict=True)
    ]
    loops: dict[str, list[_TeacherForcedLoop]] = {name: [] for name in drafters}
    for first in range(0, len(texts), batch):
        chunk = texts[first : first + batch]
        with_text = [k for k, (_, cont) in enumerate(chunk) if cont]
        states = dict(
            zip(
                with_text,
                batched_hidden_states(target, [chunk[k][0] + chunk[k][1] for k in with_text])
                if with_text
                else [],
                strict=True,
            )
        )
        for k, (ids, cont) in enumerate(chunk):
            for name, drafter in drafters.items():
                loops[name].append(
                    _teacher_forced_loop(
                        target,
                        drafter,
                        ids,
                        cont,
                        num_steps,
                        aux_layer_ids,
                        position_offset,
                        None,
                        states.get(k),
                    )  # fmt: skip
                )
        del states
    pending = [loop for rows in loops.values() for loop in rows if loop.pending is not None]
    for first in range(0, len(pending), batch):
        chunk = pending[first : first + batch]
        preds = _batched_greedy(
            target, [loop.pending.ids for loop in chunk], [loop.pending.start for loop in chunk]
        )
        for loop, found in zip(chunk, preds, strict=True):
            loop.judge(found)
    return {
        name: [
            _served_row(prompt, output, loop.row())
            for prompt, output, loop in zip(prompts, outputs, rows, strict=True)
        ]
        for name, rows in loops.items()
    }


@torch.no_grad()
def greedy_decode(
    target,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    ignore_eos: bool = True,
    use_cache: bool = False,
) -> list[int]:
    """Plain greedy decoding baseline (full recompute by default, like the loop above)."""
    device = next(target.parameters()).device
    seq = [int(t) for t in prompt_ids]
    out: list[int] = []
    past = None
    next_input = torch.tensor([seq], dtype=torch.long, device=device)
    while len(out) < max_new_tokens:
        if use_cache:
            res = target(input_ids=next_input, past_key_values=past, use_cache=True)
            past = res.past_key_values
        else:
            res = target(input_ids=torch.tensor([seq], device=device), use_cache=False)
        tok = int(torch.argmax(res.logits[0, -1]).item())
        out.append(tok)
        seq.append(tok)
        next_input = torch.tensor([[tok]], dtype=torch.long, device=device)
        if not ignore_eos and eos_token_id is not None and tok == eos_token_id:
            break
    return out


def evaluate_tau(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    num_steps: int = 3,
    max_new_tokens: int = 128,
    aux_layer_ids: Sequence[int] | None = None,
    position_offset: int = 0,
    lossless_check_prompts: int = 0,
) -> dict[str, Any]:
    """Run the reference loop over ``prompts`` and aggregate acceptance statistics.

    ``tau`` is the cycle-weighted mean over all prompts ((sum accepted + cycles) / cycles);
    ``tau_prompt_mean`` averages the per-prompt values. The first
    ``lossless_check_prompts`` prompts are also greedy-decoded and compared token by token.
    """
    start = time.perf_counter()
    results = [
        speculative_generate(
            target,
            drafter,
            p,
            num_steps,
            max_new_tokens,
            aux_layer_ids,
            position_offset=position_offset,
        )
        for p in prompts
    ]
    cycles = sum(r.num_cycles for r in results)
    acc = sum(sum(r.accepted_per_cycle) for r in results)
    tokens = sum(len(r.tokens) for r in results)
    per_pos = [
        sum(sum(1 for a in r.accepted_per_cycle if a > j) for r in results) / max(cycles, 1)
        for j in range(num_steps)
    ]
    lossless = {"checked": 0, "mismatches": 0}
    for prompt, res in list(zip(prompts, results, strict=True))[:lossless_check_prompts]:
        base = greedy_decode(target, prompt, max_new_tokens)
        lossless["checked"] += 1
        lossless["mismatches"] += int(base != res.tokens)
    taus = [r.tau for r in results if r.num_cycles]
    return {
        "num_prompts": len(results),
        "num_steps": num_steps,
        "max_new_tokens": max_new_tokens,
        "position_offset": position_offset,
        "tau": (acc + cycles) / cycles if cycles else float("nan"),
        "tau_prompt_mean": sum(taus) / len(taus) if taus else float("nan"),
        "sglang_accept_length": tokens / cycles if cycles else float("nan"),
        "accept_rate": acc / (cycles * num_steps) if cycles else float("nan"),
        "per_position_acceptance": per_pos,
        "total_cycles": cycles,
        "total_tokens": tokens,
        "lossless_check": lossless,
        "wall_s": round(time.perf_counter() - start, 3),
        "per_prompt": [
            {
                "tau": r.tau,
                "cycles": r.num_cycles,
                "accepted": r.accepted_per_cycle,
                "tokens": r.tokens,
            }
            for r in results
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sglang_ext_tools.reference --target T --drafter D --prompts prompts.jsonl``."""
    import argparse

    parser = argparse.ArgumentParser(description="offline EAGLE-3 reference tau")
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", required=True, help="jsonl with an input_ids field")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--position-offset", type=int, default=0)
    parser.add_argument("--lossless-check-prompts", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the full summary JSON here")
    args = parser.parse_args(argv)

    with open(args.prompts) as fh:
        prompts = [json.loads(line)["input_ids"] for line in fh if line.strip()]
    prompts = prompts[: args.num_prompts] if args.num_prompts else prompts
    target = load_target(args.target, args.device, args.dtype)
    drafter = load_drafter(args.drafter, args.device, args.dtype)
    summary = evaluate_tau(
        target,
        drafter,
        prompts,
        args.num_steps,
        args.max_new_tokens,
        position_offset=args.position_offset,
        lossless_check_prompts=args.lossless_check_prompts,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    brief = {k: v for k, v in summary.items() if k != "per_prompt"}
    print(json.dumps(brief, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
