"""Opt-out, for diagnosis: SGLang's Triton fused MoE without programmatic dependent launch
(``SGLANG_EXT_MOE_PDL=0``).

Why: at the seed's rank shape (issue #24) a 5/1/6 server draws one of two verify cycles per
instance, and a trace puts the whole difference in the MoE up-projection: 68.6 µs a call in the
cheap instance, 82.2 µs in the dear one, at the same launch grid
(``tests/gpu/results/seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23-bench.json``).
SGLang 0.5.23 launches that GEMM with PDL. ``invoke_fused_moe_kernel`` (in
``sglang/kernels/ops/moe/fused_moe_triton_kernels.py``) passes ``launch_pdl`` and, for M ≤ 512,
``GDC_EARLY``, so the kernel calls ``gdc_launch_dependents`` as it starts. The activation after
it then sits resident on the GPU for the whole GEMM. Whether those early blocks are what makes
some instances' GEMM dearer is the question this switch answers: it makes that module's
``is_arch_support_pdl`` say no, so the MoE GEMMs and their sum-reduce launch plainly. Every
other PDL user in SGLang keeps its own binding, and the results do not change, only the launch
order.

The rebinding happens in the process that builds the model, as it starts loading
(``ModelRunner.load_model``), so the one log line it writes comes from the process whose
kernels it changes. Off by default.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_EXT_MOE_PDL"
MODULE = "sglang.kernels.ops.moe.fused_moe_triton_kernels"
ATTRIBUTE = "is_arch_support_pdl"
TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


def requested() -> bool:
    """True where the user switched PDL off for the fused MoE; any value other than 0 or 1 is
    refused by name, rather than read as either."""
    value = os.environ.get(ENV_VAR, "1")
    if value not in ("0", "1"):
        raise ValueError(
            f"{ENV_VAR}: expected 0 (PDL off in SGLang's fused MoE) or 1, found {value!r}"
        )
    return value == "0"


def _no_pdl() -> bool:
    return False


def rebind() -> None:
    """Make the MoE module's PDL check say no (a moved check fails the model's load here)."""
    module = importlib.import_module(MODULE)
    if not callable(getattr(module, ATTRIBUTE, None)):
        raise AttributeError(f"{MODULE}.{ATTRIBUTE}: not found; {ENV_VAR}=0 cannot apply")
    if getattr(module, ATTRIBUTE) is not _no_pdl:
        setattr(module, ATTRIBUTE, _no_pdl)
        logger.info("sglang_ext: SGLang's Triton fused MoE launches without PDL (%s=0)", ENV_VAR)


def before_load_model(*args, **kwargs) -> None:
    """BEFORE hook on ``ModelRunner.load_model``."""
    rebind()


def install() -> list[str]:
    """Register the hook when requested; returns the target registered."""
    if not requested():
        return []
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if importlib.util.find_spec(MODULE) is None:  # moved upstream: the launch fails here
        raise ModuleNotFoundError(f"{MODULE}: not found; {ENV_VAR}=0 cannot apply")
    pkgutil.resolve_name(TARGET)
    HookRegistry.register(TARGET, before_load_model, HookType.BEFORE)
    return [TARGET]
