"""Function-preserving widening of a trained DeepSeek-V3-class (MLA + MoE) target to the width
of one tensor-parallel rank of Kimi-K2.5 (hidden 7168, DeepSeek-V3's MLA latent), so speed is
measured at the seed's cost ratios with a model that still predicts what the small trained one
predicts.

The rules of :mod:`sglang_ext_tools.widen` (zero-padded widths, RMSNorm weights divided by
sqrt(r) and ``rms_norm_eps`` by r), per axis of the MLA + MoE layer:

- ``hidden`` (residual stream), ``qlora`` (``q_lora_rank``: q_a_proj rows, q_b_proj
  columns, q_a_layernorm), ``inter`` (the dense first layers' MLP), ``minter`` (each
  routed expert's MLP), ``sinter`` (the shared experts', ``moe_intermediate_size`` x
  ``n_shared_experts``) are padded with zeros; padded MLP rows of gate/up meet zero columns of
  down, so they add nothing;
- the MLA latent (``kvlora``: kv_a_proj_with_mqa's latent rows, kv_b_proj columns,
  kv_a_layernorm) and, per head, ``qk_nope_head_dim``, ``qk_rope_head_dim`` and
  ``v_head_dim`` (``q_heads``: q_b_proj rows; ``kv_heads``: kv_b_proj rows; ``o_heads``:
  o_proj columns; ``kv_a``: kv_a_proj_with_mqa rows, latent then the shared RoPE key) are
  padded with zeros too: a zero nope or rope dimension adds nothing to q.k, a zero value
  dimension meets a zero o_proj column. Two things are not zeros:
  - RoPE: a rope width r -> r' keeps each trained pair on its frequency when the padding sits
    after the trained pairs (interleaved pairs, DeepSeek's default ``rope_interleave``; the
    neox layout pads each half) and ``rope_theta`` becomes theta ** (r'/r): pair j turns at
    theta' ** (-2j/r') = theta ** (-2j/r). Scaled RoPE (yarn) is not widened (its frequency
    correction depends on r): an error.
  - the softmax scale, (nope + rope) ** -0.5 in SGLang and transformers alike, shrinks when
    nope + rope grows; q_b_proj is multiplied by sqrt((nope' + rope') / (nope + rope)) so
    q.k * scale is unchanged (one bf16 rounding of q_b_proj; the function check measures it).
- heads and the vocabulary are kept; so are the experts, unless ``expert_split`` asks for
  each to become several smaller ones (``split_experts``: the router's rows repeated, top-k
  and routed_scaling_factor multiplied, the same function with Kimi-K2.5's count of expert
  rows per token).

Why widen the latent: the small fixture's latent (kv_lora 256 + rope 32, nope and v 32) is
what SGLang's triton MLA decode takes, but FA3 and FlashMLA -- SGLang's picks for DeepSeek on
Hopper -- serve DeepSeek-V3's 512 + 64 (nope and v 128), and a rank of Kimi-K2.5 spends its
attention bytes at that geometry.

One ``rms_norm_eps`` serves every norm, so it is divided by the hidden ratio; the norms whose
width grows by another ratio (q_a_layernorm, kv_a_layernorm) then see a smaller eps than they
were trained with -- exact only if that eps is negligible against the mean square it is added
to (1e-6 here; the function check measures the rest). An unknown tensor name is an error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from sglang_ext_tools.widen import (
    Shape,
    WidenError,
    copy_tokenizer,
    load_state,
    widen_tensor,
    write_sharded,
)

MLA_TOP_LAYOUT: dict[str, tuple[str, ...]] = {
    "model.embed_tokens.weight": ("vocab", "hidden"),
    "model.norm.weight": ("norm:hidden",),
    "lm_head.weight": ("vocab", "hidden"),
}
MLA_LAYER_LAYOUT: dict[str, tuple[str, ...]] = {
    "input_layernorm.weight": ("norm:hidden",),
    "post_attention_layernorm.weight": ("norm:hidden",),
    "self_attn.q_a_proj.weight": ("qlora", "hidden"),
    "self_attn.q_a_layernorm.weight": ("norm:qlora",),
    "self_attn.q_b_proj.weight": ("q_heads", "qlora"),
    "self_attn.kv_a_proj_with_mqa.weight": ("kv_a", "hidden"),
    "self_attn.kv_a_layernorm.weight": ("norm:kvlora",),
    "self_attn.kv_b_proj.weight": ("kv_heads", "kvlora"),
    "self_attn.o_proj.weight": ("hidden", "o_heads"),
    "mlp.gate_proj.weight": ("inter", "hidden"),  # dense layers (first_k_dense_replace)
    "mlp.up_proj.weight": ("inter", "hidden"),
    "mlp.down_proj.weight": ("hidden", "inter"),
    "mlp.gate.weight": ("keep", "hidden"),  # the router: one logit per expert
    "mlp.gate.e_score_correction_bias": ("copy",),
    "mlp.experts.*.gate_proj.weight": ("minter", "hidden"),
    "mlp.experts.*.up_proj.weight": ("minter", "hidden"),
    "mlp.experts.*.down_proj.weight": ("hidden", "minter"),
    "mlp.shared_experts.gate_proj.weight": ("sinter", "hidden"),
    "mlp.shared_experts.up_proj.weight": ("sinter", "hidden"),
    "mlp.shared_experts.down_proj.weight": ("hidden", "sinter"),
}
# Tensors multiplied by a factor after padding (the factor's name: MlaWidening.factor).
MLA_SCALED: dict[str, str] = {"self_attn.q_b_proj.weight": "softmax"}
_LAYER = re.compile(r"^model\.layers\.(?P<idx>\d+)\.(?P<rest>.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.\d+\.")


@dataclass(frozen=True)
class MlaShape:
    """The widths widening sets. The latent fields (``kv_lora``, ``rope``, ``nope``, ``v``)
    left None keep the small model's; heads are always kept."""

    hidden: int
    q_lora: int
    intermediate: int
    moe_intermediate: int
    n_shared: int = 1
    kv_lora: int | None = None
    rope: int | None = None
    nope: int | None = None
    v: int | None = None
    # each routed expert becomes this many (split_experts): more experts per token, same MLP
    expert_split: int = 1

    @classmethod
    def from_config(cls, cfg: Mapping) -> MlaShape:
        return cls(
            hidden=int(cfg["hidden_size"]),
            q_lora=int(cfg["q_lora_rank"]),
            intermediate=int(cfg["intermediate_size"]),
            moe_intermediate=int(cfg["moe_intermediate_size"]),
            n_shared=int(cfg.get("n_shared_experts") or 0),
            kv_lora=int(cfg["kv_lora_rank"]),
            rope=int(cfg["qk_rope_head_dim"]),
            nope=int(cfg["qk_nope_head_dim"]),
            v=int(cfg["v_head_dim"]),
        )


