"""The typed drafter config: one validated object, either format, and what it implies.

:class:`DrafterSpec` (field names follow speculators') is what speculators_format reads a
drafter directory into, once, at startup; its derived facts (fc input width, sliding window in
SGLang's convention, the target layers it consumes) and its checks against a target live here.
Nothing here imports SGLang or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from sglang_ext.drafter.aux_capture import (
    FINAL_STATE_CAPTURE_SINCE,
    TargetInfo,
    sglang_default_capture,
)
from sglang_ext.drafter.config_fields import require_field


@dataclass(frozen=True)
class MLAGeometry:
    """DeepSeek-V2 multi-latent attention of an MLA draft layer (config field names)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> MLAGeometry:
        # SGLang's Eagle3MLADecoderLayer fuses q_a and kv_a into one projection and refuses a
        # config without q_lora_rank.
        return cls(
            **{name: require_field(config, name, int, where) for name in cls.__annotations__}
        )


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter, either format, validated once. Field names follow speculators'."""

    format: Literal["speculators", "sglang"]
    source: str
    architecture: str
    layer_type: Literal["llama", "qwen3", "mla"]
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int | None  # None: SGLang format without a draft head (lm_head from target)
    target_hidden_size: int | None
    # Aux ids as written in the checkpoint, in the convention named by aux_id_convention.
    aux_hidden_state_layer_ids: tuple[int, ...] | None
    aux_id_convention: Literal["speculators", "sglang"]
    num_aux_hidden_states: int
    # eagle_config.use_aux_hidden_state (SGLang format): false switches the target's capture
    # off, so it hands over its final hidden state alone (SGLang spec_aux_hidden_state.py).
    use_aux_hidden_state: bool = True
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    embed_requires_grad: bool = False
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    speculative_tokens: int | None = None
    verifier_name_or_path: str | None = None
    dtype: str | None = None
    # Multi-latent attention (layer_type "mla", SGLang's kimi_k25_eagle3.py); None otherwise.
    mla: MLAGeometry | None = None
    layer_config: dict = field(default_factory=dict, compare=False, repr=False)

    # -- derived facts -------------------------------------------------------------------

    @property
    def fc_input_hidden_size(self) -> int:
        return self.target_hidden_size or self.hidden_size

    @property
    def expected_target_feature_width(self) -> int:
        return self.num_aux_hidden_states * self.fc_input_hidden_size

    @property
    def has_vocab_mapping(self) -> bool:
        return self.draft_vocab_size is not None and self.draft_vocab_size != self.vocab_size

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "sliding_attention")

    def sglang_window_size(self) -> int | None:
        """The window of each sliding layer's RadixAttention (`sliding_window_size`, what the
        extend kernels mask with), or None for full attention everywhere.

        speculators masks `kv_idx > q_idx - sliding_window` (models/eagle3/attention.py:
        create_combined_mask_mod): S = `sliding_window` keys including the query's own.
        SGLang's extend kernels keep `q - k <= sliding_window_size`, i.e. w + 1 keys
        (kernels/ops/attention/extend_attention.py, the triton backend's draft extend; the
        flashinfer backend's `window_left` alike), so the layer gets S - 1, the convention its
        Gemma/Mistral models follow.
        """
        if not self.sliding_layers or self.sliding_window is None:
            return None
        return self.sliding_window - 1

    def sglang_decode_window(self) -> int | None:
        """The model-level window (`get_attention_sliding_window_size`, which the backend
        sizes its window index buffers with), or None for full attention everywhere.

        SGLang's triton decode keeps `min(keys, w)` keys including the query's own
        (layers/attention/triton_backend.py: update_sliding_window_buffer;
        kernels/ops/speculative/cache_locs.py: generate_draft_decode_window_kv_indices for the
        multi-step draft), one fewer than its extend kernels for the same w: so the model
        reports S while each sliding layer masks with S - 1 (`sglang_window_size`), and every
        path keeps S keys. The extend kernels read a prefix of up to S keys and mask it down.
        """
        if not self.sliding_layers or self.sliding_window is None:
            return None
        return self.sliding_window

    def captured_layers(self, target: TargetInfo) -> list[int]:
        """Target layers (state entering layer k) whose hidden states this drafter consumes."""
        ids = list(self.aux_hidden_state_layer_ids) if self.aux_hidden_state_layer_ids else None
        if self.aux_id_convention == "speculators":
            if ids is None:  # speculators resolves the default against the verifier
                ids = sglang_default_capture(target.num_hidden_layers)
            return ids
        return target.captured_from_sglang_ids(ids)

    def capture_problems(self, target: TargetInfo) -> list[str]:
        if not self.use_aux_hidden_state:
            return [self.no_capture_problem(target.hidden_size)]
        captured = self.captured_layers(target)
        problems = target.capture_problems(captured, self.num_aux_hidden_states, "aux layers")
        handed = len(set(captured)) * target.hidden_size
        if problems and handed != self.expected_target_feature_width:
            seed = self.as_wide_as_the_drafter(handed)
            problems.append(
                f"widths: the target would hand over {handed} features ({len(set(captured))} x "
                f"{target.hidden_size}){seed}, but fc reads {self.num_aux_hidden_states} x "
                f"{self.fc_input_hidden_size} = {self.expected_target_feature_width}"
            )
        if (
            self.aux_id_convention == "speculators"
            and target.num_hidden_layers in captured
            and not target.captures_final_state
        ):
            problems.append(
                f"aux layer id {target.num_hidden_layers} names the target's final hidden state "
                f"(after its last decoder layer); SGLang's {target.architecture} only captures "
                "states entering a decoder layer (the final state is captured by "
                f"{', '.join(sorted(FINAL_STATE_CAPTURE_SINCE))}), so this drafter cannot be "
                "served with this target"
            )
        return problems

    def as_wide_as_the_drafter(self, handed: int) -> str:
        """The seed's failure, said where the target hands over ``handed`` features as wide as
        the drafter (stock SGLang's test for fusing); "" for any other width."""
        if handed != self.hidden_size:
            return ""
        return (
            ": one layer as wide as the drafter, where stock SGLang skips fc without a word "
            "and the drafter runs on unfused features (accept length ~1)"
        )

    def no_capture_problem(self, target_hidden_size: int) -> str:
        """eagle_config.use_aux_hidden_state false: the seed's failure, as a sentence."""
        seed = self.as_wide_as_the_drafter(target_hidden_size)
        return (
            "eagle_config.use_aux_hidden_state is false: the target captures nothing and hands "
            f"over its final hidden state, {target_hidden_size} wide{seed}, but fc reads "
            f"{self.num_aux_hidden_states} x {self.fc_input_hidden_size} = "
            f"{self.expected_target_feature_width}; set it true (or drop it)"
        )

    def target_problems(self, target: TargetInfo) -> list[str]:
        """Hidden size, vocab and layer-count checks against a target."""
        problems = []
        if self.fc_input_hidden_size != target.hidden_size:
            field_name = "target_hidden_size" if self.target_hidden_size else "hidden_size"
            problems.append(
                f"drafter {field_name} is {self.fc_input_hidden_size} but the target's "
                f"hidden_size is {target.hidden_size}: the drafter was trained for another target"
            )
        if self.vocab_size != target.vocab_size:
            problems.append(
                f"drafter vocab_size is {self.vocab_size} but the target's is "
                f"{target.vocab_size}: the drafter was trained for another tokenizer"
            )
        problems.extend(self.capture_problems(target))
        return problems

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON data (what the translation attaches to SGLang's config and doctor
        prints), without the raw layer config; :meth:`from_json` reads it back."""
        data = asdict(self)
        data.pop("layer_config")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DrafterSpec:
        """The inverse of :meth:`to_json` (tuples and the MLA geometry restored)."""
        data = dict(data)
        for key in ("aux_hidden_state_layer_ids", "layer_types"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        if data.get("mla") is not None:
            data["mla"] = MLAGeometry(**data["mla"])
        return cls(**data)
