"""Opt-in: SGLang's DeepSeek MoE layers run their shared expert on the main stream, before the
routed experts, instead of on a second stream beside them (``SGLANG_EXT_MOE_SHARED_STREAM=0``).

Why: at the seed's rank shape (issue #24) the routed experts' up-projection runs in two modes in
servers. A dummy-weight no-speculation server traced on an H100 on 2026-12-07 put them apart by
what was on the GPU as each instance launched: in 2,311 of 2,340 one-token instances the shared
expert's GEMM, which ``DeepseekV2MoE.forward_normal_dual_stream`` (``sglang/srt/models/
deepseek_v2.py``) forks onto ``alt_stream`` at the layer's start, was still running, and the
up-projection took 56.03 µs a call (median); in the 29 where nothing was, 25.95 µs, what the same
compiled kernel takes alone (``tests/gpu/results/seed-shape-2026-12-07-dummy-nvidia-h100-
sglang0.5.23-overlap.json``). The shared expert's kernels take ~15 µs a layer on their stream, so
running them first on the main stream should cost less than the ~30 µs the overlap costs.

SGLang takes the dual-stream path only while a layer has an ``alt_stream``; this switch sets that
attribute to None on every such MoE layer of the target as its model finishes loading
(``ModelRunner.load_model``), before the CUDA graphs are captured, so SGLang's own
``forward_normal`` runs (shared expert, then gate, top-k and the routed experts). Attention keeps
its own streams. The outputs are the same sums in another order. A target without such a layer
is refused by name rather than served unchanged. Off by default.
"""

from __future__ import annotations

import logging
import os
import pkgutil
from typing import Any

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_EXT_MOE_SHARED_STREAM"
TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
# what marks one of SGLang's MoE layers that can fork its shared expert (0.5.23)
DUAL_STREAM_METHOD = "forward_normal_dual_stream"


def requested() -> bool:
    """True where the user asked for the shared expert on the main stream; any value other than
    0 or 1 is refused by name, rather than read as either."""
    value = os.environ.get(ENV_VAR, "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"{ENV_VAR}: expected 0 (the shared expert on the main stream) or 1 (SGLang's "
            f"second stream), found {value!r}"
        )
    return value == "0"


def dual_stream_layers(model: Any) -> list[Any]:
    """The model's MoE layers that would fork their shared expert onto a second stream."""
    return [
        m
        for m in model.modules()
        if callable(getattr(m, DUAL_STREAM_METHOD, None))
        and getattr(m, "alt_stream", None) is not None
        and getattr(m, "shared_experts", None) is not None
    ]


def serialize(model: Any, where: str) -> int:
    """Take the second stream from every such layer of ``model``; the count taken."""
    layers = dual_stream_layers(model)
    if not layers:
        raise ValueError(
            f"{ENV_VAR}=0: {where} ({type(model).__name__}) has no MoE layer with a shared "
            f"expert on a second stream ({DUAL_STREAM_METHOD} and alt_stream); unset it for "
            "this model"
        )
    for layer in layers:
        layer.alt_stream = None
    logger.info(
        "sglang_ext: %d MoE layers of %s run their shared expert on the main stream (%s=0)",
        len(layers),
        type(model).__name__,
        ENV_VAR,
    )
    return len(layers)


def after_load_model(result: Any, runner: Any, *args, **kwargs) -> None:
    """AFTER hook on ``ModelRunner.load_model``: the target's runner only (a drafter has no
    MoE layer of its own to change)."""
    if getattr(runner, "is_draft_worker", False):
        return None
    serialize(runner.model, "the target model")
    return None


def install() -> list[str]:
    """Register the hook when requested; returns the target registered."""
    if not requested():
        return []
    from sglang.srt.models import deepseek_v2
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not callable(getattr(deepseek_v2.DeepseekV2MoE, DUAL_STREAM_METHOD, None)):
        raise AttributeError(
            f"sglang.srt.models.deepseek_v2.DeepseekV2MoE.{DUAL_STREAM_METHOD}: not found; "
            f"{ENV_VAR}=0 cannot apply"
        )
    pkgutil.resolve_name(TARGET)
    HookRegistry.register(TARGET, after_load_model, HookType.AFTER)
    return [TARGET]