# One tensor-parallel rank of Kimi-K2.5's text model (DeepSeek-V3 class) at TP8, as SGLang's
# deepseek_v2 shards it: the residual stream is whole on every rank (hidden 7168) and so is the
# q latent (q_a_proj is replicated: q_lora_rank 1536); the dense MLP (18432) and each routed
# and shared expert's MLP (2048) are split 8 ways. Heads (64 / 8 = 8) are the fixture's own;
# the latent is DeepSeek-V3's (kv_lora 512, rope 64, nope 128, v 128), whole on every rank.
# Experts: a token of Kimi-K2.5 runs 8 routed + 1 shared expert, 9 x 256 = 2304 MLP rows per
# rank, which is what a batch-1 decode step reads. The fixture routes top-2 of 8, so its shared
# MLP carries the other 7 x 256 (n_shared 7: one MLP 1792 wide in SGLang and transformers).
# Fused shared experts are off for 8 routed experts and for Kimi-K2.5's bf16 checkpoint alike
# (deepseek_v2.py:DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason). Without this the
# rank would read ~2 B fewer parameters per step than Kimi's; the drafter would look ~1.8x dearer.
KIMI_K25_TP8_RANK_SHARED7 = MlaShape(
    hidden=7168,
    q_lora=1536,
    intermediate=18432 // 8,
    moe_intermediate=2048 // 8,
    n_shared=7,
    kv_lora=512,
    rope=64,
    nope=128,
    v=128,
)
# The 2026-12-02 H200 run served the shape above. Its trained chain cost 1.37 decode steps
# where dummy weights said 1.12: a verify pass reads every expert its tokens route to, and a
# shared MLP carrying 7 of the 9 experts hides most of that fan-out (sglang_ext.cli.moe_fanout).
# So the rank shape now keeps Kimi-K2.5's expert layout per token instead: each of the
# fixture's 8 trained experts split in 4 (split_experts), 32 experts of 256 with top-8 routed
# plus 1 shared of 256 -- Kimi's bytes per decode token, and a fan-out in Kimi's units (4
# tokens read ~22 of 32 parts here, ~31 of 384 experts there).
KIMI_K25_TP8_RANK = replace(KIMI_K25_TP8_RANK_SHARED7, n_shared=1, expert_split=4)


