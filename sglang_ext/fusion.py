"""When the drafter's `fc` fusion applies, decided by capture, not by tensor width.

Stock SGLang (``llama_eagle3.py:LlamaModel.forward``, ``kimi_k25_eagle3.py:Eagle3MLAModel.
forward``) fuses the target's auxiliary hidden states only when
``hidden_states.shape[-1] != embeds.shape[-1]``. When the target hands over a single layer as
wide as the drafter (aux capture not active), the widths match, fusion is skipped and the
drafter runs on features it was never trained on: accept length 1.00, no error.

Here the forward mode decides: draft decode steps (``ForwardMode.DECODE``) carry the drafter's
own recurrent state and never fuse; every other forward that carries tokens (the draft extend
after prefill, ``EXTEND``/``MIXED``, and after verify, ``DRAFT_EXTEND_V2``) carries the
target's captured features and always fuses, and a width other than
``num_aux × target_hidden_size`` is an error that says why. Both decisions are made on
Python-level facts fixed at CUDA-graph capture time, so captured graphs stay valid.

This module also plans and verifies the target's capture at startup, so the common causes
fail before serving instead of on the first request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_ext.speculators_format import (
    CaptureRule,
    DrafterConfigError,
    DrafterSpec,
    TargetInfo,
    capture_rule_for,
    check_capture,
    sglang_ids_for_capture,
)

logger = logging.getLogger(__name__)

LIKELY_CAUSES = (
    "the target is not capturing the auxiliary hidden states this EAGLE-3 drafter was trained "
    "on. Likely causes: (1) --speculative-algorithm EAGLE with an EAGLE-3 drafter (use "
    "--speculative-algorithm EAGLE3); (2) the target's model class has no "
    "set_eagle3_layers_to_capture; (3) aux layer ids that collapse to fewer distinct layers "
    "(SGLang's default [2, L//2, L-3] does on targets with fewer than 6 layers)"
)


class FusionError(RuntimeError):
    """Target features that do not fit the drafter's fc; the message names both widths."""


@dataclass(frozen=True)
class FusionPolicy:
    drafter: str
    num_aux_hidden_states: int
    fc_input_hidden_size: int
    hidden_size: int

    @classmethod
    def for_spec(cls, spec: DrafterSpec) -> FusionPolicy:
        return cls(
            drafter=spec.source,
            num_aux_hidden_states=spec.num_aux_hidden_states,
            fc_input_hidden_size=spec.fc_input_hidden_size,
            hidden_size=spec.hidden_size,
        )

    @property
    def target_feature_width(self) -> int:
        return self.num_aux_hidden_states * self.fc_input_hidden_size

    def applies(self, forward_mode, width: int) -> bool:
        """Whether `fc` fuses these hidden states; raises when they fit neither path."""
        if forward_mode.is_idle():
            # An empty batch (DP attention idle rank): no token is at stake, and SGLang sizes
            # the empty tensor for whichever path it prepared.
            return width == self.target_feature_width
        if forward_mode.is_decode():
            if width != self.hidden_size:
                raise FusionError(
                    f"EAGLE-3 drafter {self.drafter}: a draft decode step carries hidden states "
                    f"{width} wide, expected the drafter's own hidden size {self.hidden_size}"
                )
            return False
        if width != self.target_feature_width:
            raise FusionError(self.width_message(width))
        return True

    def width_message(self, width: int) -> str:
        detail = ""
        if width == self.fc_input_hidden_size:
            detail = " (exactly one target layer: aux capture is not active)"
        elif width % self.fc_input_hidden_size == 0:
            detail = f" ({width // self.fc_input_hidden_size} target layers)"
        return (
            f"EAGLE-3 drafter {self.drafter}: target features are {width} wide{detail}, but its "
            f"fc expects {self.num_aux_hidden_states} x {self.fc_input_hidden_size} = "
            f"{self.target_feature_width}: {LIKELY_CAUSES}."
        )


# --------------------------------------------------------------------------------------------
# Startup checks


def check_algorithm(algorithm: str | None, drafter: str) -> None:
    """An EAGLE-3 drafter needs the EAGLE3 algorithm: under EAGLE the target captures nothing
    and SGLang overwrites the drafter's lm_head with the target's (eagle_worker_v2.py:
    init_lm_head)."""
    if algorithm is None:
        return
    if str(algorithm).upper() not in ("EAGLE3",):
        raise FusionError(
            f"EAGLE-3 drafter {drafter} is served with --speculative-algorithm {algorithm}; "
            "it needs --speculative-algorithm EAGLE3 (under EAGLE the target does not capture "
            "the auxiliary hidden states the drafter fuses)."
        )


