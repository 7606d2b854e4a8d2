"""The checkpoint-key tables: which model parameter each checkpoint tensor fills, as data.

One table for the Llama/Qwen3 drafter (speculators and SGLang names, SGLang's legacy
prefixes) and one for SGLang's MLA drafter, read through :func:`route`. Like vLLM's
``WeightsMapper``, a checkpoint dialect here is a declarative table, testable on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# --------------------------------------------------------------------------------------------
# The checkpoint-key table
#
# One rule per line: a regex over checkpoint names, the model parameter it fills (with the
# stacked shard id SGLang's weight loaders take), and for which formats it applies. Layers are
# numbered with {n}; the function expands `first`/`rest` for layer 0 and layers >= 1. `stock`
# is the checkpoint name stock SGLang's llama drafter reads the tensor under (SAME: unchanged;
# None: stock has no such parameter), which `sglang-ext convert` writes.
SAME = "same"


@dataclass(frozen=True)
class KeyRule:
    pattern: str  # checkpoint name; {n} = layer index
    param: str  # model parameter; {n} = layer index
    shard: str | int | None = None
    layers: Literal["any", "first", "rest"] = "any"
    formats: tuple[str, ...] = ("speculators", "sglang")
    note: str = ""
    stock: str | None = SAME  # the name stock SGLang reads it under; None: it has none


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
    *(
        KeyRule(
            f"layers.{{n}}.self_attn.{norm}.weight",
            f"model.layers.{{n}}.self_attn.{norm}.weight",
            formats=("speculators",),
            note="qwen3 draft layers",
            stock=None,  # stock SGLang's llama layers have no q_norm/k_norm
        )
        for norm in ("q_norm", "k_norm")
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
        stock="layers.{n}.hidden_norm.weight",
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


def stock_checkpoint_name(name: str, fmt: str = "speculators") -> str | None:
    """The name a checkpoint tensor takes for stock SGLang's llama drafter (the key table's
    ``stock`` column; a name no rule routes is kept), or None where stock has no parameter."""
    routed = route(name, fmt)
    if routed is None or routed[2].stock == SAME:
        return name
    rule = routed[2]
    if rule.stock is None:
        return None
    n = _compile(rule).match(canonical_checkpoint_name(name, fmt)).groupdict().get("n")
    return rule.stock.replace("{n}", n) if n is not None else rule.stock