@dataclass(frozen=True)
class DrafterRankWidths:
    """An EAGLE-3 drafter layer's widths on one rank: hidden (whole), the query and key-value
    projections' output widths and the MLP (sharded). ``shape`` turns them into a widening
    target for a small drafter, keeping its head_dim (RoPE and the softmax scale)."""

    hidden: int
    q: int
    kv: int
    intermediate: int

    def shape(self, small: Shape) -> Shape:
        hd = small.head_dim
        if self.q % hd or self.kv % hd:
            raise WidenError(
                f"the rank's query/key-value widths {self.q}/{self.kv} are not multiples of the "
                f"drafter's head_dim {hd}"
            )
        heads, kv_heads = self.q // hd, max(self.kv // hd, small.kv_heads)
        return Shape(self.hidden, heads, kv_heads, hd, self.intermediate)


# SpecForge's Kimi-K2.5 EAGLE-3 drafter (tests/data/public_configs/specforge-kimi-k25-eagle3
# .json: hidden 7168, 64 query and 64 key-value heads of 128, MLP 18432) on one rank of TP8.
KIMI_K25_TP8_DRAFTER = DrafterRankWidths(
    hidden=7168, q=8 * 128, kv=8 * 128, intermediate=18432 // 8
)


@dataclass(frozen=True)
class MlaWidening:
    small: MlaShape
    big: MlaShape
    heads: int
    rope_interleave: bool = True  # DeepSeek's (and transformers') default layout of the pairs

    def __post_init__(self) -> None:
        kept = {
            f.name: getattr(self.small, f.name)
            for f in fields(MlaShape)
            if getattr(self.big, f.name) is None
        }
        object.__setattr__(self, "big", replace(self.big, **kept))
        s, b = asdict(self.small), asdict(self.big)
        # n_shared is checked as the width it makes: SGLang's deepseek_v2 and transformers both
        # build the shared experts as one MLP of moe_intermediate_size x n_shared_experts
        # ("sinter"); expert_split is applied before widening (split_experts)
        shrinks = [
            f"{k} {s[k]} -> {b[k]}"
            for k in s
            if k not in ("n_shared", "expert_split") and b[k] < s[k]
        ]
        small_shared, big_shared = self.widths("sinter")
        if big_shared < small_shared:
            shrinks.append(f"shared experts' MLP {small_shared} -> {big_shared}")
        if shrinks:
            raise WidenError(f"cannot widen {self.small} into {self.big}: " + "; ".join(shrinks))

    @classmethod
    def from_config(cls, small_cfg: Mapping, big: MlaShape) -> MlaWidening:
        return cls(
            MlaShape.from_config(small_cfg),
            big,
            heads=int(small_cfg["num_attention_heads"]),
            rope_interleave=bool(small_cfg.get("rope_interleave", True)),
        )

    def widths(self, kind: str) -> tuple[int, int]:
        s, b, h = self.small, self.big, self.heads
        table = {
            "hidden": (s.hidden, b.hidden),
            "qlora": (s.q_lora, b.q_lora),
            "inter": (s.intermediate, b.intermediate),
            "minter": (s.moe_intermediate, b.moe_intermediate),
            "sinter": (s.moe_intermediate * s.n_shared, b.moe_intermediate * b.n_shared),
            "kvlora": (s.kv_lora, b.kv_lora),
            "q_heads": (h * (s.nope + s.rope), h * (b.nope + b.rope)),
            "kv_heads": (h * (s.nope + s.v), h * (b.nope + b.v)),
            "o_heads": (h * s.v, h * b.v),
            "kv_a": (s.kv_lora + s.rope, b.kv_lora + b.rope),
        }
        if kind not in table:
            raise WidenError(f"unknown axis kind {kind!r}")
        return table[kind]

    def rope_positions(self) -> torch.Tensor:
        """Where each small RoPE dimension sits in the big rope width (module docstring)."""
        small, big = self.small.rope, self.big.rope
        dims = torch.arange(small)
        if self.rope_interleave:
            return dims
        return torch.where(dims < small // 2, dims, dims - small // 2 + big // 2)

    def index(self, kind: str) -> tuple[torch.Tensor, int]:
        s, b = self.small, self.big
        _, size = self.widths(kind)
        # per-head blocks: (small sub-block positions in the big block, big block length)
        blocks = {
            "q_heads": (
                torch.cat([torch.arange(s.nope), b.nope + self.rope_positions()]),
                b.nope + b.rope,
            ),
            "kv_heads": (
                torch.cat([torch.arange(s.nope), b.nope + torch.arange(s.v)]),
                b.nope + b.v,
            ),
            "o_heads": (torch.arange(s.v), b.v),
        }
        if kind in blocks:
            inner, stride = blocks[kind]
            heads = torch.arange(self.heads)[:, None] * stride
            return (heads + inner[None, :]).reshape(-1), size
        if kind == "kv_a":
            return torch.cat([torch.arange(s.kv_lora), b.kv_lora + self.rope_positions()]), size
        small, big = self.widths(kind)
        return torch.arange(small), big

    def norm_ratio(self, kind: str) -> float:
        small, big = self.widths(kind)
        return big / small

    @property
    def ratio(self) -> float:
        return self.norm_ratio("hidden")

    def factor(self, name: str) -> float:
        if name == "softmax":  # (nope + rope) ** -0.5 shrinks; q grows by its inverse
            s, b = self.small, self.big
            return math.sqrt((b.nope + b.rope) / (s.nope + s.rope))
        raise WidenError(f"unknown factor {name!r}")

    def widen(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        out = widen_tensor(self.index, self.norm_ratio, name, tensor, mla_layout(name))
        scaled = MLA_SCALED.get(_layer_key(name) or "")
        if scaled is not None and self.factor(scaled) != 1.0:
            out = (out.float() * self.factor(scaled)).to(tensor.dtype)
        return out


def _layer_key(name: str) -> str | None:
    match = _LAYER.match(name)
    return _EXPERT.sub("mlp.experts.*.", match["rest"]) if match else None


def mla_layout(name: str) -> tuple[str, ...]:
    if name in MLA_TOP_LAYOUT:
        return MLA_TOP_LAYOUT[name]
    rest = _layer_key(name)
    if rest in MLA_LAYER_LAYOUT:
        return MLA_LAYER_LAYOUT[rest]
    raise WidenError(f"MLA target tensor {name!r} has no declared layout")


_ROUTED = re.compile(
    r"^(?P<layer>model\.layers\.\d+\.mlp\.)experts\.(?P<e>\d+)\.(?P<proj>\w+)\.weight$"
)
_ROUTER = re.compile(r"^model\.layers\.\d+\.mlp\.gate\.(weight|e_score_correction_bias)$")
# the axis of each routed-expert projection that runs over the expert's intermediate rows
_SPLIT_AXIS = {"gate_proj": 0, "up_proj": 0, "down_proj": 1}


def split_experts(
    cfg: Mapping, state: Mapping[str, torch.Tensor], parts: int
) -> tuple[dict, dict[str, torch.Tensor]]:
    """Each routed expert as ``parts`` experts of 1/parts of its MLP rows, the same function.

    The router's row and correction bias are repeated, so a token's scores come in groups of
    ``parts`` equal values and top-(k x parts) selects exactly the parts of its top-k experts;
    normalised over them (norm_topk_prob), each part's weight is 1/parts of its expert's, and
    routed_scaling_factor x parts gives it back (exact: a power of two here). The parts' MLP
    slices sum to the expert's output. What changes is the number of experts a token reads:
    k x parts, the same rows in all -- so several tokens' fan-out is counted in smaller pieces,
    as in a target with many small experts (Kimi-K2.5: 384, top-8). Grouped routing
    (n_group > topk_group) scores groups by their best experts, which repeated rows change:
    refused, as is routing without norm_topk_prob."""
    inter = int(cfg["moe_intermediate_size"])
    if parts < 1 or inter % parts:
        raise WidenError(f"expert split {parts}: must divide moe_intermediate_size {inter}")
    if not cfg.get("norm_topk_prob"):
        raise WidenError("expert split needs norm_topk_prob: true (weights renormalised)")
    groups, chosen = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    if groups != chosen:
        raise WidenError(
            f"expert split with grouped routing (n_group {groups}, topk_group {chosen}): the "
            "group scores would change"
        )
    rows = inter // parts
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        routed, router = _ROUTED.match(name), _ROUTER.match(name)
        if routed:
            axis = _SPLIT_AXIS.get(routed["proj"])
            if axis is None:
                raise WidenError(f"{name}: no intermediate axis known for {routed['proj']!r}")
            for j, piece in enumerate(torch.split(tensor, rows, dim=axis)):
                e = int(routed["e"]) * parts + j
                out[f"{routed['layer']}experts.{e}.{routed['proj']}.weight"] = piece.clone()
        elif router:
            out[name] = tensor.repeat_interleave(parts, dim=0)
        else:
            out[name] = tensor
    split_cfg = {
        **cfg,
        "n_routed_experts": int(cfg["n_routed_experts"]) * parts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]) * parts,
        "routed_scaling_factor": float(cfg.get("routed_scaling_factor", 1.0)) * parts,
        "moe_intermediate_size": rows,
    }
    # the shared experts keep their width: moe_intermediate_size x n_shared_experts
    shared = int(cfg.get("n_shared_experts") or 0)
    if shared and (inter * shared) % rows == 0:
        split_cfg["n_shared_experts"] = inter * shared // rows
    elif shared:
        raise WidenError(f"shared experts {shared} x {inter} rows do not split into {rows}")
    return split_cfg, out


