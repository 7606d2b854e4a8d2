"""The drafter's lm_head in fp8 where the drafter is served in fp8
(``--speculative-draft-model-quantization fp8``); ``SGLANG_EXT_DRAFT_FP8_LM_HEAD=0`` keeps
SGLang's bf16 head. On by default since 2026-12-06 (below: the trained drafter's τ held).

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
7/1/8, drafter in fp8): the cycle fell by 0.043 decode steps, as predicted. On the trained
8B-shaped drafter (2026-12-06, one H100, fa3, 32 prompts, paired by prompt): τ 1.0032
(0.9953-1.0117) of the fp8 drafter's with a bf16 head at 7/1/8, 1.0006 (0.9933-1.0085) of
the bf16 drafter's at 3/1/4; the 7/1/8 cycle 0.052 decode steps cheaper (registered
0.04-0.06). The registered rule was: on by default if τ holds within 2 %.
At the seed shape's 8,192 × 7168 head the kernel saves nothing (H200: 4.9 µs slower a call
in the microbench), a few µs in a ~10 ms cycle; ``=0`` turns it off there.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_EXT_DRAFT_FP8_LM_HEAD"


def requested() -> bool | None:
    """True: asked for (``=1``); False: refused (``=0``); None: unset, the default (on where
    the drafter is served in online fp8, silently off elsewhere)."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{ENV_VAR}={value!r}: expected 0 (bf16 head) or 1 (fp8 head)")
    return value == "1"


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
    where the drafter is served in online fp8, unless refused (``=0``). Where it cannot
    apply, say so in the startup log (a warning where it was asked for) and keep SGLang's."""
    asked = requested()
    if asked is False or (asked is None and not is_online_fp8(quant_config)):
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
        if asked:
            logger.warning(
                "sglang_ext: %s=1 asks for drafter %s's lm_head in fp8, but %s; its lm_head "
                "stays as SGLang builds it",
                ENV_VAR,
                source,
                reason,
            )
        else:
            logger.info(
                "sglang_ext: drafter %s's lm_head stays as SGLang builds it (not fp8: %s)",
                source,
                reason,
            )
        return False
    model.lm_head = head
    logger.info(
        "sglang_ext: drafter %s's lm_head (%d x %d) served in fp8 (%s=0 keeps it bf16)",
        source,
        config.draft_vocab_size,
        config.hidden_size,
        ENV_VAR,
    )
    return True
