"""EAGLE-3 drafter with Llama/Qwen3 layers: SGLang's class, speculators' math, strict loading.

Subclasses ``sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3`` and overrides only what
differs:

- ``LlamaModel.forward``: fusion decided by the forward mode (``sglang_ext.serving.fusion``);
- the first decoder layer's forward: speculators' ``norm_before_residual``
  (``speculators/models/eagle3/model_definitions.py:Eagle3FirstLayerMixin.forward``);
- the attention's q/k projection prep: per-head ``q_norm``/``k_norm`` for qwen3 draft layers;
- per-layer sliding window from ``layer_types``/``sliding_window``;
- ``set_embed``: a drafter that trained its own embeddings keeps them;
- ``load_weights``: every tensor loaded, ignored for a stated reason, or an error
  (``sglang_ext.drafter.loading``; ``load_with_plan`` is shared with the MLA drafter).

SGLang's constructors name their submodule classes directly (``LlamaModel(...)``,
``LlamaDecoderLayer(...)``), so the overrides are applied by re-classing the modules SGLang
built (``module.__class__ = Subclass``); the subclasses add no parameters of SGLang's own, so
nothing is allocated twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.models import llama_eagle3 as upstream
from sglang.srt.models.llama import LlamaAttention

from sglang_ext import compat
from sglang_ext.drafter.checkpoint_files import DrafterLoadError, torch_dtype_name
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.drafter_spec import DrafterSpec
from sglang_ext.drafter.loading import LoadPlan, LoadReport
from sglang_ext.drafter.speculators_format import drafter_spec_for
from sglang_ext.serving import draft_head
from sglang_ext.serving.fusion import FusionPolicy, check_algorithm

logger = logging.getLogger(__name__)


def token_embeddings(embed_tokens, input_ids, forward_batch, input_embeds):
    """Token embeddings as SGLang's eagle3 drafters take them (multimodal targets hand over
    their own embeddings for image positions and the drafter embeds only the newest token)."""
    if input_embeds is not None:
        return input_embeds
    embeds = forward_batch.mm_input_embeds
    if embeds is None:
        return embed_tokens(input_ids)
    mode = forward_batch.forward_mode
    if mode.is_extend() and forward_batch.contains_mm_inputs() and not mode.is_draft_extend_v2():
        newest = (forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1).long()
        embeds[newest] = embed_tokens(input_ids[newest])
    return embeds


class Eagle3Model(upstream.LlamaModel):
    """SGLang's eagle3 LlamaModel with the fusion decided by `self.fusion` (a FusionPolicy)."""

    fusion: FusionPolicy

    def fuse_target_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.input_norm is not None:  # speculators norm_before_fc
            hidden_states = self.input_norm(hidden_states)
        if self.fc_norm is not None:  # speculators fc_norm (Eagle 3.1)
            chunks = hidden_states.chunk(self.num_aux_hidden_states, dim=-1)
            normed = [norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)]
            hidden_states = torch.cat(normed, dim=-1)
        return self.fc(hidden_states)

    def forward(
        self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None
    ):
        embeds = token_embeddings(self.embed_tokens, input_ids, forward_batch, input_embeds)
        if self.is_mrope_enabled:
            positions = forward_batch.mrope_positions
        hidden_states = forward_batch.spec_info.hidden_states
        if self.fusion.applies(forward_batch.forward_mode, hidden_states.shape[-1]):
            hidden_states = self.fuse_target_features(hidden_states)
        if hidden_states.shape[0] == 0:
            return hidden_states, [hidden_states]
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(
                positions, embeds, hidden_states, forward_batch, residual
            )
        normed, pre_norm = self.norm(hidden_states, residual)
        # The state fed to the next draft step: post-norm with speculators' norm_output.
        return normed, [normed if self.norm_output else pre_norm]


