"""Function-preserving widening of a small trained Llama target and its EAGLE-3 drafter.

Speed has to be measured where decode is memory-bound (an 8B-class target), but a useful
8B model cannot be downloaded here and cannot be trained in minutes. A trained small model
can be *embedded* in a large one instead, so the large one computes exactly the same
function at the large one's cost:

- hidden dimensions are zero-padded: the residual stream of the big model is the small
  model's residual stream followed by zeros, in every layer;
- RMSNorm then sees ``r = big_hidden / small_hidden`` times the number of dimensions, so
  its mean square is ``r`` times smaller; every norm weight is divided by ``sqrt(r)`` and
  ``rms_norm_eps`` by ``r``, which makes the normalised output identical;
- attention heads keep their ``head_dim`` (so RoPE and the softmax scale are unchanged);
  small query head ``h`` of KV group ``g`` becomes big query head ``g * big_group + h %
  small_group`` and KV head ``g`` stays ``g``; unused big heads read zeros and their
  ``o_proj`` columns are zero;
- extra decoder layers are identity residual blocks: random q/k/v/gate/up (so the layer
  costs what a real one does), zero ``o_proj`` and ``down_proj`` (so it adds exactly 0);
- the vocabulary may grow (``Shape.vocab`` / ``Shape.draft_vocab``, None: keep): new
  ``embed_tokens`` and ``lm_head`` rows are zero, so a new id's logit is exactly 0 and the
  argmax over the big vocabulary stays the small one's wherever the small top-1 logit is
  positive (the fixture builders check that); a drafter's draft->target map (speculators'
  ``d2t``/``t2d``) keeps its draft ids and maps each new draft id to an unused target id
  (draft i -> target i for a full-vocabulary drafter).

The same rules widen a speculators drafter (its ``fc`` reads ``num_aux`` hidden-width
blocks and its first layer reads ``cat(embeds, hidden)``). Which parameter has which
layout is declared in the tables below; an unknown parameter name is an error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# Axis kinds: how one tensor dimension maps from the small model into the big one.
#   hidden   residual-stream width               pair   cat(embeds, hidden): 2 x hidden
#   aux      cat of num_aux target hidden states  q/kv   query / key-value heads x head_dim
#   inter    MLP width                           vocab  target vocabulary (rows: zero-padded)
#   draft    a drafter's draft vocabulary (rows: zero-padded to Shape.draft_vocab)
# A 1-d "norm" tensor is an RMSNorm weight over hidden (or aux) and gets 1/sqrt(r);
# "vocab_map" marks speculators' d2t/t2d (rebuilt by widen_vocab_mapping).
TARGET_LAYOUT: dict[str, tuple[str, ...]] = {
    "model.embed_tokens.weight": ("vocab", "hidden"),
    "model.norm.weight": ("norm:hidden",),
    "lm_head.weight": ("vocab", "hidden"),
}
LAYER_LAYOUT: dict[str, tuple[str, ...]] = {
    "input_layernorm.weight": ("norm:hidden",),
    "post_attention_layernorm.weight": ("norm:hidden",),
    "self_attn.q_proj.weight": ("q", "hidden"),
    "self_attn.k_proj.weight": ("kv", "hidden"),
    "self_attn.v_proj.weight": ("kv", "hidden"),
    "self_attn.o_proj.weight": ("hidden", "q"),
    "mlp.gate_proj.weight": ("inter", "hidden"),
    "mlp.up_proj.weight": ("inter", "hidden"),
    "mlp.down_proj.weight": ("hidden", "inter"),
}
DRAFTER_LAYOUT: dict[str, tuple[str, ...]] = {
    "embed_tokens.weight": ("vocab", "hidden"),
    "fc.weight": ("hidden", "aux"),
    "input_norm.weight": ("norm:aux",),
    "norm.weight": ("norm:hidden",),
    "lm_head.weight": ("draft", "hidden"),
    "d2t": ("vocab_map",),
    "t2d": ("vocab_map",),
}
# speculators' first draft layer reads cat(embeds, hidden) and owns a second norm.
FIRST_DRAFT_LAYER_LAYOUT: dict[str, tuple[str, ...]] = {
    **LAYER_LAYOUT,
    "hidden_norm.weight": ("norm:hidden",),
    "self_attn.q_proj.weight": ("q", "pair"),
    "self_attn.k_proj.weight": ("kv", "pair"),
    "self_attn.v_proj.weight": ("kv", "pair"),
}
IDENTITY_ZERO = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # identity blocks
_LAYER_KEY = re.compile(r"^(?P<prefix>(?:model\.)?layers)\.(?P<idx>\d+)\.(?P<rest>.+)$")


class WidenError(ValueError):
    """A shape or configuration that cannot be widened without changing the function."""


@dataclass(frozen=True)
class Shape:
    """The attention/MLP shape of one side (small or big). ``vocab`` / ``draft_vocab`` are
    read on the big side only: the (draft) vocabulary to zero-pad to; None keeps the small
    model's (``from_config`` leaves them None)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int | None = None
    draft_vocab: int | None = None

    @classmethod
    def from_config(cls, cfg: Mapping) -> Shape:
        heads = int(cfg["num_attention_heads"])
        return cls(
            hidden=int(cfg["hidden_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate=int(cfg["intermediate_size"]),
        )


@dataclass(frozen=True)
class Widening:
    """Index maps from a small shape into a big one (validated on construction)."""

    small: Shape
    big: Shape
    num_aux: int = 3

    def __post_init__(self) -> None:
        s, b = self.small, self.big
        problems = []
        if s.head_dim != b.head_dim:
            problems.append(f"head_dim {s.head_dim} -> {b.head_dim} (RoPE would change)")
        for field in ("hidden", "heads", "kv_heads", "intermediate"):
            if getattr(b, field) < getattr(s, field):
                problems.append(f"{field} shrinks {getattr(s, field)} -> {getattr(b, field)}")
        if s.heads % s.kv_heads or b.heads % b.kv_heads:
            problems.append("heads must be a multiple of kv_heads")
        elif b.heads // b.kv_heads < s.heads // s.kv_heads:
            problems.append(
                f"query heads per KV head {s.heads // s.kv_heads} -> {b.heads // b.kv_heads}"
            )
        if problems:
            raise WidenError(f"cannot widen {s} into {b}: " + "; ".join(problems))

    @property
    def ratio(self) -> float:
        """r: how many times more dimensions each RMSNorm averages over."""
        return self.big.hidden / self.small.hidden

    def index(self, kind: str) -> tuple[torch.Tensor, int]:
        """(big positions of the small axis, big axis length) for one axis kind."""
        s, b = self.small, self.big
        if kind == "hidden":
            return torch.arange(s.hidden), b.hidden
        if kind == "pair":
            return block_positions(2, s.hidden, b.hidden), 2 * b.hidden
        if kind == "aux":
            return block_positions(self.num_aux, s.hidden, b.hidden), self.num_aux * b.hidden
        if kind == "kv":
            return torch.arange(s.kv_heads * s.head_dim), b.kv_heads * b.head_dim
        if kind == "q":
            small_group, big_group = s.heads // s.kv_heads, b.heads // b.kv_heads
            heads = [(h // small_group) * big_group + h % small_group for h in range(s.heads)]
            idx = torch.cat([h * s.head_dim + torch.arange(s.head_dim) for h in heads])
            return idx, b.heads * b.head_dim
        if kind == "inter":
            return torch.arange(s.intermediate), b.intermediate
        raise WidenError(f"unknown axis kind {kind!r}")

    def widen(self, name: str, tensor: torch.Tensor, layout: Sequence[str]) -> torch.Tensor:
        """The big tensor for one small tensor, zeros outside the small model's positions
        (new vocabulary rows included)."""
        out = widen_tensor(self.index, lambda _kind: self.ratio, name, tensor, layout)
        rows = {"vocab": self.big.vocab, "draft": self.big.draft_vocab}.get(layout[0])
        return pad_rows(name, out, rows)


def block_positions(count: int, small_width: int, big_width: int) -> torch.Tensor:
    """Where ``count`` concatenated small-width blocks sit in their big-width concatenation:
    block k at the start of big block k (the "pair" and "aux" axes)."""
    return torch.cat([k * big_width + torch.arange(small_width) for k in range(count)])


def pad_aux_states(hidden: torch.Tensor, num_aux: int, big_width: int) -> torch.Tensor:
    """A small drafter's fc input ``[..., num_aux x small]`` as the widened drafter reads it:
    each aux block at the start of its big block, zeros elsewhere (what the widened target
    hands over, its padded dimensions being zero)."""
    small_width = hidden.shape[-1] // num_aux
    out = hidden.new_zeros(*hidden.shape[:-1], num_aux * big_width)
    out[..., block_positions(num_aux, small_width, big_width)] = hidden
    return out


def pad_rows(name: str, tensor: torch.Tensor, rows: int | None) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` (None: unchanged). Zero rows of an
    ``lm_head`` give logit exactly 0; zero rows of ``embed_tokens`` are never looked up (only
    real ids are fed) and, tied, are that zero ``lm_head``."""
    if rows is None or rows == tensor.shape[0]:
        return tensor
    if rows < tensor.shape[0]:
        raise WidenError(f"{name}: vocabulary shrinks {tensor.shape[0]} -> {rows}")
    out = torch.zeros((rows, *tensor.shape[1:]), dtype=tensor.dtype)
    out[: tensor.shape[0]] = tensor
    return out


def widen_tensor(index, norm_ratio, name: str, tensor: torch.Tensor, layout: Sequence[str]):
    """One small tensor placed in its big shape: ``index(kind)`` gives (big positions of the
    small axis, big length) per axis kind, zeros elsewhere ("vocab", "draft" and "keep" axes
    stay as they are: ``Widening.widen`` pads vocabulary rows afterwards); a ("norm:KIND",)
    RMSNorm weight is divided by sqrt(norm_ratio(KIND)), the big/small ratio of the width it
    averages over, and so is its padding (a norm over zeros contributes nothing either way)."""
    if layout == ("copy",):
        return tensor.clone()
    if len(layout) == 1 and layout[0].startswith("norm:"):
        kind = layout[0].split(":", 1)[1]
        idx, size = index(kind)
        _check_shape(name, tensor, (len(idx),))
        scale = 1.0 / math.sqrt(norm_ratio(kind))
        out = torch.full((size,), scale, dtype=torch.float32)
        out[idx] = tensor.float() * scale
        return out.to(tensor.dtype)
    if len(layout) != tensor.dim():
        raise WidenError(f"{name}: layout {layout} does not fit shape {tuple(tensor.shape)}")
    maps = [
        (torch.arange(size), size) if kind in ("vocab", "draft", "keep") else index(kind)
        for size, kind in zip(tensor.shape, layout, strict=True)
    ]
    _check_shape(name, tensor, tuple(len(idx) for idx, _ in maps))
    out = torch.zeros([size for _, size in maps], dtype=tensor.dtype)
    if tensor.dim() == 1:
        out[maps[0][0]] = tensor
    else:
        out[maps[0][0][:, None], maps[1][0][None, :]] = tensor
    return out


def _check_shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise WidenError(
            f"{name}: expected shape {expected} from the small config, found {tuple(tensor.shape)}"
        )


def check_placement(placement: Sequence[int], big_layers: int) -> None:
    if list(placement) != sorted(set(placement)) or not placement:
        raise WidenError(f"layer placement {list(placement)} must be strictly increasing")
    if placement[0] < 0 or placement[-1] >= big_layers:
        raise WidenError(f"layer placement {list(placement)} outside 0..{big_layers - 1}")


def map_aux_ids(
    small_ids: Sequence[int], placement: Sequence[int], big_ids: Sequence[int] | None = None
) -> list[int]:
    """Aux ids (speculators convention: id k = residual stream entering layer k) in the big
    model that carry the same state as ``small_ids`` in the small one.

    The stream entering big layer K equals the one entering small layer k when exactly the
    small layers ``0..k-1`` sit below K: ``placement[k-1] < K <= placement[k]`` (the upper
    bound is the number of big layers for k == number of small layers). ``big_ids`` picks
    a point in each range (checked); by default the lowest, ``placement[k-1] + 1``.
    """
    out = []
    for pos, k in enumerate(small_ids):
        low = placement[k - 1] + 1 if k > 0 else 0
        high = placement[k] if k < len(placement) else None
        if big_ids is None:
            out.append(low)
            continue
        want = int(big_ids[pos])
        if want < low or (high is not None and want > high):
            raise WidenError(
                f"big aux id {want} does not carry small aux id {k}: with layer placement "
                f"{list(placement)} it must lie in [{low}, {high if high is not None else 'L'}]"
            )
        out.append(want)
    return out


# --------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------


def widened_fields(small: Mapping, big: Shape) -> dict:
    """The HF config fields that change when ``small`` is widened into ``big``: the shape,
    ``rms_norm_eps`` divided by r so every RMSNorm output stays the same, and ``vocab_size``
    when ``big.vocab`` is set."""
    ratio = big.hidden / int(small["hidden_size"])
    fields = dict(
        hidden_size=big.hidden,
        num_attention_heads=big.heads,
        num_key_value_heads=big.kv_heads,
        head_dim=big.head_dim,
        intermediate_size=big.intermediate,
        rms_norm_eps=float(small["rms_norm_eps"]) / ratio,
    )
    if big.vocab is not None:
        if big.vocab < int(small["vocab_size"]):
            raise WidenError(f"vocab_size shrinks {small['vocab_size']} -> {big.vocab}")
        fields["vocab_size"] = big.vocab
    return fields


def widen_llama_config(small: Mapping, big: Shape, num_layers: int) -> dict:
    """The big target's config.json: same RoPE, dtype and ``tie_word_embeddings``; eps
    divided by r; ``vocab_size`` = ``big.vocab`` when set."""
    cfg = {**small, **widened_fields(small, big), "num_hidden_layers": num_layers}
    if "layer_types" in cfg:
        cfg["layer_types"] = ["full_attention"] * num_layers
    return cfg


def widen_target_tensors(
    small_state: Mapping[str, torch.Tensor],
    widening: Widening,
    placement: Sequence[int],
    num_layers: int,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    init_std: float = 0.02,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the big target's tensors (on CPU) one by one, layer by layer."""
    check_placement(placement, num_layers)
    small_layers = {int(m["idx"]) for k in small_state if (m := _LAYER_KEY.match(k))}
    if sorted(small_layers) != list(range(len(placement))):
        raise WidenError(
            f"placement has {len(placement)} entries but the small model has layers "
            f"{sorted(small_layers)}"
        )
    seen = set()
    for name, layout in TARGET_LAYOUT.items():
        if name in small_state:
            seen.add(name)
            yield name, widening.widen(name, small_state[name], layout)
    where = {big: small for small, big in enumerate(placement)}
    gen = torch.Generator(device=device).manual_seed(seed)
    for layer in range(num_layers):
        for rest, layout in LAYER_LAYOUT.items():
            name = f"model.layers.{layer}.{rest}"
            if layer in where:
                small_name = f"model.layers.{where[layer]}.{rest}"
                if small_name not in small_state:
                    raise WidenError(f"small target has no {small_name}")
                seen.add(small_name)
                yield name, widening.widen(small_name, small_state[small_name], layout)
                continue
            dtype = small_state[f"model.layers.0.{rest}"].dtype
            shape = [widening.index(k.split(":")[-1])[1] for k in layout]
            if layout[0].startswith("norm:"):
                tensor = torch.ones(shape, dtype=dtype)
            elif rest in IDENTITY_ZERO:
                tensor = torch.zeros(shape, dtype=dtype)
            else:
                tensor = torch.empty(shape, device=device, dtype=torch.float32)
                tensor.normal_(0.0, init_std, generator=gen)
                tensor = tensor.to(dtype).cpu()
            yield name, tensor
    unknown = sorted(set(small_state) - seen - {k for k in small_state if "rotary" in k})
    if unknown:
        raise WidenError(f"small target tensors with no declared layout: {unknown[:5]}")


# --------------------------------------------------------------------------------------
# speculators drafters
# --------------------------------------------------------------------------------------


def drafter_layout(name: str) -> tuple[str, ...]:
    if name in DRAFTER_LAYOUT:
        return DRAFTER_LAYOUT[name]
    match = _LAYER_KEY.match(name)
    if match and match["prefix"] == "layers":
        table = FIRST_DRAFT_LAYER_LAYOUT if match["idx"] == "0" else LAYER_LAYOUT
        if match["rest"] in table:
            return table[match["rest"]]
    raise WidenError(f"drafter tensor {name!r} has no declared layout")


def drafter_vocab_sizes(small_state: Mapping[str, torch.Tensor]) -> tuple[int, int] | None:
    """(target vocab, draft vocab) of a speculators drafter's tensors, None if they do not
    say. speculators' DraftVocabMixin._init_vocab (speculators/model.py): ``t2d`` is a bool
    [verifier vocab], ``d2t`` an int64 [draft vocab], ``embed_tokens`` has verifier-vocab
    rows and ``lm_head`` draft-vocab rows; without a mapping the two vocabularies are one."""
    if "d2t" in small_state and "t2d" in small_state:
        return int(small_state["t2d"].shape[0]), int(small_state["d2t"].shape[0])
    if "lm_head.weight" in small_state:
        draft = int(small_state["lm_head.weight"].shape[0])
        embed = small_state.get("embed_tokens.weight")
        return (int(embed.shape[0]) if embed is not None else draft), draft
    return None


def widen_vocab_mapping(
    small_d2t: torch.Tensor | None, small_vocab: int, big_vocab: int, big_draft: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """speculators' (d2t, t2d) for a draft vocabulary of ``big_draft`` over a target
    vocabulary of ``big_vocab``, keeping the small drafter's map (identity when
    ``small_d2t`` is None) for its draft ids.

    Conventions (speculators/train/vocab_mapping.py: build_vocab_mappings_from_distribution;
    speculators/model.py: DraftVocabMixin._init_vocab / load_vocab_mappings): ``d2t`` is
    int64 [draft vocab] with target id = draft id + d2t[draft id]; ``t2d`` is bool [target
    vocab], True exactly at the target ids some draft id maps to; target ids ascending in
    draft order. SGLang 0.5.23 reads only ``d2t`` (sglang/srt/models/llama_eagle3.py:
    LlamaForCausalLMEagle3.load_weights: hot_token_id = d2t + arange) and skips ``t2d``.

    New draft ids map, in order, to the lowest unused target ids above every mapped one
    (then to lower unused ones), so a full-vocabulary small drafter gets draft i -> target
    i (d2t all zero, t2d True below ``big_draft``). None when the result is the identity
    over the whole target vocabulary: speculators registers no d2t/t2d then.
    """
    small_draft = small_vocab if small_d2t is None else int(small_d2t.shape[0])
    targets = torch.arange(small_draft) + (0 if small_d2t is None else small_d2t.long())
    if big_vocab < small_vocab or big_draft < small_draft:
        raise WidenError(
            f"vocabulary shrinks: target {small_vocab} -> {big_vocab}, "
            f"draft {small_draft} -> {big_draft}"
        )
    if targets.numel() and (
        int(targets.min()) < 0
        or int(targets.max()) >= small_vocab
        or targets.unique().numel() != small_draft
    ):
        raise WidenError("small d2t maps draft ids outside the target vocabulary or twice")
    if big_draft > big_vocab:
        raise WidenError(f"draft vocabulary {big_draft} exceeds the target's {big_vocab}")
    used = torch.zeros(big_vocab, dtype=torch.bool)
    used[targets] = True
    free = (~used).nonzero().flatten()
    top = int(targets.max()) if targets.numel() else -1
    free = torch.cat([free[free > top], free[free <= top]])
    targets = torch.cat([targets, free[: big_draft - small_draft]])
    if big_draft == big_vocab and torch.equal(targets, torch.arange(big_vocab)):
        return None
    t2d = torch.zeros(big_vocab, dtype=torch.bool)
    t2d[targets] = True
    return (targets - torch.arange(big_draft)).to(torch.int64), t2d


def widen_drafter_state(
    small_state: Mapping[str, torch.Tensor], widening: Widening
) -> dict[str, torch.Tensor]:
    """The big drafter's tensors: widened as declared, vocabulary rows padded to
    ``widening.big.vocab`` / ``.draft_vocab`` and d2t/t2d rebuilt for the new sizes (copied
    when both stay)."""
    out = {
        name: widening.widen(name, t, layout)
        for name, t in small_state.items()
        if (layout := drafter_layout(name)) != ("vocab_map",)
    }
    maps = {name: small_state[name].clone() for name in ("d2t", "t2d") if name in small_state}
    sizes = drafter_vocab_sizes(small_state)
    big = widening.big
    if big.vocab is None and big.draft_vocab is None:
        return {**out, **maps}
    if sizes is None:
        raise WidenError("cannot widen the vocabulary: the drafter has no lm_head or d2t/t2d")
    if len(maps) == 1:
        raise WidenError(f"drafter has {next(iter(maps))} without its partner")
    vocab, draft = sizes
    big_vocab, big_draft = big.vocab or vocab, big.draft_vocab or draft
    if (big_vocab, big_draft) == (vocab, draft):
        return {**out, **maps}
    mapping = widen_vocab_mapping(maps.get("d2t"), vocab, big_vocab, big_draft)
    if mapping is not None:
        out["d2t"], out["t2d"] = mapping
    return out


def widen_drafter_config(
    small: Mapping,
    big: Shape,
    *,
    verifier_dir: str,
    aux_ids: Sequence[int],
    verifier_architectures: Sequence[str] | None = None,
) -> dict:
    """The big drafter's speculators config.json (transformer_layer_config widened; its
    ``vocab_size`` is speculators' verifier vocabulary, DraftVocabMixin._init_vocab, and the
    top-level ``draft_vocab_size`` the draft one)."""
    cfg = json.loads(json.dumps(small))
    layer = cfg["transformer_layer_config"]
    layer.update(widened_fields(layer, big))
    if big.draft_vocab is not None:
        cfg["draft_vocab_size"] = big.draft_vocab
    cfg["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    verifier = cfg.setdefault("speculators_config", {}).setdefault("verifier", {})
    verifier["name_or_path"] = str(verifier_dir)
    if verifier_architectures:
        verifier["architectures"] = list(verifier_architectures)
    return cfg


# --------------------------------------------------------------------------------------
# Directories
# --------------------------------------------------------------------------------------


def load_state(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WidenError(f"{directory}: no *.safetensors files")
    for path in files:
        state.update(load_file(str(path)))
    return state


def write_sharded(
    tensors: Iterator[tuple[str, torch.Tensor]], out_dir: Path, shard_bytes: int = 4 << 30
) -> dict:
    """Save tensors as model-0000k-of-0000n.safetensors + model.safetensors.index.json."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[list[str]] = []
    weight_map: dict[str, str] = {}
    pending: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            name = f"shard-{len(shards):05d}.tmp"
            save_file({k: v.contiguous() for k, v in pending.items()}, str(out_dir / name))
            shards.append(list(pending))
            pending, size = {}, 0

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if pending and size + nbytes > shard_bytes:
            flush()
        pending[name] = tensor
        size += nbytes
        total += nbytes
    flush()
    for k, names in enumerate(shards):
        final = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        (out_dir / f"shard-{k:05d}.tmp").rename(out_dir / final)
        weight_map.update({n: final for n in names})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return index


def copy_tokenizer(small_dir: Path, out_dir: Path) -> None:
    """The small model's tokenizer and generation config, beside the widened weights."""
    import shutil

    for extra in Path(small_dir).iterdir():
        if extra.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(extra, Path(out_dir) / extra.name)


def write_widened_target(
    small_dir: Path,
    out_dir: Path,
    big: Shape,
    num_layers: int,
    placement: Sequence[int],
    *,
    seed: int = 0,
    device: str = "cpu",
) -> dict:
    """Widen a small Llama target directory into ``out_dir`` (config, shards, tokenizer)."""

    small_dir, out_dir = Path(small_dir), Path(out_dir)
    small_cfg = json.loads((small_dir / "config.json").read_text())
    widening = Widening(Shape.from_config(small_cfg), big)
    state = load_state(small_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = write_sharded(
        widen_target_tensors(state, widening, placement, num_layers, seed=seed, device=device),
        out_dir,
    )
    cfg = widen_llama_config(small_cfg, big, num_layers)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    copy_tokenizer(small_dir, out_dir)
    return {
        "dir": str(out_dir),
        "num_layers": num_layers,
        "shape": big.__dict__,
        "placement": list(placement),
        "ratio": widening.ratio,
        "vocab_size": int(cfg["vocab_size"]),
        "small_vocab_size": int(small_cfg["vocab_size"]),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "bytes": index["metadata"]["total_size"],
        "shards": len(set(index["weight_map"].values())),
    }


def write_widened_drafter(
    small_dir: Path,
    out_dir: Path,
    big: Shape,
    *,
    verifier_dir: Path,
    placement: Sequence[int],
    aux_ids: Sequence[int] | None = None,
) -> dict:
    """Widen a speculators drafter directory for the widened target in ``verifier_dir``."""
    from safetensors.torch import save_file

    small_dir, out_dir = Path(small_dir), Path(out_dir)
    small_cfg = json.loads((small_dir / "config.json").read_text())
    small_ids = small_cfg["eagle_aux_hidden_state_layer_ids"]
    big_ids = map_aux_ids(small_ids, placement, aux_ids)
    layer = small_cfg["transformer_layer_config"]
    widening = Widening(Shape.from_config(layer), big, num_aux=len(small_ids))
    state = widen_drafter_state(load_state(small_dir), widening)
    verifier_cfg = json.loads((Path(verifier_dir) / "config.json").read_text())
    cfg = widen_drafter_config(
        small_cfg,
        big,
        verifier_dir=str(verifier_dir),
        aux_ids=big_ids,
        verifier_architectures=verifier_cfg.get("architectures"),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    info = {"dir": str(out_dir), "aux_ids": big_ids, "small_aux_ids": list(small_ids)}
    info.update(
        vocab_size=int(cfg["transformer_layer_config"]["vocab_size"]),
        draft_vocab_size=int(cfg.get("draft_vocab_size", layer["vocab_size"])),
        small_vocab_size=int(layer["vocab_size"]),
        small_draft_vocab_size=int(small_cfg.get("draft_vocab_size", layer["vocab_size"])),
    )
    if "d2t" in state:
        target_ids = state["d2t"] + torch.arange(state["d2t"].shape[0])
        info["vocab_mapping"] = {
            "t2d_sum": int(state["t2d"].sum()),
            "d2t_nonzero": int(state["d2t"].count_nonzero()),
            "max_target_id": int(target_ids.max()),
        }
    return info
