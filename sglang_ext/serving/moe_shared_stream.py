"""Opt-in: where SGLang's DeepSeek MoE layers run their shared expert. ``0`` runs it on the main
stream, before the routed experts, instead of on a second stream beside them; ``join`` keeps a
second stream for it and joins it back before the routed up-projection. Off by default (``1``,
SGLang's own second stream).

Why ``0``: at the seed's rank shape (issue #24) the routed experts' up-projection runs in two
modes in servers. A dummy-weight no-speculation server traced on an H100 on 2026-12-07 put them
apart by what was on the GPU as each instance launched: in 2,311 of 2,340 one-token instances the
shared expert's GEMM, which ``DeepseekV2MoE.forward_normal_dual_stream`` (``sglang/srt/models/
deepseek_v2.py``) forks onto ``alt_stream`` at the layer's start, was still running, and the
up-projection took 56.03 µs a call (median); in the 29 where nothing was, 25.95 µs, what the same
compiled kernel takes alone (``tests/gpu/results/seed-shape-2026-12-07-dummy-nvidia-h100-
sglang0.5.23-overlap.json``). SGLang takes the dual-stream path only while a layer has an
``alt_stream``; ``0`` sets that attribute to None on every such MoE layer of the target as its
model finishes loading (``ModelRunner.load_model``), before the CUDA graphs are captured, so
SGLang's own ``forward_normal`` runs (shared expert, then gate, top-k and the routed experts).
Measured: 1.09x without speculation, 1.11-1.14x with it (README).

Why ``join``: the serial path pays the shared expert in full (~12 µs a layer at one token), where
SGLang's stream, in its cheap stretches of steps, had it done beside the router and the block
alignment (~9 µs) before the up-projection launched: a cheap step took 6.8 ms, a serial one 7.6
(``sglang_ext_tools.moe_regimes``). A stream of the highest priority did not make that order
(2026-12-07, twenty-fourth session: every step dear). ``join`` makes it by dependency: the layer
runs SGLang's ``forward_normal``; its ``_forward_shared_experts`` call is issued on one second
stream forked from the main one, and the main stream waits for it right after
``moe_align_block_size`` (rebound in ``sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe``),
before the up-projection reads the GPU's SMs. Only while SGLang captures a full CUDA graph, as its
own dual-stream path; elsewhere the shared expert runs in line. Refused by name: a layer whose
routed experts are not in place (the shared expert then runs after them); a fork that no
alignment joined (another MoE runner), when the next layer forks, at capture, before serving;
and a target whose CUDA graphs captured no fork at all (``ModelRunner.init_cuda_graphs``: no
full decode graph), where the shared expert would run in line, as ``0``, without a word.
Measured on an H100 (2026-12-07, twenty-fifth session): 1.05x over ``0`` without speculation,
every step's up-projection at the cheap 26.5 µs, the 60 MoE layers 6.57 ms a step against
``0``'s 7.36; and (twenty-sixth session) 1.07x over ``0`` and 1.18x over SGLang's stream at
3/1/4, 1.16x over SGLang's stream without speculation at batch 4, level at 16, where ``0``
lost (0.95x) (README).
The outputs are the same sums in another order. A target without a dual-stream layer is refused
by name rather than served unchanged.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
from typing import Any

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_EXT_MOE_SHARED_STREAM"
TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
# where the target's CUDA graphs have been captured: =join reports its forks there
CAPTURED = "sglang.srt.model_executor.model_runner.ModelRunner.init_cuda_graphs"
# what marks one of SGLang's MoE layers that can fork its shared expert (0.5.23)
DUAL_STREAM_METHOD = "forward_normal_dual_stream"
# where the triton MoE runner aligns the routed tokens, just before the up-projection
ALIGN_MODULE = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"
ALIGN = "moe_align_block_size"

MAIN, SECOND, JOIN = "0", "1", "join"
VALUES = {
    MAIN: "the shared expert on the main stream",
    SECOND: "SGLang's second stream",
    JOIN: "a second stream joined before the routed up-projection",
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


def capturing() -> bool:
    """Where SGLang itself would fork the shared expert: a full CUDA graph being captured."""
    from sglang.srt.model_executor.runner import get_is_capture_mode
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        is_in_breakable_cuda_graph,
    )

    return bool(get_is_capture_mode()) and not is_in_breakable_cuda_graph()


class Fork:
    """One second stream for every layer (SGLang shares one too) and the fork not yet joined."""

    def __init__(self, stream: Any, streams: Any, capturing=capturing):
        self.stream, self.streams, self.capturing = stream, streams, capturing
        self.pending: str | None = None
        self.forks = 0  # captured so far

    def shared(self, original, name: str):
        """``original`` (a layer's ``_forward_shared_experts``) issued on the second stream."""

        def forked(*args, **kwargs):
            if not self.capturing():
                return original(*args, **kwargs)
            if self.pending is not None:
                raise RuntimeError(
                    f"{ENV_VAR}=join: the shared expert forked in {self.pending} was never "
                    f"joined: its routed experts did not reach {ALIGN_MODULE}.{ALIGN} (another "
                    "MoE runner); unset it for this model"
                )
            main = self.streams.current_stream()
            self.stream.wait_stream(main)
            with self.streams.stream(self.stream):
                out = original(*args, **kwargs)
            self.pending = name
            self.forks += 1
            return out

        return forked

    def align(self, original):
        """``original`` (SGLang's ``moe_align_block_size``) followed by the main stream's wait
        for a pending shared expert: the up-projection launches after it."""

        def joined(*args, **kwargs):
            out = original(*args, **kwargs)
            if self.pending is not None:
                self.streams.current_stream().wait_stream(self.stream)
                self.pending = None
            return out

        joined.sglang_ext_join = self
        return joined


def _check_joinable(layers: list[Any]) -> None:
    for i, layer in enumerate(layers):
        config = getattr(getattr(layer, "experts", None), "moe_runner_config", None)
        if getattr(config, "inplace", None) is not True:
            raise ValueError(
                f"{ENV_VAR}=join: MoE layer {i} ({type(layer).__name__}): experts."
                f"moe_runner_config.inplace expected True (the shared expert runs before the "
                f"routed experts), found {getattr(config, 'inplace', None)!r}; use 0 or unset it"
            )
        if getattr(layer, "_fuse_shared_experts_inside_sbo", False):
            raise ValueError(
                f"{ENV_VAR}=join: MoE layer {i} ({type(layer).__name__}): "
                "_fuse_shared_experts_inside_sbo expected False, found True; use 0 or unset it"
            )


def join(model: Any, where: str, streams: Any = None, module: Any = None) -> int:
    """SGLang's serial path on every such layer of ``model``, its shared expert forked onto one
    new stream and joined after the routed tokens' alignment; the count changed."""
    layers = _layers(model, where, JOIN)
    _check_joinable(layers)
    if streams is None:
        import torch

        streams = torch.cuda
    module = module or importlib.import_module(ALIGN_MODULE)
    original = getattr(module, ALIGN, None)
    if not callable(original):
        raise AttributeError(f"{ALIGN_MODULE}.{ALIGN}: not found; {ENV_VAR}=join cannot apply")
    fork = current_fork(module)
    if fork is None:
        fork = Fork(streams.Stream(), streams)
        setattr(module, ALIGN, fork.align(original))
    for i, layer in enumerate(layers):
        layer.alt_stream = None  # SGLang's serial path, whose shared expert call is wrapped
        layer._forward_shared_experts = fork.shared(layer._forward_shared_experts, f"layer {i}")
    logger.info(
        "sglang_ext: %d MoE layers of %s fork their shared expert and join it before the "
        "routed up-projection (%s=join)",
        len(layers),
        type(model).__name__,
        ENV_VAR,
    )
    return len(layers)


def current_fork(module: Any = None) -> Fork | None:
    """The Fork that =join set up in this process, if any."""
    module = module or importlib.import_module(ALIGN_MODULE)
    return getattr(getattr(module, ALIGN, None), "sglang_ext_join", None)


def after_init_cuda_graphs(result: Any, runner: Any, *args, module: Any = None, **kwargs) -> None:
    """AFTER hook on ``ModelRunner.init_cuda_graphs`` (=join, the target's runner): how many
    shared-expert forks its graphs captured; none is refused, since the shared expert would
    then run in line, as =0, without a word (``--disable-cuda-graph``, say)."""
    if getattr(runner, "is_draft_worker", False):
        return None
    if not kwargs.get("capture_decode_cuda_graph", args[0] if args else True):
        return None  # decode graphs deferred (a role switch captures them later)
    fork = current_fork(module)
    if fork is None or fork.forks == 0:
        raise ValueError(
            f"{ENV_VAR}=join: the target's CUDA graphs captured no MoE layer's shared expert "
            "(no full decode graph: --disable-cuda-graph, or only breakable graphs), so it "
            "would run in line, as =0; set 0 or unset it"
        )
    logger.info(
        "sglang_ext: %d shared-expert forks captured in the target's CUDA graphs, each joined "
        "before its routed up-projection (%s=join)",
        fork.forks,
        ENV_VAR,
    )
    return None


def after_load_model(result: Any, runner: Any, *args, **kwargs) -> None:
    """AFTER hook on ``ModelRunner.load_model``: the target's runner only (a drafter has no
    MoE layer of its own to change)."""
    if getattr(runner, "is_draft_worker", False):
        return None
    if mode() == JOIN:
        join(runner.model, "the target model")
    else:
        serialize(runner.model, "the target model")
    return None


def install() -> list[str]:
    """Register the hooks when asked for (0 or join); returns the targets registered."""
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
    if value != JOIN:
        return [TARGET]
    pkgutil.resolve_name(CAPTURED)
    HookRegistry.register(CAPTURED, after_init_cuda_graphs, HookType.AFTER)
    return [TARGET, CAPTURED]
