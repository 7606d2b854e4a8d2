"""The speculators EAGLE-3 checkpoint format, as data: typed config, key table, aux-id conventions.

speculators (0.9.0, ``speculators/models/eagle3/config.py:Eagle3SpeculatorConfig``) saves a
drafter as a ``config.json`` with ``speculators_model_type: "eagle3"`` and no ``model_type``,
a nested ``transformer_layer_config`` and options SGLang has no name for. This module reads
such a directory (or an SGLang-format EAGLE-3 directory) into one typed, validated object,
:class:`DrafterSpec`, once, and derives from it everything else: the config SGLang sees, the
checkpoint-key table, the aux layers the target must capture.

Nothing here imports SGLang or torch, so ``sglang-ext doctor`` runs anywhere. Config files are
parsed as JSON data: the ``config.py`` that speculators writes beside ``config.json`` (with
``auto_map``) is never imported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

SPECULATORS_ARCHITECTURES = ("Eagle3DraftModel", "Eagle3Speculator")
SGLANG_EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
SUPPORTED_LAYER_TYPES = ("llama", "qwen3")

# Keys of speculators' transformer_layer_config that SGLang must not see: SGLang's ModelConfig
# reads `layer_types`/`sliding_window` as "this is a hybrid-SWA model" and would size the draft
# KV pool differently. The window is applied by our drafter class instead (see
# DrafterSpec.sglang_window_size).
_LAYER_KEYS_HIDDEN_FROM_SGLANG = frozenset(
    {
        "layer_types",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "model_type",
        "architectures",
        "auto_map",
        "_attn_implementation",
        "transformers_version",
    }
)


class DrafterConfigError(ValueError):
    """A drafter or target config that cannot be served; the message says where and why."""


# --------------------------------------------------------------------------------------------
# Small readers


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON file as data, with an error that names the file."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise DrafterConfigError(f"{path}: file not found") from exc
    except OSError as exc:
        raise DrafterConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise DrafterConfigError(
            f"{path}: not a JSON text file ({exc}); expected a model directory or its config.json"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DrafterConfigError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise DrafterConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _is_hub_id(path: str | Path) -> bool:
    return not Path(path).exists() and bool(HUB_REPO_ID.match(str(path)))


def config_path(path: str | Path) -> Path:
    """Accept a model directory, a bare config.json, or a Hugging Face Hub id (its config.json
    fetched through the local HF cache, as transformers does for SGLang)."""
    if _is_hub_id(path):
        from huggingface_hub import hf_hub_download

        try:
            return Path(hf_hub_download(str(path), "config.json"))
        except Exception as exc:  # noqa: BLE001 - offline, missing repo, no access: say which
            raise DrafterConfigError(
                f"{path}: not a local path, and its config.json could not be fetched from the "
                f"Hugging Face Hub ({type(exc).__name__}: {exc})"
            ) from exc
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def model_dir(path: str | Path) -> Path:
    """A local directory holding a drafter's config and safetensors (Hub ids are downloaded
    into the HF cache: only *.json and *.safetensors, the files SGLang loads anyway)."""
    if not _is_hub_id(path):
        path = Path(path)
        return path if path.is_dir() else path.parent
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:  # noqa: BLE001 - see config_path
        raise DrafterConfigError(
            f"{path}: not a local path, and it could not be fetched from the Hugging Face Hub "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def is_speculators_config(config: Mapping[str, Any]) -> bool:
    return "speculators_model_type" in config


def is_speculators_dir(path: str | Path) -> bool:
    """True when `path` holds a speculators-format config.json (cheap: one small JSON read)."""
    try:
        cfg = config_path(path)
    except DrafterConfigError:
        return False  # not ours to report: SGLang's own loader says what is wrong
    if not cfg.is_file():
        return False
    try:
        return is_speculators_config(json.loads(cfg.read_text()))
    except (OSError, json.JSONDecodeError):
        return False


def _require(config: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    if key not in config or config[key] is None:
        raise DrafterConfigError(f"{where}: required field '{key}' is missing")
    value = config[key]
    if isinstance(value, bool) and kind in (int, float):
        raise DrafterConfigError(f"{where}: field '{key}' must be {kind.__name__}, found {value!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DrafterConfigError(
            f"{where}: field '{key}' must be {names}, found {type(value).__name__} {value!r}"
        )
    return value


def _optional(config: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    """An optional field: None when absent or null, else type-checked like `_require`."""
    return None if config.get(key) is None else _require(config, key, kind, where)


def _architectures(config: Mapping[str, Any], where: str) -> list[str] | None:
    archs = config.get("architectures")
    if archs is None:
        return None
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise DrafterConfigError(
            f"{where}: field 'architectures' must be a list of class names, found {archs!r}"
        )
    return archs or None


def _flag(config: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise DrafterConfigError(f"{where}: field '{key}' must be true/false, found {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# The target


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

    @classmethod
    def from_path(cls, path: str | Path) -> TargetInfo:
        cfg_file = config_path(path)
        config = read_json(cfg_file)
        where = str(cfg_file)
        # Multimodal targets (Kimi-K2.5, Qwen3-VL) keep the language model in text_config.
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        archs = (
            _architectures(config, where)
            or _architectures(text, f"{where}: text_config")
            or ["<unknown>"]
        )
        return cls(
            path=str(path),
            architecture=str(archs[0]),
            model_type=str(text.get("model_type") or config.get("model_type") or "<unknown>"),
            num_hidden_layers=_require(text, "num_hidden_layers", int, where),
            hidden_size=_require(text, "hidden_size", int, where),
            vocab_size=_require(text, "vocab_size", int, where),
            captures_final_state=class_captures_final_state(archs, installed_sglang_version()),
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
# back (sglang_ext.fusion.apply_capture). They are kept, as data, for what runs without the
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


def installed_sglang_version() -> tuple[int, ...] | None:
    """(major, minor, patch) of the installed SGLang, read from its metadata (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("sglang")
    except PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


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


# --------------------------------------------------------------------------------------------
# The typed drafter config


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
        return cls(**{name: _require(config, name, int, where) for name in cls.__annotations__})


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
        """The window in SGLang's convention, or None for full attention everywhere.

        speculators masks `kv_idx > q_idx - sliding_window` (models/eagle3/attention.py:
        create_combined_mask_mod), i.e. `sliding_window` keys including the query's own;
        SGLang's attention backends keep `sliding_window_size + 1` keys (window_left), the
        convention its Gemma/Mistral models follow by passing `sliding_window - 1`.
        """
        if not self.sliding_layers or self.sliding_window is None:
            return None
        return self.sliding_window - 1

    def captured_layers(self, target: TargetInfo) -> list[int]:
        """Target layers (state entering layer k) whose hidden states this drafter consumes."""
        ids = list(self.aux_hidden_state_layer_ids) if self.aux_hidden_state_layer_ids else None
        if self.aux_id_convention == "speculators":
            if ids is None:  # speculators resolves the default against the verifier
                ids = sglang_default_capture(target.num_hidden_layers)
            return ids
        rule = capture_rule_for(model_type=target.model_type, architecture=target.architecture)
        return captured_layers_from_sglang_ids(ids, rule, target.num_hidden_layers)

    def capture_problems(self, target: TargetInfo) -> list[str]:
        if not self.use_aux_hidden_state:
            return [self.no_capture_problem(target.hidden_size)]
        captured = self.captured_layers(target)
        problems = check_capture(
            captured,
            self.num_aux_hidden_states,
            target.num_hidden_layers,
            "aux layers",
            final_state=target.captures_final_state,
        )
        handed = len(set(captured)) * target.hidden_size
        if problems and handed != self.expected_target_feature_width:
            seed = (
                ": one layer as wide as the drafter, where stock SGLang skips fc without a "
                "word and the drafter runs on unfused features (accept length ~1)"
                if handed == self.hidden_size
                else ""
            )
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

    def no_capture_problem(self, target_hidden_size: int) -> str:
        """eagle_config.use_aux_hidden_state false: the seed's failure, as a sentence."""
        seed = (
            ": one layer as wide as the drafter, where stock SGLang skips fc without a word "
            "and the drafter runs on unfused features (accept length ~1)"
            if target_hidden_size == self.hidden_size
            else ""
        )
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
        data = asdict(self)
        data.pop("layer_config")
        return data


def load_drafter_spec(path: str | Path) -> DrafterSpec:
    """Read a drafter directory (or its config.json, or a Hub id) in either format."""
    cfg_file = config_path(model_dir(path)) if _is_hub_id(path) else config_path(path)
    config = read_json(cfg_file)
    if is_speculators_config(config):
        return _speculators_spec(config, cfg_file)
    return _sglang_spec(config, cfg_file)


def _layer_geometry(layer: Mapping[str, Any], where: str) -> dict[str, int]:
    hidden = _require(layer, "hidden_size", int, where)
    heads = _require(layer, "num_attention_heads", int, where)
    if heads <= 0:
        raise DrafterConfigError(f"{where}: field 'num_attention_heads' must be > 0, found {heads}")
    head_dim = _optional(layer, "head_dim", int, where) or hidden // heads
    return {
        "hidden_size": hidden,
        "num_hidden_layers": _require(layer, "num_hidden_layers", int, where),
        "num_attention_heads": heads,
        "num_key_value_heads": _optional(layer, "num_key_value_heads", int, where) or heads,
        "head_dim": head_dim,
        "intermediate_size": _require(layer, "intermediate_size", int, where),
        "vocab_size": _require(layer, "vocab_size", int, where),
    }


def _refuse_biases(layer: Mapping[str, Any], where: str) -> None:
    """Biased projections cannot be served: SGLang's EAGLE-3 draft layer rebuilds its qkv_proj
    with bias=False (llama_eagle3.py) and SGLang's LlamaMLP has no biases (llama.py), so the
    trained biases would be dropped. Said here, by field, not as unexpected tensors."""
    for key, what in (
        ("attention_bias", "q/k/v projections without biases"),
        ("mlp_bias", "gate/up/down projections without biases"),
    ):
        if _flag(layer, key, where):
            raise DrafterConfigError(
                f"{where}: {key} is true, but SGLang's EAGLE-3 draft layer has {what}, so "
                f"the trained biases would be dropped: expected {key} false, found true. "
                "Retrain the drafter without biases."
            )


def _aux_ids(value: Any, where: str, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise DrafterConfigError(
            f"{where}: field '{key}' must be a list of integers, found {value!r}"
        )
    if not value:
        raise DrafterConfigError(f"{where}: field '{key}' is an empty list")
    return tuple(value)


def _speculators_spec(config: Mapping[str, Any], cfg_file: Path) -> DrafterSpec:
    where = str(cfg_file)
    kind = config["speculators_model_type"]
    if kind != "eagle3":
        raise DrafterConfigError(
            f"{where}: speculators_model_type is {kind!r}; only 'eagle3' drafters are served by "
            "SGLang's EAGLE-3 path"
        )
    archs = _architectures(config, where) or ["Eagle3Speculator"]
    if archs[0] not in SPECULATORS_ARCHITECTURES:
        raise DrafterConfigError(
            f"{where}: architectures is {archs}; expected one of {list(SPECULATORS_ARCHITECTURES)}"
        )
    layer = _require(config, "transformer_layer_config", dict, where)
    layer_where = f"{where}: transformer_layer_config"
    layer_type = layer.get("model_type", "qwen3")  # speculators' default layer config is Qwen3
    if layer_type not in SUPPORTED_LAYER_TYPES:
        raise DrafterConfigError(
            f"{layer_where}: model_type {layer_type!r} is not supported; supported draft layer "
            f"types: {list(SUPPORTED_LAYER_TYPES)}"
        )
    geometry = _layer_geometry(layer, layer_where)
    _refuse_biases(layer, layer_where)
    draft_vocab = _require(config, "draft_vocab_size", int, where)
    if draft_vocab > geometry["vocab_size"]:
        raise DrafterConfigError(
            f"{where}: draft_vocab_size {draft_vocab} exceeds the vocab_size "
            f"{geometry['vocab_size']} of transformer_layer_config"
        )
    norm_before_fc = _flag(config, "norm_before_fc", where)
    fc_norm = _flag(config, "fc_norm", where)
    if norm_before_fc and fc_norm:
        raise DrafterConfigError(
            f"{where}: norm_before_fc and fc_norm are both true; speculators treats them as "
            "mutually exclusive (models/eagle3/config.py:_check_norm_flags)"
        )
    aux = _aux_ids(
        config.get("eagle_aux_hidden_state_layer_ids"), where, "eagle_aux_hidden_state_layer_ids"
    )
    layer_types, window = _sliding_window(layer, geometry["num_hidden_layers"], layer_where)
    target_hidden = config.get("target_hidden_size")
    if target_hidden is not None and (not isinstance(target_hidden, int) or target_hidden <= 0):
        raise DrafterConfigError(f"{where}: target_hidden_size must be a positive integer")
    speculators_config = _optional(config, "speculators_config", dict, where) or {}
    config_where = f"{where}: speculators_config"
    proposals = _optional(speculators_config, "proposal_methods", list, config_where) or [{}]
    if not isinstance(proposals[0], dict):
        raise DrafterConfigError(
            f"{config_where}: field 'proposal_methods' must be a list of objects, "
            f"found {proposals!r}"
        )
    verifier = _optional(speculators_config, "verifier", dict, config_where) or {}
    return DrafterSpec(
        format="speculators",
        source=str(cfg_file.parent),
        architecture=archs[0],
        layer_type=layer_type,
        **geometry,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target_hidden,
        aux_hidden_state_layer_ids=aux,
        aux_id_convention="speculators",
        num_aux_hidden_states=len(aux) if aux else 3,
        norm_before_residual=_flag(config, "norm_before_residual", where),
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        norm_output=_flag(config, "norm_output", where),
        embed_requires_grad=_flag(config, "embed_requires_grad", where),
        tie_word_embeddings=False,  # speculators always saves its own lm_head
        attention_bias=False,  # _refuse_biases
        layer_types=layer_types,
        sliding_window=window,
        speculative_tokens=proposals[0].get("speculative_tokens"),
        verifier_name_or_path=verifier.get("name_or_path"),
        dtype=config.get("dtype") or config.get("torch_dtype"),
        layer_config=dict(layer),
    )


def _sliding_window(layer: Mapping[str, Any], num_layers: int, where: str):
    layer_types = _optional(layer, "layer_types", list, where) or []
    if layer_types and len(layer_types) != num_layers:
        raise DrafterConfigError(
            f"{where}: layer_types has {len(layer_types)} entries for {num_layers} layers"
        )
    unknown = [t for t in layer_types if t not in ("full_attention", "sliding_attention")]
    if unknown:
        raise DrafterConfigError(f"{where}: unknown layer_types {unknown}")
    window = layer.get("sliding_window")
    if "sliding_attention" in layer_types and not (isinstance(window, int) and window > 0):
        raise DrafterConfigError(
            f"{where}: layer_types has sliding_attention layers but sliding_window is {window!r}"
        )
    return tuple(layer_types), (window if "sliding_attention" in layer_types else None)


MLA_DRAFTER_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"


def _sglang_spec(config: Mapping[str, Any], cfg_file: Path) -> DrafterSpec:
    where = str(cfg_file)
    archs = _architectures(config, where) or []
    if not archs or archs[0] not in SGLANG_EAGLE3_ARCHITECTURES:
        raise DrafterConfigError(
            f"{where}: not an EAGLE-3 drafter: no 'speculators_model_type' and architectures is "
            f"{archs} (expected one of {list(SGLANG_EAGLE3_ARCHITECTURES)} or a speculators "
            "config)"
        )
    geometry = _layer_geometry(config, where)
    _refuse_biases(config, where)
    eagle = _optional(config, "eagle_config", dict, where) or {}
    aux = _aux_ids(
        eagle.get("eagle_aux_hidden_state_layer_ids"),
        where,
        "eagle_config.eagle_aux_hidden_state_layer_ids",
    )
    num_aux = _optional(config, "num_aux_hidden_states", int, where) or (len(aux) if aux else 3)
    norm_before_fc = bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False)))
    mla = None
    if archs[0] == MLA_DRAFTER_ARCHITECTURE:
        mla = MLAGeometry.from_config(config, where)
        num_aux = _mla_aux_count(config, aux, where)
        if geometry["num_hidden_layers"] != 1:
            raise DrafterConfigError(
                f"{where}: num_hidden_layers is {geometry['num_hidden_layers']}; SGLang's "
                f"{MLA_DRAFTER_ARCHITECTURE} has exactly 1 draft layer"
            )
        if norm_before_fc:
            raise DrafterConfigError(
                f"{where}: norm_before_fc is true, but SGLang's {MLA_DRAFTER_ARCHITECTURE} has "
                "no input norm before fc (kimi_k25_eagle3.py); it would be ignored"
            )
    return DrafterSpec(
        format="sglang",
        source=str(cfg_file.parent),
        architecture=archs[0],
        layer_type="mla" if mla else "llama",
        **geometry,
        draft_vocab_size=_optional(config, "draft_vocab_size", int, where),
        target_hidden_size=_optional(config, "target_hidden_size", int, where),
        aux_hidden_state_layer_ids=aux,
        aux_id_convention="sglang",
        num_aux_hidden_states=int(num_aux),
        use_aux_hidden_state=bool(eagle.get("use_aux_hidden_state", True)),
        norm_before_residual=False,
        norm_before_fc=norm_before_fc,
        fc_norm=bool(config.get("fc_norm") or config.get("use_aux_norm")),
        norm_output=bool(config.get("norm_output", False)),
        embed_requires_grad=False,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=False,
        dtype=config.get("dtype") or config.get("torch_dtype"),
        mla=mla,
        layer_config=dict(config),
    )


