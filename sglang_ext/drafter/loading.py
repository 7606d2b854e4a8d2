"""Strict loading: every checkpoint tensor is loaded, deliberately ignored, or an error.

SGLang's ``llama_eagle3.py:LlamaForCausalLMEagle3.load_weights`` skips names it does not
know without a word, so a speculators checkpoint whose keys it cannot map runs with random
weights (accept length 1.00). Here one :class:`LoadPlan` decides, per checkpoint tensor, what
happens to it, and at the end names every model parameter that nothing filled. The server's
``load_weights`` and ``sglang-ext doctor`` both drive the same plan, so what doctor predicts is
what the server does.

Weight files are read by :mod:`sglang_ext.drafter.checkpoint_files`: safetensors headers, or pickles
through PyTorch's weights_only loader, as SGLang reads them. A pickle that loader refuses fails
the server's get_config hook (speculators directories) or the building of the
:class:`LoadPlan` (the drafter class's constructor, before SGLang's loader reads any weights),
with the loader's reason.

``d2t`` is checked against ``t2d`` (both must select the same target ids, inside the target
vocabulary) by :func:`plan_from_checkpoint`, which the server's startup (get_config hook, for
speculators directories) and doctor run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglang_ext.drafter.checkpoint_files import (
    DrafterLoadError,
    TensorInfo,
    nonfinite_count,
    refuse_unsafe_pickles,
    shard_index,
    tensor_values,
)
from sglang_ext.drafter.drafter_spec import DrafterSpec
from sglang_ext.drafter.key_table import KeyRule, route

FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})
INTEGER_DTYPES = frozenset({"I64", "I32"})


def dtype_found(dtype: str) -> str:
    """What a weight's dtype is, in words, for a dtype_mismatch (F64 is not "quantized")."""
    if dtype == "F64":
        return "F64 (double precision) weights; cast them to F32, F16 or BF16"
    if dtype.startswith(("F8", "F6", "F4")):
        return f"{dtype} (quantized) weights; quantized drafters are not supported"
    if dtype.startswith(("I", "U")):
        return f"{dtype} (integer) weights; quantized or integer drafters are not supported"
    return f"{dtype} weights, which a drafter parameter cannot hold"

# Checkpoint tensors we read but do not load into a parameter, with the reason. Anything not
# routed by key_table.KEY_TABLE and not listed here is "unexpected" (an error).
IGNORED_TENSORS: dict[str, str] = {
    "t2d": "target->draft vocab mask; SGLang maps draft ids with d2t (checked against t2d by "
    "plan_from_checkpoint)",
    "verifier_lm_head.weight": "speculators training-only copy of the target's lm_head",
    "verifier_norm.weight": "speculators training-only copy of the target's final norm",
}


# --------------------------------------------------------------------------------------------
# The expected parameters


@dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]  # logical (unsharded) shape
    shards: dict | None = None  # shard id -> logical shape of that slice in the checkpoint
    derived: str | None = None  # why no checkpoint tensor fills it (None: one must)
    # The shards are concatenated along dim 0, in `shards` order, and loaded whole (the
    # parameter's loader takes no shard id: MLA's fused_qkv_a_proj_with_mqa).
    concatenated: bool = False


def owns_embeddings(spec: DrafterSpec) -> bool:
    """Whether the drafter's embedding table must come from its checkpoint.

    speculators trains with the target's frozen embeddings unless embed_requires_grad, and
    SGLang shares the target's table with the drafter (LlamaForCausalLM.set_embed) unless the
    hidden sizes differ; a drafter that trained its own must keep them.
    """
    return spec.embed_requires_grad or (
        spec.target_hidden_size is not None and spec.target_hidden_size != spec.hidden_size
    )


