"""`sglang-ext doctor DRAFT [--target TARGET] [--json]`: what SGLang will do with a drafter.

No GPU, no server, no SGLang import: reads config.json as data and safetensors headers, and
runs the same LoadPlan the server's load_weights runs (``sglang_ext.drafter.loading``), the same
capture planning the startup hook runs (``sglang_ext.drafter.aux_capture``), and predicts what
stock SGLang (no plugin) would do with the same directory.

JSON schema (top-level keys): see README "doctor JSON".
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_ext import __version__, compat
from sglang_ext.cli import exit_codes
from sglang_ext.drafter import architecture_aliases
from sglang_ext.drafter import context_length as ctx
from sglang_ext.drafter.aux_capture import TargetInfo
from sglang_ext.drafter.checkpoint_files import DrafterLoadError, read_checkpoint
from sglang_ext.drafter.config_fields import DrafterConfigError, read_json
from sglang_ext.drafter.drafter_spec import DrafterSpec
from sglang_ext.drafter.key_table import SGLANG_LEGACY_PREFIXES
from sglang_ext.drafter.loading import LoadReport, expected_parameters, plan_from_checkpoint
from sglang_ext.drafter.model_paths import config_path
from sglang_ext.drafter.speculators_format import (
    load_drafter_spec,
    served_config_dict,
    sglang_config_dict,
)

STOCK_UNRECOGNIZED = (
    "ValueError: Unrecognized model in {path}. Should have a `model_type` key in its config.json"
)


@dataclass
class Diagnosis:
    drafter: str | None  # None: the command line named none (usage error)
    target: str | None
    format: str | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config: dict | None = None
    sglang_config: dict | None = None
    report: LoadReport | None = None
    aux_layers: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    stock_sglang: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "ERROR" if self.errors else "OK"

    def to_json(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for entry in self.report.entries if self.report else []:
            counts[entry.status] = counts.get(entry.status, 0) + 1
        return {
            "sglang_ext_version": __version__,
            "drafter": self.drafter,
            "target": self.target,
            "format": self.format,
            "verdict": self.verdict,
            "errors": self.errors,
            "warnings": self.warnings,
            "config": self.config,
            "sglang_config": self.sglang_config,
            "tensors": self.report.to_json() if self.report else [],
            "tensor_counts": counts,
            "aux_layers": self.aux_layers,
            "checks": self.checks,
            "stock_sglang": self.stock_sglang,
        }


def diagnose(
    drafter: str | Path, target: str | Path | None = None, context_length: int | None = None
) -> Diagnosis:
    """`context_length`: the server's --context-length, if it will be given one."""
    diagnosis = Diagnosis(drafter=str(drafter), target=str(target) if target else None)
    try:
        spec = load_drafter_spec(drafter)
    except DrafterConfigError as exc:
        diagnosis.errors.append(str(exc))
        return diagnosis
    diagnosis.format = spec.format
    diagnosis.config = spec.to_json()
    alias = alias_note_for(spec)
    if alias:
        diagnosis.warnings.append(alias)
    if spec.format == "speculators":
        diagnosis.sglang_config = sglang_config_dict(spec)
    target_info = None
    if target is not None:
        try:
            target_info = TargetInfo.from_path(target)
        except DrafterConfigError as exc:
            diagnosis.errors.append(str(exc))
    load_error = None
    try:
        tensors = read_checkpoint(spec.source)
    except DrafterLoadError as exc:
        diagnosis.errors.append(str(exc))
        tensors, load_error = None, str(exc)
    if tensors is not None:
        try:
            diagnosis.report = plan_from_checkpoint(spec, tensors)
        except DrafterLoadError as exc:  # d2t/t2d values unreadable
            diagnosis.errors.append(str(exc))
            tensors = None
    tensor_errors: list[str] = []
    if tensors is not None:
        # Most important first: config-level causes (the config does not describe the
        # checkpoint, the drafter does not fit the target) before the per-tensor lines.
        causes = diagnosis.report.causes
        diagnosis.errors.extend(causes)
        tensor_errors = diagnosis.report.errors[len(causes):]
        _vocab_checks(diagnosis, spec, tensors, spec.source)
    _aux_layers(diagnosis, spec, target_info, target_given=target is not None)
    _config_checks(diagnosis, spec)
    diagnosis.errors.extend(tensor_errors)
    diagnosis.stock_sglang = predict_stock(spec, tensors, target_info)
    if alias_note_for(spec):
        diagnosis.stock_sglang = {
            "startup": "fails",
            "summary": "fails at startup: ValueError: Model architectures "
            f"{spec.layer_config['architectures']} are not supported for now "
            "(models/registry.py: SGLang registers no class under that name)",
        }
    elif load_error is not None and spec.format == "sglang":
        # SGLang's own loader reads the same files the same way (safetensors, or pickles
        # with weights_only=True), so it fails on them too, only later and with a traceback.
        diagnosis.stock_sglang = {
            "startup": "fails",
            "summary": f"fails loading the weights, as the plugin does: {load_error}",
        }
    _context_check(diagnosis, spec, target if target_info is not None else None, context_length)
    return diagnosis


