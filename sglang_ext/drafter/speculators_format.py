"""Read an EAGLE-3 drafter directory, either format, into one DrafterSpec; translate it for SGLang.

speculators (0.9.0, ``speculators/models/eagle3/config.py:Eagle3SpeculatorConfig``) saves a
drafter as a ``config.json`` with ``speculators_model_type: "eagle3"`` and no ``model_type``,
a nested ``transformer_layer_config`` and options SGLang has no name for. This module detects
and reads such a directory (or an SGLang-format EAGLE-3 directory) into one typed, validated
object, :class:`~sglang_ext.drafter.drafter_spec.DrafterSpec`, once, translates it into the config
SGLang sees, and reads it back from that config in the drafter class. (vLLM splits its
speculators support the same way: detect + read, then one updater per algorithm.)

Nothing here imports SGLang or torch, so ``sglang-ext doctor`` runs anywhere. Config files are
parsed as JSON data: the ``config.py`` that speculators writes beside ``config.json`` (with
``auto_map``) is never imported.

The typed object lives in :mod:`sglang_ext.drafter.drafter_spec`, the aux-layer capture
conventions in :mod:`sglang_ext.drafter.aux_capture`, the checkpoint-key tables in
:mod:`sglang_ext.drafter.key_table`, and locating a model (directory, config.json, Hub id) in
:mod:`sglang_ext.drafter.model_paths`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_ext.drafter import architecture_aliases
from sglang_ext.drafter.config_fields import (
    DrafterConfigError,
    architectures_field,
    flag_field,
    optional_field,
    read_json,
    require_field,
    size_field,
)
from sglang_ext.drafter.drafter_spec import DrafterSpec, MLAGeometry
from sglang_ext.drafter.model_paths import config_path, is_hub_id, model_dir

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


def load_drafter_spec(path: str | Path) -> DrafterSpec:
    """Read a drafter directory (or its config.json, or a Hub id) in either format."""
    cfg_file = config_path(model_dir(path)) if is_hub_id(path) else config_path(path)
    config = read_json(cfg_file)
    if is_speculators_config(config):
        return _speculators_spec(config, cfg_file)
    return _sglang_spec(config, cfg_file)


def _layer_geometry(layer: Mapping[str, Any], where: str) -> dict[str, int]:
    def size(key: str, required: bool = True) -> int | None:
        return size_field(layer, key, where, required)

    hidden, heads = size("hidden_size"), size("num_attention_heads")
    head_dim = size("head_dim", required=False) or hidden // heads
    kv_heads = size("num_key_value_heads", required=False) or heads
    if heads % kv_heads:
        raise DrafterConfigError(
            f"{where}: field 'num_key_value_heads' must divide num_attention_heads {heads}, "
            f"found {kv_heads}"
        )
    return {
        "hidden_size": hidden,
        "num_hidden_layers": size("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": size("intermediate_size"),
        "vocab_size": size("vocab_size"),
    }


# the dtypes a checkpoint's config may name (HF's torch_dtype / dtype, "torch." prefix allowed)
CONFIG_DTYPES = ("bfloat16", "float16", "float32", "float64", "auto")


def _dtype_field(config: Mapping[str, Any], where: str) -> str | None:
    """``dtype`` (transformers >= 4.56) or ``torch_dtype``: a dtype name or absent."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if value is None:
            continue
        name = value.removeprefix("torch.") if isinstance(value, str) else None
        if name not in CONFIG_DTYPES:
            raise DrafterConfigError(
                f"{where}: field '{key}' must be one of {list(CONFIG_DTYPES)}, found {value!r}"
            )
        return value
    return None


def _refuse_biases(layer: Mapping[str, Any], where: str) -> None:
    """Biased projections cannot be served: SGLang's EAGLE-3 draft layer rebuilds its qkv_proj
    with bias=False (llama_eagle3.py) and SGLang's LlamaMLP has no biases (llama.py), so the
    trained biases would be dropped. Said here, by field, not as unexpected tensors."""
    for key, what in (
        ("attention_bias", "q/k/v projections without biases"),
        ("mlp_bias", "gate/up/down projections without biases"),
    ):
        if flag_field(layer, key, where):
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
    archs = architectures_field(config, where) or ["Eagle3Speculator"]
    if archs[0] not in SPECULATORS_ARCHITECTURES:
        raise DrafterConfigError(
            f"{where}: architectures is {archs}; expected one of {list(SPECULATORS_ARCHITECTURES)}"
        )
    layer = require_field(config, "transformer_layer_config", dict, where)
    layer_where = f"{where}: transformer_layer_config"
    layer_type = layer.get("model_type", "qwen3")  # speculators' default layer config is Qwen3
    if layer_type not in SUPPORTED_LAYER_TYPES:
        raise DrafterConfigError(
            f"{layer_where}: model_type {layer_type!r} is not supported; supported draft layer "
            f"types: {list(SUPPORTED_LAYER_TYPES)}"
        )
    geometry = _layer_geometry(layer, layer_where)
    _refuse_biases(layer, layer_where)
    draft_vocab = size_field(config, "draft_vocab_size", where)
    if draft_vocab > geometry["vocab_size"]:
        raise DrafterConfigError(
            f"{where}: draft_vocab_size {draft_vocab} exceeds the vocab_size "
            f"{geometry['vocab_size']} of transformer_layer_config"
        )
    norm_before_fc = flag_field(config, "norm_before_fc", where)
    fc_norm = flag_field(config, "fc_norm", where)
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
    speculators_config = optional_field(config, "speculators_config", dict, where) or {}
    config_where = f"{where}: speculators_config"
    proposals = optional_field(speculators_config, "proposal_methods", list, config_where) or [{}]
    if not isinstance(proposals[0], dict):
        raise DrafterConfigError(
            f"{config_where}: field 'proposal_methods' must be a list of objects, "
            f"found {proposals!r}"
        )
    verifier = optional_field(speculators_config, "verifier", dict, config_where) or {}
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
        norm_before_residual=flag_field(config, "norm_before_residual", where),
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        norm_output=flag_field(config, "norm_output", where),
        embed_requires_grad=flag_field(config, "embed_requires_grad", where),
        tie_word_embeddings=False,  # speculators always saves its own lm_head
        attention_bias=False,  # _refuse_biases
        layer_types=layer_types,
        sliding_window=window,
        speculative_tokens=proposals[0].get("speculative_tokens"),
        verifier_name_or_path=verifier.get("name_or_path"),
        dtype=_dtype_field(config, where),
        layer_config=dict(layer),
    )


