"""Served target features against the HF target's hidden states, in bf16 ulps.

The GPU suite holds what SGLang hands a drafter (the aux-dump test plugin's files) against
the HF target's hidden state at the same layer id and positions, and against the states
one layer away (what an off-by-one capture would hand over). A difference is counted in
units of bf16 resolution at the magnitude of its row (one position's hidden state): 2 ^
(floor(log2 rms(row)) - 7), 8 significant bits. Per element resolution would be wrong here:
an element of the reference that is exactly 0 has no resolution to speak of, and a bf16
rounding of a neighbouring sum lands there as an infinite number of "ulps" (the 2026-12-01
run recorded mean_ulps = inf for states that agreed to 0.5 % in mean absolute terms).
"""

from __future__ import annotations

from typing import Any

BF16_MANTISSA_BITS = 7
SMALLEST_NORMAL = 2.0**-126


def row_resolution(reference: Any) -> Any:
    """bf16 resolution at each row's RMS magnitude, shaped (rows, 1)."""
    import torch

    rms = reference.float().pow(2).mean(dim=-1, keepdim=True).sqrt()
    return torch.exp2(torch.floor(torch.log2(rms.clamp_min(SMALLEST_NORMAL))) - BF16_MANTISSA_BITS)


def layer_agreement(served: Any, reference: Any) -> dict:
    """``served`` features against ``reference`` states (same positions x width): absolute
    differences and differences in bf16 ulps at each row's magnitude."""
    if served.shape != reference.shape:
        raise ValueError(
            f"served features {tuple(served.shape)} and reference states "
            f"{tuple(reference.shape)} differ in shape"
        )
    diff = (served.float() - reference.float()).abs()
    ulps = diff / row_resolution(reference)
    return {
        "max_abs": round(diff.max().item(), 6),
        "mean_abs": round(diff.mean().item(), 6),
        "mean_abs_ref": round(reference.float().abs().mean().item(), 6),
        "max_ulps": round(ulps.max().item(), 2),
        "mean_ulps": round(ulps.mean().item(), 4),
        "frac_over_4_ulps": round((ulps > 4).float().mean().item(), 6),
    }