def _context_check(diagnosis: Diagnosis, spec: DrafterSpec, target, context_length) -> None:
    """The drafter's context against the one SGLang builds it with (the target's context_len,
    which --context-length sets): sglang_ext.drafter.context_length, which the server's hook
    follows."""
    try:
        drafter_length, field_name = ctx.drafter_context(
            served_config_dict(spec), spec.format == "speculators"
        )
    except ctx.ContextLengthError as exc:
        diagnosis.errors.append(f"{config_path(spec.source)}: {exc}")
        return
    target_length = context_length
    if target is not None:
        target_file = config_path(target)
        try:
            derived, target_field = ctx.from_mapping(
                ctx.target_text_config(read_json(target_file))
            )
        except (ctx.ContextLengthError, DrafterConfigError) as exc:
            diagnosis.errors.append(f"{target_file}: {exc}")
            return
        if context_length is None:
            target_length = derived
        elif context_length > derived and not ctx.override_allowed():
            diagnosis.errors.append(
                f"--context-length {context_length} is above the target's derived context "
                f"length {derived} ({target_file}: {target_field or 'SGLang default'}): "
                f"SGLang refuses it at startup (stock and plugin alike); give at most {derived} "
                f"or set {ctx.OVERRIDE_ENV}=1"
            )
    diagnosis.checks["context_length"] = {
        "drafter": drafter_length,
        "drafter_field": field_name,
        "served_at": target_length,
    }
    if target_length is None:
        return
    warning = ctx.context_warning(
        drafter_length, str(config_path(spec.source)), field_name, target_length
    )
    if warning is None:
        return
    diagnosis.warnings.append(warning)
    if ctx.override_allowed():
        return
    refusal = ctx.stock_refusal(drafter_length, target_length)
    stock = diagnosis.stock_sglang
    if stock.get("startup") == "starts":
        stock["startup"] = "fails"
        stock["summary"] = f"fails at startup: {refusal}"
    else:
        stock.setdefault("if_converted_naively", []).append(f"fails at startup: {refusal}")


def alias_note_for(spec: DrafterSpec) -> str | None:
    """The published name an SGLang-format drafter's config carries, if it is an alias."""
    archs = spec.layer_config.get("architectures") if spec.format == "sglang" else None
    return architecture_aliases.alias_note(archs[0]) if isinstance(archs, list) and archs else None