def widen_mla_config(small: Mapping, widening: MlaWidening) -> dict:
    """The big config.json: the widths, eps divided by the hidden ratio, and rope_theta raised
    to r'/r when the rope width grows (module docstring)."""
    big = widening.big
    out = {
        **small,
        "hidden_size": big.hidden,
        "q_lora_rank": big.q_lora,
        "intermediate_size": big.intermediate,
        "moe_intermediate_size": big.moe_intermediate,
        "n_shared_experts": big.n_shared,
        "kv_lora_rank": big.kv_lora,
        "qk_rope_head_dim": big.rope,
        "qk_nope_head_dim": big.nope,
        "v_head_dim": big.v,
        "rms_norm_eps": float(small["rms_norm_eps"]) / widening.ratio,
    }
    # transformers' DeepseekV3Config also saves these two derived widths; its rotary embedding
    # reads head_dim (= the rope width)
    if "head_dim" in small:
        out["head_dim"] = big.rope
    if "qk_head_dim" in small:
        out["qk_head_dim"] = big.nope + big.rope
    if big.rope != widening.small.rope:
        out.update(_widened_rope(small, big.rope / widening.small.rope))
    return out


def _widened_rope(cfg: Mapping, power: float) -> dict:
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):
        kind = params.get("rope_type", "default")
        if kind != "default" or cfg.get("rope_scaling"):
            raise WidenError(
                f"rope_parameters.rope_type {kind!r}: only unscaled RoPE keeps its pairs' "
                "frequencies when qk_rope_head_dim grows; keep the rope width for this model"
            )
        return {"rope_parameters": {**params, "rope_theta": float(params["rope_theta"]) ** power}}
    if cfg.get("rope_scaling"):
        raise WidenError("rope_scaling is set: only unscaled RoPE can widen qk_rope_head_dim")
    return {"rope_theta": float(cfg.get("rope_theta", 10000.0)) ** power}


