"""Opt-in: SGLang's DeepSeek MoE layers run their shared expert on the main stream, before the
routed experts, instead of on a second stream beside them (``SGLANG_EXT_MOE_SHARED_STREAM=0``),
or on a second stream of the highest priority (``=high``).

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

``SGLANG_EXT_MOE_SHARED_STREAM=high`` keeps the second stream but gives the shared expert its
own stream of the highest priority the device has. Why: the three H100 runs of 2026-12-07
(twenty-third session) read the dear mode step by step (``sglang_ext_tools.moe_regimes``): a
whole decode step is dear or cheap, all 60 layers alike, in stretches of steps. In dear steps
the shared expert's last GEMM began 0.8 µs before the routed up-projection (median); in cheap
ones it had ended 11 µs before, so the shared expert's four kernels ran while the router's
one-block kernels did. A cheap step took 6.8 ms, a dear one 8.6, the serial server 7.6. Both
branches start at the layer's fork; which one the GPU dispatches first is what the regimes
differ by, and a stream's priority decides that where both have work waiting. PyTorch
instantiates its CUDA graphs with ``cudaGraphInstantiateFlagUseNodePriority``, and a kernel
captured on a stream keeps that stream's priority as its node's, so the stream is set before
SGLang captures. SGLang's capture stream has the default (lowest) priority.
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


MAIN, SECOND, HIGH = "0", "1", "high"
VALUES = {
    MAIN: "the shared expert on the main stream",
    SECOND: "SGLang's second stream",
    HIGH: "a second stream of the highest priority",
}


def mode() -> str:
    """The value asked for (SECOND where unset); any other value is refused by name, rather
    than read as one of them."""
    value = os.environ.get(ENV_VAR, SECOND)
    if value not in VALUES:
        wanted = ", ".join(f"{v} ({what})" for v, what in VALUES.items())
        raise ValueError(f"{ENV_VAR}: expected {wanted}; found {value!r}")
    return value


def dual_stream_layers(model: Any) -> list[Any]:
    """The model's MoE layers that would fork their shared expert onto a second stream."""
    return [
        m
        for m in model.modules()
        if callable(getattr(m, DUAL_STREAM_METHOD, None))
        and getattr(m, "alt_stream", None) is not None
        and getattr(m, "shared_experts", None) is not None
    ]


def _layers(model: Any, where: str, value: str) -> list[Any]:
    layers = dual_stream_layers(model)
    if not layers:
        raise ValueError(
            f"{ENV_VAR}={value}: {where} ({type(model).__name__}) has no MoE layer with a shared "
            f"expert on a second stream ({DUAL_STREAM_METHOD} and alt_stream); unset it for "
            "this model"
        )
    return layers


def serialize(model: Any, where: str) -> int:
    """Take the second stream from every such layer of ``model``; the count taken."""
    layers = _layers(model, where, MAIN)
    for layer in layers:
        layer.alt_stream = None
    logger.info(
        "sglang_ext: %d MoE layers of %s run their shared expert on the main stream (%s=0)",
        len(layers),
        type(model).__name__,
        ENV_VAR,
    )
    return len(layers)


def high_priority_stream() -> Any:
    """A new CUDA stream of the device's highest priority (PyTorch maps a priority past the
    range to its end)."""
    import torch

    return torch.cuda.Stream(priority=-(2**10))


def prioritize(model: Any, where: str, make_stream=high_priority_stream) -> int:
    """Give every such layer of ``model`` one new stream of the highest priority in place of
    SGLang's second stream (one for all layers, as SGLang shares one); the count changed."""
    layers = _layers(model, where, HIGH)
    stream = make_stream()
    for layer in layers:
        layer.alt_stream = stream
    logger.info(
        "sglang_ext: %d MoE layers of %s run their shared expert on a stream of priority %s "
        "(%s=high)",
        len(layers),
        type(model).__name__,
        getattr(stream, "priority", "?"),
        ENV_VAR,
    )
    return len(layers)


def after_load_model(result: Any, runner: Any, *args, **kwargs) -> None:
    """AFTER hook on ``ModelRunner.load_model``: the target's runner only (a drafter has no
    MoE layer of its own to change)."""
    if getattr(runner, "is_draft_worker", False):
        return None
    if mode() == HIGH:
        prioritize(runner.model, "the target model")
    else:
        serialize(runner.model, "the target model")
    return None


def install() -> list[str]:
    """Register the hook when asked for (0 or high); returns the target registered."""
    value = mode()
    if value == SECOND:
        return []
    from sglang.srt.models import deepseek_v2
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not callable(getattr(deepseek_v2.DeepseekV2MoE, DUAL_STREAM_METHOD, None)):
        raise AttributeError(
            f"sglang.srt.models.deepseek_v2.DeepseekV2MoE.{DUAL_STREAM_METHOD}: not found; "
            f"{ENV_VAR}={value} cannot apply"
        )
    pkgutil.resolve_name(TARGET)
    HookRegistry.register(TARGET, after_load_model, HookType.AFTER)
    return [TARGET]
