"""Function-preserving widening of a trained DeepSeek-V3-class (MLA + MoE) target to the width
of one tensor-parallel rank of Kimi-K2.5 (hidden 7168), so speed is measured at the seed's
cost ratios with a model that still predicts what the small trained one predicts.

The rules of :mod:`sglang_ext_tools.widen` (zero-padded widths, RMSNorm weights divided by
sqrt(r) and ``rms_norm_eps`` by r), per axis of the MLA + MoE layer:

- ``hidden`` (residual stream), ``qlora`` (``q_lora_rank``: q_a_proj rows, q_b_proj
  columns, q_a_layernorm), ``inter`` (the dense first layers' MLP), ``minter`` (each
  routed expert's MLP), ``sinter`` (the shared experts', ``moe_intermediate_size`` x
  ``n_shared_experts``) are padded with zeros; padded MLP rows of gate/up meet zero columns of
  down, so they add nothing;
- the MLA latent geometry is kept (``kv_lora_rank``, ``qk_rope_head_dim``,
  ``qk_nope_head_dim``, ``v_head_dim``, heads: RoPE and the softmax scale stay as they are,
  and the latent width stays one SGLang's MLA kernels serve), as are the expert count, the
  router's output and its correction bias, and the vocabulary.

One ``rms_norm_eps`` serves every norm, so it is divided by the hidden ratio; the norms whose
width grows by another ratio (q_a_layernorm) or not at all (kv_a_layernorm) then see a
smaller eps than they were trained with -- exact only if that eps is negligible against the
mean square it is added to (1e-6 here; the function check measures the rest). An unknown
tensor name is an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
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
    "self_attn.q_b_proj.weight": ("keep", "qlora"),
    "self_attn.kv_a_proj_with_mqa.weight": ("keep", "hidden"),
    "self_attn.kv_a_layernorm.weight": ("copy",),
    "self_attn.kv_b_proj.weight": ("keep", "keep"),
    "self_attn.o_proj.weight": ("hidden", "keep"),
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
_LAYER = re.compile(r"^model\.layers\.(?P<idx>\d+)\.(?P<rest>.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.\d+\.")


@dataclass(frozen=True)
class MlaShape:
    """The widths that widening changes (the MLA latent geometry is kept)."""

    hidden: int
    q_lora: int
    intermediate: int
    moe_intermediate: int
    n_shared: int = 1

    @classmethod
    def from_config(cls, cfg: Mapping) -> MlaShape:
        return cls(
            hidden=int(cfg["hidden_size"]),
            q_lora=int(cfg["q_lora_rank"]),
            intermediate=int(cfg["intermediate_size"]),
            moe_intermediate=int(cfg["moe_intermediate_size"]),
            n_shared=int(cfg.get("n_shared_experts") or 0),
        )


# One tensor-parallel rank of Kimi-K2.5's text model (DeepSeek-V3 class) at TP8, as SGLang's
# deepseek_v2 shards it: the residual stream is whole on every rank (hidden 7168) and so is the
# q latent (q_a_proj is replicated: q_lora_rank 1536); the dense MLP (18432) and each routed
# and shared expert's MLP (2048) are split 8 ways. Heads (64 / 8 = 8) are the fixture's own.
KIMI_K25_TP8_RANK = MlaShape(
    hidden=7168, q_lora=1536, intermediate=18432 // 8, moe_intermediate=2048 // 8, n_shared=1
)


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

    def __post_init__(self) -> None:
        s, b = asdict(self.small), asdict(self.big)
        shrinks = [f"{k} {s[k]} -> {b[k]}" for k in s if b[k] < s[k]]
        if s["n_shared"] != b["n_shared"]:
            shrinks.append(f"n_shared {s['n_shared']} -> {b['n_shared']} (must stay)")
        if shrinks:
            raise WidenError(f"cannot widen {self.small} into {self.big}: " + "; ".join(shrinks))

    def widths(self, kind: str) -> tuple[int, int]:
        s, b = self.small, self.big
        table = {
            "hidden": (s.hidden, b.hidden),
            "qlora": (s.q_lora, b.q_lora),
            "inter": (s.intermediate, b.intermediate),
            "minter": (s.moe_intermediate, b.moe_intermediate),
            "sinter": (s.moe_intermediate * s.n_shared, b.moe_intermediate * b.n_shared),
        }
        if kind not in table:
            raise WidenError(f"unknown axis kind {kind!r}")
        return table[kind]

    def index(self, kind: str) -> tuple[torch.Tensor, int]:
        small, big = self.widths(kind)
        return torch.arange(small), big

    def norm_ratio(self, kind: str) -> float:
        small, big = self.widths(kind)
        return big / small

    @property
    def ratio(self) -> float:
        return self.norm_ratio("hidden")

    def widen(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return widen_tensor(self.index, self.norm_ratio, name, tensor, mla_layout(name))


def mla_layout(name: str) -> tuple[str, ...]:
    if name in MLA_TOP_LAYOUT:
        return MLA_TOP_LAYOUT[name]
    match = _LAYER.match(name)
    if match:
        rest = _EXPERT.sub("mlp.experts.*.", match["rest"])
        if rest in MLA_LAYER_LAYOUT:
            return MLA_LAYER_LAYOUT[rest]
    raise WidenError(f"MLA target tensor {name!r} has no declared layout")


def widen_mla_config(small: Mapping, big: MlaShape) -> dict:
    """The big config.json: the four widths and eps divided by the hidden ratio."""
    ratio = big.hidden / int(small["hidden_size"])
    return {
        **small,
        "hidden_size": big.hidden,
        "q_lora_rank": big.q_lora,
        "intermediate_size": big.intermediate,
        "moe_intermediate_size": big.moe_intermediate,
        "rms_norm_eps": float(small["rms_norm_eps"]) / ratio,
    }


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
    widening = MlaWidening(MlaShape.from_config(small_cfg), big)
    index = write_sharded(widen_mla_tensors(load_state(small_dir), widening), out_dir)
    (out_dir / "config.json").write_text(json.dumps(widen_mla_config(small_cfg, big), indent=2))
    copy_tokenizer(small_dir, out_dir)
    return {
        "dir": str(out_dir),
        "shape": asdict(big),
        "small_shape": asdict(widening.small),
        "ratio": widening.ratio,
        "bytes": index["metadata"]["total_size"],
        "shards": len(set(index["weight_map"].values())),
    }
