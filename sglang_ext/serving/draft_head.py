"""Opt-in: the drafter's lm_head in fp8 where the drafter is served in fp8
(``SGLANG_EXT_DRAFT_FP8_LM_HEAD=1`` with ``--speculative-draft-model-quantization fp8``).

Why: SGLang's online fp8 quantises the drafter's linear layers but not its lm_head.
``Fp8Config.get_quant_method`` gives an fp8 method to ``LinearBase`` layers only, and
``ParallelLMHead`` is an embedding. At a published draft vocabulary (32,000 × 4096) the head
is 262 MB in bf16, half of what an fp8 draft step reads: the H200 measured a draft step at
0.041 decode steps in fp8 against 0.051 in bf16 (2026-12-03, 7/1/8, from the traces).
SGLang's logits processor applies an lm_head's own ``quant_method``
(``logits_processor.py:_compute_lm_head``, through ``should_apply_lm_head_quant_method``). So
a head built as a linear layer with the drafter's quant config is served in fp8:
- the weights are quantised once after loading, like every other fp8 linear of the drafter;
- activations get the per-token dynamic scale of ``Fp8LinearMethod.apply``.
The layer is a ``ColumnParallelLinear``. It is built only where SGLang's head is not sharded
(one rank): a sharded head's slices follow ``ParallelLMHead``'s padding and group choice
(``enable_dp_lm_head``), which this layer would not match. TP=2 is issue #25's.

Predicted: about 33 µs off each draft step, so 0.05 decode steps off a 7/1/8 cycle, with τ
within 2 % of the bf16 head's. The kernel's premise held on an H100 without SGLang
(``sglang_ext_tools.head_gemv_bench``, 2026-12-06): a 32,000 × 4096 head at batch 1 in
0.54 of bf16's time, 43 µs saved a call; an 8,192 × 7168 head saves only 7 µs (too few
column tiles for the GPU's SMs). Served in SGLang on dummy weights (2026-12-06, one H200,
7/1/8, drafter in fp8): the cycle fell by 0.043 decode steps, as predicted. Off by default
until a trained drafter's τ with it is measured (``sglang_ext_tools.head_quant_tau`` gives
it offline; a server bench is the test).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_EXT_DRAFT_FP8_LM_HEAD"


def requested() -> bool:
    return os.environ.get(ENV_VAR, "0") == "1"


def is_online_fp8(quant_config) -> bool:
    """The quant config SGLang builds for ``--speculative-draft-model-quantization fp8``."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    return (
        isinstance(quant_config, Fp8Config)
        and not quant_config.is_checkpoint_fp8_serialized
        and not getattr(quant_config, "use_mxfp8", False)
    )


def why_not(model, quant_config) -> str | None:
    """Why the fp8 head cannot replace the head SGLang built for this drafter (``model``, its
    ``__init__`` done), or None when it can. Read from the model, not its config: SGLang's
    constructor fills a missing ``draft_vocab_size`` with the target's vocabulary and marks
    the head to be replaced by the target's (``load_lm_head_from_target``) at startup."""
    if not is_online_fp8(quant_config):
        return "the drafter is not served with --speculative-draft-model-quantization fp8"
    if getattr(model.config, "tie_word_embeddings", False):
        return "its lm_head is its embedding (tie_word_embeddings)"
    if getattr(model, "load_lm_head_from_target", False):
        return "it has no lm_head of its own (no draft_vocab_size: SGLang shares the target's)"
    shards = getattr(model.lm_head, "tp_size", 1)
    if shards != 1:
        return f"SGLang shards its lm_head over {shards} ranks (one rank only, for now)"
    if getattr(model.logits_processor, "use_fp32_lm_head", False):
        return "--enable-fp32-lm-head asks for its logits in fp32"
    return None


def fp8_head(config, quant_config, prefix: str):
    """The drafter's lm_head as a linear layer with ``quant_config``."""
    from sglang.srt.layers.linear import ColumnParallelLinear

    return ColumnParallelLinear(
        config.hidden_size,
        config.draft_vocab_size,
        bias=False,
        quant_config=quant_config,
        prefix=prefix,
    )


def apply(model, quant_config, prefix: str, source: str) -> bool:
    """Replace ``model.lm_head`` (SGLang's, built; ``prefix`` the model's) with the fp8 head
    when requested. Where it cannot apply, say so in the startup log and keep SGLang's head."""
    if not requested():
        return False
    config = model.config
    reason = why_not(model, quant_config)
    head = None
    if reason is None:
        from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod

        head = fp8_head(config, quant_config, f"{prefix}.lm_head" if prefix else "lm_head")
        if not isinstance(head.quant_method, Fp8LinearMethod):  # SGLANG_FP8_IGNORED_LAYERS
            reason = f"SGLang's fp8 config gives it {type(head.quant_method).__name__}"
    if reason is not None:
        logger.warning(
            "sglang_ext: %s=1 asks for drafter %s's lm_head in fp8, but %s; its lm_head stays "
            "as SGLang builds it",
            ENV_VAR,
            source,
            reason,
        )
        return False
    model.lm_head = head
    logger.info(
        "sglang_ext: drafter %s's lm_head (%d x %d) served in fp8 (%s=1)",
        source,
        config.draft_vocab_size,
        config.hidden_size,
        ENV_VAR,
    )
    return True
