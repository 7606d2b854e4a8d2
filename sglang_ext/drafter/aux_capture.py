"""Aux-layer capture conventions: which target layers feed the drafter's fc, in each numbering.

speculators (and vLLM) name an aux layer by the hidden state entering a decoder layer; SGLang's
target classes derive the layers they capture from eagle_config ids with a per-class rule.
This module keeps those rules, the table of classes that also capture the final state, the
check that a capture list feeds the drafter's fc, and :class:`TargetInfo`, the target as these
conventions see it. Nothing here imports SGLang or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sglang_ext.compat import sglang_version, version_tuple
from sglang_ext.drafter.config_fields import (
    DrafterConfigError,
    architectures_field,
    read_json,
    size_field,
)
from sglang_ext.drafter.model_paths import config_path


@dataclass(frozen=True)
class TargetInfo:
    """What the drafter needs to know about the target model, read from its config.json."""

    path: str
    architecture: str
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    # Its SGLang class also captures the state after the last decoder layer (boundary L).
    captures_final_state: bool = False
    # How its SGLang class turns eagle_config ids into captured layers: resolved once, here,
    # from the architecture and then the model_type (capture_rule_for), so doctor, convert
    # and the server read the same rule from this object instead of looking it up again.
    capture_rule: CaptureRule | None = None

    def __post_init__(self) -> None:
        if self.capture_rule is None:
            rule = capture_rule_for(model_type=self.model_type, architecture=self.architecture)
            object.__setattr__(self, "capture_rule", rule)

    def captured_from_sglang_ids(self, ids: list[int] | None) -> list[int]:
        """The layers this target's class captures for SGLang-format eagle_config ids."""
        return captured_layers_from_sglang_ids(ids, self.capture_rule, self.num_hidden_layers)

    def sglang_ids_for(self, captured: list[int]) -> list[int]:
        """eagle_config ids that make this target's class capture ``captured``."""
        return sglang_ids_for_capture(captured, self.capture_rule)

    def capture_problems(self, captured: list[int], num_aux: int, source: str) -> list[str]:
        """check_capture against this target's depth and final-state capture."""
        return check_capture(
            captured, num_aux, self.num_hidden_layers, source, self.captures_final_state
        )

    @classmethod
    def from_path(cls, path: str | Path) -> TargetInfo:
        cfg_file = config_path(path)
        config = read_json(cfg_file)
        where = str(cfg_file)
        # Multimodal targets (Kimi-K2.5, Qwen3-VL) keep the language model in text_config.
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        archs = (
            architectures_field(config, where)
            or architectures_field(text, f"{where}: text_config")
            or ["<unknown>"]
        )
        sizes = {
            key: size_field(text, key, where)
            for key in ("num_hidden_layers", "hidden_size", "vocab_size")
        }
        return cls(
            path=str(path),
            architecture=str(archs[0]),
            model_type=str(text.get("model_type") or config.get("model_type") or "<unknown>"),
            **sizes,
            captures_final_state=class_captures_final_state(archs, version_tuple(sglang_version())),
        )


# --------------------------------------------------------------------------------------------
# Aux-id conventions
#
# speculators and vLLM name an aux layer by the hidden state ENTERING decoder layer k (HF
# `output_hidden_states[k]`; speculators/models/utils.py:resolve_target_layer_ids allows
# 0..num_layers). SGLang's targets capture the state entering layer `layers_to_capture[j]`
# (boundary k; boundary L = after the last decoder layer, where a class captures it), and
# derive `layers_to_capture` from the ids passed to `set_eagle3_layers_to_capture` with a
# per-class rule:
#   llama.py, qwen2.py, qwen3.py, ...:            [id + 1 for id in ids]
#   deepseek_v2.py and its subclasses (DeepSeek-V3, Kimi-K2.x, GLM-5 `GlmMoeDsa` in glm4_moe.py,
#   MistralLarge3), glm4_moe_lite.py:             +1 only when ids[0] == 1, else ids as given
#   gpt_oss.py:                                   ids as given when max(ids) == L, else +1
# The server does not rely on these rules: it sets the planned list on the target and reads it
# back (sglang_ext.serving.fusion.apply_capture). They are kept, as data, for what runs without the
# target class: doctor's prediction of SGLang-format ids, and convert.

CaptureRule = Literal["plus_one", "plus_one_if_first_is_one", "plus_one_unless_final"]

_DEEPSEEK_RULE: CaptureRule = "plus_one_if_first_is_one"
CAPTURE_RULE_BY_TARGET_ARCHITECTURE: dict[str, CaptureRule] = {
    "DeepseekV2ForCausalLM": _DEEPSEEK_RULE,
    "DeepseekV3ForCausalLM": _DEEPSEEK_RULE,
    "DeepseekV32ForCausalLM": _DEEPSEEK_RULE,
    "KimiK25ForConditionalGeneration": _DEEPSEEK_RULE,
    "GlmMoeDsaForCausalLM": _DEEPSEEK_RULE,
    "MistralLarge3ForCausalLM": _DEEPSEEK_RULE,
    "Glm4MoeLiteForCausalLM": _DEEPSEEK_RULE,
    "GptOssForCausalLM": "plus_one_unless_final",
}
CAPTURE_RULE_BY_TARGET_MODEL_TYPE: dict[str, CaptureRule] = {
    "deepseek_v2": _DEEPSEEK_RULE,
    "deepseek_v3": _DEEPSEEK_RULE,
    "kimi_k2": _DEEPSEEK_RULE,
    "kimi_k25": _DEEPSEEK_RULE,
    "glm_moe_dsa": _DEEPSEEK_RULE,
    "glm4_moe_lite": _DEEPSEEK_RULE,
    "gpt_oss": "plus_one_unless_final",
}
DEFAULT_CAPTURE_RULE: CaptureRule = "plus_one"