class Eagle3DecoderLayer(upstream.LlamaDecoderLayer):
    """SGLang's eagle3 decoder layer with speculators' `norm_before_residual` on layer 0."""

    norm_before_residual: bool = False

    def forward(self, positions, embeds, hidden_states, forward_batch, residual):
        if not (self.is_input_layer and self.norm_before_residual):
            return super().forward(positions, embeds, hidden_states, forward_batch, residual)
        # speculators Eagle3FirstLayerMixin.forward with norm_before_residual=True: the residual
        # stream starts from the normalised target features, not the raw ones.
        hidden_states = self.hidden_norm(hidden_states)
        residual = hidden_states
        attn_input = torch.cat([self.input_layernorm(embeds), hidden_states], dim=-1)
        hidden_states = self.self_attn(
            positions=positions, hidden_states=attn_input, forward_batch=forward_batch
        )
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class QKNormLlamaAttention(LlamaAttention):
    """LlamaAttention plus Qwen3's per-head RMSNorm of q and k before rotary embedding."""

    def forward_prepare_native(self, positions, hidden_states):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v


class LlamaForCausalLMEagle3(upstream.LlamaForCausalLMEagle3):
    """SGLang's EAGLE-3 drafter, loading speculators checkpoints natively and strictly."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        spec = drafter_spec_for(config)
        args = compat.server_args()
        check_algorithm(getattr(args, "speculative_algorithm", None), spec.source)
        if not spec.use_aux_hidden_state:  # the target would never capture: refuse now
            raise DrafterConfigError(
                f"EAGLE-3 drafter {spec.source}: "
                + spec.no_capture_problem(spec.fc_input_hidden_size)
            )
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        draft_head.apply(self, quant_config, prefix, spec.source)
        self.spec = spec
        self.model.__class__ = Eagle3Model
        self.model.fusion = FusionPolicy.for_spec(spec)
        for layer in self.model.layers:
            layer.__class__ = Eagle3DecoderLayer
            layer.norm_before_residual = spec.norm_before_residual
            if spec.layer_type == "qwen3":
                self._add_qk_norm(layer.self_attn, config.rms_norm_eps)
        self.served_window = self._serve_sliding_window(spec)
        self.load_plan = LoadPlan(spec)
        self.load_plan.check_model(self)
        logger.info(
            "sglang_ext: EAGLE-3 drafter %s (%s format, %d %s layer(s), norm_before_residual=%s, "
            "trained sliding_window=%s)",
            spec.source,
            spec.format,
            spec.num_hidden_layers,
            spec.layer_type,
            spec.norm_before_residual,
            spec.sliding_window,
        )

    @staticmethod
    def _add_qk_norm(attn, eps: float) -> None:
        attn.q_norm = RMSNorm(attn.head_dim, eps=eps)
        attn.k_norm = RMSNorm(attn.head_dim, eps=eps)
        attn.__class__ = QKNormLlamaAttention

    def _serve_sliding_window(self, spec: DrafterSpec) -> int | None:
        """speculators' per-layer sliding window, where this SGLang can serve it
        (`compat.supports("draft_layer_window")`, 0.5.23 on); returns the model-level window
        that `get_attention_sliding_window_size` reports, or None to leave SGLang's own.

        Served: each `sliding_attention` layer masks with S - 1 and the model reports S
        (DrafterSpec.sglang_window_size / sglang_decode_window say why), so SGLang's draft
        extend and draft decode both keep speculators' S keys; `full_attention` layers stay
        full (-1). The trained window wins over `--speculative-draft-window-size` (which
        SGLang would put on every layer, full ones too), with a warning naming both.

        Not served (0.5.17-0.5.22): the multi-step draft decode builds no window indices (a
        drafter-level window crashes the first draft decode: `kv_indices` is None in
        decode_attention), so the window is full attention, the same math for every context
        shorter than the window, and the startup log says so. The flag, if given, still
        applies as SGLang applies it.
        """
        if spec.sglang_window_size() is None:
            return None  # no sliding layer: SGLang's own handling of the flag stands
        flag = self._draft_window_size
        if not compat.supports("draft_layer_window"):
            if flag is None:
                logger.warning(
                    "sglang_ext: drafter %s was trained with sliding_window=%d on layers %s; "
                    "SGLang %s's EAGLE draft decode cannot apply a per-layer window (0.5.23 "
                    "can), so it attends to the full context: identical for contexts up to %d "
                    "tokens, lower acceptance (never wrong output) beyond",
                    spec.source,
                    spec.sliding_window,
                    list(spec.sliding_layers),
                    compat.sglang_version(),
                    spec.sliding_window,
                )
            return None
        if flag is not None and flag != spec.sliding_window:
            logger.warning(
                "sglang_ext: --speculative-draft-window-size=%d differs from the window drafter "
                "%s was trained with (sliding_window=%d); applying the trained %d on its "
                "sliding layers %s (full-attention layers stay full), not %d",
                flag,
                spec.source,
                spec.sliding_window,
                spec.sliding_window,
                list(spec.sliding_layers),
                flag,
            )
        sliding = set(spec.sliding_layers)
        for index, layer in enumerate(self.model.layers):
            window = spec.sglang_window_size() if index in sliding else -1
            layer.self_attn.attn.sliding_window_size = window
        full = [i for i in range(len(self.model.layers)) if i not in sliding]
        logger.info(
            "sglang_ext: drafter %s sliding window as trained: layers %s attend to the last %d "
            "keys (SGLang layer sliding_window_size=%d, model window %d), layers %s full",
            spec.source,
            sorted(sliding),
            spec.sliding_window,
            spec.sglang_window_size(),
            spec.sglang_decode_window(),
            full,
        )
        return spec.sglang_decode_window()

    def get_attention_sliding_window_size(self):
        served = getattr(self, "served_window", None)
        if served is not None:
            return served
        return super().get_attention_sliding_window_size()

    def set_embed(self, embed):
        if self.load_plan.params["model.embed_tokens.weight"].derived is None:
            return  # the drafter owns its embeddings (embed_requires_grad or another width)
        return super().set_embed(embed)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.load_report = load_with_plan(self, self.load_plan, weights)


def load_with_plan(model, plan: LoadPlan, weights) -> LoadReport:
    """Drive the drafter's LoadPlan (built once, in its constructor) over checkpoint tensors
    into `model`'s parameters and raise on any problem (the plan doctor runs on safetensors
    headers). Shards of a concatenated parameter are joined in the plan's order before its
    loader sees them."""
    spec = plan.begin().spec
    params = dict(model.named_parameters())
    pending: dict[str, dict] = {}
    for name, tensor in weights:
        decision = plan.route(name, tuple(tensor.shape), torch_dtype_name(tensor.dtype))
        if decision.action == "d2t":
            model.hot_token_id = hot_token_ids(spec, tensor)
        if decision.action != "load":
            continue
        if tensor.is_floating_point():  # NaN/Inf weights: refused, naming tensor and count
            finite = int(torch.isfinite(tensor).sum())
            plan.mark_nonfinite(name, tensor.numel() - finite, tensor.numel())
        param = params[decision.param]
        loader = getattr(param, "weight_loader", default_weight_loader)
        expected = plan.params[decision.param]
        if expected.concatenated:
            parts = pending.setdefault(decision.param, {})
            parts[decision.shard] = tensor
            if len(parts) == len(expected.shards):
                loader(param, torch.cat([parts[shard] for shard in expected.shards], dim=0))
        elif decision.shard is None:
            loader(param, tensor)
        else:
            loader(param, tensor, decision.shard)
    report = plan.finish()
    report.raise_for_errors()
    logger.info(
        "sglang_ext: loaded %d tensors from %s (%d ignored, %d derived)",
        report.count("loaded"),
        spec.source,
        report.count("ignored"),
        report.count("derived"),
    )
    return report


def hot_token_ids(spec: DrafterSpec, d2t: torch.Tensor) -> torch.Tensor:
    """SGLang's hot_token_id (draft id -> target id) from speculators' d2t offsets."""
    ids = d2t.to(torch.int64) + torch.arange(d2t.shape[0], dtype=torch.int64)
    bad = (ids < 0) | (ids >= spec.vocab_size)
    if bool(bad.any()):
        raise DrafterLoadError(
            f"{spec.source}: d2t maps {int(bad.sum())} draft ids outside the target "
            f"vocabulary [0, {spec.vocab_size})"
        )
    return ids


class Eagle3DraftModel(LlamaForCausalLMEagle3):
    """speculators' architecture name (config.json `architectures`)."""


class Eagle3Speculator(LlamaForCausalLMEagle3):
    """speculators' architecture name (config.json `architectures`)."""


EntryClass = [LlamaForCausalLMEagle3, Eagle3DraftModel, Eagle3Speculator]
