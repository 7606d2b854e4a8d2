"""The MLA EAGLE-3 drafter (Kimi-K2.x) with fusion decided by capture, not by width.

Subclasses ``sglang.srt.models.kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM``; only
``Eagle3MLAModel.forward`` differs (``sglang_ext.fusion``), applied by re-classing the module
SGLang built, as in ``sglang_ext.models.llama_eagle3``.
"""

from __future__ import annotations

import torch
from sglang.srt.models import kimi_k25_eagle3 as upstream
from sglang.srt.utils import BumpAllocator

from sglang_ext import compat
from sglang_ext.fusion import FusionPolicy, check_algorithm
from sglang_ext.models.llama_eagle3 import token_embeddings


class Eagle3MLAModel(upstream.Eagle3MLAModel):
    fusion: FusionPolicy

    def fuse_target_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.fc_norm is not None:
            chunks = hidden_states.chunk(self.num_aux_hidden_states, dim=-1)
            normed = [norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)]
            hidden_states = torch.cat(normed, dim=-1)
        hidden_states, _ = self.fc(hidden_states)
        return self._fc_gatherer(hidden_states)

    def forward(
        self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None
    ):
        embeds = token_embeddings(self.embed_tokens, input_ids, forward_batch, input_embeds)
        hidden_states = forward_batch.spec_info.hidden_states
        if self.fusion.applies(forward_batch.forward_mode, hidden_states.shape[-1]):
            hidden_states = self.fuse_target_features(hidden_states)
        if hidden_states.shape[0] == 0:
            return hidden_states, [hidden_states]
        scratch = BumpAllocator(buffer_size=2, dtype=torch.float32, device=embeds.device)
        hidden_states, residual = self.midlayer(
            positions, embeds, hidden_states, forward_batch, scratch
        )
        normed, pre_norm = self.norm(hidden_states, residual)
        return normed, [normed if self.norm_output else pre_norm]


def fusion_policy_for(config) -> FusionPolicy:
    target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
    return FusionPolicy(
        drafter=str(getattr(config, "_name_or_path", "") or "<mla drafter>"),
        num_aux_hidden_states=upstream._get_eagle_aux_layer_count(config),
        fc_input_hidden_size=target_hidden,
        hidden_size=config.hidden_size,
    )


class Eagle3DeepseekV2ForCausalLM(upstream.Eagle3DeepseekV2ForCausalLM):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        policy = fusion_policy_for(config)
        check_algorithm(
            getattr(compat.server_args(), "speculative_algorithm", None), policy.drafter
        )
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        self.model.__class__ = Eagle3MLAModel
        self.model.fusion = policy


EntryClass = [Eagle3DeepseekV2ForCausalLM]
