"""The MLA EAGLE-3 drafter (Kimi-K2.x): fusion decided by capture, strict loading.

Subclasses ``sglang.srt.models.kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM`` and overrides only
what differs:

- ``Eagle3MLAModel.forward``: fusion decided by the forward mode (``sglang_ext.serving.fusion``),
  applied by re-classing the module SGLang built, as in ``sglang_ext.models.llama_eagle3``;
- ``load_weights``: the same LoadPlan as the llama drafter (``sglang_ext.drafter.loading``, key
  table ``key_table.MLA_KEY_TABLE``) instead of SGLang's loop, which skips unknown names with
  a log line and never checks for missing ones; SGLang's ``post_load_weights`` (kv_b_proj split
  into MLA's w_kc / w_vc) still runs after it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from sglang.srt.models import kimi_k25_eagle3 as upstream
from sglang.srt.utils import BumpAllocator

from sglang_ext import compat
from sglang_ext.drafter.loading import LoadPlan
from sglang_ext.drafter.speculators_format import drafter_spec_for
from sglang_ext.models.llama_eagle3 import load_with_plan, token_embeddings
from sglang_ext.serving import draft_head
from sglang_ext.serving.fusion import FusionPolicy, check_algorithm


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


class Eagle3DeepseekV2ForCausalLM(upstream.Eagle3DeepseekV2ForCausalLM):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        spec = drafter_spec_for(config)
        check_algorithm(getattr(compat.server_args(), "speculative_algorithm", None), spec.source)
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        draft_head.apply(self, quant_config, prefix, spec.source)
        self.spec = spec
        self.model.__class__ = Eagle3MLAModel
        self.model.fusion = FusionPolicy.for_spec(spec)
        self.load_plan = LoadPlan(spec)
        self.load_plan.check_model(self)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.load_report = load_with_plan(self, self.load_plan, weights)
        self.post_load_weights()


EntryClass = [Eagle3DeepseekV2ForCausalLM]