def _mla_aux_count(config: Mapping[str, Any], aux, where: str) -> int:
    """kimi_k25_eagle3.py:_get_eagle_aux_layer_count: eagle_config ids, else top-level ids,
    else 3; SGLang's MLA drafter never reads num_aux_hidden_states."""
    if aux is None:
        key = "eagle_aux_hidden_state_layer_ids"
        aux = _aux_ids(config.get(key), where, key)
    count = len(aux) if aux else 3
    stated = config.get("num_aux_hidden_states")
    if stated is not None and stated != count:
        raise DrafterConfigError(
            f"{where}: num_aux_hidden_states is {stated}, but SGLang's "
            f"{MLA_DRAFTER_ARCHITECTURE} sizes fc for {count} aux states (from the aux layer ids)"
        )
    return count


# --------------------------------------------------------------------------------------------
# The config SGLang sees

SPEC_ATTRIBUTE = "sglang_ext_spec"


def sglang_config_dict(spec: DrafterSpec) -> dict[str, Any]:
    """The flat, SGLang-style config for a speculators drafter, as a dict.

    Layer geometry comes from transformer_layer_config; speculators' top-level options keep
    their names where SGLang already reads them (norm_before_fc, fc_norm, norm_output,
    target_hidden_size, draft_vocab_size, eagle_config) and the full typed spec rides along as
    `sglang_ext_spec` for our drafter class. Aux ids stay in speculators' convention, marked
    as such: our capture hook converts them for the target's class (sglang_ids_for_capture).
    """
    if spec.format != "speculators":
        raise ValueError("sglang_config_dict translates speculators drafters only")
    config = {k: v for k, v in spec.layer_config.items() if k not in _LAYER_KEYS_HIDDEN_FROM_SGLANG}
    config.update(
        model_type="llama",
        architectures=[spec.architecture],
        num_aux_hidden_states=spec.num_aux_hidden_states,
        draft_vocab_size=spec.draft_vocab_size,
        norm_before_fc=spec.norm_before_fc,
        fc_norm=spec.fc_norm,
        norm_output=spec.norm_output,
        tie_word_embeddings=False,
        head_dim=spec.head_dim,
        eagle_config={
            "use_aux_hidden_state": True,
            "norm_before_fc": spec.norm_before_fc,
            "eagle_aux_hidden_state_layer_ids": (
                list(spec.aux_hidden_state_layer_ids) if spec.aux_hidden_state_layer_ids else None
            ),
            "aux_id_convention": "speculators",
        },
    )
    if spec.target_hidden_size is not None:
        config["target_hidden_size"] = spec.target_hidden_size
    if spec.dtype is not None:
        config["torch_dtype"] = spec.dtype
    config[SPEC_ATTRIBUTE] = spec.to_json()
    return config