def _shared_parameters(spec: DrafterSpec) -> dict[str, ParamSpec]:
    """Embeddings, fc and its norms, the final norm and lm_head: the same in every drafter."""
    hidden, fc_in = spec.hidden_size, spec.fc_input_hidden_size
    embed_source = None
    if not owns_embeddings(spec):
        embed_source = "shared from the target at startup (SGLang set_embed)"
        if spec.format == "speculators":
            embed_source += "; drafter trained with embed_requires_grad=false"
    params = {
        "model.embed_tokens.weight": ParamSpec((spec.vocab_size, hidden), derived=embed_source),
        "model.fc.weight": ParamSpec((hidden, spec.num_aux_hidden_states * fc_in)),
        "model.norm.weight": ParamSpec((hidden,)),
    }
    if spec.norm_before_fc:
        params["model.input_norm.weight"] = ParamSpec((spec.num_aux_hidden_states * fc_in,))
    if spec.fc_norm:
        for i in range(spec.num_aux_hidden_states):
            params[f"model.fc_norm.{i}.weight"] = ParamSpec((fc_in,))
    if spec.tie_word_embeddings:
        pass  # lm_head is model.embed_tokens
    elif spec.draft_vocab_size is None:
        params["lm_head.weight"] = ParamSpec(
            (spec.vocab_size, hidden),
            derived="taken from the target at startup (config has no draft_vocab_size)",
        )
    else:
        params["lm_head.weight"] = ParamSpec((spec.draft_vocab_size, hidden))
    return params


def expected_mla_parameters(spec: DrafterSpec) -> dict[str, ParamSpec]:
    """SGLang's MLA drafter (kimi_k25_eagle3.py: Eagle3MLADecoderLayer, one draft layer)."""
    mla, hidden, heads = spec.mla, spec.hidden_size, spec.num_attention_heads
    attn, inter = "model.midlayer.self_attn.", spec.intermediate_size
    rope_kv = mla.kv_lora_rank + mla.qk_rope_head_dim
    params = _shared_parameters(spec)
    params.update(
        {
            attn + "fused_qkv_a_proj_with_mqa.weight": ParamSpec(
                (mla.q_lora_rank + rope_kv, 2 * hidden),
                shards={"q_a": (mla.q_lora_rank, 2 * hidden), "kv_a": (rope_kv, 2 * hidden)},
                concatenated=True,
            ),
            attn + "q_a_layernorm.weight": ParamSpec((mla.q_lora_rank,)),
            attn + "q_b_proj.weight": ParamSpec(
                (heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim), mla.q_lora_rank)
            ),
            attn + "kv_a_layernorm.weight": ParamSpec((mla.kv_lora_rank,)),
            attn + "kv_b_proj.weight": ParamSpec(
                (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank)
            ),
            attn + "o_proj.weight": ParamSpec((hidden, heads * mla.v_head_dim)),
            "model.midlayer.mlp.gate_up_proj.weight": ParamSpec(
                (2 * inter, hidden), shards={0: (inter, hidden), 1: (inter, hidden)}
            ),
            "model.midlayer.mlp.down_proj.weight": ParamSpec((hidden, inter)),
        }
    )
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        params[f"model.midlayer.{norm}.weight"] = ParamSpec((hidden,))
    return params


def expected_parameters(spec: DrafterSpec) -> dict[str, ParamSpec]:
    """Every parameter of the plugin's drafter model for `spec`, with its source."""
    if spec.layer_type == "mla":
        return expected_mla_parameters(spec)
    hidden, heads, kv, hd = (
        spec.hidden_size,
        spec.num_attention_heads,
        spec.num_key_value_heads,
        spec.head_dim,
    )
    params = _shared_parameters(spec)
    for n in range(spec.num_hidden_layers):
        prefix = f"model.layers.{n}."
        width = 2 * hidden if n == 0 else hidden
        params[prefix + "self_attn.qkv_proj.weight"] = ParamSpec(
            ((heads + 2 * kv) * hd, width),
            shards={"q": (heads * hd, width), "k": (kv * hd, width), "v": (kv * hd, width)},
        )
        params[prefix + "self_attn.o_proj.weight"] = ParamSpec((hidden, heads * hd))
        inter = spec.intermediate_size
        params[prefix + "mlp.gate_up_proj.weight"] = ParamSpec(
            (2 * inter, hidden), shards={0: (inter, hidden), 1: (inter, hidden)}
        )
        params[prefix + "mlp.down_proj.weight"] = ParamSpec((hidden, inter))
        params[prefix + "post_attention_layernorm.weight"] = ParamSpec((hidden,))
        params[prefix + "hidden_norm.weight"] = ParamSpec((hidden,))
        params[prefix + "input_layernorm.weight"] = ParamSpec(
            (hidden,),
            derived=None
            if n == 0
            else "unused: SGLang's eagle3 layers >= 1 normalise their input with hidden_norm",
        )
        if spec.layer_type == "qwen3":
            params[prefix + "self_attn.q_norm.weight"] = ParamSpec((hd,))
            params[prefix + "self_attn.k_norm.weight"] = ParamSpec((hd,))
    return params


