"""What verifying n tokens at once costs an MoE target beyond one decode step: expert fan-out.

At batch 1 a decode step is bound by the weight bytes it reads. One token reads its top-k
routed experts per MoE layer; a verify pass over n draft tokens reads every expert any of them
routes to -- with N experts and uniform routing, N * (1 - (1 - k/N) ** n) of them. A dense
target reads the same weights for 1 token or n, so this term is zero there.

A zero-acceptance probe with ``--load-format dummy`` does not see the term:
``sglang/srt/model_loader/weight_utils.py:initialize_dummy_weights`` fills every weight,
norms and router included, with U(-1e-3, 1e-3), so the router's scores are all ~sigmoid(0)
and its correction bias picks the same experts for every token. Measured on one H200 at one
TP8 rank of Kimi-K2.5's shape (8 routed top-2, issue #24, 2026-12-02): chain 3/1/4 costs 1.123
decode steps on dummy weights and 1.370 with the trained ones; this term predicts 0.246 of
the 0.247 difference.

The estimate is one of bytes only (``extra_decode_steps``: the fan-out's expert bytes over
the bytes one decode step reads, for the part of the model one GPU holds at tensor
parallelism ``tp``): it is the time share where a decode step is bound by its weight reads
(the one-GPU fixture above), less where the step also waits on communication (TP across
GPUs). It ignores KV-cache reads (small at short contexts) and assumes uniform routing.
Weights are bf16 unless ``quantization_config`` says otherwise (``weight_bytes``): Kimi-K2.5
ships compressed-tensors int4 for everything but attention and lm_head, DeepSeek-V3 fp8.
DeepSeek-V3-family configs (DeepSeek-V3, Kimi-K2.5's ``text_config``) are read; another MoE
layout or quantization method is refused by name rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_ext.cli import exit_codes


class FanoutConfigError(exit_codes.InputError):
    """A target config.json whose MoE layout cannot be read (names the field)."""


_MOE_MARKERS = ("n_routed_experts", "num_experts", "num_local_experts")


def _int(cfg: Mapping[str, Any], name: str, where: str, least: int = 1) -> int:
    value = cfg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        kind = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise FanoutConfigError(f"{where}: field {name!r} must be {kind}, found {value!r}")
    return value


def _optional_int(cfg: Mapping[str, Any], name: str, where: str) -> int:
    """A count a config may leave out or set to null (DeepSeek-V2-Lite's q_lora_rank): 0."""
    return 0 if cfg.get(name) is None else _int(cfg, name, where, least=0)


@dataclass(frozen=True)
class WeightBytes:
    """Bytes per parameter of the MLP (dense, shared and routed experts), the attention and
    lm_head weights."""

    mlp: float = 2.0
    attention: float = 2.0
    lm_head: float = 2.0


def weight_bytes(cfg: Mapping[str, Any], where: str) -> WeightBytes:
    quant = cfg.get("quantization_config")
    if quant is None or quant == {}:
        return WeightBytes()
    if not isinstance(quant, Mapping):
        raise FanoutConfigError(
            f"{where}: field 'quantization_config' must be an object with a 'quant_method', "
            f"found {quant!r}"
        )
    method = quant.get("quant_method")
    if method == "fp8":  # DeepSeek-V3's block fp8: every linear layer but lm_head
        return WeightBytes(mlp=1.0, attention=1.0)
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        if not isinstance(groups, Mapping):
            raise FanoutConfigError(
                f"{where}: quantization_config.config_groups must be an object of named groups "
                f"(each with its 'weights'), found {groups!r}"
            )
        for name, group in groups.items():
            if not (isinstance(group, Mapping) and isinstance(group.get("weights") or {}, Mapping)):
                raise FanoutConfigError(
                    f"{where}: quantization_config.config_groups[{name!r}] must be an object "
                    f"whose 'weights' is an object, found {group!r}"
                )
        bits = {g["weights"].get("num_bits") for g in groups.values() if g.get("weights")}
        width = next(iter(bits)) if len(bits) == 1 else None
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise FanoutConfigError(
                f"{where}: quantization_config.config_groups: expected one weights.num_bits "
                f"(a positive integer), found {sorted(map(str, bits))}"
            )
        ignore = quant.get("ignore") or []
        if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
            raise FanoutConfigError(
                f"{where}: quantization_config.ignore must be a list of module names or 're:' "
                f"patterns, found {ignore!r}"
            )
        width /= 8
        ignored = " ".join(ignore)
        return WeightBytes(
            mlp=width,
            attention=2.0 if "self_attn" in ignored else width,
            lm_head=2.0 if "lm_head" in ignored else width,
        )
    raise FanoutConfigError(
        f"{where}: quantization_config.quant_method {method!r} is not modelled (bf16, 'fp8' "
        "and 'compressed-tensors' are)"
    )


@dataclass(frozen=True)
class MoeFanout:
    moe_layers: int
    experts: int
    experts_per_token: int
    expert_bytes: float  # one routed expert's gate, up and down on this GPU
    decode_bytes: float  # what one decode step reads on this GPU

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str, tp: int = 1) -> MoeFanout | None:
        """None for a dense target; the DeepSeek-V3 family's fields otherwise."""
        if not isinstance(config, Mapping):
            raise FanoutConfigError(
                f"{where}: expected a JSON object (the target's config.json), found {config!r:.60}"
            )
        cfg = config.get("text_config")  # Kimi-K2.5 nests its DeepSeek-V3 text model
        if cfg is None:  # absent or null: the text model is the config itself
            cfg = config
        elif not isinstance(cfg, Mapping):
            raise FanoutConfigError(
                f"{where}: field 'text_config' must be an object (the nested text model's "
                f"config, as Kimi-K2.5 ships it) or null, found {cfg!r}"
            )
        if not any(k in cfg for k in _MOE_MARKERS):
            return None
        if "n_routed_experts" not in cfg or "kv_lora_rank" not in cfg:
            found = next(k for k in _MOE_MARKERS if k in cfg)
            raise FanoutConfigError(
                f"{where}: an MoE config ({found!r}) outside the DeepSeek-V3 family (no "
                "'n_routed_experts' with MLA 'kv_lora_rank'); its verify fan-out is not modelled"
            )
        f = {
            k: _int(cfg, k, where)
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "n_routed_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "intermediate_size",
                "num_attention_heads",
                "kv_lora_rank",
                "qk_rope_head_dim",
                "qk_nope_head_dim",
                "v_head_dim",
                "vocab_size",
            )
        }
        f["first_k_dense_replace"] = _int(cfg, "first_k_dense_replace", where, least=0)
        if f["num_experts_per_tok"] > f["n_routed_experts"]:
            raise FanoutConfigError(
                f"{where}: field 'num_experts_per_tok' is {f['num_experts_per_tok']}, more than "
                f"n_routed_experts {f['n_routed_experts']} (a token routes to k of the N experts)"
            )
        q_lora = _optional_int(cfg, "q_lora_rank", where)
        shared = _optional_int(cfg, "n_shared_experts", where)
        if tp < 1 or f["num_attention_heads"] % tp or f["moe_intermediate_size"] % tp:
            raise FanoutConfigError(
                f"{where}: tensor parallelism {tp} does not divide num_attention_heads "
                f"{f['num_attention_heads']} and moe_intermediate_size {f['moe_intermediate_size']}"
            )
        h, heads = f["hidden_size"], f["num_attention_heads"] // tp
        qk = f["qk_nope_head_dim"] + f["qk_rope_head_dim"]
        q = q_lora * h + heads * qk * q_lora if q_lora else heads * qk * h
        attention = (
            q
            + (f["kv_lora_rank"] + f["qk_rope_head_dim"]) * h
            + heads * (f["qk_nope_head_dim"] + f["v_head_dim"]) * f["kv_lora_rank"]
            + h * heads * f["v_head_dim"]
        )
        size = weight_bytes(cfg, where)
        expert = 3 * h * f["moe_intermediate_size"] // tp * size.mlp
        dense_layers = min(f["first_k_dense_replace"], f["num_hidden_layers"])
        moe_layers = f["num_hidden_layers"] - dense_layers
        per_token = f["num_experts_per_tok"]
        decode = (
            f["num_hidden_layers"] * attention * size.attention
            + dense_layers * 3 * h * f["intermediate_size"] // tp * size.mlp
            + moe_layers * (per_token + shared) * expert
            + f["vocab_size"] * h // tp * size.lm_head
        )
        return cls(moe_layers, f["n_routed_experts"], per_token, expert, decode)

    def distinct_experts(self, tokens: int) -> float:
        """Expected experts per MoE layer that ``tokens`` tokens route to (uniform routing)."""
        n, k = self.experts, self.experts_per_token
        return n * (1.0 - (1.0 - k / n) ** tokens)

    def extra_decode_steps(self, tokens: int) -> float:
        """A verify pass over ``tokens`` tokens reads this many decode steps' worth of weights
        more than one token's experts."""
        fresh = self.distinct_experts(tokens) - self.experts_per_token
        return self.moe_layers * fresh * self.expert_bytes / self.decode_bytes