def to_sglang_config(spec: DrafterSpec):
    """A transformers LlamaConfig carrying the translated config (what get_config returns)."""
    from transformers import LlamaConfig

    data = sglang_config_dict(spec)
    data.pop("model_type")
    config = LlamaConfig(**data)
    config._name_or_path = spec.source
    return config


def drafter_spec_for(config) -> DrafterSpec:
    """The typed spec of the drafter SGLang builds from `config`: attached by the speculators
    translation, or read from the SGLang-format config itself."""
    spec = spec_from_hf_config(config)
    if spec is not None:
        return spec
    source = getattr(config, "_name_or_path", "") or "<drafter>"
    return _sglang_spec(config.to_dict(), config_path(source) if source else config_path("."))


def spec_from_hf_config(config) -> DrafterSpec | None:
    """The DrafterSpec our translation attached to an SGLang-side config, if any."""
    data = getattr(config, SPEC_ATTRIBUTE, None)
    if not data:
        return None
    data = dict(data)
    for key in ("aux_hidden_state_layer_ids", "layer_types"):
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    if data.get("mla") is not None:
        data["mla"] = MLAGeometry(**data["mla"])
    return DrafterSpec(**data)


# --------------------------------------------------------------------------------------------
# The checkpoint-key table
#
# One rule per line: a regex over checkpoint names, the model parameter it fills (with the
# stacked shard id SGLang's weight loaders take), and for which formats it applies. Layers are
# numbered with {n}; the function expands `first`/`rest` for layer 0 and layers >= 1.