# --------------------------------------------------------------------------------------------
# The plan and its report


@dataclass
class TensorEntry:
    name: str
    # loaded | ignored | derived | missing | unexpected | shape_mismatch | dtype_mismatch |
    # value_mismatch (d2t/t2d)
    status: str
    param: str | None = None
    expected: str | None = None
    found: str | None = None
    reason: str = ""

    @property
    def is_error(self) -> bool:
        return self.status in (
            "missing",
            "unexpected",
            "shape_mismatch",
            "dtype_mismatch",
            "value_mismatch",
            "non_finite",
        )


@dataclass
class LoadReport:
    source: str
    entries: list[TensorEntry] = field(default_factory=list)
    # Config-level causes (the config's layer count or hidden size does not describe the
    # checkpoint), each one sentence summing up the per-tensor entries it explains.
    causes: list[str] = field(default_factory=list)
    explained: set[int] = field(default_factory=set)  # ids of the entries a cause sums up

    @property
    def errors(self) -> list[str]:
        """Causes first, then the per-tensor problems no cause explains."""
        return self.causes + [
            self.describe(e) for e in self.entries if e.is_error and id(e) not in self.explained
        ]

    def count(self, status: str) -> int:
        return sum(1 for e in self.entries if e.status == status)

    @staticmethod
    def describe(entry: TensorEntry) -> str:
        what = {
            "missing": "missing",
            "unexpected": "unexpected tensor",
            "shape_mismatch": "shape mismatch",
            "dtype_mismatch": "dtype mismatch",
            "value_mismatch": "value mismatch",
            "non_finite": "non-finite values",
        }.get(entry.status, entry.status)
        text = f"{entry.name}: {what}"
        if entry.expected or entry.found:
            text += f" (expected {entry.expected or '-'}, found {entry.found or '-'})"
        if entry.reason:
            text += f": {entry.reason}"
        return text

    def raise_for_errors(self) -> None:
        errors = self.errors
        if errors:
            shown = "\n  - ".join(errors[:40])
            more = f"\n  ... and {len(errors) - 40} more" if len(errors) > 40 else ""
            raise DrafterLoadError(
                f"drafter checkpoint {self.source} does not match the model it configures "
                f"({len(errors)} problem(s)); refusing to serve a partly random drafter:\n"
                f"  - {shown}{more}\nRun `sglang-ext doctor {self.source}` for the full report."
            )

    def to_json(self) -> list[dict]:
        return [asdict(e) for e in self.entries]


@dataclass(frozen=True)
class Decision:
    action: str  # "load" | "d2t" | "skip"
    param: str | None = None
    shard: str | int | None = None


def _fmt(shape, dtype=None) -> str:
    text = "[" + ", ".join(str(d) for d in shape) + "]"
    return f"{text} {dtype}" if dtype else text


def fc_width_reason(spec: DrafterSpec, fc_in: int) -> str:
    """Why an fc trained on more (or fewer) target layers than the config names cannot serve:
    the seed's failure, where the target handed over one layer as wide as the drafter."""
    width, n = spec.fc_input_hidden_size, spec.num_aux_hidden_states
    if width <= 0:  # a config error reported on its own
        return f"fc reads {fc_in} target features; the config's hidden size is {width}"
    layers = (
        f" = {fc_in // width} x {width}" if fc_in % width == 0 else f" (not a multiple of {width})"
    )
    seed = spec.as_wide_as_the_drafter(n * width)
    return (
        f"fc reads {fc_in}{layers} target features, but the config's aux layer ids "
        f"{list(spec.aux_hidden_state_layer_ids or [])} name {n} layer(s), so the target hands "
        f"over {n} x {width} = {n * width}{seed}; list the layers it was trained on"
    )