# Target classes whose forward also captures boundary L (the state after the last decoder
# layer, before the final norm), from the first SGLang version where it does:
#   gpt_oss.py GptOssModel.forward: `i + 1 in self.layers_to_capture` after block i (0.5.17),
#     `self.end_layer in self.layers_to_capture` at the final norm (0.5.23);
#   minimax_m3.py: `self.end_layer in self.layers_to_capture` (0.5.23; not in 0.5.17).
FINAL_STATE_CAPTURE_SINCE: dict[str, tuple[int, int, int]] = {
    "GptOssForCausalLM": (0, 5, 17),
    "MiniMaxM3SparseForCausalLM": (0, 5, 23),
}


def capture_rule_for(model_type: str | None = None, architecture: str | None = None) -> CaptureRule:
    if architecture is not None and architecture in CAPTURE_RULE_BY_TARGET_ARCHITECTURE:
        return CAPTURE_RULE_BY_TARGET_ARCHITECTURE[architecture]
    if model_type is not None and model_type in CAPTURE_RULE_BY_TARGET_MODEL_TYPE:
        return CAPTURE_RULE_BY_TARGET_MODEL_TYPE[model_type]
    return DEFAULT_CAPTURE_RULE


def class_captures_final_state(class_names, sglang_version: tuple[int, ...] | None) -> bool:
    """Whether a target class (any of `class_names`: its MRO or config architectures) captures
    boundary L in this SGLang version (unknown version: no)."""
    if sglang_version is None:
        return False
    return any(
        sglang_version >= FINAL_STATE_CAPTURE_SINCE[name]
        for name in class_names
        if name in FINAL_STATE_CAPTURE_SINCE
    )


def sglang_default_capture(num_layers: int) -> list[int]:
    """What SGLang's targets capture when the drafter names no ids (llama.py, deepseek_v2.py)."""
    return [2, num_layers // 2, num_layers - 3]


def captured_layers_from_sglang_ids(ids: list[int] | None, rule: CaptureRule, num_layers: int):
    """The `layers_to_capture` an SGLang target derives from eagle_config ids (None = default)."""
    if ids is None:
        return sglang_default_capture(num_layers)
    if rule == "plus_one_unless_final":
        return list(ids) if ids and max(ids) == num_layers else [i + 1 for i in ids]
    if rule == "plus_one" or (ids and ids[0] == 1):
        return [i + 1 for i in ids]
    return list(ids)


def sglang_ids_for_capture(captured: list[int], rule: CaptureRule) -> list[int]:
    """Inverse of captured_layers_from_sglang_ids: ids that make the target capture `captured`."""
    if rule in ("plus_one", "plus_one_unless_final"):
        return [k - 1 for k in captured]  # gpt_oss: a final L becomes L - 1, then +1 again
    if captured and captured[0] == 2:
        return [k - 1 for k in captured]  # first id becomes 1, which triggers the +1
    if captured and captured[0] == 1:
        raise DrafterConfigError(
            "this target's SGLang class (deepseek_v2.py: +1 only when the first id is 1) cannot "
            f"be asked through eagle_config ids to capture {captured}: a first aux layer of 1 "
            "(the output of decoder layer 0) is not expressible. The plugin sets the capture "
            "list directly; stock SGLang cannot serve this drafter."
        )
    return list(captured)


def check_capture(
    captured: list[int], num_aux: int, num_layers: int, source: str, final_state: bool = False
) -> list[str]:
    """Problems with a capture list, as sentences; empty when it feeds the drafter's fc.
    `final_state`: the target also captures boundary `num_layers` (FINAL_STATE_CAPTURE_SINCE)."""
    problems = []
    distinct = sorted(set(captured))
    if len(distinct) != len(captured):
        problems.append(
            f"{source}: aux layer ids collapse to {len(distinct)} distinct layers {distinct} "
            f"(from {captured}); the drafter's fc expects {num_aux}"
        )
    last = num_layers if final_state else num_layers - 1
    out = [k for k in captured if k < 0 or k > last]
    if out:
        valid = f"the state entering layer 0..{num_layers - 1}"
        if final_state:
            valid += f", or {num_layers}: the state after the last one"
        problems.append(
            f"{source}: aux layers {out} are outside the target's {num_layers} decoder layers "
            f"(valid: {valid}); they would never be captured"
        )
    if len(captured) != num_aux:
        problems.append(
            f"{source}: {len(captured)} aux layers {captured} but the drafter's fc expects "
            f"{num_aux}"
        )
    return problems