@dataclass(frozen=True)
class KeyRule:
    pattern: str  # checkpoint name; {n} = layer index
    param: str  # model parameter; {n} = layer index
    shard: str | int | None = None
    layers: Literal["any", "first", "rest"] = "any"
    formats: tuple[str, ...] = ("speculators", "sglang")
    note: str = ""


KEY_TABLE: tuple[KeyRule, ...] = (
    KeyRule("fc.weight", "model.fc.weight"),
    KeyRule("input_norm.weight", "model.input_norm.weight", note="norm_before_fc"),
    KeyRule("fc_norm.{n}.weight", "model.fc_norm.{n}.weight", note="fc_norm (per aux state)"),
    KeyRule("norm.weight", "model.norm.weight"),
    KeyRule("lm_head.weight", "lm_head.weight"),
    KeyRule("embed_tokens.weight", "model.embed_tokens.weight"),
    KeyRule(
        "layers.{n}.self_attn.q_proj.weight", "model.layers.{n}.self_attn.qkv_proj.weight", "q"
    ),
    KeyRule(
        "layers.{n}.self_attn.k_proj.weight", "model.layers.{n}.self_attn.qkv_proj.weight", "k"
    ),
    KeyRule(
        "layers.{n}.self_attn.v_proj.weight", "model.layers.{n}.self_attn.qkv_proj.weight", "v"
    ),
    KeyRule("layers.{n}.self_attn.o_proj.weight", "model.layers.{n}.self_attn.o_proj.weight"),
    KeyRule(
        "layers.{n}.self_attn.q_norm.weight",
        "model.layers.{n}.self_attn.q_norm.weight",
        formats=("speculators",),
        note="qwen3 draft layers",
    ),
    KeyRule(
        "layers.{n}.self_attn.k_norm.weight",
        "model.layers.{n}.self_attn.k_norm.weight",
        formats=("speculators",),
        note="qwen3 draft layers",
    ),
    KeyRule("layers.{n}.mlp.gate_proj.weight", "model.layers.{n}.mlp.gate_up_proj.weight", 0),
    KeyRule("layers.{n}.mlp.up_proj.weight", "model.layers.{n}.mlp.gate_up_proj.weight", 1),
    KeyRule("layers.{n}.mlp.down_proj.weight", "model.layers.{n}.mlp.down_proj.weight"),
    KeyRule(
        "layers.{n}.post_attention_layernorm.weight",
        "model.layers.{n}.post_attention_layernorm.weight",
    ),
    KeyRule(
        "layers.{n}.hidden_norm.weight",
        "model.layers.{n}.hidden_norm.weight",
        layers="first",
        formats=("speculators",),
    ),
    KeyRule(
        "layers.{n}.input_layernorm.weight",
        "model.layers.{n}.input_layernorm.weight",
        layers="first",
        formats=("speculators",),
        note="normalises the token embeddings",
    ),
    # speculators' layers >= 1 are ordinary decoder layers: they normalise their input with
    # input_layernorm. SGLang's eagle3 layers >= 1 fuse that add+norm into `hidden_norm`.
    KeyRule(
        "layers.{n}.input_layernorm.weight",
        "model.layers.{n}.hidden_norm.weight",
        layers="rest",
        formats=("speculators",),
        note="speculators layers >= 1 normalise with input_layernorm; SGLang names it hidden_norm",
    ),
    KeyRule(
        "layers.{n}.hidden_norm.weight", "model.layers.{n}.hidden_norm.weight", formats=("sglang",)
    ),
    KeyRule(
        "layers.{n}.input_layernorm.weight",
        "model.layers.{n}.input_layernorm.weight",
        formats=("sglang",),
    ),
)

