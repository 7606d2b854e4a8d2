"""A drafter's context length against its target's: what SGLang derives, and what we serve.

SGLang builds the draft model's ``ModelConfig`` with the target's ``context_len`` (0.5.23
``speculative/eagle_worker_v2.py`` and ``draft_worker_common.py``: "the draft runs at absolute
target positions") and ``configs/model_config.py:ModelConfig._derive_context_length`` compares
it with the length derived from the drafter's own config
(``utils/hf_transformers/common.py:get_context_length``). A drafter below the target is a
``ValueError`` at startup unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``; published
Llama-3.1-8B drafters say 2048 beside a 131072 target.

The plugin serves such an EAGLE-3 drafter on purpose, as SGLang's own override does: a rope
drafter has no hard position limit (its rotary cache is sized from ``max_position_embeddings``,
which is raised to the target's length), but beyond the length it was trained on its
acceptance may fall, which the per-position acceptance metrics show; outputs stay lossless
since the target verifies every token. One sentence (:func:`context_warning`) says so, at
startup and in doctor.

Nothing here imports SGLang or torch: doctor reads config.json as data with the same rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

# utils/hf_transformers/common.py:CONTEXT_LENGTH_KEYS, in its order of preference.
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
# get_context_length's answer for a config with none of the keys; also transformers'
# LlamaConfig default for max_position_embeddings (the class our translated config is).
DEFAULT_CONTEXT_LENGTH = 2048
OVERRIDE_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


class ContextLengthError(ValueError):
    """A context-length field SGLang cannot read as a number (it would fail on it too)."""


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ContextLengthError(f"field {key!r} must be a positive number, found {value!r}")
    return value


def derived_context_length(get: Callable[[str], Any]) -> tuple[int, str | None]:
    """(length, field) as SGLang's get_context_length derives it from a config read by `get`:
    the first key present, times rope_scaling's factor unless the scaling keeps the original
    positions (original_max_position_embeddings, or rope_type llama3). field None: default."""
    rope_scaling = get("rope_scaling")
    factor = 1
    if isinstance(rope_scaling, Mapping) and rope_scaling:
        factor = _number(rope_scaling.get("factor", 1), "rope_scaling.factor")
        if "original_max_position_embeddings" in rope_scaling:
            factor = 1
        if rope_scaling.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = get(key)
        if value is not None:
            return int(factor * _number(value, key)), key
    return DEFAULT_CONTEXT_LENGTH, None


def from_mapping(config: Mapping[str, Any]) -> tuple[int, str | None]:
    return derived_context_length(config.get)


def target_text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """SGLang's hf_text_config of a target: the language model's config of a multimodal one."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def drafter_context(served_config: Mapping[str, Any], speculators: bool) -> tuple[int, str | None]:
    """(length, field) of a drafter from the config SGLang builds it from (the translated one
    for a speculators drafter, whose layer config keeps the field nested)."""
    length, field_name = from_mapping(served_config)
    if field_name is not None and speculators:
        field_name = f"transformer_layer_config.{field_name}"
    return length, field_name


def override_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """SGLang's EnvBool reading of SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN (environ.py)."""
    value = (environ if environ is not None else os.environ).get(OVERRIDE_ENV, "")
    return value.lower() in ("true", "1", "yes", "y")


def context_warning(
    drafter_length: int, drafter_file: str, drafter_field: str | None, target_length: int
) -> str | None:
    """The one sentence (startup WARNING and doctor warning) for a drafter shorter than the
    context it is served at; None when it is not."""
    if target_length <= drafter_length:
        return None
    where = f"{drafter_file}: {drafter_field}" if drafter_field else (
        f"{drafter_file} (no {'/'.join(CONTEXT_LENGTH_KEYS)}: SGLang's default)"
    )
    return (
        f"drafter context length {drafter_length} ({where}) is below the target's context "
        f"length {target_length}: sglang_ext serves the drafter at {target_length} positions "
        f"on purpose (stock SGLang refuses it at startup unless {OVERRIDE_ENV}=1), so its "
        f"acceptance may fall beyond the {drafter_length} positions it was trained on (see "
        f"the per-position acceptance metrics; outputs stay lossless). To serve within the "
        f"trained length, start the server with --context-length {drafter_length}; or use a "
        f"drafter trained on longer sequences"
    )


def stock_refusal(drafter_length: int, target_length: int) -> str:
    """What stock SGLang raises (configs/model_config.py:_derive_context_length), abridged."""
    return (
        f"ValueError: Warning: Target model's context_length ({target_length}) is greater than "
        f"the derived context_length ({drafter_length}). ... To allow overriding this maximum, "
        f"set the env var {OVERRIDE_ENV}=1"
    )