def _aux_layers(
    diagnosis: Diagnosis, spec: DrafterSpec, target: TargetInfo | None, target_given: bool
) -> None:
    ids = list(spec.aux_hidden_state_layer_ids) if spec.aux_hidden_state_layer_ids else None
    info: dict[str, Any] = {
        "checkpoint_ids": ids,
        "checkpoint_convention": (
            "speculators/vLLM: id k = hidden state entering decoder layer k "
            "(HF output_hidden_states[k])"
            if spec.aux_id_convention == "speculators"
            else "SGLang eagle_config: ids passed to the target's set_eagle3_layers_to_capture"
        ),
        "num_aux_hidden_states": spec.num_aux_hidden_states,
        "fc_input_width": spec.expected_target_feature_width,
    }
    if target is None:
        info["captured_layers"] = None
        diagnosis.warnings.append(
            ("--target could not be read (see the errors)" if target_given else "no --target given")
            + ": aux layer ids, hidden size and vocab are not checked"
        )
        diagnosis.aux_layers = info
        return
    rule = target.capture_rule
    captured = spec.captured_layers(target)
    info.update(
        target_num_layers=target.num_hidden_layers,
        target_architecture=target.architecture,
        capture_rule=rule,
        captured_layers=captured,
        captured_as="hidden state entering target layer k (= HF output_hidden_states[k])",
    )
    problems = spec.target_problems(target)
    diagnosis.errors.extend(problems)
    if spec.aux_id_convention == "speculators" and not problems:
        try:
            info["sglang_ids"] = target.sglang_ids_for(captured)
        except DrafterConfigError as exc:
            info["sglang_ids"] = None
            info["capture_set_directly"] = True
            diagnosis.warnings.append(str(exc))
    elif spec.aux_id_convention == "sglang":
        info["sglang_ids"] = ids
    diagnosis.checks.update(
        hidden_size_matches=spec.fc_input_hidden_size == target.hidden_size,
        vocab_matches=spec.vocab_size == target.vocab_size,
        capture_ok=not spec.capture_problems(target),
    )
    diagnosis.aux_layers = info


def served_attention(spec: DrafterSpec) -> str:
    """How the plugin serves the drafter's attention on the installed SGLang."""
    if not spec.sliding_layers:
        return "full (as trained)"
    if compat.supports("draft_layer_window"):
        return (f"sliding window {spec.sliding_window} on layers {list(spec.sliding_layers)} "
                "(as trained), full on the others")
    return "full"


def _config_checks(diagnosis: Diagnosis, spec: DrafterSpec) -> None:
    diagnosis.checks.update(
        draft_layers=spec.num_hidden_layers,
        layer_type=spec.layer_type,
        sliding_window=spec.sliding_window,
        served_attention=served_attention(spec),
        expected_parameters=len(expected_parameters(spec)),
    )
    if spec.sliding_layers and not compat.supports("draft_layer_window"):
        diagnosis.warnings.append(
            f"trained with sliding_window={spec.sliding_window} on layers "
            f"{list(spec.sliding_layers)}; SGLang {compat.sglang_version()}'s EAGLE draft decode "
            f"has no per-layer window (0.5.23 has), so it is served as full attention: the same "
            f"math for contexts up to {spec.sliding_window} tokens, lower acceptance beyond "
            f"(outputs stay lossless)"
        )
    if spec.speculative_tokens:
        diagnosis.checks["trained_speculative_tokens"] = spec.speculative_tokens


def _vocab_checks(diagnosis: Diagnosis, spec: DrafterSpec, tensors, drafter) -> None:
    """d2t and t2d must describe the same draft vocabulary: the load report checked it
    (loading.check_vocab_mapping, which the server's startup runs too)."""
    names = {t.name for t in tensors}
    if {"d2t", "t2d"} <= names and not diagnosis.report.errors:
        diagnosis.checks["vocab_mapping"] = "d2t and t2d agree"


# --------------------------------------------------------------------------------------------
# What stock SGLang (no plugin) does with the same directory


def math_stock_lacks(spec: DrafterSpec) -> list[str]:
    """speculators options whose math stock SGLang's eagle3 drafter does not implement."""
    lacks = []
    if spec.norm_before_residual:
        lacks.append(
            "norm_before_residual: stock starts the residual stream from the raw target "
            "features, speculators from the normalised ones"
        )
    if spec.layer_type == "qwen3":
        lacks.append("qwen3 draft layers: stock has no q_norm/k_norm (dropped silently)")
    if spec.embed_requires_grad and not (
        spec.target_hidden_size and spec.target_hidden_size != spec.hidden_size
    ):
        lacks.append(
            "embed_requires_grad: stock overwrites the drafter's trained embeddings with the "
            "target's (set_embed)"
        )
    # The sliding window is not listed: before 0.5.23 the plugin serves it as full attention
    # too, and from 0.5.23 on (served as trained) the difference only shows beyond the window
    # length, so it is no reason to refuse a conversion (convert's notes say it).
    return lacks