# SGLang-format dialect renames (llama_eagle3.py:load_weights legacy_name_map), as data.
SGLANG_LEGACY_PREFIXES: tuple[tuple[str, str], ...] = (
    ("midlayer.", "layers.0."),
    ("aux_norm_low.", "fc_norm.0."),
    ("aux_norm_mid.", "fc_norm.1."),
    ("aux_norm_high.", "fc_norm.2."),
)


# SGLang's MLA drafter (kimi_k25_eagle3.py:Eagle3DeepseekV2ForCausalLM.load_weights): one draft
# layer, `layers.0.` in the checkpoint and `model.midlayer.` in the model; q_a_proj and
# kv_a_proj_with_mqa are stacked (q first) into fused_qkv_a_proj_with_mqa, whose input is
# cat(embeds, hidden), twice the hidden size.
_MLA = "model.midlayer."
MLA_KEY_TABLE: tuple[KeyRule, ...] = (
    KeyRule("fc.weight", "model.fc.weight"),
    KeyRule("fc_norm.{n}.weight", "model.fc_norm.{n}.weight", note="fc_norm (per aux state)"),
    KeyRule("norm.weight", "model.norm.weight"),
    KeyRule("lm_head.weight", "lm_head.weight"),
    KeyRule("embed_tokens.weight", "model.embed_tokens.weight"),
    KeyRule(
        "layers.{n}.self_attn.q_a_proj.weight",
        _MLA + "self_attn.fused_qkv_a_proj_with_mqa.weight",
        "q_a",
        layers="first",
    ),
    KeyRule(
        "layers.{n}.self_attn.kv_a_proj_with_mqa.weight",
        _MLA + "self_attn.fused_qkv_a_proj_with_mqa.weight",
        "kv_a",
        layers="first",
    ),
    *(
        KeyRule(f"layers.{{n}}.{name}.weight", f"{_MLA}{name}.weight", layers="first")
        for name in (
            "self_attn.q_a_layernorm",
            "self_attn.q_b_proj",
            "self_attn.kv_a_layernorm",
            "self_attn.kv_b_proj",
            "self_attn.o_proj",
            "mlp.down_proj",
            "input_layernorm",
            "hidden_norm",
            "post_attention_layernorm",
        )
    ),
    KeyRule("layers.{n}.mlp.gate_proj.weight", _MLA + "mlp.gate_up_proj.weight", 0, "first"),
    KeyRule("layers.{n}.mlp.up_proj.weight", _MLA + "mlp.gate_up_proj.weight", 1, "first"),
)


