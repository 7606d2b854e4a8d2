"""sglang_ext_tools.feature_agreement: the GPU suite's served-vs-HF feature comparison."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_ext_tools.feature_agreement import layer_agreement, row_resolution


def test_a_zero_in_the_reference_does_not_make_the_agreement_infinite():
    """The 2026-12-01 run: HF states with exact zeros and a bf16-rounded served copy gave
    mean_ulps = inf. At the row's magnitude the agreement is finite and small."""
    torch.manual_seed(0)
    ref = torch.randn(64, 256)
    ref[:, ::7] = 0.0
    served = ref.to(torch.bfloat16).float()
    served[:, ::7] = 1e-3  # a rounding of a neighbouring sum where the reference is 0
    found = layer_agreement(served, ref)
    assert math.isfinite(found["mean_ulps"]) and math.isfinite(found["max_ulps"])
    assert found["mean_ulps"] < 1.0


def test_a_neighbouring_layer_is_far_in_ulps_and_the_own_layer_near():
    torch.manual_seed(1)
    own = torch.randn(32, 128)
    neighbour = own + 0.5 * torch.randn(32, 128)  # one layer's update away
    served = own.to(torch.bfloat16).float()
    near, far = layer_agreement(served, own), layer_agreement(served, neighbour)
    assert near["mean_ulps"] < far["mean_ulps"] / 4
    assert far["mean_ulps"] > 20


def test_resolution_follows_the_row_magnitude():
    rows = torch.stack([torch.full((8,), 1.0), torch.full((8,), 8.0), torch.zeros(8)])
    res = row_resolution(rows).squeeze(-1).tolist()
    assert res[0] == 2.0**-7 and res[1] == 2.0**-4 and res[2] == 2.0 ** (-126 - 7)


def test_shapes_must_match():
    with pytest.raises(ValueError, match="differ in shape"):
        layer_agreement(torch.zeros(3, 4), torch.zeros(3, 5))