def predict_stock(spec: DrafterSpec, tensors, target: TargetInfo | None) -> dict[str, Any]:
    if spec.format == "speculators":
        return {
            "startup": "fails",
            "summary": "fails at startup: " + STOCK_UNRECOGNIZED.format(path=spec.source),
            "if_converted_naively": math_stock_lacks(spec)
            + [
                "aux layer ids: speculators counts the state entering layer k, SGLang's "
                "llama/qwen targets add 1 (off by one unless converted)"
            ],
        }
    prediction: dict[str, Any] = {"startup": "starts"}
    notes = []
    if tensors is not None:
        load = stock_mla_load if spec.layer_type == "mla" else stock_load
        skipped, uninitialised = load(spec, [t.name for t in tensors])
        prediction["silently_skipped_tensors"] = skipped
        prediction["left_at_random_init"] = uninitialised
        if skipped:
            notes.append(f"silently skips {len(skipped)} tensor(s)")
        if uninitialised:
            notes.append(f"leaves {len(uninitialised)} parameter(s) at random init")
    if not spec.use_aux_hidden_state:
        width = target.hidden_size if target is not None else spec.fc_input_hidden_size
        notes.append(
            "fusion silently skipped: use_aux_hidden_state is false, so the target hands over "
            f"its final hidden state, {width} wide (accept length ~1.00)"
        )
    elif target is not None:
        captured = spec.captured_layers(target)
        distinct = len(set(k for k in captured if 0 <= k < target.num_hidden_layers))
        width = distinct * target.hidden_size
        if distinct != spec.num_aux_hidden_states:
            if width == spec.hidden_size:
                notes.append(
                    f"fusion silently skipped: the target hands over {width}-wide features, "
                    "as wide as the drafter (accept length ~1.00)"
                )
            else:
                notes.append(
                    "starts, then the scheduler dies on the first request: mat1 and mat2 shapes "
                    f"cannot be multiplied (Nx{width} and {spec.expected_target_feature_width}x"
                    f"{spec.hidden_size})"
                )
    prediction["summary"] = "; ".join(notes) or "serves as the plugin does"
    return prediction


def stock_load(spec: DrafterSpec, names: list[str]) -> tuple[list[str], list[str]]:
    """Which tensors stock `LlamaForCausalLMEagle3.load_weights` skips without a word and which
    parameters nothing fills, following its name handling (legacy_name_map, q/k/v and
    gate/up stacking, `name` or `model.name`)."""
    params = expected_parameters(spec)
    # stock renames by substring (llama_eagle3.py:load_weights legacy_name_map)
    legacy = {old.rstrip("."): new.rstrip(".") for old, new in SGLANG_LEGACY_PREFIXES}
    stacked = {
        ".q_proj": ".qkv_proj",
        ".k_proj": ".qkv_proj",
        ".v_proj": ".qkv_proj",
        ".gate_proj": ".gate_up_proj",
        ".up_proj": ".gate_up_proj",
    }
    skipped, filled = [], set()
    for original in names:
        name = original
        for old, new in legacy.items():
            name = name.replace(old, new)
        if "d2t" in name or "t2d" in name:
            continue
        for old, new in stacked.items():
            if old in name:
                name = name.replace(old, new)
                break
        param = name if name in params else f"model.{name}"
        if param in params:
            filled.add(param)
        else:
            skipped.append(original)
    uninitialised = sorted(p for p, s in params.items() if p not in filled and s.derived is None)
    return skipped, uninitialised


def stock_mla_load(spec: DrafterSpec, names: list[str]) -> tuple[list[str], list[str]]:
    """The same for stock `Eagle3DeepseekV2ForCausalLM.load_weights` (kimi_k25_eagle3.py):
    `layers.0.` -> `model.midlayer.`, `model.` prepended except to lm_head, gate/up stacked,
    q_a_proj and kv_a_proj_with_mqa fused once both arrived (one alone is dropped)."""
    params = expected_parameters(spec)
    stacked = {".gate_proj": ".gate_up_proj", ".up_proj": ".gate_up_proj"}
    fused_parts = (".q_a_proj", ".kv_a_proj_with_mqa")
    skipped, filled, parts = [], set(), {}
    for original in names:
        if original in ("d2t", "t2d") or original.endswith((".d2t", ".t2d")):
            continue
        name = re.sub(r"^layers\.0\.", "midlayer.", original)
        name = name if name.startswith("lm_head.") else f"model.{name}"
        old = next((old for old in stacked if old in name), None)
        if old is not None and name.replace(old, stacked[old]) in params:
            filled.add(name.replace(old, stacked[old]))
            continue
        part = next((part for part in fused_parts if part in name), None)
        if part is not None:  # silently kept back until its partner arrives
            fused = name.replace(part, ".fused_qkv_a_proj_with_mqa")
            parts.setdefault(fused, set()).add(part)
            if parts[fused] == set(fused_parts) and fused in params:
                filled.add(fused)
            continue
        if name in params:
            filled.add(name)
        else:
            skipped.append(original)
    uninitialised = sorted(p for p, s in params.items() if p not in filled and s.derived is None)
    return skipped, uninitialised


