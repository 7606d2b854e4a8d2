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

from sglang_ext.compat import sglang_version, version_tuple
from sglang_ext.drafter.aux_capture import (
    TargetInfo,
    check_capture,
    class_captures_final_state,
)
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.drafter_spec import DrafterSpec

# The name it had before the move to serving/: logging configurations name it.
logger = logging.getLogger("sglang_ext.fusion")

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
    """What the target must capture for a drafter, and the ids its own method is called with."""

    captured_layers: tuple[int, ...] | None  # None: what the class derives from SGLang's ids
    sglang_ids: tuple[int, ...] | None  # None: leave SGLang's ids as they are
    num_aux_hidden_states: int
    num_layers: int
    final_state: bool  # the target's forward also captures boundary num_layers


def plan_capture(spec: DrafterSpec, target: TargetInfo) -> CapturePlan:
    problems = spec.target_problems(target)
    if problems:
        raise DrafterConfigError(
            f"EAGLE-3 drafter {spec.source} cannot be served with target {target.path} "
            f"({target.architecture}, {target.num_hidden_layers} layers):\n  - "
            + "\n  - ".join(problems)
        )
    common = dict(
        num_aux_hidden_states=spec.num_aux_hidden_states,
        num_layers=target.num_hidden_layers,
        final_state=target.captures_final_state,
    )
    if spec.aux_id_convention == "sglang":
        # Ids written for SGLang: the class's own rule applies (as in stock SGLang); the
        # result is read back and checked.
        return CapturePlan(None, None, **common)
    captured = tuple(spec.captured_layers(target))
    # Ids in llama's convention make every class switch capture on for the right number of
    # layers; the list is then set to `captured` whatever the class's id rule.
    return CapturePlan(captured, tuple(k - 1 for k in captured), **common)


def target_info_from_model(model) -> TargetInfo:
    """TargetInfo from a live SGLang target model (its hf config and its class)."""
    config = model.config
    text = getattr(config, "text_config", None) or config
    archs = getattr(config, "architectures", None) or [type(model).__name__]
    classes = [model, getattr(model, "language_model", None)]
    names = {cls.__name__ for obj in classes if obj is not None for cls in type(obj).__mro__}
    return TargetInfo(
        path=str(getattr(config, "_name_or_path", "")),
        architecture=archs[0],
        model_type=getattr(text, "model_type", ""),
        num_hidden_layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
        captures_final_state=class_captures_final_state(names, version_tuple(sglang_version())),
    )


# Where SGLang's target classes (0.5.17 and 0.5.23) keep what their forward reads, relative to
# the model the runner holds: (path of the module holding `layers_to_capture`, path of the
# module holding the `capture_aux_hidden_states` switch). llama.py, deepseek_v2.py, gpt_oss.py,
# qwen*.py: model.model / model; kimi_k25.py, gemma3_mm.py, mllama4.py wrap a language model;
# gemma4_mm.py keeps the list on its language_model and the switch on itself.
CAPTURE_SLOTS: tuple[tuple[str, str], ...] = (
    ("model", ""),
    ("language_model.model", "language_model"),
    ("model.language_model", "model"),
    ("language_model", ""),
)
# qwen2_moe.py, qwen3_moe.py, qwen3_next.py, qwen3_5.py (and minimax_m3.py in 0.5.23): the
# forward reads this per-layer flag, which the class's setter sets, instead of the list.
PER_LAYER_CAPTURE_FLAG = "_is_layer_to_capture"