@dataclass(frozen=True)
class CapturePlan:
    """What the target must capture for a drafter, and the ids that make it do so."""

    captured_layers: tuple[int, ...]
    sglang_ids: tuple[int, ...] | None  # None: leave SGLang's ids as they are
    rule: CaptureRule
    num_aux_hidden_states: int
    set_directly: bool = False  # the class's id rule cannot express it (deepseek, first=1)


def plan_capture(spec: DrafterSpec, target: TargetInfo, rule: CaptureRule) -> CapturePlan:
    problems = spec.target_problems(target)
    if problems:
        raise DrafterConfigError(
            f"EAGLE-3 drafter {spec.source} cannot be served with target {target.path} "
            f"({target.architecture}, {target.num_hidden_layers} layers):\n  - "
            + "\n  - ".join(problems)
        )
    captured = spec.captured_layers(target)
    if spec.aux_id_convention == "sglang":
        return CapturePlan(tuple(captured), None, rule, spec.num_aux_hidden_states)
    try:
        ids = sglang_ids_for_capture(captured, rule)
    except DrafterConfigError:
        # Any ids that switch capture on; the list is then set on the target directly.
        ids, direct = [k - 1 for k in captured], True
    else:
        direct = False
    return CapturePlan(tuple(captured), tuple(ids), rule, spec.num_aux_hidden_states, direct)


def target_info_from_model(model) -> TargetInfo:
    """TargetInfo from a live SGLang target model (its hf config)."""
    config = model.config
    text = getattr(config, "text_config", None) or config
    archs = getattr(config, "architectures", None) or [type(model).__name__]
    return TargetInfo(
        path=str(getattr(config, "_name_or_path", "")),
        architecture=archs[0],
        model_type=getattr(text, "model_type", ""),
        num_hidden_layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
    )


def capture_rule_for_model(model) -> CaptureRule:
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    return capture_rule_for(getattr(text, "model_type", None), type(model).__module__)


def capture_owner(model):
    """The module of an SGLang target that holds `layers_to_capture`, wherever the class
    keeps it (llama/qwen/deepseek: model.model; multimodal wrappers: language_model.model)."""
    for path in ("model", "language_model.model", "model.language_model", "language_model"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None and hasattr(obj, "layers_to_capture"):
            return obj
    return None


def find_layers_to_capture(model) -> list[int] | None:
    owner = capture_owner(model)
    return None if owner is None else list(owner.layers_to_capture)


def set_capture_directly(model, plan: CapturePlan) -> None:
    owner = capture_owner(model)
    if owner is None:
        raise DrafterConfigError(
            f"target {type(model).__name__} must capture layers {list(plan.captured_layers)}, "
            "which its set_eagle3_layers_to_capture cannot express, and sglang_ext cannot find "
            "its layers_to_capture list to set them"
        )
    owner.layers_to_capture = list(plan.captured_layers)
    logger.info(
        "sglang_ext: set %s layers_to_capture to %s directly (%s ids cannot express it)",
        type(model).__name__,
        list(plan.captured_layers),
        plan.rule,
    )


def verify_capture(model, plan: CapturePlan, num_layers: int) -> None:
    """After the target configured its capture: it must capture exactly the planned layers."""
    captured = find_layers_to_capture(model)
    if captured is None:
        logger.warning(
            "sglang_ext: cannot read layers_to_capture from %s; the capture of aux layers %s "
            "is not verified at startup (the drafter still checks feature widths per batch)",
            type(model).__name__,
            list(plan.captured_layers),
        )
        return
    problems = check_capture(captured, plan.num_aux_hidden_states, num_layers, "target capture")
    if sorted(captured) != sorted(plan.captured_layers):
        problems.append(
            f"target {type(model).__name__} captures layers {captured}, the drafter was trained "
            f"on {list(plan.captured_layers)}"
        )
    if problems:
        raise DrafterConfigError(
            "EAGLE-3 target/drafter mismatch detected at startup:\n  - "
            + "\n  - ".join(dict.fromkeys(problems))
            + f"\n({LIKELY_CAUSES})"
        )