# --------------------------------------------------------------------------------------------


def format_text(diagnosis: Diagnosis) -> str:
    data = diagnosis.to_json()
    lines = [
        f"drafter: {diagnosis.drafter}",
        f"format:  {diagnosis.format or '(unknown: the config could not be read)'}",
        f"target:  {diagnosis.target or '(none given)'}",
    ]
    if diagnosis.config:
        c = diagnosis.config
        lines.append(
            f"layers:  {c['num_hidden_layers']} x {c['layer_type']}, hidden {c['hidden_size']}, "
            f"vocab {c['vocab_size']} (draft {c['draft_vocab_size']}), norm_before_residual="
            f"{c['norm_before_residual']}, norm_before_fc={c['norm_before_fc']}, "
            f"fc_norm={c['fc_norm']}, norm_output={c['norm_output']}, "
            f"embed_requires_grad={c['embed_requires_grad']}, window={c['sliding_window']}"
        )
    aux = diagnosis.aux_layers
    if aux:
        ids = aux.get("checkpoint_ids")
        line = f"aux:     checkpoint ids {ids if ids is not None else '(not set: the default)'}"
        if aux.get("captured_layers") is None:
            line += " (no --target: the layers the target captures are not resolved)"
        else:
            how = [f"rule {aux.get('capture_rule')}"]
            if aux.get("sglang_ids") is not None:
                how.insert(0, f"SGLang ids {aux['sglang_ids']}")
            line += f" -> target captures {aux['captured_layers']} ({', '.join(how)})"
        lines.append(line)
    counts = data["tensor_counts"]
    if counts:
        lines.append("tensors: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        for entry in diagnosis.report.entries:
            if entry.status != "loaded":
                lines.append(f"  - {LoadReport.describe(entry)}")
    stock = diagnosis.stock_sglang
    if stock:
        lines.append(f"stock SGLang (predicted, no server run): {stock.get('summary')}")
        for note in stock.get("if_converted_naively", []):
            lines.append(f"  if converted naively: {note}")
    for warning in diagnosis.warnings:
        lines.append(f"warning: {warning}")
    for error in diagnosis.errors:
        lines.append(f"ERROR: {error}")
    lines.append(f"verdict: {diagnosis.verdict}")
    return "\n".join(lines)


def failed(drafter, target, message: str) -> Diagnosis:
    """A report for a doctor run that could not diagnose (usage error, internal failure)."""
    return Diagnosis(
        drafter=str(drafter) if drafter else None,
        target=str(target) if target else None,
        errors=[message],
    )


def main(args) -> int:
    """Exit 0 for verdict OK, 1 for ERROR (README "Exit codes"); usage errors (2) are the
    CLI's. `--json` prints JSON whatever happens."""
    try:
        diagnosis = diagnose(args.drafter, args.target, getattr(args, "context_length", None))
    except Exception as exc:  # noqa: BLE001 - a bug must still answer in the asked format
        if os.environ.get("SGLANG_EXT_DEBUG") == "1":
            raise
        diagnosis = failed(
            args.drafter,
            args.target,
            f"sglang-ext doctor failed: {type(exc).__name__}: {exc}. This is a bug in "
            "sglang-ext; rerun with SGLANG_EXT_DEBUG=1 for the traceback and report it",
        )
    if args.json:
        exit_codes.emit(json.dumps(diagnosis.to_json(), indent=2, default=str))
    else:
        exit_codes.emit(format_text(diagnosis))
    return exit_codes.INPUT_ERROR if diagnosis.errors else exit_codes.OK