def _attribute_path(obj, path: str):
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@dataclass
class CaptureSlot:
    """The modules of one live target that hold its capture list, its per-layer flags and its
    capture switch."""

    target: str  # class name, for messages
    owner: object  # holds layers_to_capture (and `layers`)
    switch: object  # holds capture_aux_hidden_states

    @classmethod
    def find(cls, model) -> CaptureSlot | None:
        for owner_path, switch_path in CAPTURE_SLOTS:
            owner = _attribute_path(model, owner_path)
            if owner is None or not hasattr(owner, "layers_to_capture"):
                continue
            # qwen3_vl.py sets the switch on both; a wrapper may keep it on itself only.
            holders = (_attribute_path(model, switch_path), model)
            switch = next((h for h in holders if hasattr(h, "capture_aux_hidden_states")), model)
            return cls(type(model).__name__, owner, switch)
        return None

    @property
    def layers(self) -> list:
        layers = getattr(self.owner, "layers", None)
        return list(layers) if layers is not None else []

    def flagged_layers(self) -> list[int] | None:
        """Layers whose per-layer flag is set; None for a class that keeps no flags."""
        if not any(hasattr(layer, PER_LAYER_CAPTURE_FLAG) for layer in self.layers):
            return None
        flags = [getattr(layer, PER_LAYER_CAPTURE_FLAG, False) for layer in self.layers]
        return [i for i, flag in enumerate(flags) if flag is True]

    def set(self, captured: tuple[int, ...]) -> None:
        self.owner.layers_to_capture = list(captured)
        if self.flagged_layers() is None:
            return
        for i, layer in enumerate(self.layers):
            setattr(layer, PER_LAYER_CAPTURE_FLAG, i in captured)

    def problems(self, plan: CapturePlan) -> list[str]:
        captured = list(self.owner.layers_to_capture)
        where = f"target {self.target}"
        problems = []
        if getattr(self.switch, "capture_aux_hidden_states", None) is not True:
            problems.append(
                f"{where}: capture_aux_hidden_states is "
                f"{getattr(self.switch, 'capture_aux_hidden_states', '<absent>')} after its "
                "set_eagle3_layers_to_capture ran; its forward would return no aux states"
            )
        problems += check_capture(
            captured,
            plan.num_aux_hidden_states,
            plan.num_layers,
            f"{where} capture",
            final_state=plan.final_state,
        )
        if plan.captured_layers is not None and sorted(captured) != sorted(plan.captured_layers):
            problems.append(
                f"{where} captures layers {captured}, the drafter was trained on "
                f"{list(plan.captured_layers)}"
            )
        flagged = self.flagged_layers()
        inside = sorted(k for k in captured if k < plan.num_layers)
        if flagged is not None and flagged != inside:
            problems.append(
                f"{where}: its forward reads per-layer flags, set on layers {flagged}, but its "
                f"capture list is {captured}"
            )
        return problems


def apply_capture(model, plan: CapturePlan) -> list[int]:
    """After the target's own set_eagle3_layers_to_capture ran: set the planned layers where
    its class keeps them, read them back and check them. Returns the captured layers.

    A target whose capture cannot be read back is refused: the per-batch width check alone
    does not see a capture of the wrong layers of the right count.
    """
    slot = CaptureSlot.find(model)
    if slot is None:
        wanted = list(plan.captured_layers) if plan.captured_layers else "its aux layers"
        raise DrafterConfigError(
            f"EAGLE-3 target {type(model).__name__}: sglang_ext cannot find where this class "
            f"keeps layers_to_capture and capture_aux_hidden_states (looked at "
            f"{', '.join('model.' + p for p, _ in CAPTURE_SLOTS)}), so the capture of "
            f"{wanted} cannot be set or verified before serving. Refusing an unverified "
            "capture; sglang_ext.serving.fusion.CAPTURE_SLOTS needs this class's layout."
        )
    if plan.captured_layers is not None:
        slot.set(plan.captured_layers)
    problems = slot.problems(plan)
    if problems:
        raise DrafterConfigError(
            "EAGLE-3 target/drafter mismatch detected at startup:\n  - "
            + "\n  - ".join(dict.fromkeys(problems))
            + f"\n({LIKELY_CAUSES})"
        )
    return list(slot.owner.layers_to_capture)