class LoadPlan:
    """Routes checkpoint tensors to parameters and accounts for both sides.

    Built once per drafter (the model's constructor checks its parameters against it, then
    each load runs through it); :meth:`begin` starts the accounting of one pass over a
    checkpoint, so a second load is counted afresh, not as tensors appearing twice."""

    def __init__(self, spec: DrafterSpec):
        if Path(spec.source).is_dir():  # before SGLang's loader reads any pickle
            refuse_unsafe_pickles(Path(spec.source))
            shard_index(Path(spec.source))  # a missing shard is named, not 8 missing params
        self.spec = spec
        self.params = expected_parameters(spec)
        self.begin()

    def begin(self) -> LoadPlan:
        """Start one pass over a checkpoint: an empty report, nothing filled or seen yet."""
        spec = self.spec
        self.report = LoadReport(source=spec.source)
        self._filled: dict[str, set] = {name: set() for name in self.params}
        # (param, shard) a tensor was offered for but refused (shape, dtype): reported on that
        # tensor, not a second time as "missing".
        self._refused: set[tuple] = set()
        self._seen: set[str] = set()
        return self

    def check_model(self, model) -> None:
        """check_model_parameters over the model's parameters, less those SGLang marks
        ``_skip_weight_check``: what a quantization method adds with a default for when the
        checkpoint lacks it (``quantization/kv_cache.py:BaseKVCacheMethod.create_weights``:
        each attention's k_scale / v_scale under ``--speculative-draft-model-quantization
        fp8``, which SGLang sets to 1.0 after loading; its own ``weight_checker`` skips them
        alike). 2026-12-03: without this the plugin refused every fp8-served drafter."""
        self.check_model_parameters(
            name
            for name, param in model.named_parameters()
            if not getattr(param, "_skip_weight_check", False)
        )

    def check_model_parameters(self, names: Iterable[str]) -> None:
        """Fail if the SGLang model has parameters this plan does not account for (or lacks
        ones it expects): a newer SGLang layout must not leave anything at random init."""
        names = set(names)
        unknown = sorted(names - set(self.params))
        absent = sorted(set(self.params) - names)
        if unknown or absent:
            raise DrafterLoadError(
                f"sglang_ext's parameter table does not match this SGLang's drafter model: "
                f"not accounted for {unknown}, expected but absent {absent}. Upgrade sglang_ext."
            )

    def route(self, name: str, shape: tuple[int, ...], dtype: str) -> Decision:
        spec = self.spec
        entry = TensorEntry(name=name, status="loaded", found=_fmt(shape, dtype))
        self.report.entries.append(entry)
        if name in self._seen:
            entry.status, entry.reason = "unexpected", "appears twice in the checkpoint"
            return Decision("skip")
        self._seen.add(name)

        if name in ("d2t", "t2d"):
            return self._vocab_mapping(entry, name, shape, dtype)
        if name in IGNORED_TENSORS:
            entry.status, entry.reason = "ignored", IGNORED_TENSORS[name]
            return Decision("skip")

        routed = route(name, spec.format, spec.layer_type)
        if routed is None:
            entry.status = "unexpected"
            entry.reason = "no parameter of this drafter reads it"
            return Decision("skip")
        param, shard, rule = routed
        entry.param = param
        expected = self.params.get(param)
        if expected is None:
            entry.status = "unexpected"
            entry.reason = self._why_not_expected(rule)
            return Decision("skip")
        if expected.derived is not None:
            entry.status = "ignored"
            entry.reason = expected.derived
            return Decision("skip")
        want = expected.shards[shard] if expected.shards else expected.shape
        entry.expected = _fmt(want)
        if dtype not in FLOAT_DTYPES:
            entry.status = "dtype_mismatch"
            entry.expected = _fmt(want, "F32/F16/BF16")
            entry.reason = f"found {dtype_found(dtype)}"
            self._refused.add((param, shard))
            return Decision("skip")
        if tuple(shape) != tuple(want):
            entry.status = "shape_mismatch"
            self._refused.add((param, shard))
            if param == "model.fc.weight" and len(shape) == 2:
                entry.reason = fc_width_reason(spec, int(shape[1]))
            return Decision("skip")
        self._filled[param].add(shard)
        if rule.note:
            entry.reason = rule.note
        return Decision("load", param, shard)

    def mark_nonfinite(self, name: str, count: int, total: int) -> None:
        """The loaded tensor `name` holds `count` NaN/Inf values: an error on that tensor
        (a drafter with NaN weights proposes garbage, or NaN logits, on every request)."""
        if count <= 0:
            return
        entry = next(e for e in reversed(self.report.entries) if e.name == name)
        entry.status = "non_finite"
        entry.expected = "finite values"
        entry.found = f"{count} of {total} values NaN or Inf"
        entry.reason = (
            "a drafter with NaN/Inf weights cannot propose tokens; retrain or re-export it"
        )

    def _why_not_expected(self, rule: KeyRule) -> str:
        spec = self.spec
        if rule.param == "model.input_norm.weight":
            return "config has norm_before_fc=false, so nothing reads input_norm"
        if "fc_norm" in rule.param:
            return f"config has fc_norm=false or fewer aux states ({spec.num_aux_hidden_states})"
        if "q_norm" in rule.param or "k_norm" in rule.param:
            return f"draft layers are {spec.layer_type}, which have no q_norm/k_norm"
        if ".layers." in rule.param:
            return f"config has {spec.num_hidden_layers} draft layer(s)"
        return "no parameter of this drafter reads it"

    def _vocab_mapping(self, entry: TensorEntry, name: str, shape, dtype) -> Decision:
        spec = self.spec
        if name == "d2t":
            entry.expected = _fmt((spec.draft_vocab_size,), "I64")
            if dtype not in INTEGER_DTYPES:
                entry.status = "dtype_mismatch"
                entry.reason = "d2t holds integer offsets (draft id + d2t = target id)"
                return Decision("skip")
            if spec.draft_vocab_size is None or tuple(shape) != (spec.draft_vocab_size,):
                entry.status = "shape_mismatch"
                return Decision("skip")
            entry.param, entry.reason = "hot_token_id", "draft->target id map (draft id + d2t)"
            return Decision("d2t")
        entry.expected = _fmt((spec.vocab_size,), "BOOL")
        if dtype != "BOOL":
            entry.status = "dtype_mismatch"
            return Decision("skip")
        if tuple(shape) != (spec.vocab_size,):
            entry.status = "shape_mismatch"
            return Decision("skip")
        entry.status, entry.reason = "ignored", IGNORED_TENSORS["t2d"]
        return Decision("skip")

    def finish(self) -> LoadReport:
        spec = self.spec
        for param, expected in self.params.items():
            filled = self._filled[param]
            if expected.derived is not None:
                self.report.entries.append(
                    TensorEntry(name=param, status="derived", param=param, reason=expected.derived)
                )
                continue
            needed = set(expected.shards) if expected.shards else {None}
            refused = {shard for p, shard in self._refused if p == param}
            for shard in sorted(needed - filled - refused, key=str):
                shape = expected.shards[shard] if expected.shards else expected.shape
                label = param if shard is None else f"{param}[shard {shard}]"
                self.report.entries.append(
                    TensorEntry(
                        name=label,
                        status="missing",
                        param=param,
                        expected=_fmt(shape),
                        reason="no checkpoint tensor fills it; it would stay at random init",
                    )
                )
        if spec.has_vocab_mapping and "d2t" not in self._seen:
            self.report.entries.append(
                TensorEntry(
                    name="d2t",
                    status="missing",
                    expected=_fmt((spec.draft_vocab_size,), "I64"),
                    reason=f"draft_vocab_size {spec.draft_vocab_size} < vocab_size "
                    f"{spec.vocab_size} needs the draft->target id map",
                )
            )
        self._config_causes()
        return self.report

    def _config_causes(self) -> None:
        """Name the config-level cause first when the config's layer count or hidden size
        does not describe the checkpoint (a config declaring 36 draft layers beside a
        one-layer checkpoint is one sentence, not 315 "missing" lines)."""
        spec, report = self.spec, self.report
        config = f"{spec.source}/config.json"
        nested = "transformer_layer_config." if spec.format == "speculators" else ""
        layer_of = {}
        for entry in report.entries:
            parts = (entry.param or "").split(".")
            if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
                layer_of[id(entry)] = int(parts[2])
        held = {
            layer_of[id(e)]
            for e in report.entries
            if id(e) in layer_of and e.status not in ("missing", "derived")
        }
        declared = spec.num_hidden_layers
        if held and spec.layer_type != "mla" and max(held) + 1 != declared:
            count = max(held) + 1
            folded = [
                e
                for e in report.entries
                if e.is_error
                and id(e) in layer_of
                and layer_of[id(e)] >= min(count, declared)
                and e.status in ("missing", "unexpected")
            ]
            if folded:
                first, last = min(count, declared), max(count, declared) - 1
                layers = f"layer {first}" if first == last else f"layers {first}-{last}"
                what = "have no tensor" if declared > count else "have no parameter to load into"
                noun = "parameter(s)" if declared > count else "checkpoint tensor(s)"
                held_text = "layer 0" if count == 1 else f"layers 0-{count - 1}"
                report.causes.append(
                    f"{config} declares {declared} draft layer(s) ({nested}num_hidden_layers) "
                    f"but the checkpoint holds weights for {count} ({held_text}): the "
                    f"{len(folded)} {noun} of {layers} {what}; set num_hidden_layers to "
                    f"{count}, or use the checkpoint trained with {declared} layers"
                )
                if declared > count:  # hundreds of "missing" lines say nothing more
                    report.explained.update(id(e) for e in folded)
                # else the few "unexpected" lines stay: each names a tensor the config drops
        norm = next(
            (
                e
                for e in report.entries
                if e.param == "model.norm.weight" and e.status in ("loaded", "shape_mismatch")
            ),
            None,
        )
        found = norm.found.split("]")[0].strip("[") if norm and norm.found else ""
        if norm is not None and norm.status == "shape_mismatch" and found.isdigit():
            folded = [e for e in report.entries if e.status in ("shape_mismatch", "missing")]
            report.causes.insert(
                0,
                f"{config} says {nested}hidden_size {spec.hidden_size}, but the checkpoint's "
                f"tensors are "
                f"{found} wide ({norm.name} {norm.found}): the config does not describe this "
                f"checkpoint, and {len(folded)} tensor shape(s) disagree as a result; fix "
                f"hidden_size (and the fields derived from it) or use the matching checkpoint",
            )
            report.explained.update(id(e) for e in folded)