def widen_mla_tensors(
    state: Mapping[str, torch.Tensor], widening: MlaWidening
) -> Iterator[tuple[str, torch.Tensor]]:
    for name in state:
        mla_layout(name)  # every name declared before the first big tensor is built
    for name, tensor in state.items():
        yield name, widening.widen(name, tensor)


def write_widened_mla_target(small_dir: Path, out_dir: Path, big: MlaShape) -> dict:
    """Widen an MLA + MoE target directory into ``out_dir`` (config, shards, tokenizer)."""
    small_dir, out_dir = Path(small_dir), Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise WidenError(f"{out_dir}: not empty; the widened target needs a new directory")
    small_cfg = json.loads((small_dir / "config.json").read_text())
    state = load_state(small_dir)
    if big.expert_split > 1:
        small_cfg, state = split_experts(small_cfg, state, big.expert_split)
    widening = MlaWidening.from_config(small_cfg, big)
    config = widen_mla_config(small_cfg, widening)  # refuses what cannot widen, before writing
    index = write_sharded(widen_mla_tensors(state, widening), out_dir)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    copy_tokenizer(small_dir, out_dir)
    return {
        "dir": str(out_dir),
        "shape": asdict(widening.big),
        "softmax_q_factor": widening.factor("softmax"),
        "small_shape": asdict(widening.small),
        "ratio": widening.ratio,
        "bytes": index["metadata"]["total_size"],
        "shards": len(set(index["weight_map"].values())),
    }
