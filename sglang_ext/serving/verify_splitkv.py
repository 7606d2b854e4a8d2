"""Opt-in: SGLang's split-KV EAGLE verify attention on CUDA (``SGLANG_EXT_SPLITKV_VERIFY=1``).

Why: profiling the target's verify step on an H200 (SGLang 0.5.17, triton backend, Llama-3.1-8B
shape, batch 1, 6 draft tokens, ~300 cached tokens;
``tests/gpu/results/profile-dummy-2026-11-29-nvidia-h200.json``) showed that the verify CUDA
graph spends 0.85 ms in ``extend_attention``'s ``_fwd_kernel``. That kernel walks the cached
prefix serially per (sequence, head). A decode step's attention costs 0.22 ms.

SGLang ships a split-KV verify kernel (``sglang/kernels/ops/attention/verify_splitkv.py``,
flash-decode style, for chains, i.e. ``speculative_eagle_topk == 1``). Its docstring says it is
NV-safe and numerics-tested on CUDA. ``TritonAttnBackend.__init__`` enables it only on AMD
gfx95. This hook turns it on for CUDA when the user asks, with SGLang's own gates kept:
- topk must be 1;
- ``SGLANG_ENABLE_SPLITKV_VERIFY`` must not be off;
- the kernel's ``can_handle`` still falls back per call.
Off by default, because its speed on CUDA has not been measured here yet.
``tests/test_verify_splitkv.py`` checks its output against ``extend_attention_fwd`` and a
torch reference under Triton's interpreter.
"""

from __future__ import annotations

import logging
import os

# The name it had before the move to serving/: logging configurations name it.
logger = logging.getLogger("sglang_ext.verify_splitkv")

ENV_VAR = "SGLANG_EXT_SPLITKV_VERIFY"
TARGET = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__"


def requested() -> bool:
    return os.environ.get(ENV_VAR, "0") == "1"


def after_triton_backend_init(result, backend, *args, **kwargs):
    """AFTER hook on ``TritonAttnBackend.__init__``: enable split-KV verify for chains."""
    from sglang.srt.environ import envs

    if getattr(backend, "use_verify_splitkv", False):
        return None
    if getattr(backend, "topk", 0) != 1:
        logger.info(
            "sglang_ext: %s=1 ignored: split-KV verify needs --speculative-eagle-topk 1 (got %s)",
            ENV_VAR,
            getattr(backend, "topk", None),
        )
        return None
    if not envs.SGLANG_ENABLE_SPLITKV_VERIFY.get():
        return None
    backend.use_verify_splitkv = True
    logger.info("sglang_ext: triton target verify uses SGLang's split-KV kernel (%s=1)", ENV_VAR)
    return None


def install() -> list[str]:
    """Register the hook when requested; returns the targets registered."""
    if not requested():
        return []
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    pkgutil.resolve_name(TARGET)  # moved upstream: the launch fails here, not silently
    HookRegistry.register(TARGET, after_triton_backend_init, HookType.AFTER)
    return [TARGET]