def plan_from_checkpoint(spec: DrafterSpec, tensors: Iterable[TensorInfo]) -> LoadReport:
    """The load report for tensors read from disk (doctor's and the server startup's path),
    including the d2t/t2d agreement, which needs their values."""
    plan = LoadPlan(spec)
    tensors = list(tensors)
    for tensor in tensors:
        decision = plan.route(tensor.name, tensor.shape, tensor.dtype)
        if decision.action == "load":
            total = 1
            for dim in tensor.shape:
                total *= dim
            plan.mark_nonfinite(tensor.name, nonfinite_count(spec.source, tensor), total)
    report = plan.finish()
    check_vocab_mapping(spec, report, {t.name: t for t in tensors})
    return report


def check_vocab_mapping(spec: DrafterSpec, report: LoadReport, tensors: dict) -> None:
    """d2t and t2d must describe the same draft vocabulary: d2t's target ids (draft id + d2t)
    inside the target vocabulary, and exactly the ids t2d marks. A disagreement marks the
    tensor's entry `value_mismatch`."""
    entries = {e.name: e for e in report.entries if e.name in ("d2t", "t2d")}
    if not ("d2t" in tensors and entries.get("d2t") and entries["d2t"].status == "loaded"):
        return
    import numpy as np

    def values(name: str):
        return tensor_values(Path(spec.source) / tensors[name].file, name)

    d2t = values("d2t").astype(np.int64)
    target_ids = d2t + np.arange(d2t.shape[0])
    outside = (target_ids < 0) | (target_ids >= spec.vocab_size)
    if outside.any():
        entry = entries["d2t"]
        entry.status, entry.expected = "value_mismatch", f"ids in [0, {spec.vocab_size})"
        entry.found = f"{int(outside.sum())} outside, e.g. {int(target_ids[outside][0])}"
        entry.reason = "d2t maps draft ids outside the target vocabulary"
        return
    t2d_entry = entries.get("t2d")
    if "t2d" not in tensors or t2d_entry is None or t2d_entry.status != "ignored":
        return
    t2d = values("t2d").astype(bool)
    selected = np.zeros(spec.vocab_size, dtype=bool)
    selected[target_ids] = True
    if not np.array_equal(selected, t2d):
        t2d_entry.status = "value_mismatch"
        t2d_entry.expected = f"the {int(selected.sum())} target ids d2t selects"
        t2d_entry.found = f"{int(t2d.sum())} marked, {int((selected != t2d).sum())} differ"
        t2d_entry.reason = "d2t and t2d disagree on the draft vocabulary"