def _compile(rule: KeyRule) -> re.Pattern:
    return re.compile("^" + re.escape(rule.pattern).replace(r"\{n\}", r"(?P<n>\d+)") + "$")


_COMPILED = {
    "layers": tuple((rule, _compile(rule)) for rule in KEY_TABLE),
    "mla": tuple((rule, _compile(rule)) for rule in MLA_KEY_TABLE),
}


def canonical_checkpoint_name(name: str, fmt: str, mla: bool = False) -> str:
    """Strip SGLang-dialect prefixes (`model.`, `midlayer.`) to the table's names. SGLang's MLA
    drafter reads its checkpoint's names as they are (it adds `model.` itself)."""
    if fmt == "sglang" and not mla:
        if name.startswith("model."):
            name = name[len("model.") :]
        for old, new in SGLANG_LEGACY_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old) :]
    return name


def route(
    name: str, fmt: str, layer_type: str = "llama"
) -> tuple[str, str | int | None, KeyRule] | None:
    """The (model parameter, shard id, rule) a checkpoint tensor fills, or None if no rule."""
    mla = layer_type == "mla"
    canonical = canonical_checkpoint_name(name, fmt, mla)
    for rule, regex in _COMPILED["mla" if mla else "layers"]:
        if fmt not in rule.formats:
            continue
        match = regex.match(canonical)
        if not match:
            continue
        n = match.groupdict().get("n")
        if n is not None and rule.layers != "any" and "layers." in rule.pattern:
            if (rule.layers == "first") != (int(n) == 0):
                continue
        return rule.param.replace("{n}", n) if n is not None else rule.param, rule.shard, rule
    return None