def _sliding_window(layer: Mapping[str, Any], num_layers: int, where: str):
    layer_types = optional_field(layer, "layer_types", list, where) or []
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
    archs = list(architectures_field(config, where) or [])
    if archs:
        archs[0] = architecture_aliases.canonical(archs[0])
    if not archs or archs[0] not in SGLANG_EAGLE3_ARCHITECTURES:
        hint = architecture_aliases.rename_hint(archs[0], SGLANG_EAGLE3_ARCHITECTURES) if (
            archs
        ) else ""
        raise DrafterConfigError(
            f"{where}: not an EAGLE-3 drafter: no 'speculators_model_type' and architectures is "
            f"{archs} (expected one of {list(SGLANG_EAGLE3_ARCHITECTURES)} or a speculators "
            "config)" + (f"; {hint}" if hint else "")
        )
    geometry = _layer_geometry(config, where)
    _refuse_biases(config, where)
    eagle = optional_field(config, "eagle_config", dict, where) or {}
    aux = _aux_ids(
        eagle.get("eagle_aux_hidden_state_layer_ids"),
        where,
        "eagle_config.eagle_aux_hidden_state_layer_ids",
    )
    num_aux = size_field(config, "num_aux_hidden_states", where, required=False) or (
        len(aux) if aux else 3
    )
    eagle_where = f"{where}: eagle_config"
    norm_before_fc = (
        flag_field(eagle, "norm_before_fc", eagle_where)
        if eagle.get("norm_before_fc") is not None
        else flag_field(config, "norm_before_fc", where)
    )
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
        draft_vocab_size=size_field(config, "draft_vocab_size", where, required=False),
        target_hidden_size=size_field(config, "target_hidden_size", where, required=False),
        aux_hidden_state_layer_ids=aux,
        aux_id_convention="sglang",
        num_aux_hidden_states=int(num_aux),
        use_aux_hidden_state=flag_field(eagle, "use_aux_hidden_state", eagle_where, default=True),
        norm_before_residual=False,
        norm_before_fc=norm_before_fc,
        fc_norm=flag_field(config, "fc_norm", where) or flag_field(config, "use_aux_norm", where),
        norm_output=flag_field(config, "norm_output", where),
        embed_requires_grad=False,
        tie_word_embeddings=flag_field(config, "tie_word_embeddings", where),
        attention_bias=False,
        dtype=_dtype_field(config, where),
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
    ids = list(spec.aux_hidden_state_layer_ids) if spec.aux_hidden_state_layer_ids else None
    config = _flat_config(
        spec,
        spec.architecture,
        {"eagle_aux_hidden_state_layer_ids": ids, "aux_id_convention": "speculators"},
        num_aux_hidden_states=spec.num_aux_hidden_states,
    )
    config[SPEC_ATTRIBUTE] = spec.to_json()
    return config


def stock_sglang_config_dict(spec: DrafterSpec, sglang_ids: list[int]) -> dict[str, Any]:
    """The config.json of a speculators drafter converted for stock SGLang (``sglang-ext
    convert``): the same translation, aux ids already in SGLang's convention (``sglang_ids``)
    and nothing only the plugin reads."""
    return _flat_config(
        spec, "LlamaForCausalLMEagle3", {"eagle_aux_hidden_state_layer_ids": sglang_ids}
    )


def _flat_config(spec: DrafterSpec, architecture: str, eagle: dict, **extra) -> dict[str, Any]:
    """Layer geometry from transformer_layer_config, speculators' top-level options under the
    names SGLang reads, and ``eagle_config`` (``eagle`` plus the two flags SGLang reads)."""
    config = {k: v for k, v in spec.layer_config.items() if k not in _LAYER_KEYS_HIDDEN_FROM_SGLANG}
    config.update(
        model_type="llama",
        architectures=[architecture],
        **extra,
        draft_vocab_size=spec.draft_vocab_size,
        norm_before_fc=spec.norm_before_fc,
        fc_norm=spec.fc_norm,
        norm_output=spec.norm_output,
        tie_word_embeddings=False,
        head_dim=spec.head_dim,
        eagle_config={
            "use_aux_hidden_state": True, "norm_before_fc": spec.norm_before_fc, **eagle
        },
    )
    if spec.target_hidden_size is not None:
        config["target_hidden_size"] = spec.target_hidden_size
    if spec.dtype is not None:
        config["torch_dtype"] = spec.dtype
    return config


def served_config_dict(spec: DrafterSpec) -> dict[str, Any]:
    """The config SGLang builds the drafter from: translated (speculators) or its own."""
    return sglang_config_dict(spec) if spec.format == "speculators" else dict(spec.layer_config)


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
    return DrafterSpec.from_json(data) if data else None
